"""Reductions, broadcast and barrier: tensors take torch.distributed's path, values go through values.py.

Semantics follow ``torch.distributed`` (seeds 001, 002, 004) and
``ignite.distributed`` (seeds 000, 003), with the differences listed in each
docstring. Every argument is checked before any communication, on the rank
that passed it. ``src``/``dst`` are global ranks, also with a subgroup.
Data-moving collectives of any shape are in :mod:`polydist.gathering`,
point-to-point in :mod:`polydist.p2p`.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from . import codec, debug, values
from ._compat import reduce_scatter_single
from ._common import (
    active_group,
    check_serial_root,
    check_tensor,
    contiguous,
    done,
    finish,
    native_avg,
    reduce_keeps_input,
    scratch_copy,
)
from .context import device
from .groups import GroupLike, Resolved, direct_world
from .ops import OpLike, check_op_dtype, resolve_op, to_reduce_op
from .timeouts import guarded

__all__ = ["all_reduce", "reduce", "reduce_scatter", "broadcast", "barrier"]


def _op(name: str, res: Resolved) -> tuple[dist.ReduceOp, bool]:
    """The ReduceOp to run and whether AVG must be finished by dividing by the group size."""
    if name == "AVG" and not native_avg(res):
        return dist.ReduceOp.SUM, True
    return to_reduce_op(name), False


def _tensors(x: Any) -> Optional[list[torch.Tensor]]:
    """``[x]`` for a tensor, the list for a non-empty list/tuple of tensors, None otherwise."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)) and x and all(isinstance(t, torch.Tensor) for t in x):
        return list(x)
    return None


def _coalesce(tensors: list[torch.Tensor]) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    """One contiguous buffer per (dtype, device), with the tensors it carries.

    A single contiguous tensor is its own buffer (no copy); otherwise the
    tensors are flattened into one new buffer and copied back afterwards.
    """
    buckets: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        buckets.setdefault((t.dtype, t.device), []).append(t)
    out = []
    for members in buckets.values():
        if len(members) == 1 and members[0].is_contiguous():
            out.append((members[0], members))
        else:
            out.append((torch.cat([t.reshape(-1) for t in members]), members))
    return out


def _scatter_back(buf: torch.Tensor, members: list[torch.Tensor]) -> None:
    """Copy each member's part of ``buf`` back into it (one fused copy for the lot)."""
    if len(members) == 1 and buf is members[0]:
        return
    pieces = buf.split([t.numel() for t in members])
    torch._foreach_copy_(members, [p.view_as(t) for p, t in zip(pieces, members)])


def _describe(tensors: list[torch.Tensor]) -> str:
    return ", ".join(debug.describe_tensor(t.dtype, t.shape) for t in tensors)


# ---------------------------------------------------------------- all_reduce


@guarded("all_reduce")
def all_reduce(x: Any, op: OpLike = "SUM", group: GroupLike = None, *, async_op: bool = False) -> Any:
    """Reduce ``x`` across the group; every rank gets the result.

    Args:
        x: a tensor (any shape, dtype and device the backend supports; same
            shape and dtype on every rank); a list or tuple of tensors,
            reduced together in one coalesced call per dtype (e.g. all the
            gradients of a model); or a Python number (bool, int, float,
            complex; NumPy scalars accepted).
        op: "SUM", "PRODUCT", "MIN", "MAX", "AVG", "AND", "OR", "XOR" (any
            case) or a ``torch.distributed.ReduceOp``.
        group: None (world), a ProcessGroup, or a list of global ranks.
        async_op: return a :class:`~polydist.Work` whose ``wait()`` returns
            the result.

    Returns:
        For tensors: ``x`` itself, reduced **in place** (non-contiguous and
        coalesced tensors go through a contiguous buffer and are written
        back). AVG is SUM then division by the group size on backends without
        a native AVG. For a number: the reduced number, identical on every
        rank — ints exact at any size, floats as float64, AVG a float, bools
        under AND/OR/XOR stay bools. Serial: the input (AVG of a number: as
        float).

    Raises:
        ValueError: unknown ``op``; bad ``group``.
        TypeError: ``op`` undefined on the dtype (AND/OR/XOR on floating
            tensors or floats, AVG on integer tensors, MIN/MAX/PRODUCT on
            complex); ``x`` neither tensor(s) nor number.

    Source: ``torch.distributed.all_reduce``; idist ``all_reduce`` for values.
    """
    name = resolve_op(op)
    if group is None and not async_op and type(x) is torch.Tensor and not debug.is_debug():
        direct = direct_world()  # MPI world: the backend's blocking allreduce, minus torch's dispatch
        if direct is not None:
            check_op_dtype(name, x.dtype)
            return direct.allreduce_tensor(x, name)
    tensors = _tensors(x)
    if tensors is None:
        number = values.check_number(x, name)
        res = active_group(group)
        if res is None:
            return done(values.reduce_numbers([number], name), async_op)
        if debug.is_debug():
            debug.check(res, "all_reduce", (name, "number"), f"all_reduce(number, op={name})")
        return done(values.all_reduce_value(number, name, res), async_op)
    for t in tensors:
        check_op_dtype(name, t.dtype)
    res = active_group(group)
    if res is None:
        return done(x, async_op)
    if debug.is_debug():
        layout = [(codec.dtype_name(t.dtype), list(t.shape)) for t in tensors]
        debug.check(res, "all_reduce", (name, layout), f"all_reduce({_describe(tensors)}, op={name})")
    if res.direct is not None and not async_op and len(tensors) == 1:
        return res.direct.allreduce_tensor(tensors[0], name)  # MPI: skip torch's dispatch, same operation
    red, divide = _op(name, res)
    buckets = _coalesce(tensors)
    works = [dist.all_reduce(buf, red, group=res.pg, async_op=async_op) for buf, _ in buckets]

    def result() -> Any:
        for buf, members in buckets:
            if divide:
                buf.div_(res.size)
            _scatter_back(buf, members)
        return x

    return finish(result, works, async_op)


# ---------------------------------------------------------------- reduce


@guarded("reduce", rooted=True)
def reduce(x: Any, dst: int = 0, op: OpLike = "SUM", group: GroupLike = None, *, async_op: bool = False) -> Any:
    """Reduce ``x`` across the group onto global rank ``dst``.

    Args:
        x: a tensor (same shape and dtype on every rank) or a Python number.
        dst: global rank that receives the result.
        op, group, async_op: as for :func:`all_reduce`.

    Returns:
        On ``dst``: ``x`` holding the result **in place** (a number: the
        reduced number). Elsewhere: ``x``, **untouched** — unlike gloo's
        native reduce, which leaves partial sums in non-root inputs (seed 001
        prints them); polydist hands gloo a copy there. Serial: ``x``.

    Raises:
        ValueError: unknown ``op``; ``dst`` not in the group; bad ``group``.
        TypeError: ``op`` undefined on the dtype (see :func:`all_reduce`);
            ``dst`` not an int.

    Source: ``torch.distributed.reduce``.
    """
    name = resolve_op(op)
    if not isinstance(x, torch.Tensor):
        number = values.check_number(x, name)
        res = active_group(group)
        if res is None:
            check_serial_root(dst, "dst")
            return done(values.reduce_numbers([number], name), async_op)
        res.check_root(dst, "dst")
        if debug.is_debug():
            debug.check(res, "reduce", (name, dst, "number"), f"reduce(number, dst={dst}, op={name})")
        return done(values.reduce_value(number, name, dst, res), async_op)
    check_op_dtype(name, x.dtype)
    res = active_group(group)
    if res is None:
        check_serial_root(dst, "dst")
        return done(x, async_op)
    res.check_root(dst, "dst")
    if debug.is_debug():
        agree = (name, dst, codec.dtype_name(x.dtype), list(x.shape))
        debug.check(res, "reduce", agree, f"reduce({_describe([x])}, dst={dst}, op={name})")
    here = res.rank == dst
    red, divide = _op(name, res)
    if here or reduce_keeps_input(res):
        buf = contiguous(x)
    else:  # the backend would leave partial results in x: hand it a copy
        buf = x.clone(memory_format=torch.contiguous_format) if async_op else scratch_copy(x)
    work = dist.reduce(buf, dst, red, group=res.pg, async_op=async_op)

    def result() -> Any:
        if here:
            if divide:
                buf.div_(res.size)
            if buf is not x:
                x.copy_(buf)
        return x

    return finish(result, [work], async_op)


# ---------------------------------------------------------------- reduce_scatter


@guarded("reduce_scatter")
def reduce_scatter(x: torch.Tensor, op: OpLike = "SUM", group: GroupLike = None, *, async_op: bool = False) -> Any:
    """Reduce ``x`` across the group and give each rank one chunk of the result.

    Args:
        x: a tensor with at least one dimension, same shape and dtype on
            every rank. It is split along dim 0 into group-size chunks as
            ``torch.tensor_split`` does: when ``x.shape[0]`` does not divide,
            the first ``x.shape[0] % size`` chunks have one row more.
        op, group, async_op: as for :func:`all_reduce`.

    Returns:
        A new tensor: chunk ``i`` of the reduced ``x`` on group rank ``i``,
        on ``x``'s device. ``x`` is not modified. Serial: ``x``.

    Raises:
        TypeError: ``x`` is not a tensor; ``op`` undefined on its dtype.
        ValueError: unknown ``op``; ``x`` is 0-dim; bad ``group``.

    Source: ``torch.distributed.reduce_scatter_tensor`` (which needs dim 0
    divisible by the group size; this does not).
    """
    name = resolve_op(op)
    check_tensor(x, "reduce_scatter")
    if x.dim() == 0:
        raise ValueError("reduce_scatter needs a tensor with at least one dimension to split, got a 0-dim tensor")
    check_op_dtype(name, x.dtype)
    res = active_group(group)
    if res is None:
        return done(x, async_op)
    if debug.is_debug():
        agree = (name, codec.dtype_name(x.dtype), list(x.shape))
        debug.check(res, "reduce_scatter", agree, f"reduce_scatter({_describe([x])}, op={name})")
    n, rows, rest = res.size, x.shape[0], x.shape[1:]
    q, r = divmod(rows, n)
    sizes = [q + 1] * r + [q] * (n - r)  # torch.tensor_split's chunk sizes
    width = sizes[0]
    if rows == n * width:
        source = contiguous(x)
    else:  # pad every chunk to the first (largest) one
        source = x.new_zeros((n * width, *rest))
        offset = 0
        for i, size in enumerate(sizes):
            source[i * width : i * width + size] = x[offset : offset + size]
            offset += size
    out = torch.empty((width, *rest), dtype=x.dtype, device=x.device)
    red, divide = _op(name, res)
    work = reduce_scatter_single(out, source, red, group=res.pg, async_op=async_op)

    def result() -> torch.Tensor:
        if divide:
            out.div_(n)
        return out[: sizes[res.group_rank]]

    return finish(result, [work], async_op)


# ---------------------------------------------------------------- broadcast

_TENSOR_FRAME, _VALUE_FRAME = b"T", b"V"


@guarded("broadcast", rooted=True)
def broadcast(
    x: Any,
    src: int = 0,
    group: GroupLike = None,
    *,
    safe_mode: bool = False,
    async_op: bool = False,
    allow_pickle: Optional[bool] = None,
) -> Any:
    """Send ``src``'s ``x`` to every rank of the group.

    Args:
        x: on ``src``: a tensor, or any value the codec takes (number, str,
            bytes, ``pathlib.Path``, list/tuple/dict/set, nested, tensors
            inside). Elsewhere: when ``src`` sends a tensor without
            ``safe_mode``, a tensor of the same shape and dtype (filled in
            place); when ``src`` sends a value, or with ``safe_mode=True``,
            anything, e.g. None (ignored). A tensor on ``src`` meeting a
            non-tensor elsewhere without ``safe_mode`` is a mismatch between
            ranks (debug mode reports it).
        src: global rank of the source.
        group: None (world), a ProcessGroup, or a list of global ranks.
        safe_mode: src first sends the tensor's shape and dtype, so other
            ranks may pass None or a tensor of another shape (a new tensor is
            then returned, on the backend's device).
        async_op: return a :class:`~polydist.Work` whose ``wait()`` returns
            the result (the size/value frame is exchanged before returning).
        allow_pickle: pickle values the safe codec does not support (and
            accept pickled values) for this call; None follows
            :func:`~polydist.set_allow_pickle`. Unpickling can run code.

    Returns:
        A tensor broadcast is done **in place** where the receiving tensor
        matches and that tensor is returned; otherwise a new tensor. A value
        is returned decoded: ints exact at any size, floats float64, strings
        exact (UTF-8), tuples stay tuples, tensors inside on this rank's
        ``device()``.

    Raises:
        ValueError: ``src`` not in the group.
        TypeError: a value the codec cannot encode — on every rank, since src
            announces the failure instead of the value.

    Source: ``torch.distributed.broadcast``; idist ``broadcast`` (safe_mode),
    without its float32 rounding of numbers and its ASCII-only strings.
    """
    res = active_group(group)
    if res is None:
        check_serial_root(src, "src")
        if isinstance(x, torch.Tensor):
            return done(x, async_op)
        return done(codec.decode(codec.encode(x, allow_pickle), allow_pickle=allow_pickle), async_op)  # as a real one
    res.check_root(src, "src")
    raw = isinstance(x, torch.Tensor) and not safe_mode
    if debug.is_debug():
        if raw:
            agree, shown = ("tensor", codec.dtype_name(x.dtype), list(x.shape)), _describe([x])
        else:
            agree, shown = ("framed",), ("safe_mode" if safe_mode else type(x).__name__)
        debug.check(res, "broadcast", (src, *agree), f"broadcast({shown}, src={src})")
    if raw:
        buf = contiguous(x)
        work = dist.broadcast(_bytes_of(buf), src, group=res.pg, async_op=async_op)
        return finish(lambda: _copy_back(buf, x), [work], async_op)
    return _framed_broadcast(x, src, res, async_op, allow_pickle)


# Dtypes every backend (gloo included) carries natively; others travel as their bytes.
_NATIVE = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
                     torch.int32, torch.int64, torch.bool})  # fmt: skip


def _bytes_of(buf: torch.Tensor) -> torch.Tensor:
    """``buf`` itself, or for a dtype gloo cannot carry (int16, uint32, complex, ...) its memory as uint8."""
    return buf if buf.dtype in _NATIVE else buf.reshape(-1).view(torch.uint8)


def _copy_back(buf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if buf is not x:
        x.copy_(buf)
    return x


def _framed_broadcast(x: Any, src: int, res: Resolved, async_op: bool, allow_pickle: Optional[bool]) -> Any:
    """Broadcast with a leading frame saying what follows: a tensor's dtype/shape, or a value."""
    is_src = res.rank == src
    frame = None
    if is_src:
        if isinstance(x, torch.Tensor):
            frame = _TENSOR_FRAME + codec.encode([codec.dtype_name(x.dtype), list(x.shape)])
        else:
            frame = values.encode(x, allow_pickle)
            if isinstance(frame, bytes):
                frame = _VALUE_FRAME + frame
    got = values.broadcast_bytes(frame, src, res)
    if got[:1] == _VALUE_FRAME:
        return done(x if is_src else codec.decode(got[1:], device=device(), allow_pickle=allow_pickle), async_op)
    dtype_name, shape = codec.decode(got[1:])
    dtype = codec.torch_dtype(dtype_name)
    if is_src or (isinstance(x, torch.Tensor) and x.dtype == dtype and list(x.shape) == shape):
        target = x
    else:
        target = torch.empty(shape, dtype=dtype, device=values.comm_device(res))
    buf = contiguous(target)
    work = dist.broadcast(_bytes_of(buf), src, group=res.pg, async_op=async_op)
    return finish(lambda: _copy_back(buf, target), [work], async_op)


# ---------------------------------------------------------------- barrier


@guarded("barrier")
def barrier(group: GroupLike = None, *, async_op: bool = False) -> Any:
    """Block until every rank of the group has entered the barrier (no-op when serial).

    With ``async_op=True``, return a :class:`~polydist.Work` instead of
    blocking. Raises ``ValueError``/``TypeError`` for a bad ``group``.
    Source: ``torch.distributed.barrier``.
    """
    res = active_group(group)
    if res is None:
        return done(None, async_op)
    if debug.is_debug():
        debug.check(res, "barrier", (), "barrier()")
    work = dist.barrier(group=res.pg, async_op=async_op)
    return finish(lambda: None, [work], async_op)
