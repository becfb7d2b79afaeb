"""Data-moving collectives of any shape: all_gather, gather, scatter, all_to_all.

Ranks may hold tensors of different shapes, or Python values. Sizes travel in
one small metadata round (the slots of :mod:`polydist.values`), so
callers never pass shapes; the data then moves in one ``torch.distributed``
call — directly when every shape agrees, padded to the largest otherwise
(all_to_all moves exact sizes with split sizes). Errors found on one rank
(a wrong list length, an unsupported value) ride in the metadata round, so
every rank raises the same exception type and none is left waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from . import codec, debug, values
from ._common import active_group, check_list, check_serial_root, contiguous, done, finish
from ._compat import all_gather_single
from .context import device
from .groups import GroupLike, Resolved

__all__ = ["all_gather", "gather", "scatter", "all_to_all"]

_TENSOR, _VALUE = b"T", b"V"
_ALIGN = 16  # all_to_all items start on 16-byte boundaries, so any dtype can view them


def _ranks(res: Resolved, items: list) -> str:
    return ", ".join(f"rank {r}: {item}" for r, item in zip(res.ranks, items))


@dataclass
class _Layout:
    """Shapes of the tensors every rank contributes, and how to move them."""

    shapes: list[tuple[int, ...]]
    numels: list[int]
    width: int  # elements per rank in the data round (the largest numel)

    @property
    def even(self) -> bool:
        return len(set(self.shapes)) == 1

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` flattened (and zero-padded to ``width`` when shapes differ), ready to send."""
        src = contiguous(x).reshape(-1)
        if src.numel() == self.width:
            return src
        padded = src.new_zeros(self.width)
        padded[: src.numel()] = src
        return padded

    def split(self, out: torch.Tensor, concat: bool) -> Any:
        """Per-rank tensors (views) out of a received ``[size * width]`` buffer, or their concatenation."""
        if self.even:
            if concat:
                return out.view(len(self.shapes) * self.shapes[0][0], *self.shapes[0][1:])
            return list(out.view(len(self.shapes), *self.shapes[0]).unbind(0))
        w = self.width
        pieces = [out[i * w : i * w + n].view(s) for i, (n, s) in enumerate(zip(self.numels, self.shapes))]
        return torch.cat(pieces) if concat else pieces


def _exchange_layout(x: torch.Tensor, res: Resolved, name: str, concat: bool) -> _Layout:
    """All-gather every rank's dtype and shape; ``ValueError`` on every rank when they cannot combine."""
    meta = codec.encode([codec.dtype_name(x.dtype), list(x.shape)])
    rows = [codec.decode(b) for b in values.all_gather_bytes(meta, res, name)]
    dtypes, shapes = [r[0] for r in rows], [tuple(r[1]) for r in rows]
    if len(set(dtypes)) > 1:
        raise ValueError(f"{name} needs one dtype on every rank, got {_ranks(res, dtypes)}")
    if concat:
        shapes = [s if s else (1,) for s in shapes]
        if len({s[1:] for s in shapes}) > 1:
            raise ValueError(
                f"{name}(concat=True) needs the same trailing dims on every rank "
                f"(only dim 0 may differ), got {_ranks(res, shapes)}; pass concat=False for a list"
            )
    numels = [int(torch.Size(s).numel()) for s in shapes]
    return _Layout(shapes, numels, max(numels))


def _serial_gather(x: Any, concat: bool, allow_pickle: Optional[bool]) -> Any:
    if not isinstance(x, torch.Tensor):
        return [codec.decode(codec.encode(x, allow_pickle), allow_pickle=allow_pickle)]  # as a real gather
    if concat:
        return x.reshape(1) if x.dim() == 0 else x
    return [x]


def _debug_kind(x: Any) -> str:
    return debug.describe_tensor(x.dtype, x.shape) if isinstance(x, torch.Tensor) else type(x).__name__


# ---------------------------------------------------------------- all_gather


def all_gather(
    x: Any, group: GroupLike = None, *, concat: bool = True, async_op: bool = False, allow_pickle: Optional[bool] = None
) -> Any:
    """Gather ``x`` from every rank of the group onto every rank.

    Args:
        x: a tensor — shapes may differ between ranks (callers never pass
            shapes), dtypes must agree — or any value the codec takes.
        group: None (world), a ProcessGroup, or a list of global ranks.
        concat: for tensors. True: concatenate along dim 0 (a 0-dim tensor
            counts as shape ``(1,)``), so dim 0 may differ per rank but
            trailing dims must agree. False: return the list of per-rank
            tensors, any shapes.
        async_op: return a :class:`~polydist.Work` whose ``wait()`` returns
            the result (the metadata round runs before returning).
        allow_pickle: pickle values the safe codec does not support (and
            accept pickled values) for this call; None follows
            :func:`~polydist.set_allow_pickle`. Unpickling can run code.

    Returns:
        A new tensor (concat) or list of tensors, on ``x``'s device, in group
        rank order; for a value, the list of every rank's value (decoded on
        this rank, tensors on its ``device()``). Serial: ``x`` (as 1-d when
        0-dim), ``[x]``, or ``[value]``.

    Raises:
        ValueError: on every rank, when dtypes differ, or with ``concat=True``
            when trailing dims differ — naming each rank's shape or dtype.
        TypeError: on every rank, when a rank's value cannot be encoded (the
            value itself is never sent).

    Source: ``torch.distributed.all_gather`` / ``all_gather_into_tensor``;
    idist ``all_gather`` (which aborts on uneven shapes; this does not).
    """
    res = active_group(group)
    if res is None:
        return done(_serial_gather(x, concat, allow_pickle), async_op)
    is_tensor = isinstance(x, torch.Tensor)
    if debug.is_debug():
        debug.check(res, "all_gather", (is_tensor, concat), f"all_gather({_debug_kind(x)}, concat={concat})")
    if not is_tensor:
        rows = values.all_gather_bytes(values.encode(x, allow_pickle), res)
        return done(values.decode_all(rows, allow_pickle), async_op)
    layout = _exchange_layout(x, res, "all_gather", concat)
    out = torch.empty(res.size * layout.width, dtype=x.dtype, device=x.device)
    work = all_gather_single(out, layout.flat(x), group=res.pg, async_op=async_op)
    return finish(lambda: layout.split(out, concat), [work], async_op)


# ---------------------------------------------------------------- gather


def gather(
    x: Any,
    dst: int = 0,
    group: GroupLike = None,
    *,
    concat: bool = True,
    async_op: bool = False,
    allow_pickle: Optional[bool] = None,
) -> Any:
    """Gather ``x`` from every rank of the group onto global rank ``dst``.

    Args and shapes as for :func:`all_gather` (``allow_pickle`` too);
    ``dst`` is the global rank that receives.

    Returns:
        On ``dst``: what :func:`all_gather` returns there. Elsewhere: None.

    Raises:
        ValueError: ``dst`` not in the group (on the rank that passed it,
            before communication); dtypes or trailing dims that cannot be
            combined (on every rank).
        TypeError: ``dst`` not an int; a value that cannot be encoded (on
            every rank).

    Source: ``torch.distributed.gather`` (which needs equal shapes on gloo).
    """
    res = active_group(group)
    if res is None:
        check_serial_root(dst, "dst")
        return done(_serial_gather(x, concat, allow_pickle), async_op)
    res.check_root(dst, "dst")
    is_tensor = isinstance(x, torch.Tensor)
    if debug.is_debug():
        debug.check(res, "gather", (dst, is_tensor, concat), f"gather({_debug_kind(x)}, dst={dst}, concat={concat})")
    here = res.rank == dst
    if not is_tensor:
        rows = values.gather_bytes(values.encode(x, allow_pickle), dst, res)
        return done(values.decode_all(rows, allow_pickle) if here else None, async_op)
    layout = _exchange_layout(x, res, "gather", concat)
    out = torch.empty(res.size * layout.width, dtype=x.dtype, device=x.device) if here else None
    outs = list(out.chunk(res.size)) if here else None
    work = dist.gather(layout.flat(x), outs, dst=dst, group=res.pg, async_op=async_op)
    return finish(lambda: layout.split(out, concat) if here else None, [work], async_op)


# ---------------------------------------------------------------- scatter


def _scatter_plan(xs: Any, size: int, allow_pickle: Optional[bool]) -> tuple[Any, Optional[_Layout]]:
    """On src: one payload per rank (tensor metadata, or an encoded value), and the tensor layout if any."""
    try:
        items = check_list(xs, size, "scatter", "on src")
    except (TypeError, ValueError) as e:
        return values.Failure(e), None
    dtypes = {t.dtype for t in items if isinstance(t, torch.Tensor)}
    if len(dtypes) == 1 and all(isinstance(t, torch.Tensor) and t.layout == torch.strided for t in items):
        shapes = [tuple(t.shape) for t in items]
        numels = [t.numel() for t in items]
        layout = _Layout(shapes, numels, max(numels))
        name = codec.dtype_name(items[0].dtype)
        return [_TENSOR + codec.encode([name, list(s), layout.width]) for s in shapes], layout
    payloads = []
    for item in items:  # mixed or non-tensor items travel as values (tensors inside land on device())
        p = values.encode(item, allow_pickle)
        if isinstance(p, values.Failure):
            return p, None
        payloads.append(_VALUE + p)
    return payloads, None


def scatter(
    xs: Any, src: int = 0, group: GroupLike = None, *, async_op: bool = False, allow_pickle: Optional[bool] = None
) -> Any:
    """Give item ``i`` of ``src``'s list to group rank ``i``.

    Args:
        xs: on ``src``: a list or tuple with one item per rank of the group —
            tensors (shapes may differ; one dtype), or any values the codec
            takes (mixed lists travel as values). Elsewhere: ignored (pass
            None).
        src: global rank of the source.
        group: None (world), a ProcessGroup, or a list of global ranks.
        async_op: return a :class:`~polydist.Work` whose ``wait()`` returns
            the result (the metadata round runs before returning).
        allow_pickle: pickle values the safe codec does not support (and
            accept pickled values) for this call; None follows
            :func:`~polydist.set_allow_pickle`. Unpickling can run code.

    Returns:
        This rank's item: on ``src`` the item itself; elsewhere a new tensor
        on the backend's device (CPU for gloo) or the decoded value (tensors
        inside on ``device()``). Serial: ``xs[0]``.

    Raises:
        ValueError: ``src`` not in the group (on the rank that passed it); a
            list on ``src`` whose length is not the group size (on every rank).
        TypeError: ``xs`` not a list on ``src``, or an item that cannot be
            encoded (on every rank: src announces the failure instead of
            data).

    Source: ``torch.distributed.scatter`` (which needs equal shapes and a
    receive tensor of the right shape on every rank; this does not).
    """
    res = active_group(group)
    if res is None:
        check_serial_root(src, "src")
        return done(check_list(xs, 1, "scatter", "on src")[0], async_op)
    res.check_root(src, "src")
    if debug.is_debug():
        debug.check(res, "scatter", (src,), f"scatter(src={src})")
    here = res.rank == src
    payloads, layout = _scatter_plan(xs, res.size, allow_pickle) if here else (None, None)
    mine = values.scatter_bytes(payloads, src, res, "scatter")
    if mine[:1] == _VALUE:
        result = xs[res.group_rank] if here else codec.decode(mine[1:], device=device(), allow_pickle=allow_pickle)
        return done(result, async_op)
    name, shape, width = codec.decode(mine[1:])
    dev = values.comm_device(res)
    out = torch.empty(width, dtype=codec.torch_dtype(name), device=dev)
    items = [layout.flat(t) for t in xs] if here else None
    work = dist.scatter(out, items, src=src, group=res.pg, async_op=async_op)
    numel = int(torch.Size(shape).numel())
    return finish(lambda: xs[res.group_rank] if here else out[:numel].view(shape), [work], async_op)


# ---------------------------------------------------------------- all_to_all


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def all_to_all(
    xs: Any, group: GroupLike = None, *, async_op: bool = False, allow_pickle: Optional[bool] = None
) -> Any:
    """Send ``xs[i]`` to group rank ``i``; return the list of what each rank sent here.

    Args:
        xs: a list or tuple with one item per rank of the group: tensors of
            any shapes and dtypes, or any values the codec takes, mixed
            freely.
        group: None (world), a ProcessGroup, or a list of global ranks.
        async_op: return a :class:`~polydist.Work` whose ``wait()`` returns
            the result (the metadata round runs before returning).
        allow_pickle: pickle values the safe codec does not support (and
            accept pickled values) for this call; None follows
            :func:`~polydist.set_allow_pickle`. Unpickling can run code.

    Returns:
        A list in group-rank order: item ``j`` is what group rank ``j`` passed
        as its item for this rank. Tensors are new, on the backend's device
        (CPU for gloo), dtype and shape as sent; values decoded, tensors
        inside on ``device()``. Serial: ``[xs[0]]``.

    Raises:
        ValueError: a list whose length is not the group size (on every rank).
        TypeError: ``xs`` not a list, or an item that cannot be encoded (on
            every rank).

    Source: ``torch.distributed.all_to_all`` / ``all_to_all_single`` (which
    need the receive shapes up front; this does not).
    """
    res = active_group(group)
    if res is None:
        return done([check_list(xs, 1, "all_to_all", "item i goes to rank i")[0]], async_op)
    if debug.is_debug():
        debug.check(res, "all_to_all", (), "all_to_all()")
    payloads = _all_to_all_plan(xs, res.size, allow_pickle)
    received = values.all_to_all_bytes(payloads, res, "all_to_all")
    kinds = [r[:1] for r in received]
    if not any(r[1:2] == b"1" for r in received):  # nobody sends a tensor: no data round
        return done([_decode_value(r, allow_pickle) for r in received], async_op)
    dev = values.comm_device(res)
    send_sizes = [_aligned(t.numel() * t.element_size()) if isinstance(t, torch.Tensor) else 0 for t in xs]
    metas = [codec.decode(r[2:]) if k == _TENSOR else None for r, k in zip(received, kinds)]
    recv_sizes = [_aligned(m[2]) if m is not None else 0 for m in metas]
    send = torch.zeros(sum(send_sizes), dtype=torch.uint8, device=dev)
    offset = 0
    for t, size in zip(xs, send_sizes):
        if size:
            flat = contiguous(t).reshape(-1).view(torch.uint8)
            send[offset : offset + flat.numel()].copy_(flat)
        offset += size
    recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=dev)
    work = dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=res.pg, async_op=async_op)

    def result() -> list:
        out, offset = [], 0
        for r, meta, size in zip(received, metas, recv_sizes):
            if meta is None:
                out.append(_decode_value(r, allow_pickle))
            else:
                name, shape, nbytes = meta
                out.append(recv[offset : offset + nbytes].view(codec.torch_dtype(name)).view(shape))
            offset += size
        return out

    return finish(result, [work], async_op)


def _all_to_all_plan(xs: Any, size: int, allow_pickle: Optional[bool]) -> Any:
    """One payload per destination: kind, whether this rank sends any tensor, then metadata or value."""
    try:
        items = check_list(xs, size, "all_to_all", "item i goes to rank i")
    except (TypeError, ValueError) as e:
        return values.Failure(e)
    flag = b"1" if any(isinstance(t, torch.Tensor) for t in items) else b"0"
    payloads = []
    for t in items:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            meta = [codec.dtype_name(t.dtype), list(t.shape), t.numel() * t.element_size()]
            payloads.append(_TENSOR + flag + codec.encode(meta))
            continue
        p = values.encode(t, allow_pickle)
        if isinstance(p, values.Failure):
            return p
        payloads.append(_VALUE + flag + p)
    return payloads


def _decode_value(payload: bytes, allow_pickle: Optional[bool]) -> Any:
    return codec.decode(payload[2:], device=device(), allow_pickle=allow_pickle)
