"""torch's dispatcher for polydist's Python groups: taken while a tool watches it, skipped otherwise.

A Python group (:class:`~polydist.backends.python_group.PythonProcessGroup`) is the ProcessGroup itself (torch's
``_new_process_group_helper`` takes any ProcessGroup subclass a creator returns as the group), so
``torch.distributed.all_reduce`` calls its Python ``allreduce`` directly, past ``torch.ops.c10d.allreduce_``.
Where ``_dispatch.cpp`` was built (:data:`DISPATCH`), :func:`for_torch` registers a compiled ``GroupBackend``
forwarding to the group as its CPU backend, and each of the group's methods of torch's names is a door
(:func:`install_doors`): while a tool watches the dispatcher on this thread (a dispatch mode such as
``CommDebugMode`` or a tracing mode, or the profiler: ``DISPATCH.watched()``), the call takes torch's own
ProcessGroup method, which calls the dispatcher op, whose kernel reaches the group's method again through the
Backend; otherwise it runs the group's method at once. So those tools count and see what they do on gloo, and an
unwatched call does not pay the dispatcher, which costs more than a small MPI call (3.3-3.7x raw mpi4py
for an 8-byte all_reduce through it, 2.0-2.3x past it). Records, watchdog, lanes and errors are the group's either
way.
"""

from __future__ import annotations

import functools
import threading
import types
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from .. import settings
from .._compiled import load
from .direct import DirectProcessGroup

__all__ = ["DISPATCH", "for_torch", "behind", "dispatched", "install_doors", "watched", "TORCH_OPS"]

# The compiled Backend (_dispatch.cpp, built by setup.py against the installed torch), or None: a Python group then
# stands beside torch's dispatcher.
DISPATCH = load(__package__, "_dispatch", "_dispatch.cpp")
_CPU = torch.device("cpu")

# torch's ProcessGroup methods that call a dispatcher op, by the names torch.distributed calls on a group (2.13's
# *_single names and the older ones, both a function of _dispatch's).
TORCH_OPS = ("allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "_allgather_base",
             "all_gather_single", "allgather_coalesced", "allgather_into_tensor_coalesced", "all_gather_single_coalesced",
             "gather", "scatter", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single",
             "reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced", "alltoall", "alltoall_base",
             "all_to_all_single", "send", "recv", "recv_anysource", "barrier")  # fmt: skip

# whether a tool watches torch's dispatcher on this thread; without _dispatch, the profiler alone (the lane's events)
watched: Callable[[], bool] = torch._C._autograd._profiler_enabled if DISPATCH is None else DISPATCH.watched
_inside = threading.local()  # .on: this thread is in a door's dispatcher call (its kernel calls the door again)


def dispatched() -> bool:
    """Whether new Python groups get a Backend for torch's dispatcher: :data:`DISPATCH` built and ``POLYDIST_DISPATCH``
    not off."""
    return DISPATCH is not None and settings.DISPATCH.read()


def for_torch(group: DirectProcessGroup, name: str, fast: Optional[tuple] = None) -> DirectProcessGroup:
    """What a creator returns for Python group ``group`` (rank and size its own): the group, with a ``GroupBackend``
    (``getBackendName()``: ``name``) registered as its CPU backend where :func:`dispatched`.

    ``fast``: ``(capsule, communicator handle, size)``, a compiled common all_reduce (the MPI group's, ``_lean``)
    the backend calls without Python where it applies.
    """
    if not dispatched():
        return group
    backend = DISPATCH.GroupBackend(group, group._rank, group._size, name)
    if fast is not None:
        backend.set_fast(*fast)
    custom = dist.ProcessGroup.BackendType.CUSTOM
    group._register_backend(_CPU, custom, backend)  # the dispatcher's CPU kernels call pg.getBackend(CPU)
    group._set_default_backend(custom)
    group._dispatch_backend = backend
    return group


def _door(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (a group's method of torch's name ``name``), through torch's dispatcher while it is watched."""
    through = getattr(DISPATCH, name)

    @functools.wraps(method)
    def door(self: Any, *args: Any, **kwargs: Any) -> Any:
        if watched() and self._dispatch_backend is not None and not getattr(_inside, "on", False):
            _inside.on = True
            try:
                return through(self, *args, **kwargs)
            finally:
                _inside.on = False
        return method(self, *args, **kwargs)

    door._door = True  # type: ignore[attr-defined]
    return door


def install_doors(cls: type) -> None:
    """Make the most derived Python definition of each of :data:`TORCH_OPS` on ``cls`` a door (a compiled one, as
    the MPI group's ``allreduce``, checks for itself and calls a Python method that is). Nothing without _dispatch."""
    if DISPATCH is None:
        return
    for name in TORCH_OPS:
        method = getattr(cls, name, None)
        if isinstance(method, types.FunctionType) and not getattr(method, "_door", False):
            setattr(cls, name, _door(name, method))


def behind(pg: Any) -> Optional[DirectProcessGroup]:
    """The Python group of ProcessGroup ``pg``: ``pg`` itself where it is one; None for any other group (gloo's,
    nccl's)."""
    return pg if isinstance(pg, DirectProcessGroup) else None
