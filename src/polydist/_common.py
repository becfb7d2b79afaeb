"""Argument handling shared by the collective modules (internal)."""

from __future__ import annotations

import reprlib
from typing import Any, Optional

import torch
import torch.distributed as dist

from .context import require_group
from .groups import GroupLike, Resolved, resolve
from .timeouts import count
from .work import Work

# Backends whose reduce() leaves the input of non-destination ranks untouched.
# gloo (and unknown backends, to be safe) write partial results into it.
_REDUCE_KEEPS_INPUT = frozenset({"nccl", "mpi", "mpi4py"})
# Backends with a native ReduceOp.AVG that matches SUM-then-divide.
_NATIVE_AVG = frozenset({"nccl", "mpi4py"})


_scratch: dict[torch.device, torch.Tensor] = {}


def scratch_copy(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``x`` in a buffer reused across calls (one per device).

    Reusing it spares the page faults of fresh memory, which cost several
    times the copy itself at tens of MiB. Synchronous use only: the copy is
    overwritten by the next call. :func:`release_scratch` frees it.
    """
    nbytes = x.numel() * x.element_size()
    buf = _scratch.get(x.device)
    if buf is None or buf.numel() < nbytes:
        buf = _scratch[x.device] = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    return buf[:nbytes].view(x.dtype).view(x.shape).copy_(x)


def release_scratch() -> None:
    _scratch.clear()


def active_group(group: GroupLike, collective: bool = True) -> Optional[Resolved]:
    """The resolved group, or None when the run is serial (no process group, not launched).

    ``collective``: number the call on the group (see :mod:`polydist.timeouts`);
    point-to-point calls pass False, since only two members take part.
    """
    if not require_group():
        return None
    res = resolve(group)
    if collective:
        count(res)
    return res


def backend_of(res: Resolved) -> str:
    return str(dist.get_backend(res.pg))


def reduce_keeps_input(res: Resolved) -> bool:
    return backend_of(res) in _REDUCE_KEEPS_INPUT


def native_avg(res: Resolved) -> bool:
    return backend_of(res) in _NATIVE_AVG


def check_serial_root(root: int, name: str) -> None:
    if isinstance(root, bool) or not isinstance(root, int):
        raise TypeError(f"{name} must be an int global rank, got {root!r}")
    if root != 0:
        raise ValueError(f"{name}={root} is not a rank of a serial (world size 1) run")


def contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_contiguous() else x.contiguous()


def check_tensor(x: Any, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} takes a tensor, got {type(x).__name__}: {reprlib.repr(x)}")
    if x.layout != torch.strided:
        raise TypeError(f"{name} takes a dense (strided) tensor, got layout {x.layout}")
    return x


def check_list(xs: Any, size: int, name: str, what: str) -> list:
    """``xs`` as a list of exactly ``size`` items; ``ValueError``/``TypeError`` naming the bad value."""
    if not isinstance(xs, (list, tuple)):
        raise TypeError(f"{name} takes a list with one item per rank of the group ({what}), got {type(xs).__name__}")
    if len(xs) != size:
        raise ValueError(f"{name} needs a list of {size} items, one per rank of the group ({what}), got {len(xs)}")
    return list(xs)


def finish(result_fn, works, async_op: bool) -> Any:
    """Return ``result_fn()`` now, or a :class:`Work` that waits ``works`` and then calls it."""
    if async_op:
        return Work(works, result_fn)
    for w in works:
        if w is not None:
            w.wait()
    return result_fn()


def done(result: Any, async_op: bool) -> Any:
    return Work.done(result) if async_op else result
