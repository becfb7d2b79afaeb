"""The state of one distributed world: everything polydist knows about the live default group.

One :class:`World` exists per default process group. :mod:`polydist.context`
owns it: it makes one when a group appears (``initialize()``, or a group the
user created with ``torch.distributed.init_process_group``) and drops it
when the default group changes identity (``finalize()``, or the user's
``destroy_process_group()`` and a new ``init_process_group``), so no cache,
counter or buffer outlives the world it belongs to. The precedent is
PyTorch's own ``_World`` in ``torch.distributed.distributed_c10d``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = ["Layout", "World"]


@dataclass(frozen=True)
class Layout:
    """Node layout of the job, as seen from this process."""

    local_rank: int
    nproc_per_node: int
    nnodes: int
    node_rank: int


# Host names cross ranks as fixed-size byte rows (not pickled objects): the mpi:// rendezvous
# gathers them over MPI, layout_from_hostnames over the new group.
HOST_BYTES = 256  # a host name is at most 253 bytes (RFC 1035)


def host_row(name: str) -> np.ndarray:
    """``name`` as a zero-padded ``HOST_BYTES``-byte uint8 row."""
    row = np.zeros(HOST_BYTES, dtype=np.uint8)
    data = name.encode("utf-8")[: HOST_BYTES - 1]
    row[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    return row


def host_names(rows: np.ndarray) -> list:
    """The names in gathered rows (``[n, HOST_BYTES]`` uint8), in rank order; bytes from other ranks decode safely."""
    return [row.tobytes().rstrip(b"\0").decode("utf-8", "replace") for row in rows.reshape(-1, HOST_BYTES)]


class World:
    """What polydist knows about one default process group (see the module docstring).

    Attributes:
        pg: torch's default group; its identity is this world's identity.
        rank, size: this process's global rank and the world size, from ``pg``.
        owns_group: polydist created ``pg``, so ``finalize()`` destroys it.
        layout: the node layout; ``layout_known`` False while it is a
            single-node guess (an adopted group whose launcher exported none).
        timeout: the collective timeout ``initialize(timeout=)`` applied
            (None: PyTorch's default); groups polydist creates get it too.
        groups: rank tuple → the ProcessGroup polydist created for it.
        resolved: ``group`` argument key → its :class:`~polydist.groups.Resolved`
            (which carries the group's collective sequence number);
            ``world_group`` is the one of ``group=None``, once resolved.
        warned: groups a non-member call was already warned about.
    """

    __slots__ = ("pg", "rank", "size", "owns_group", "layout", "layout_known", "timeout", "world_group", "groups", "resolved", "warned", "_scratch")

    def __init__(
        self,
        pg: "dist.ProcessGroup",
        owns_group: bool,
        layout: Layout,
        timeout: Optional[timedelta],
        layout_known: bool = True,
    ) -> None:
        self.pg = pg
        self.rank, self.size = pg.rank(), pg.size()
        self.owns_group = owns_group
        self.layout, self.layout_known = layout, layout_known
        self.timeout = timeout
        self.groups: dict[tuple[int, ...], Any] = {}
        self.resolved: dict[Any, Any] = {}
        self.world_group: Any = None
        self.warned: set = set()
        self._scratch: dict[torch.device, torch.Tensor] = {}

    def scratch_copy(self, x: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of ``x`` in a buffer reused across calls (one per device).

        Reusing it spares the page faults of fresh memory, which cost several
        times the copy itself at tens of MiB. Synchronous use only: the copy is
        overwritten by the next call; it is freed with the world.
        """
        nbytes = x.numel() * x.element_size()
        buf = self._scratch.get(x.device)
        if buf is None or buf.numel() < nbytes:
            buf = self._scratch[x.device] = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
        return buf[:nbytes].view(x.dtype).view(x.shape).copy_(x)
