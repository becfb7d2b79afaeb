"""A backend's registry entry, the declaration side: the :class:`Backend` record and :func:`declare`.

An entry is a small record of what the core asks about a backend's
communication (devices, reductions, subgroups, point-to-point, AVG, the
mover: :data:`DIRECT` or :data:`SLOTS`) and its
:class:`~polydist.backends.lifecycle.Lifecycle`. Each backend declares its
entry once, torch's own in :mod:`polydist.backends.builtin`, polydist's in
their folders; :data:`DECLARED` holds them, and
:mod:`polydist.backends.registry`, which re-exports these names, answers the
core's questions from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from .. import ops
from .dispatch import behind
from .lifecycle import DEFAULT_LIFECYCLE, Lifecycle

__all__ = ["Backend", "declare", "DECLARED", "DIRECT", "SLOTS"]

# How polydist's collectives move a group's bytes (:attr:`Backend.mover`; collectives/exchange.py maps them).
DIRECT = "direct"  # the group's own blocking calls, past torch's dispatch (a DirectProcessGroup: the Python groups)
SLOTS = "slots"  # torch.distributed calls, the predicted-slot protocol (collectives/slots.py)


@dataclass(frozen=True, eq=False)  # an entry is itself: compared and hashed by identity
class Backend:
    """What the core asks about one backend's communication (defaults: what torch.distributed promises of any
    backend), and its :class:`Lifecycle`.

    Attributes:
        name: the name ``torch.distributed.get_backend`` gives its groups.
        builtin: one of torch's own backends (listed first by :func:`~polydist.backends.registry.available_names`, in declaration order).
        device: the device type its byte buffers live on; ``"cuda"``: the current CUDA device (:meth:`comm_device`).
        default_for: the device type it is the default backend for, when that device is visible (:func:`~polydist.backends.registry.default_name`).
        reduce_keeps_input: ``reduce`` leaves the non-destination ranks' inputs untouched (gloo writes
            partial results into them; unknown backends are assumed to, to be safe).
        native_avg: it has a ``ReduceOp.AVG`` that matches SUM-then-divide.
        no_subgroups: None when its members alone make groups of fewer ranks than the world; else
            the error for such a group of the given global ranks, or None where this job can make it
            with every rank's help (:meth:`Lifecycle.add_group`; horovod with dynamic process sets).
        point_to_point: it has send/recv.
        model_name: ``polydist.model_name()`` on it, as ``ignite.distributed`` names it.
        reductions: what it reduces (op x dtype), checked before any communication; None: not second-guessed.
        mover: how polydist's collectives move its groups' bytes: :data:`DIRECT` (the group's direct calls:
            it must be a :class:`~polydist.backends.direct.DirectProcessGroup`) or :data:`SLOTS`; None: by the
            group (a DirectProcessGroup gets its direct calls, any other the slots). See :meth:`moves_direct`.
        timeout_settable: its default group's timeout can be changed after creation (torch's
            ``_set_pg_timeout``: gloo and nccl).
        torch_recorder: torch's own flight recorder sees its groups' calls (gloo, nccl), so calls not made
            through polydist's API (DDP's) are in torch's dump, not polydist's.
        torch_devices: the device types torch is told its groups take (``Backend.register_backend(devices=...)``,
            ``Backend.backend_capability``) where polydist implements it; None: torch's own backend, left as torch says.
        listed: named in ``polydist run --help`` (False for second spellings and names that never run here).
        lifecycle: what it does at start, join, launch, adoption and finalize (:class:`Lifecycle`).
    """

    name: str
    builtin: bool = False
    device: str = "cpu"
    default_for: Optional[str] = None
    reduce_keeps_input: bool = False
    native_avg: bool = False
    no_subgroups: Optional[Callable[[list], Optional[Exception]]] = None
    point_to_point: bool = True
    model_name: str = "native-dist"
    reductions: Optional[ops.Reductions] = None
    mover: Optional[str] = None
    timeout_settable: bool = False
    torch_recorder: bool = False
    torch_devices: Optional[tuple] = None
    listed: bool = True
    lifecycle: Lifecycle = DEFAULT_LIFECYCLE

    def comm_device(self) -> torch.device:
        """Where a group of this backend communicates: ``cuda:<current device>`` for CUDA backends, else the type."""
        if self.device == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(self.device)

    def device_visible(self) -> bool:
        """Whether this process sees a device of :attr:`device`'s type (:meth:`Lifecycle.sees_device`)."""
        return self.lifecycle.sees_device(self.device)

    def moves_direct(self, group: Any) -> bool:
        """Whether polydist's collectives call the direct calls of ``group``'s Python group (:attr:`mover`; the group
        itself: :func:`~polydist.backends.dispatch.behind`), not torch.distributed's.

        Asked once per group and world (:class:`polydist.groups.Resolved`). Raises ``TypeError`` where the
        entry declares :data:`DIRECT` for a group that has no direct calls.
        """
        direct = behind(group) is not None
        if self.mover is None:
            return direct
        if self.mover == DIRECT and not direct:
            raise TypeError(f"backend {self.name!r} declares the direct mover, but its group is a "
                            f"{type(group).__name__}, not a DirectProcessGroup")
        return self.mover == DIRECT


DECLARED: dict[str, Backend] = {}  # every declared entry by name, in declaration order (written by declare only)


def declare(entry: Backend) -> Backend:
    """Declare (or replace) the entry of ``entry.name``; what its reduction table refuses is marked in :data:`polydist.ops.SUSPECT`."""
    DECLARED[entry.name] = entry
    if entry.reductions is not None:
        ops.mark_suspects(entry.reductions)
    return entry
