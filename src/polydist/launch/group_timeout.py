"""``polydist run --timeout`` for the groups a program creates itself, without polydist.

A program that calls torch's ``init_process_group()`` or ``new_group()``
without a ``timeout`` gets torch's default (30 minutes; nccl's 10), whatever
the launcher was told. In a worker of ``polydist run --timeout T``
(``$POLYDIST_TIMEOUT``), :func:`apply` makes ``T`` that default instead:

* ``init_process_group()`` without a timeout joins with ``max(T, 2 min)``
  (ranks that start slowly do not fail the rendezvous, as under
  :func:`polydist.initialize`), then its collectives wait ``T``
  (``_set_pg_timeout``); where the backend cannot change it after creation,
  ``T`` from the start;
* groups created later without one (``new_group``, ``DeviceMesh``'s) wait ``T``.

An explicit ``timeout`` always wins. torch reads its default through
``distributed_c10d._get_default_timeout`` and takes ``init_process_group``'s
``timeout`` as an argument; nothing else of torch changes.
"""

from __future__ import annotations

import functools
import inspect
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from .. import _torch, settings
from ..backends import registry
from ..rendezvous import JOIN_TIMEOUT_FLOOR

__all__ = ["apply"]


def apply() -> bool:
    """Make ``$POLYDIST_TIMEOUT`` the default timeout of the groups this process creates (see the module
    docstring); False, changing nothing, where it is unset or this torch lacks the hooks. Idempotent."""
    seconds = settings.TIMEOUT.read()
    c10d = getattr(dist, "distributed_c10d", None)
    if seconds is None or c10d is None or not hasattr(c10d, "_get_default_timeout"):
        return False
    if getattr(c10d.init_process_group, "_polydist_timeout", False):
        return True
    td = timedelta(seconds=seconds)
    init = c10d.init_process_group
    signature = inspect.signature(init)

    def default_timeout(backend: Any) -> timedelta:
        return td

    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind_partial(*args, **kwargs)
        if bound.arguments.get("timeout") is not None:
            return init(*args, **kwargs)
        backend = bound.arguments.get("backend")
        settable = _settable(backend)
        bound.arguments["timeout"] = max(td, JOIN_TIMEOUT_FLOOR) if settable else td
        init(*bound.args, **bound.kwargs)
        if settable:
            _torch.set_default_timeout(td)

    init_process_group._polydist_timeout = True  # type: ignore[attr-defined]
    c10d._get_default_timeout = default_timeout
    c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group
    return True


def _settable(backend: Any) -> bool:
    """Whether the default group's timeout can be changed once made (its registry entry says so: gloo and
    nccl, also when none is named and torch picks them); not for a combined ``"cpu:...,cuda:..."`` string."""
    return registry.timeout_settable(registry.default_name() if backend is None else str(backend).lower())
