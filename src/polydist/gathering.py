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
from .timeouts import guarded

__all__ = ["all_gather", "gather", "scatter", "all_to_all"]

_TENSOR, _VALUE = b"T", b"V"


def _ranks(res: Resolved, items: list) -> str:
    return ", ".join(f"rank {r}: {item}" for r, item in zip(res.ranks, items))


def _tensor_meta(x: torch.Tensor, extra: list, limit: int, inline: bool = True) -> tuple[bytes, bool]:
    """``[dtype, shape, *extra, raw]`` encoded, and whether ``raw`` holds the elements.

    The elements ride along when the whole fits in ``limit`` bytes (a slot's
    inline part), so small tensors need no data round; otherwise ``raw`` is None.
    """
    head = [codec.dtype_name(x.dtype), list(x.shape), *extra]
    if inline and x.numel() * x.element_size() <= limit:
        meta = codec.encode([*head, codec.tensor_bytes(x)])
        if len(meta) <= limit:
            return meta, True
    return codec.encode([*head, None]), False


def as_bytes(x: torch.Tensor) -> torch.Tensor:
    """The elements of ``x`` as a flat uint8 tensor (a view when ``x`` is contiguous).

    Data-moving collectives send bytes, so every dtype travels — also those a
    backend cannot reduce or even carry itself (gloo has no int16, uint16,
    uint32 or float8 transport).
    """
    return contiguous(x).reshape(-1).view(torch.uint8)


@dataclass
class _Layout:
    """Dtype and shapes of the tensors every rank contributes, and how to move them as bytes."""

    dtype: str
    shapes: list[tuple[int, ...]]
    raws: list[Optional[bytes]]  # each rank's elements when they rode in the metadata slot

    def __post_init__(self) -> None:
        self.torch_dtype = codec.torch_dtype(self.dtype)
        self.numels = [int(torch.Size(s).numel()) for s in self.shapes]
        self.itemsize = torch.empty(0, dtype=self.torch_dtype).element_size()
        self.nbytes = [n * self.itemsize for n in self.numels]
        self.width = max(self.nbytes)  # bytes per rank in a padded data round

    @property
    def even(self) -> bool:
        return len(set(self.shapes)) == 1

    @property
    def inline(self) -> bool:
        """Every rank's data already arrived with the metadata."""
        return all(r is not None for r in self.raws)

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as bytes (padded to ``width`` when shapes differ), ready to send; padding is never read."""
        src = as_bytes(x)
        if src.numel() == self.width:
            return src
        padded = src.new_empty(self.width)
        padded[: src.numel()] = src
        return padded

    def combine(self, pieces: list[torch.Tensor], concat: bool) -> Any:
        return torch.cat(pieces) if concat else pieces

    def from_inline(self, device: torch.device, concat: bool) -> Any:
        pieces = [codec.tensor_from_bytes(self.dtype, s, r, device) for s, r in zip(self.shapes, self.raws)]
        return self.combine(pieces, concat)

    def split(self, out: torch.Tensor, concat: bool) -> Any:
        """Per-rank tensors (views) out of a received ``[size * width]`` byte buffer, or their concatenation."""
        elems = out.view(self.torch_dtype)
        if self.even:
            if concat:
                return elems.view(len(self.shapes) * self.shapes[0][0], *self.shapes[0][1:])
            return list(elems.view(len(self.shapes), *self.shapes[0]).unbind(0))
        w = self.width // self.itemsize
        pieces = [elems[i * w : i * w + n].view(s) for i, (n, s) in enumerate(zip(self.numels, self.shapes))]
        return self.combine(pieces, concat)

    def packed(self, out: torch.Tensor, concat: bool) -> Any:
        """Per-rank tensors (views) out of a byte buffer holding them back to back, or all of it reshaped."""
        elems = out.view(self.torch_dtype)
        if concat:
            return elems.view(sum(s[0] for s in self.shapes), *self.shapes[0][1:])
        return [elems[o : o + n].view(s) for o, n, s in zip(_offsets(self.numels), self.numels, self.shapes)]


def _offsets(sizes: list[int]) -> list[int]:
    out, total = [], 0
    for n in sizes:
        out.append(total)
        total += n
    return out


def _exchange_layout(x: torch.Tensor, res: Resolved, name: str, concat: bool) -> _Layout:
    """All-gather every rank's dtype and shape; ``ValueError`` on every rank when they cannot combine."""
    limit = values.inline_size(values.slot_size(res.size))
    rows = [codec.decode(b) for b in values.all_gather_bytes(_tensor_meta(x, [], limit)[0], res, name)]
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
    return _Layout(dtypes[0], shapes, [r[2] for r in rows])


def _serial_gather(x: Any, concat: bool, allow_pickle: Optional[bool]) -> Any:
    if not isinstance(x, torch.Tensor):
        return [codec.decode(codec.encode(x, allow_pickle), allow_pickle=allow_pickle)]  # as a real gather
    if concat:
        return x.reshape(1) if x.dim() == 0 else x
    return [x]


def _debug_kind(x: Any) -> str:
    return debug.describe_tensor(x.dtype, x.shape) if isinstance(x, torch.Tensor) else type(x).__name__


# ---------------------------------------------------------------- all_gather


@guarded("all_gather")
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
    if layout.inline:
        return done(layout.from_inline(x.device, concat), async_op)
    if layout.even:
        out = torch.empty(res.size * layout.width, dtype=torch.uint8, device=x.device)
        work = all_gather_single(out, layout.flat(x), group=res.pg, async_op=async_op)
        return finish(lambda: layout.split(out, concat), [work], async_op)
    # Uneven: each rank broadcasts its piece straight into its place in the result — no padding, no
    # concatenation afterwards (torch's uneven all_gather on NCCL works the same way).
    out = torch.empty(sum(layout.nbytes), dtype=torch.uint8, device=x.device)
    offsets = _offsets(layout.nbytes)
    me = res.group_rank
    out[offsets[me] : offsets[me] + layout.nbytes[me]].copy_(as_bytes(x))
    works = [
        dist.broadcast(out[o : o + n], src, group=res.pg, async_op=True)
        for src, o, n in zip(res.ranks, offsets, layout.nbytes)
        if n
    ]
    return finish(lambda: layout.packed(out, concat), works, async_op)


# ---------------------------------------------------------------- gather


@guarded("gather", rooted=True)
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
    if layout.inline:
        return done(layout.from_inline(x.device, concat) if here else None, async_op)
    out = torch.empty(res.size * layout.width, dtype=torch.uint8, device=x.device) if here else None
    outs = list(out.chunk(res.size)) if here else None
    work = dist.gather(layout.flat(x), outs, dst=dst, group=res.pg, async_op=async_op)
    return finish(lambda: layout.split(out, concat) if here else None, [work], async_op)


# ---------------------------------------------------------------- scatter


def _scatter_plan(xs: Any, size: int, allow_pickle: Optional[bool]) -> tuple[Any, Optional[_Layout]]:
    """On src: one payload per rank (tensor metadata, or an encoded value), and the tensor layout if any.

    Tensor items of one dtype travel as tensors (their elements inside the
    metadata when every item fits in a slot); anything else travels as values.
    """
    try:
        items = check_list(xs, size, "scatter", "on src")
    except (TypeError, ValueError) as e:
        return values.Failure(e), None
    dtypes = {t.dtype for t in items if isinstance(t, torch.Tensor)}
    if len(dtypes) == 1 and all(isinstance(t, torch.Tensor) and t.layout == torch.strided for t in items):
        layout = _Layout(codec.dtype_name(items[0].dtype), [tuple(t.shape) for t in items], [None] * size)
        limit = values.inline_size(values.slot_size(size))
        metas = [_tensor_meta(t, [layout.width], limit) for t in items]
        if not all(inlined for _, inlined in metas):
            metas = [_tensor_meta(t, [layout.width], limit, inline=False) for t in items]
        return [_TENSOR + meta for meta, _ in metas], layout
    payloads = []
    for item in items:  # mixed or non-tensor items travel as values (tensors inside land on device())
        p = values.encode(item, allow_pickle)
        if isinstance(p, values.Failure):
            return p, None
        payloads.append(_VALUE + p)
    return payloads, None


@guarded("scatter", rooted=True)
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
    name, shape, width, raw = codec.decode(mine[1:])
    dev = values.comm_device(res)
    if raw is not None:  # src put every item inside the metadata: no data round for anyone
        return done(xs[res.group_rank] if here else codec.tensor_from_bytes(name, shape, raw, dev), async_op)
    out = torch.empty(width, dtype=torch.uint8, device=dev)
    items = [layout.flat(t) for t in xs] if here else None
    work = dist.scatter(out, items, src=src, group=res.pg, async_op=async_op)
    dtype = codec.torch_dtype(name)
    nbytes = int(torch.Size(shape).numel()) * torch.empty(0, dtype=dtype).element_size()
    return finish(lambda: xs[res.group_rank] if here else out[:nbytes].view(dtype).view(shape), [work], async_op)


# ---------------------------------------------------------------- all_to_all


@guarded("all_to_all")
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
    payloads, send_sizes = _all_to_all_plan(xs, res.size, allow_pickle)
    received = values.all_to_all_bytes(payloads, res, "all_to_all")
    dev = values.comm_device(res)
    metas = [codec.decode(r[2:]) if r[:1] == _TENSOR else None for r in received]
    if not any(r[1:2] == b"1" for r in received):  # every tensor rode in its slot: no data round
        return done([_received(r, m, dev, None, 0, allow_pickle) for r, m in zip(received, metas)], async_op)
    recv_sizes = [m[2] if m is not None and m[3] is None else 0 for m in metas]
    send = _send_buffer(xs, send_sizes, dev)
    recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=dev)
    work = dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=res.pg, async_op=async_op)

    def result() -> list:
        offsets = _offsets(recv_sizes)
        return [_received(r, m, dev, recv, o, allow_pickle) for r, m, o in zip(received, metas, offsets)]

    return finish(result, [work], async_op)


def _all_to_all_plan(xs: Any, size: int, allow_pickle: Optional[bool]) -> tuple[Any, list[int]]:
    """One payload per destination, and the bytes each tensor needs in the data round (0: none).

    A payload is its kind (tensor or value), whether this rank needs the data
    round at all, then ``[dtype, shape, nbytes, raw]`` for a tensor (``raw``
    holds small tensors' elements) or the encoded value.
    """
    try:
        items = check_list(xs, size, "all_to_all", "item i goes to rank i")
    except (TypeError, ValueError) as e:
        return values.Failure(e), []
    limit = values.inline_size(values.slot_size(size))
    metas, sizes = [], []
    for t in items:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            nbytes = t.numel() * t.element_size()
            meta, inlined = _tensor_meta(t, [nbytes], limit)
            metas.append(_TENSOR + meta)
            sizes.append(0 if inlined else nbytes)
            continue
        p = values.encode(t, allow_pickle)
        if isinstance(p, values.Failure):
            return p, []
        metas.append(_VALUE + p)
        sizes.append(0)
    flag = b"1" if any(sizes) else b"0"
    return [m[:1] + flag + m[1:] for m in metas], sizes


def _send_buffer(xs: list, sizes: list[int], dev: torch.device) -> torch.Tensor:
    """The bytes of the tensors that go in the data round, back to back.

    When they already lie back to back in one contiguous block of memory (the
    pieces of ``x.chunk()``, ``x.split()``, ``x.unbind()``), that block is sent
    as it is, without a copy.
    """
    sent = [t for t, size in zip(xs, sizes) if size]
    if sent and all(t.is_contiguous() and t.device == dev for t in sent):
        base, ptr = sent[0], sent[0].data_ptr()
        for t in sent:
            if t.data_ptr() != ptr or t.untyped_storage().data_ptr() != base.untyped_storage().data_ptr():
                break
            ptr += t.numel() * t.element_size()
        else:
            start = base.data_ptr() - base.untyped_storage().data_ptr()
            return torch.empty(0, dtype=torch.uint8, device=dev).set_(base.untyped_storage(), start, (sum(sizes),))
    send = torch.empty(sum(sizes), dtype=torch.uint8, device=dev)
    for t, offset, size in zip(xs, _offsets(sizes), sizes):
        if size:
            send[offset : offset + size].copy_(as_bytes(t))
    return send


def _received(payload: bytes, meta: Optional[list], dev: torch.device, buf, offset: int, allow_pickle) -> Any:
    """One received item: a value, a tensor that rode in its slot, or a view into the data round's buffer."""
    if meta is None:
        return codec.decode(payload[2:], device=device(), allow_pickle=allow_pickle)
    name, shape, nbytes, raw = meta
    if raw is not None:
        return codec.tensor_from_bytes(name, shape, raw, dev)
    dtype = codec.torch_dtype(name)
    piece = buf[offset : offset + nbytes]
    if offset % torch.empty(0, dtype=dtype).element_size():  # after an item of a smaller dtype: realign
        piece = piece.clone()
    return piece.view(dtype).view(shape)
