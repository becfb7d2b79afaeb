"""A Python group behind a torch-made ProcessGroup, so torch-level calls take torch's dispatcher.

A Python group (:class:`~polydist.backends.python_group.PythonProcessGroup`) that a creator returns as it is
becomes the ProcessGroup itself (torch's ``_new_process_group_helper`` takes any ProcessGroup subclass as the
group): ``torch.distributed.all_reduce`` then calls its Python ``allreduce`` directly and never reaches
``torch.ops.c10d.allreduce_``, so torch's tools that hook the dispatcher (``CommDebugMode``, the profiler's c10d
events, tracing modes) see nothing. Where ``_dispatch.cpp`` was built (:data:`DISPATCH`), a creator returns
:func:`backend_for`'s compiled ``GroupBackend`` instead, a c10d ``Backend`` forwarding each operation to the
group's method of torch's name: torch makes the ProcessGroup over it (as over its own ``ProcessGroupMPI``) and
each call takes the dispatcher's op on its way to the same Python method, so records, watchdog, lanes and errors
are the group's as before. :func:`behind` finds the Python group behind either kind of ProcessGroup.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .. import settings
from .._compiled import load
from .direct import DirectProcessGroup

__all__ = ["DISPATCH", "backend_for", "behind", "dispatched"]

# The compiled Backend (_dispatch.cpp, built by setup.py against the installed torch), or None: a Python group is
# then the ProcessGroup itself, past torch's dispatcher.
DISPATCH = load(__package__, "_dispatch", "_dispatch.cpp")
_CPU = torch.device("cpu")


def dispatched() -> bool:
    """Whether new Python groups go behind torch-made ProcessGroups: :data:`DISPATCH` built and
    ``POLYDIST_DISPATCH`` not off."""
    return DISPATCH is not None and settings.DISPATCH.read()


def backend_for(group: DirectProcessGroup, name: str, fast: Optional[tuple] = None) -> Any:
    """What a creator returns for Python group ``group`` (rank and size its own): a ``GroupBackend`` forwarding to it,
    which ``getBackendName()`` calls ``name``, where :func:`dispatched`; else ``group`` itself.

    ``fast``: ``(capsule, communicator handle, size)``, a compiled common all_reduce (the MPI group's, ``_lean``)
    the backend calls without Python where it applies.
    """
    if not dispatched():
        return group
    backend = DISPATCH.GroupBackend(group, group._rank, group._size, name)
    if fast is not None:
        backend.set_fast(*fast)
    return backend


def behind(pg: Any) -> Optional[DirectProcessGroup]:
    """The Python group of ProcessGroup ``pg``: ``pg`` itself where it is one, the group its CPU backend forwards to
    where torch made ``pg`` over a ``GroupBackend``; None for any other group (gloo's, nccl's)."""
    if isinstance(pg, DirectProcessGroup):
        return pg
    if DISPATCH is None or pg is None:
        return None
    try:
        backend = pg._get_backend(_CPU)
    except (RuntimeError, AttributeError):  # no CPU backend (nccl), or not a ProcessGroup
        return None
    return backend.group if isinstance(backend, DISPATCH.GroupBackend) else None
