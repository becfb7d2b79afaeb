"""Collectives: tensors take torch.distributed's path, Python values go through values.py.

Semantics follow ``torch.distributed`` (seeds 001, 002, 004) and
``ignite.distributed`` (seeds 000, 003), with the differences listed in each
docstring. Every argument is checked before any communication, on the rank
that passed it. ``src``/``dst`` are global ranks, also with a subgroup.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from . import codec, values
from ._compat import all_gather_single
from .context import device, require_group
from .groups import GroupLike, Resolved, resolve
from .ops import OpLike, check_op_dtype, resolve_op, to_reduce_op

__all__ = ["all_reduce", "broadcast", "all_gather", "barrier"]


def _group(group: GroupLike) -> Optional[Resolved]:
    """The resolved group, or None when serial."""
    return resolve(group) if require_group() else None


def _check_serial_root(root: int, name: str) -> None:
    if root != 0:
        raise ValueError(f"{name}={root} is not a rank of a serial (world size 1) run")


def _contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_contiguous() else x.contiguous()


# ---------------------------------------------------------------- all_reduce


def all_reduce(x: Any, op: OpLike = "SUM", group: GroupLike = None) -> Any:
    """Reduce ``x`` across the group; every rank gets the result.

    Args:
        x: a tensor (any shape, dtype, device the backend supports; same
            shape and dtype on every rank) or a Python number (bool, int,
            float, complex; NumPy scalars accepted).
        op: "SUM", "PRODUCT", "MIN", "MAX", "AVG", "AND", "OR", "XOR" (any
            case) or a ``torch.distributed.ReduceOp``.
        group: None (world), a ProcessGroup, or a list of global ranks.

    Returns:
        For a tensor: ``x`` itself, reduced **in place** (a non-contiguous
        tensor is reduced through a contiguous copy and written back). AVG is
        SUM then division by the group size on backends without a native AVG.
        For a number: the reduced number, identical on every rank — ints
        exact at any size, floats as float64, AVG a float, bools under
        AND/OR/XOR stay bools. Serial: the input (AVG of a number: as float).

    Raises:
        ValueError: unknown ``op``; bad ``group``.
        TypeError: ``op`` undefined on the dtype (AND/OR/XOR on floating
            tensors or floats, AVG on integer tensors, MIN/MAX/PRODUCT on
            complex); ``x`` neither tensor nor number.

    Source: ``torch.distributed.all_reduce``; idist ``all_reduce`` for values.
    """
    name = resolve_op(op)
    if isinstance(x, torch.Tensor):
        check_op_dtype(name, x.dtype)
        res = _group(group)
        if res is None:
            return x
        buf = _contiguous(x)
        if name == "AVG" and str(dist.get_backend(res.pg)) != "nccl":
            dist.all_reduce(buf, dist.ReduceOp.SUM, group=res.pg)
            buf.div_(res.size)
        else:
            dist.all_reduce(buf, to_reduce_op(name), group=res.pg)
        if buf is not x:
            x.copy_(buf)
        return x
    number = values.check_number(x, name)
    res = _group(group)
    if res is None:
        return values.reduce_numbers([number], name)
    return values.all_reduce_value(number, name, res)


# ---------------------------------------------------------------- broadcast

_TENSOR_FRAME, _VALUE_FRAME = b"T", b"V"


def broadcast(x: Any, src: int = 0, group: GroupLike = None, *, safe_mode: bool = False) -> Any:
    """Send ``src``'s ``x`` to every rank of the group.

    Args:
        x: on ``src``: a tensor, or any value the safe codec takes (number,
            str, bytes, ``pathlib.Path``, list/tuple/dict/set, nested, tensors
            inside). Elsewhere: when ``src`` sends a tensor without
            ``safe_mode``, a tensor of the same shape and dtype (filled in
            place); when ``src`` sends a value, or with ``safe_mode=True``,
            anything, e.g. None (ignored). A tensor on ``src`` meeting a
            non-tensor elsewhere without ``safe_mode`` is a mismatch between
            ranks (the receivers cannot know what ``src`` holds).
        src: global rank of the source.
        group: None (world), a ProcessGroup, or a list of global ranks.
        safe_mode: src first sends the tensor's shape and dtype, so other
            ranks may pass None or a tensor of another shape (a new tensor is
            then returned, on this rank's ``device()``).

    Returns:
        A tensor broadcast is done **in place** where the receiving tensor
        matches and that tensor is returned; otherwise a new tensor. A value
        is returned decoded: ints exact at any size, floats float64, strings
        exact (UTF-8), tuples stay tuples, tensors inside on this rank's
        ``device()``.

    Raises:
        ValueError: ``src`` not in the group.
        TypeError: a value the codec cannot encode (on ``src``).

    Source: ``torch.distributed.broadcast``; idist ``broadcast`` (safe_mode),
    without its float32 rounding of numbers and its ASCII-only strings.
    """
    res = _group(group)
    if res is None:
        _check_serial_root(src, "src")
        if isinstance(x, torch.Tensor):
            return x
        return codec.decode(codec.encode(x))  # same value semantics as a real broadcast
    res.check_root(src, "src")
    if isinstance(x, torch.Tensor) and not safe_mode:
        buf = _contiguous(x)
        dist.broadcast(buf, src, group=res.pg)
        if buf is not x:
            x.copy_(buf)
        return x
    return _framed_broadcast(x, src, res, res.rank == src)


def _framed_broadcast(x: Any, src: int, res: Resolved, is_src: bool) -> Any:
    """Broadcast with a leading frame saying what follows: a tensor's dtype/shape, or a value."""
    frame = None
    if is_src:
        if isinstance(x, torch.Tensor):
            frame = _TENSOR_FRAME + codec.encode([codec.dtype_name(x.dtype), list(x.shape)])
        else:
            frame = _VALUE_FRAME + codec.encode(x)
    got = values.broadcast_bytes(frame, src, res)
    if got[:1] == _VALUE_FRAME:
        return x if is_src else codec.decode(got[1:], device=device())
    dtype_name, shape = codec.decode(got[1:])
    dtype = codec.torch_dtype(dtype_name)
    if is_src:
        target = x
    elif isinstance(x, torch.Tensor) and x.dtype == dtype and list(x.shape) == shape:
        target = x
    else:
        target = torch.empty(shape, dtype=dtype, device=values.comm_device(res))
    buf = _contiguous(target)
    dist.broadcast(buf, src, group=res.pg)
    if buf is not target:
        target.copy_(buf)
    return target


# ---------------------------------------------------------------- all_gather


def _gather_shapes(x: torch.Tensor, res: Resolved) -> tuple[list, list]:
    meta = codec.encode([codec.dtype_name(x.dtype), list(x.shape)])
    rows = [codec.decode(b) for b in values.all_gather_bytes(meta, res)]
    return [r[0] for r in rows], [tuple(r[1]) for r in rows]


def _describe(ranks: tuple, items: list) -> str:
    return ", ".join(f"rank {r}: {item}" for r, item in zip(ranks, items))


def all_gather(x: Any, group: GroupLike = None, *, concat: bool = True) -> Any:
    """Gather ``x`` from every rank of the group onto every rank.

    Args:
        x: a tensor — shapes may differ between ranks (sizes are exchanged
            in one small metadata round; callers never pass shapes), dtypes
            must agree — or any value the safe codec takes.
        group: None (world), a ProcessGroup, or a list of global ranks.
        concat: for tensors. True: concatenate along dim 0 (a 0-dim tensor
            counts as shape ``(1,)``), so dim 0 may differ per rank but
            trailing dims must agree. False: return the list of per-rank
            tensors, any shapes.

    Returns:
        A new tensor (concat) or list of tensors, on ``x``'s device, in group
        rank order; for a value, the list of every rank's value (decoded on
        this rank, tensors on its ``device()``). Serial: ``x`` (as 1-d when
        0-dim), ``[x]``, or ``[value]``.

    Raises:
        ValueError: on every rank, when dtypes differ, or with ``concat=True``
            when trailing dims differ — naming each rank's shape or dtype.
        TypeError: a value the codec cannot encode (before communication).

    Source: ``torch.distributed.all_gather`` / ``all_gather_into_tensor``;
    idist ``all_gather`` (which aborts on uneven shapes; this does not).
    """
    res = _group(group)
    if not isinstance(x, torch.Tensor):
        if res is None:
            return [codec.decode(codec.encode(x))]  # same value semantics as a real gather
        return values.all_gather_value(x, res)  # encodes (TypeError) before communicating
    if res is None:
        if concat:
            return x.reshape(1) if x.dim() == 0 else x
        return [x]
    dtypes, shapes = _gather_shapes(x, res)
    if len(set(dtypes)) > 1:
        raise ValueError(f"all_gather needs one dtype on every rank, got {_describe(res.ranks, dtypes)}")
    if concat:
        shapes = [s if s else (1,) for s in shapes]
        if len({s[1:] for s in shapes}) > 1:
            raise ValueError(
                "all_gather(concat=True) needs the same trailing dims on every rank "
                f"(only dim 0 may differ), got {_describe(res.ranks, shapes)}; pass concat=False for a list"
            )
    src = _contiguous(x).reshape(-1)
    if len(set(shapes)) == 1:
        out = torch.empty(res.size * src.numel(), dtype=x.dtype, device=x.device)
        all_gather_single(out, src, group=res.pg)
        if concat:
            return out.view(res.size * shapes[0][0], *shapes[0][1:])
        return list(out.view(res.size, *shapes[0]).unbind(0))
    numels = [int(torch.Size(s).numel()) for s in shapes]
    width = max(numels)
    padded = torch.zeros(width, dtype=x.dtype, device=x.device)
    padded[: src.numel()] = src
    out = torch.empty(res.size * width, dtype=x.dtype, device=x.device)
    all_gather_single(out, padded, group=res.pg)
    pieces = [out[i * width : i * width + n].view(s) for i, (n, s) in enumerate(zip(numels, shapes))]
    return torch.cat(pieces) if concat else pieces


# ---------------------------------------------------------------- barrier


def barrier(group: GroupLike = None) -> None:
    """Block until every rank of the group has entered the barrier (no-op when serial).

    Raises ``ValueError``/``TypeError`` for a bad ``group``.
    Source: ``torch.distributed.barrier``.
    """
    res = _group(group)
    if res is not None:
        dist.barrier(group=res.pg)
