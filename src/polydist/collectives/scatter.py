"""scatter and all_to_all of any shapes, dtypes and Python values.

Item ``i`` of a list goes to group rank ``i``. What each rank receives — a
tensor's dtype and shape, or a value — travels first in one small metadata
round (the slots of :mod:`~polydist.collectives.frames`), with small tensors'
elements inside it; larger tensors then move as bytes in one
``torch.distributed`` call. Errors found on the sending rank (a wrong list
length, a value the codec cannot take) ride in the metadata round, so every
rank raises and none is left waiting. Every call takes the one path of
:mod:`~polydist.collectives.pipeline`.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from .. import codec
from ..context import device
from ..groups import GroupLike, Resolved
from . import frames
from .layout import TENSOR, VALUE, Layout, as_bytes, offsets_of, read_meta, tensor_meta
from .pipeline import Collective, check_list, done, finish

__all__ = ["scatter", "all_to_all"]


# ---------------------------------------------------------------- scatter


def _scatter_plan(xs: Any, size: int, allow_pickle: Optional[bool]) -> tuple[Any, Optional[Layout]]:
    """On src: one payload per rank (tensor metadata, or an encoded value), and the tensor layout if any.

    Tensor items of one dtype travel as tensors (their elements inside the
    metadata when every item fits in a slot); anything else travels as frames.
    """
    try:
        items = check_list(xs, size, "scatter", "on src")
    except (TypeError, ValueError) as e:
        return frames.Failure(e), None
    dtypes = {t.dtype for t in items if isinstance(t, torch.Tensor)}
    if len(dtypes) == 1 and all(isinstance(t, torch.Tensor) and t.layout == torch.strided for t in items):
        layout = Layout(codec.dtype_name(items[0].dtype), [tuple(t.shape) for t in items], [None] * size)
        limit = frames.inline_size(frames.slot_size(size))
        metas = [tensor_meta(t, [layout.width], limit) for t in items]
        if not all(inlined for _, inlined in metas):
            metas = [tensor_meta(t, [layout.width], limit, inline=False) for t in items]
        return [TENSOR + meta for meta, _ in metas], layout
    payloads = []
    for item in items:  # mixed or non-tensor items travel as values (tensors inside land on device())
        p = frames.encode(item, allow_pickle)
        if isinstance(p, frames.Failure):
            return p, None
        payloads.append(VALUE + p)
    return payloads, None


def scatter(
    tensors: Any,
    src: int = 0,
    group: GroupLike = None,
    *,
    async_op: bool = False,
    allow_pickle: Optional[bool] = None,
) -> Any:
    """Give item ``i`` of ``src``'s list to group rank ``i``.

    Args:
        tensors: on ``src``: a list or tuple with one item per rank of the group —
            tensors (shapes may differ; one dtype), or any values the codec
            takes (mixed lists travel as values). Elsewhere: ignored (pass
            None).
        src: global rank of the source.
        group: as for :func:`~polydist.all_gather`.
        async_op: as for :func:`~polydist.all_gather`.
        allow_pickle: as for :func:`~polydist.all_gather`.

    Returns:
        This rank's item: on ``src`` the item itself; elsewhere a new tensor
        on the backend's device (CPU for gloo) or the decoded value (tensors
        inside on ``device()``). Serial: ``tensors[0]``.

    Dtypes by backend: any dtype on gloo and ``mpi4py`` (CPU tensors): tensors
    travel as their bytes, so also dtypes gloo cannot carry itself (int16,
    uint16/32/64, float8, complex); nccl CUDA tensors.

    Examples:
        On 2 ranks (``import polydist as pdist``)::

            xs = [torch.zeros(2), torch.ones(3)] if pdist.get_rank() == 0 else None
            pdist.scatter(xs, src=0)        # rank 0: tensor([0., 0.]); rank 1: tensor([1., 1., 1.])
            pdist.scatter(["a", {"b": 1}] if pdist.get_rank() == 0 else None, src=0)   # rank 0: 'a'; rank 1: {'b': 1}

    Raises:
        ValueError: ``src`` not in the group (on the rank that passed it); a
            list on ``src`` whose length is not the group size (on every rank).
        TypeError: ``tensors`` not a list on ``src``, or an item that cannot be
            encoded (on every rank: src announces the failure instead of
            data).

    Source: ``torch.distributed.scatter`` (which needs equal shapes and a
    receive tensor of the right shape on every rank; this does not).
    """
    return _SCATTER.run(group, src, async_op, tensors, src, allow_pickle)


def _scatter_body(res: Resolved, xs: Any, src: int, allow_pickle: Optional[bool], async_op: bool) -> Any:
    here = res.rank == src
    payloads, layout = _scatter_plan(xs, res.size, allow_pickle) if here else (None, None)
    mine = frames.scatter_bytes(payloads, src, res, "scatter")
    if mine[:1] == VALUE:
        result = xs[res.group_rank] if here else frames.decode_from(mine[1:], src, "scatter", device(), allow_pickle)
        return done(result, async_op)
    name, shape, width, raw = read_meta(mine[1:], src, "scatter", sizes=1)
    dev = res.device
    if raw is not None:  # src put every item inside the metadata: no data round for anyone
        return done(xs[res.group_rank] if here else codec.tensor_from_bytes(name, shape, raw, dev), async_op)
    out = torch.empty(width, dtype=torch.uint8, device=dev)
    items = [layout.flat(t).to(dev) for t in xs] if here else None  # gloo scatters from the CPU only
    work = dist.scatter(out, items, src=src, group=res.pg, async_op=async_op)
    dtype = codec.torch_dtype(name)
    nbytes = int(torch.Size(shape).numel()) * torch.empty(0, dtype=dtype).element_size()
    return finish(lambda: xs[res.group_rank] if here else out[:nbytes].view(dtype).view(shape), [work], async_op)


_SCATTER = Collective(
    "scatter",
    _scatter_body,
    lambda xs, src, allow_pickle: check_list(xs, 1, "scatter", "on src")[0],
    lambda xs, src, allow_pickle: ((src,), f"scatter(src={src})"),
    root="src",
)


# ---------------------------------------------------------------- all_to_all


def all_to_all(
    tensors: Any, group: GroupLike = None, *, async_op: bool = False, allow_pickle: Optional[bool] = None
) -> Any:
    """Send ``tensors[i]`` to group rank ``i``; return the list of what each rank sent here.

    Args:
        tensors: a list or tuple with one item per rank of the group: tensors of
            any shapes and dtypes, or any values the codec takes, mixed
            freely.
        group: as for :func:`~polydist.all_gather`.
        async_op: as for :func:`~polydist.all_gather`.
        allow_pickle: as for :func:`~polydist.all_gather`.

    Returns:
        A list in group-rank order: item ``j`` is what group rank ``j`` passed
        as its item for this rank. Tensors are new, on the backend's device
        (CPU for gloo), dtype and shape as sent; values decoded, tensors
        inside on ``device()``. Serial: ``[tensors[0]]``.

    Dtypes by backend: as for :func:`scatter` (any dtype; nccl CUDA tensors).

    Examples:
        On 2 ranks (``import polydist as pdist``)::

            r = pdist.get_rank()
            xs = [torch.tensor([10 * r]), torch.tensor([10 * r + 1])]  # rank 0: [[0], [1]]; rank 1: [[10], [11]]
            pdist.all_to_all(xs)         # rank 0: [tensor([0]), tensor([10])]; rank 1: [tensor([1]), tensor([11])]
            pdist.all_to_all([f"{r}->0", f"{r}->1"])   # rank 0: ['0->0', '1->0']; rank 1: ['0->1', '1->1']

    Raises:
        ValueError: a list whose length is not the group size (on every rank).
        TypeError: ``tensors`` not a list, or an item that cannot be encoded (on
            every rank).

    Source: ``torch.distributed.all_to_all`` / ``all_to_all_single`` (which
    need the receive shapes up front; this does not).
    """
    return _ALL_TO_ALL.run(group, None, async_op, tensors, allow_pickle)


def _all_to_all_body(res: Resolved, xs: Any, allow_pickle: Optional[bool], async_op: bool) -> Any:
    payloads, send_sizes = _all_to_all_plan(xs, res.size, allow_pickle)
    received = frames.all_to_all_bytes(payloads, res, "all_to_all")
    dev = res.device
    metas = [read_meta(b[2:], r, "all_to_all", sizes=1) if b[:1] == TENSOR else None for b, r in zip(received, res.ranks)]
    if not any(r[1:2] == b"1" for r in received):  # every tensor rode in its slot: no data round
        return done([_received(b, m, r, dev, None, 0, allow_pickle) for b, m, r in zip(received, metas, res.ranks)], async_op)
    recv_sizes = [m[2] if m is not None and m[3] is None else 0 for m in metas]
    send = _send_buffer(xs, send_sizes, dev)
    recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=dev)
    work = dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=res.pg, async_op=async_op)

    def result() -> list:
        offsets = offsets_of(recv_sizes)
        return [_received(b, m, r, dev, recv, o, allow_pickle) for b, m, r, o in zip(received, metas, res.ranks, offsets)]

    return finish(result, [work], async_op)


_ALL_TO_ALL = Collective(
    "all_to_all",
    _all_to_all_body,
    lambda xs, allow_pickle: [check_list(xs, 1, "all_to_all", "item i goes to rank i")[0]],
    lambda xs, allow_pickle: ((), "all_to_all()"),
)


def _all_to_all_plan(xs: Any, size: int, allow_pickle: Optional[bool]) -> tuple[Any, list[int]]:
    """One payload per destination, and the bytes each tensor needs in the data round (0: none).

    A payload is its kind (tensor or value), whether this rank needs the data
    round at all, then ``[dtype, shape, nbytes, raw]`` for a tensor (``raw``
    holds small tensors' elements) or the encoded value.
    """
    try:
        items = check_list(xs, size, "all_to_all", "item i goes to rank i")
    except (TypeError, ValueError) as e:
        return frames.Failure(e), []
    limit = frames.inline_size(frames.slot_size(size))
    metas, sizes = [], []
    for t in items:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            nbytes = t.numel() * t.element_size()
            meta, inlined = tensor_meta(t, [nbytes], limit)
            metas.append(TENSOR + meta)
            sizes.append(0 if inlined else nbytes)
            continue
        p = frames.encode(t, allow_pickle)
        if isinstance(p, frames.Failure):
            return p, []
        metas.append(VALUE + p)
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
    for t, offset, size in zip(xs, offsets_of(sizes), sizes):
        if size:
            send[offset : offset + size].copy_(as_bytes(t))
    return send


def _received(payload: bytes, meta: Optional[list], rank: int, dev: torch.device, buf, offset: int, allow_pickle) -> Any:
    """One received item (from global rank ``rank``): a value, a tensor that rode in its slot, or a view into the data round's buffer."""
    if meta is None:
        return frames.decode_from(payload[2:], rank, "all_to_all", device(), allow_pickle)
    name, shape, nbytes, raw = meta
    if raw is not None:
        return codec.tensor_from_bytes(name, shape, raw, dev)
    dtype = codec.torch_dtype(name)
    piece = buf[offset : offset + nbytes]
    if offset % torch.empty(0, dtype=dtype).element_size():  # after an item of a smaller dtype: realign
        piece = piece.clone()
    return piece.view(dtype).view(shape)
