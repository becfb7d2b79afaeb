"""Data-moving collectives of any shape: all_gather and gather (scatter and all_to_all: :mod:`~polydist.collectives.scatter`).

Ranks may hold tensors of different shapes, or Python values. A tensor
travels as a piece (:mod:`~polydist.collectives.pieces`): its dtype and shape
in a fixed header beside its bytes, so callers never pass shapes and the
common case — the same shapes as in earlier calls — costs one
``torch.distributed`` call (:mod:`~polydist.collectives.exchange`; on MPI,
a header exchange and one ``Allgatherv``/``Gatherv`` at the exact sizes).
Python values travel as codec frames (:mod:`~polydist.collectives.frames`).
"""

from __future__ import annotations

import reprlib
from typing import Any, Optional, Sequence

import torch

from .. import codec
from . import frames
from .exchange import Received, all_gather_pieces, gather_pieces, joined
from .pieces import TENSOR, Header, Piece, raise_failures, tensor_of
from .pipeline import Collective, check_layout, done
from ..groups import GroupLike, Resolved
from .debug import describe_tensor

__all__ = ["all_gather", "all_gather_tensors_with_shapes", "gather"]

def _ranks(res: Resolved, items: list) -> str:
    return ", ".join(f"rank {r}: {item}" for r, item in zip(res.ranks, items))


def _combine(got: Received, res: Resolved, name: str, concat: bool, device: torch.device) -> Any:
    """The tensors the received pieces hold: concatenated along dim 0, or as a list, on ``device``.

    Raises (on every rank that received the pieces): the failure a rank
    announced; ``ValueError`` when dtypes differ, or with ``concat`` when
    trailing dims differ, naming each rank's. The checks run once per set
    of headers (:class:`~polydist.collectives.pieces.Plan` keeps the outcome).
    """
    plan = got.plan
    if plan.failed:
        raise_failures(plan.headers, got.bodies, name)
    shape = plan.memo.get(concat)
    if shape is None:
        shape = plan.memo[concat] = _result_shape(plan.headers, res, name, concat)
    if shape == "list" or shape == "tensors":
        tensors = [tensor_of(h, b, name) for h, b in zip(plan.headers, got.bodies)]
        if shape == "tensors":  # shapes beyond a header's 4 dims came in the bodies: check them now
            _check_shapes(res, name, concat, [tuple(t.shape) for t in tensors])
            if concat:
                out = torch.cat([t.reshape(1) if t.dim() == 0 else t for t in tensors])
                return out if out.device == device else out.to(device)
        return tensors if tensors[0].device == device else [t.to(device) for t in tensors]
    dtype, data = plan.headers[0].dtype, got.buffer
    if data is not None and data.dtype == dtype and data.shape == shape:  # MPI received into the result itself
        out = data
    else:  # MPI: bodies back to back in a new buffer; else copied out of the slots
        out = (data if data is not None else joined(got.bodies, copy=True)).view(dtype).view(shape)
    return out if out.device == device else out.to(device)


def _into_result(res: Resolved, name: str) -> Any:
    """For MPI's concatenating gathers: the result tensor the bodies can land in directly (None: a uint8 buffer).

    Never raises: it runs between the header and body calls, and a gather's
    senders go on to the body call whatever the root finds; pieces that
    cannot combine land in a byte buffer and :func:`_combine` raises after.
    """

    def into(plan: Any) -> Optional[torch.Tensor]:
        if plan.failed:
            return None
        shape = plan.memo.get(True)
        if shape is None:
            try:
                shape = plan.memo[True] = _result_shape(plan.headers, res, name, True)
            except ValueError:
                return None
        return torch.empty(shape, dtype=plan.headers[0].dtype) if isinstance(shape, tuple) else None

    return into


def _result_shape(headers: list[Header], res: Resolved, name: str, concat: bool) -> Any:
    """The concatenation's shape; "list" (concat=False); "tensors" (a shape has more dims than a header holds)."""
    for h in headers:
        if h.kind != TENSOR:
            raise ValueError(f"{name}: rank {h.rank} sent a value where every rank sends a tensor")
    dtypes = [codec.dtype_name(h.dtype) for h in headers]
    if len(set(dtypes)) > 1:
        raise ValueError(f"{name} needs one dtype on every rank, got {_ranks(res, dtypes)}")
    if any(h.ndim > len(h.dims) for h in headers):
        return "tensors"
    shapes = [tuple(h.dims) for h in headers]
    _check_shapes(res, name, concat, shapes)
    if not concat:
        return "list"
    shapes = [s if s else (1,) for s in shapes]
    return (sum(s[0] for s in shapes), *shapes[0][1:])


def _check_shapes(res: Resolved, name: str, concat: bool, shapes: list) -> None:
    shapes = [s if s else (1,) for s in shapes]
    if concat and len({s[1:] for s in shapes}) > 1:
        raise ValueError(
            f"{name}(concat=True) needs the same trailing dims on every rank "
            f"(only dim 0 may differ), got {_ranks(res, shapes)}; pass concat=False for a list"
        )


def _serial_gather(x: Any, concat: bool, allow_pickle: Optional[bool]) -> Any:
    if not isinstance(x, torch.Tensor):
        return [codec.decode(codec.encode(x, allow_pickle), allow_pickle=allow_pickle)]  # as a real gather
    if concat:
        return x.reshape(1) if x.dim() == 0 else x
    return [x]


def _debug_kind(x: Any) -> str:
    return describe_tensor(x.dtype, x.shape) if isinstance(x, torch.Tensor) else type(x).__name__


# ---------------------------------------------------------------- all_gather


def all_gather(
    tensor: Any, group: GroupLike = None, *, concat: bool = True, async_op: bool = False, allow_pickle: Optional[bool] = None
) -> Any:
    """Gather ``tensor`` from every rank of the group onto every rank.

    Args:
        tensor: a tensor — shapes may differ between ranks (callers never pass
            shapes), dtypes must agree — or any value the codec takes.
        group: None (world), a ProcessGroup, or a list of global ranks.
        concat: for tensors. True: concatenate along dim 0 (a 0-dim tensor
            counts as shape ``(1,)``), so dim 0 may differ per rank but
            trailing dims must agree. False: return the list of per-rank
            tensors, any shapes.
        async_op: return a :class:`~polydist.Work` whose ``wait()`` returns
            the result. The exchange completes before the call returns: a
            second round, when a size outgrew its prediction, must be issued
            at the same point on every rank.
        allow_pickle: pickle values the safe codec does not support (and
            accept pickled values) for this call; None follows
            :func:`~polydist.set_allow_pickle`. Unpickling can run code.

    Returns:
        A new tensor (concat) or list of tensors, on ``tensor``'s device, in group
        rank order; for a value, the list of every rank's value (decoded on
        this rank, tensors on its ``device()``). Serial: ``tensor`` (as 1-d when
        0-dim), ``[tensor]``, or ``[value]``.

    Dtypes by backend: any dtype on gloo and ``mpi4py`` (CPU tensors): tensors
    travel as their bytes, so also dtypes gloo cannot carry itself (int16,
    uint16/32/64, float8, complex); nccl CUDA tensors.

    Examples:
        On 2 ranks (``import polydist as pdist``)::

            t = torch.arange(pdist.get_rank() + 1)        # rank 0: [0]; rank 1: [0, 1]
            pdist.all_gather(t)                           # every rank: tensor([0, 0, 1])
            pdist.all_gather(t, concat=False)             # every rank: [tensor([0]), tensor([0, 1])]
            pdist.all_gather(f"rank{pdist.get_rank()}")   # every rank: ['rank0', 'rank1']

    Raises:
        ValueError: on every rank, when dtypes differ, or with ``concat=True``
            when trailing dims differ — naming each rank's shape or dtype.
        TypeError: a sparse tensor (naming its layout), on this rank before
            any communication; on every rank, when a rank's value cannot be encoded (the
            value itself is never sent).
        ValueError: on every rank, when a rank's value is refused otherwise
            (nested past the codec's depth limit, text UTF-8 cannot encode),
            naming that rank and the reason.

    Source: ``torch.distributed.all_gather`` / ``all_gather_into_tensor``;
    idist ``all_gather`` (which aborts on uneven shapes; this does not).
    """
    check_layout(tensor, "all_gather")
    return _ALL_GATHER.run(group, None, async_op, tensor, concat, allow_pickle)


def _all_gather_fingerprint(x: Any, concat: bool, allow_pickle: Optional[bool]) -> tuple:
    return (isinstance(x, torch.Tensor), concat), f"all_gather({_debug_kind(x)}, concat={concat})"


def _all_gather_body(res: Resolved, x: Any, concat: bool, allow_pickle: Optional[bool], async_op: bool) -> Any:
    if not isinstance(x, torch.Tensor):
        rows = frames.all_gather_bytes(frames.encode(x, allow_pickle), res)
        return done(frames.decode_all(rows, res, "all_gather", allow_pickle), async_op)
    into = _into_result(res, "all_gather") if concat else None
    got = all_gather_pieces(res, Piece.tensor(x, res.device), "all_gather", views=not concat, into=into)
    return done(_combine(got, res, "all_gather", concat, x.device), async_op)


_ALL_GATHER = Collective("all_gather", _all_gather_body, _serial_gather, _all_gather_fingerprint)


def all_gather_tensors_with_shapes(tensor: torch.Tensor, shapes: Sequence[Sequence[int]], group: GroupLike = None) -> list:
    """Every group member's ``tensor``, whose shapes all ranks know in advance: ``shapes[i]`` is group rank ``i``'s.

    Args:
        tensor: this rank's tensor, any dtype, shape ``shapes[group rank]``,
            on the backend's device or the CPU.
        shapes: one shape per group rank, in group-rank order.
        group: None (the world), a ProcessGroup or a list of global ranks.

    Returns:
        ``list[Tensor]`` in group-rank order, each of its shape (views into
        one receive buffer); ``[tensor]`` on a rank outside ``group`` (a
        no-op, warned once, as every collective) and when serial.

    Raises:
        TypeError: ``tensor`` is not a tensor, or ``shapes`` not a sequence
            of int sequences.
        ValueError: ``len(shapes)`` is not the group size, or this rank's
            entry is not ``tensor.shape`` (both before communicating); a
            rank's tensor arrived with another shape than listed.
        NotInitializedError: a launcher started several processes but no
            process group exists yet.
        CollectiveMismatchError: in debug mode, ranks passed different
            ``shapes``.

    It takes the one path of every collective
    (:mod:`~polydist.collectives.pipeline`): numbered, recorded by the flight
    recorder (as an ``all_gather``), fingerprinted in debug mode and named on
    a timeout, as one call.

    Source: ``ignite.distributed.all_gather_tensors_with_shapes``, which pads
    to the largest shape and needs the same number of dims on every rank;
    :func:`all_gather` with ``concat=False`` moves any shapes, so this checks
    the shapes it is given and does that.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"all_gather_tensors_with_shapes takes a tensor, got {type(tensor).__name__}")
    try:
        listed = tuple(tuple(int(d) for d in s) for s in shapes)
    except TypeError:
        raise TypeError(f"shapes must be a sequence of int sequences, got {reprlib.repr(shapes)}") from None
    # The input as a list of one: what a rank outside the group gets back (the pipeline echoes it), as ignite.
    return _WITH_SHAPES.run(group, None, False, [tensor], listed)


def _check_listed(size: int, me: int, x: torch.Tensor, listed: tuple) -> None:
    if len(listed) != size:
        raise ValueError(f"all_gather_tensors_with_shapes: {len(listed)} shapes for a group of {size} ranks")
    if listed[me] != tuple(x.shape):
        raise ValueError(
            f"all_gather_tensors_with_shapes: this rank's tensor has shape {list(x.shape)}, "
            f"but shapes[{me}] is {list(listed[me])}"
        )


def _with_shapes_serial(xs: list, listed: tuple) -> list:
    _check_listed(1, 0, xs[0], listed)
    return xs


def _with_shapes_fingerprint(xs: list, listed: tuple) -> tuple:
    return (listed,), f"all_gather_tensors_with_shapes({_debug_kind(xs[0])}, shapes={[list(s) for s in listed]})"


def _with_shapes_body(res: Resolved, xs: list, listed: tuple, async_op: bool) -> list:
    out = _all_gather_body(res, xs[0], False, None, False)
    wrong = [(r, list(t.shape), list(s)) for r, t, s in zip(res.ranks, out, listed) if tuple(t.shape) != s]
    if wrong:
        raise ValueError(f"all_gather_tensors_with_shapes: tensors arrived with other shapes than listed: {wrong}")
    return out


# Recorded and numbered as the all_gather it is on the wire (the trace tools and the export to PyTorch's
# Flight Recorder format know that name); debug mode's fingerprint still names the call.
_WITH_SHAPES = Collective(
    "all_gather", _with_shapes_body, _with_shapes_serial, _with_shapes_fingerprint,
    check=lambda res, xs, listed: _check_listed(res.size, res.group_rank, xs[0], listed),
)


# ---------------------------------------------------------------- gather


def gather(
    tensor: Any, dst: int = 0, group: GroupLike = None, *, concat: bool = True, async_op: bool = False,
    allow_pickle: Optional[bool] = None,
) -> Any:  # fmt: skip
    """Gather ``tensor`` from every rank of the group onto global rank ``dst``.

    Args and shapes as for :func:`all_gather` (``allow_pickle`` too);
    ``dst`` is the global rank that receives.

    Returns:
        On ``dst``: what :func:`all_gather` returns there. Elsewhere: None.

    Dtypes by backend: as for :func:`all_gather` (any dtype; nccl CUDA tensors).

    Examples:
        On 2 ranks (``import polydist as pdist``)::

            t = torch.arange(pdist.get_rank() + 1)        # rank 0: [0]; rank 1: [0, 1]
            pdist.gather(t, dst=0)                        # rank 0: tensor([0, 0, 1]); rank 1: None
            pdist.gather(10 * pdist.get_rank(), dst=1)    # rank 0: None; rank 1: [0, 10]

    Raises:
        ValueError: ``dst`` not in the group (on the rank that passed it,
            before communication); dtypes or trailing dims that cannot be
            combined (on ``dst``, the only rank that sees every piece; the
            others return None as usual).
        TypeError: a sparse tensor (naming its layout), on this rank before
            any communication; ``dst`` not an int; a value that cannot be encoded (on
            every rank); a tensor of a dtype that cannot travel (on that
            rank and on ``dst``). A value refused for its depth or its text
            is a ``ValueError`` on every rank.

    Source: ``torch.distributed.gather`` (which needs equal shapes on gloo).
    """
    check_layout(tensor, "gather")
    return _GATHER.run(group, dst, async_op, tensor, concat, allow_pickle, dst)


def _gather_fingerprint(x: Any, concat: bool, allow_pickle: Optional[bool], dst: int) -> tuple:
    return (dst, isinstance(x, torch.Tensor), concat), f"gather({_debug_kind(x)}, dst={dst}, concat={concat})"


def _gather_body(res: Resolved, x: Any, concat: bool, allow_pickle: Optional[bool], dst: int, async_op: bool) -> Any:
    here = res.rank == dst
    if not isinstance(x, torch.Tensor):
        rows = frames.gather_bytes(frames.encode(x, allow_pickle), dst, res)
        return done(frames.decode_all(rows, res, "gather", allow_pickle) if here else None, async_op)
    got = gather_pieces(res, Piece.tensor(x, res.device), dst, "gather", into=_into_result(res, "gather") if concat else None)
    return done(_combine(got, res, "gather", concat, x.device) if here else None, async_op)


_GATHER = Collective(
    "gather", _gather_body, lambda x, concat, allow_pickle, dst: _serial_gather(x, concat, allow_pickle),
    _gather_fingerprint, root="dst",
)
