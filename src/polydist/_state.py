"""The state of one distributed world: everything polydist knows about the live default group.

One :class:`World` exists per default process group. :mod:`polydist.live_world`
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

import torch


if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = ["Layout", "World"]



SCRATCH_LIMIT = 64 << 20  # larger buffers are allocated per call, not kept (their transfer dwarfs the faults)


def reuse(store: dict, name: str, nbytes: int, device: torch.device) -> torch.Tensor:
    """The one scratch policy: a uint8 buffer of ``nbytes`` on ``device`` kept in ``store`` under ``name``.

    Fresh memory costs a page fault per 4 KiB on first touch (about as much as
    copying it), so a buffer that does not outlive its call is kept: the
    largest seen per name and device, up to :data:`SCRATCH_LIMIT` bytes
    (64 MiB); a larger one is allocated for the call only. Synchronous use
    only: the next call under ``name`` overwrites it. ``store`` is the
    World's (:meth:`World.scratch`) or a group's (the slot protocol's).
    """
    key = (name, device)
    buf = store.get(key)
    if buf is None or buf.numel() < nbytes:
        buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
        if nbytes <= SCRATCH_LIMIT:
            store[key] = buf
    return buf[:nbytes]

@dataclass(frozen=True)
class Layout:
    """Node layout of the job, as seen from this process."""

    local_rank: int
    nproc_per_node: int
    nnodes: int
    node_rank: int


class World:
    """What polydist knows about one default process group (see the module docstring).

    Attributes:
        pg: torch's default group; its identity is this world's identity.
        rank, size: this process's global rank and the world size, from ``pg``.
        owns_group: polydist created ``pg``, so ``finalize()`` destroys it.
        store_shared: the ranks share ``pg``'s store, so ``finalize()`` can
            wait there for all of them; False for a group made over a runtime
            the program started (``hvd.init()``), whose store is the process's own.
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

    __slots__ = ("pg", "rank", "size", "owns_group", "store_shared", "layout", "layout_known", "timeout", "world_group", "groups", "resolved", "warned", "_scratch")

    def __init__(
        self,
        pg: "dist.ProcessGroup",
        owns_group: bool,
        layout: Layout,
        timeout: Optional[timedelta],
        layout_known: bool = True,
        store_shared: bool = True,
    ) -> None:
        self.pg = pg
        self.rank, self.size = pg.rank(), pg.size()
        self.owns_group, self.store_shared = owns_group, store_shared
        self.layout, self.layout_known = layout, layout_known
        self.timeout = timeout
        self.groups: dict[tuple[int, ...], Any] = {}
        self.resolved: dict[Any, Any] = {}
        self.world_group: Any = None
        self.warned: set = set()
        self._scratch: dict[tuple, torch.Tensor] = {}

    def scratch(self, name: str, nbytes: int, device: torch.device) -> torch.Tensor:
        """A uint8 buffer of ``nbytes`` on ``device``, reused from call to call under ``name``.

        Fresh memory costs a page fault per 4 KiB on first touch (about as
        much as copying it), so a buffer that does not outlive its call (send
        slots, a receive buffer the result is copied out of) is kept: the
        largest seen per name and device, up to :data:`SCRATCH_LIMIT` bytes
        (64 MiB); a larger one is allocated for the call only. Synchronous use
        only: the next call under ``name`` overwrites it; freed with the world.
        """
        return reuse(self._scratch, name, nbytes, device)

    def scratch_copy(self, x: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of ``x`` in :meth:`scratch`'s buffer ``"copy"`` (same rules: kept up to 64 MiB)."""
        buf = self.scratch("copy", x.numel() * x.element_size(), x.device)
        return buf.view(x.dtype).view(x.shape).copy_(x)
