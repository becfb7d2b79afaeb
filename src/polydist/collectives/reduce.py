"""Reductions: all_reduce, reduce, reduce_scatter — of tensors, lists of tensors and Python numbers.

Semantics follow ``torch.distributed`` (PyTorch docs, "Collective
functions"; the "Writing Distributed Applications" tutorial) and
``ignite.distributed`` for numbers, with the differences listed in each
docstring. Every call takes the one path of
:mod:`~polydist.collectives.pipeline`; ``dst`` is a global rank, also with a
subgroup.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from .. import codec
from .._torch import reduce_scatter_single
from ..context import world
from ..groups import GroupLike, Resolved
from ..ops import SUSPECT, OpLike, check_backend, check_op_dtype, op_for, resolve_op, to_reduce_op
from .exchange import mover
from .numbers import all_reduce_value, check_number, check_value, is_structure, reduce_value, reduce_values
from .pipeline import Collective, check_tensor, contiguous, done, finish
from .debug import describe_tensor

__all__ = ["all_reduce", "reduce", "reduce_scatter"]


def _op(name: str, res: Resolved) -> tuple[dist.ReduceOp, bool]:
    """The ReduceOp to run and whether AVG must be finished by dividing by the group size."""
    if name == "AVG" and not res.entry.native_avg:
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


def _layout(tensors: list[torch.Tensor]) -> list:
    return [(codec.dtype_name(t.dtype), list(t.shape)) for t in tensors]


def _shown(tensors: list[torch.Tensor]) -> str:
    return ", ".join(describe_tensor(t.dtype, t.shape) for t in tensors)


# ---------------------------------------------------------------- all_reduce


def all_reduce(tensor: Any, op: OpLike = "SUM", group: GroupLike = None, *, async_op: bool = False) -> Any:
    """Reduce ``tensor`` across the group; every rank gets the result.

    Args:
        tensor: a tensor (any shape, dtype and device the backend supports; same
            shape and dtype on every rank); a list or tuple of tensors,
            reduced together in one coalesced call per dtype (e.g. all the
            gradients of a model); a Python number (bool, int, float,
            complex; NumPy scalars accepted); or a structure of numbers and
            tensors — a dict (``OrderedDict``, ``Counter``, ``defaultdict``
            too), list, tuple, named tuple or dataclass, nested — reduced leaf
            by leaf in one collective (a metrics dict, a dataclass of metrics).
        op: "SUM", "PRODUCT", "MIN", "MAX", "AVG", "AND", "OR", "XOR" (any
            case; also torch's "BAND", "BOR", "BXOR", and "PROD", "MEAN",
            "AVERAGE": ``polydist.ops.SPELLINGS``) or a ``torch.distributed.ReduceOp``.
        group: None (world), a ProcessGroup, or a list of global ranks.
        async_op: return a :class:`~polydist.Work` whose ``wait()`` returns
            the result.

    Returns:
        For tensors: ``tensor`` itself, reduced **in place** (non-contiguous and
        coalesced tensors go through a contiguous buffer and are written
        back). AVG is SUM then division by the group size on backends without
        a native AVG. For a number: the reduced number, identical on every
        rank — ints exact at any size, floats as float64, AVG a float, bools
        under AND/OR/XOR stay bools. For a structure: a new structure of the
        same type and keys, each number reduced as above and each tensor a new
        tensor on ``polydist.device()`` (AVG of an integer tensor: a floating
        one), identical on every rank; nothing in place. Serial: the input
        (AVG of a number: as float).

    Dtypes by backend (:class:`polydist.ops.Reductions`, one table per
    backend): gloo reduces float16, bfloat16, float32, float64, int8, uint8,
    int32, int64 and bool, and complex64/128 under SUM/AVG
    (``torch.distributed`` reduces them as pairs of reals), not int16 or
    uint16/32/64; ``mpi4py`` float16/bfloat16 (in float32), float32/64, every
    int and uint width, bool, complex64/128 (SUM/AVG); horovod the same but
    no MIN/MAX of uint16/32/64; nccl CUDA tensors of int8, uint8, int32,
    int64, bool, the float types (float8 too), no AND/OR/XOR. Numbers: any
    backend.

    Examples:
        On 2 ranks (``import polydist as pdist``)::

            t = torch.tensor([1, 2]) + 2 * pdist.get_rank()   # rank 0: [1, 2]; rank 1: [3, 4]
            pdist.all_reduce(t)                                # every rank: tensor([4, 6]), in place
            pdist.all_reduce(pdist.get_rank() + 1)             # every rank: 3 (an exact int)
            pdist.all_reduce(pdist.get_rank() + 1, op="AVG")   # every rank: 1.5
            pdist.all_reduce({"loss": 0.5 + pdist.get_rank(), "n": 4})   # every rank: {'loss': 2.0, 'n': 8}

    Raises:
        ValueError: unknown ``op``; bad ``group``.
        TypeError: ``op`` undefined on the dtype (AND/OR/XOR on floating
            tensors or floats, AVG on integer tensors, MIN/MAX/PRODUCT on
            complex), or a dtype/op the group's backend cannot reduce (naming
            both and the backend), before anything is sent; ``tensor``
            neither tensor(s), number nor structure of them; a sparse tensor
            (naming its layout). In a structure, a leaf that is neither (naming
            its key path): on every rank, the others naming the rank.
        CollectiveMismatchError: ranks passed structures that differ (keys,
            lengths, types, tensor dtypes or shapes): on every rank, naming
            the ranks, what each passed and the key path.
        CollectiveTimeoutError: the group's other ranks did not all arrive
            within its timeout; names the ranks that did not. A
            ``RuntimeError``, raised in place of the backend's own timeout
            error; with ``async_op=True``, by the handle's ``wait()``.
        RuntimeError: the backend's own error when a peer is lost mid-call
            (gloo: "Connection closed by peer"); on MPI the job ends with
            ``MPI_Abort`` instead.

    Source: ``torch.distributed.all_reduce``; idist ``all_reduce`` for values.
    """
    if type(tensor) is torch.Tensor and tensor.layout == torch.strided:  # the common case, first
        dtype = tensor.dtype
        name = op_for(op, dtype)
        spec = _ALL_REDUCE_CHECKED if (name, dtype) in SUSPECT else _ALL_REDUCE  # a backend may refuse it
        return spec.run(group, None, async_op, tensor, name, (tensor,))
    name = resolve_op(op)
    tensors = _tensors(tensor)
    if tensors is None:
        return _ALL_REDUCE.run(group, None, async_op, _value(tensor, name), name, None)
    for t in tensors:
        codec.check_dense(t, "all_reduce")
        check_op_dtype(name, t.dtype)
    return _ALL_REDUCE_CHECKED.run(group, None, async_op, tensor, name, tensors)


def _value(x: Any, name: str) -> Any:
    """A number checked now (``TypeError`` before communication); a structure as it is, checked in-band."""
    return x if is_structure(x) else check_number(x, name)


def _reduce_alone(x: Any, name: str) -> Any:
    """What a reduction of a value over one rank gives: the value, checked (AVG: numbers as floats)."""
    if is_structure(x):
        codec.encode(x)  # refused as it would be with other ranks (a dataclass not allowed)
    return reduce_values([check_value(x, name)], name, [0])


def _all_reduce_serial(tensor: Any, name: str, tensors: Any) -> Any:
    return tensor if tensors is not None else _reduce_alone(tensor, name)


def _all_reduce_fingerprint(tensor: Any, name: str, tensors: Any) -> tuple:
    if tensors is None:
        return (name, "number"), f"all_reduce({'number' if not is_structure(tensor) else type(tensor).__name__}, op={name})"
    return (name, _layout(tensors)), f"all_reduce({_shown(tensors)}, op={name})"


def _all_reduce_body(res: Resolved, tensor: Any, name: str, tensors: Any, async_op: bool) -> Any:
    lean = (res.mover or mover(res)).all_reduce
    if lean is not None and tensors is not None and len(tensors) == 1 and not async_op:
        lean(tensors[0], name)  # the mover's own blocking call (mpi4py's, minus torch's dispatch)
        return tensor  # what the caller passed: the tensor, or its one-tensor list or tuple
    if tensors is None:
        return done(all_reduce_value(tensor, name, res), async_op)
    red, divide = _op(name, res)
    buckets = _coalesce(tensors)
    works = [dist.all_reduce(buf, red, group=res.pg, async_op=async_op) for buf, _ in buckets]

    def result() -> Any:
        for buf, members in buckets:
            if divide:
                buf.div_(res.size)
            _scatter_back(buf, members)
        return tensor

    return finish(result, works, async_op)


def _all_reduce_check(res: Resolved, tensor: Any, name: str, tensors: Any) -> None:
    if tensors is not None:
        for t in tensors:
            check_backend(res.entry.reductions, name, t.dtype)


_ALL_REDUCE = Collective("all_reduce", _all_reduce_body, _all_reduce_serial, _all_reduce_fingerprint, op_at=1)
# The same call, for (op, dtype) pairs some backend refuses (ops.SUSPECT) and for lists: the group's backend is checked.
_ALL_REDUCE_CHECKED = Collective(
    "all_reduce", _all_reduce_body, _all_reduce_serial, _all_reduce_fingerprint, op_at=1, check=_all_reduce_check
)


# ---------------------------------------------------------------- reduce


def reduce(tensor: Any, dst: int = 0, op: OpLike = "SUM", group: GroupLike = None, *, async_op: bool = False) -> Any:
    """Reduce ``tensor`` across the group onto global rank ``dst``.

    Args:
        tensor: a tensor (same shape and dtype on every rank), a Python
            number, or a structure of numbers and tensors (as for :func:`all_reduce`).
        dst: global rank that receives the result.
        op: as for :func:`all_reduce`.
        group: as for :func:`all_reduce`.
        async_op: as for :func:`all_reduce`.

    Returns:
        On ``dst``: ``tensor`` holding the result **in place** (a number: the
        reduced number; a structure: a new one, as :func:`all_reduce` gives). Elsewhere: ``tensor``, **untouched** — unlike gloo's
        native reduce, which leaves partial sums in non-root inputs; polydist
        hands gloo a copy there. Serial: ``tensor``.

    Dtypes by backend: as for :func:`all_reduce`.

    Examples:
        On 2 ranks (``import polydist as pdist``)::

            t = torch.tensor([1, 2]) + 2 * pdist.get_rank()   # rank 0: [1, 2]; rank 1: [3, 4]
            pdist.reduce(t, dst=0)              # rank 0: tensor([4, 6]), in place; rank 1: tensor([3, 4]), untouched
            pdist.reduce(pdist.get_rank() + 1, dst=0)           # rank 0: 3; rank 1: 2 (its own number back)

    Raises:
        ValueError: unknown ``op``; ``dst`` not in the group; bad ``group``.
        TypeError: ``op`` undefined on the dtype, or not reduced by the
            backend (see :func:`all_reduce`); ``dst`` not an int; a sparse
            tensor; a structure's bad leaf (as :func:`all_reduce`).
        CollectiveMismatchError: structures that differ across ranks, on
            ``dst`` (as :func:`all_reduce`).
        CollectiveTimeoutError, RuntimeError: as :func:`all_reduce`.

    Source: ``torch.distributed.reduce``.
    """
    name = resolve_op(op)
    if isinstance(tensor, torch.Tensor):
        codec.check_dense(tensor, "reduce")
        check_op_dtype(name, tensor.dtype)
        return _REDUCE.run(group, dst, async_op, tensor, dst, name, True)
    return _REDUCE.run(group, dst, async_op, _value(tensor, name), dst, name, False)


def _reduce_serial(tensor: Any, dst: int, name: str, is_tensor: bool) -> Any:
    return tensor if is_tensor else _reduce_alone(tensor, name)


def _reduce_fingerprint(tensor: Any, dst: int, name: str, is_tensor: bool) -> tuple:
    if not is_tensor:
        return (name, dst, "number"), f"reduce(number, dst={dst}, op={name})"
    agree = (name, dst, codec.dtype_name(tensor.dtype), list(tensor.shape))
    return agree, f"reduce({_shown([tensor])}, dst={dst}, op={name})"


def _reduce_body(res: Resolved, tensor: Any, dst: int, name: str, is_tensor: bool, async_op: bool) -> Any:
    if not is_tensor:
        return done(reduce_value(tensor, name, dst, res), async_op)
    here = res.rank == dst
    red, divide = _op(name, res)
    if here or res.entry.reduce_keeps_input:  # gloo writes partial results into it
        buf = contiguous(tensor)
    else:  # the backend would leave partial results in the input: hand it a copy
        buf = tensor.clone(memory_format=torch.contiguous_format) if async_op else _scratch_copy(tensor)
    work = dist.reduce(buf, dst, red, group=res.pg, async_op=async_op)

    def result() -> Any:
        if here:
            if divide:
                buf.div_(res.size)
            if buf is not tensor:
                tensor.copy_(buf)
        return tensor

    return finish(result, [work], async_op)


def _scratch_copy(tensor: torch.Tensor) -> torch.Tensor:
    return world().scratch_copy(tensor)  # the live world's reusable buffer


def _reduce_check(res: Resolved, tensor: Any, dst: int, name: str, is_tensor: bool) -> None:
    if is_tensor:
        check_backend(res.entry.reductions, name, tensor.dtype)


_REDUCE = Collective(
    "reduce", _reduce_body, _reduce_serial, _reduce_fingerprint, root="dst", op_at=2, check=_reduce_check
)


# ---------------------------------------------------------------- reduce_scatter


def reduce_scatter(tensor: torch.Tensor, op: OpLike = "SUM", group: GroupLike = None, *, async_op: bool = False) -> Any:
    """Reduce ``tensor`` across the group and give each rank one chunk of the result.

    Args:
        tensor: a tensor with at least one dimension, same shape and dtype on
            every rank. It is split along dim 0 into group-size chunks as
            ``torch.tensor_split`` does: when ``tensor.shape[0]`` does not divide,
            the first ``tensor.shape[0] % size`` chunks have one row more.
        op: as for :func:`all_reduce`.
        group: as for :func:`all_reduce`.
        async_op: as for :func:`all_reduce`.

    Returns:
        A new tensor: chunk ``i`` of the reduced ``tensor`` on group rank ``i``,
        on ``tensor``'s device. ``tensor`` is not modified. Serial: ``tensor``.

    Dtypes by backend: as for :func:`all_reduce` (tensors only).

    Examples:
        On 2 ranks (``import polydist as pdist``)::

            t = torch.arange(3.0) * (pdist.get_rank() + 1)   # rank 0: [0., 1., 2.]; rank 1: [0., 2., 4.]
            pdist.reduce_scatter(t)                          # rank 0: tensor([0., 3.]); rank 1: tensor([6.])

    Raises:
        TypeError: ``tensor`` is not a tensor; ``op`` undefined on its dtype,
            or not reduced by the backend (see :func:`all_reduce`).
        ValueError: unknown ``op``; ``tensor`` is 0-dim; bad ``group``.
        CollectiveTimeoutError, RuntimeError: as :func:`all_reduce`.

    Source: ``torch.distributed.reduce_scatter_tensor`` (which needs dim 0
    divisible by the group size; this does not).
    """
    name = resolve_op(op)
    check_tensor(tensor, "reduce_scatter")
    if tensor.dim() == 0:
        raise ValueError("reduce_scatter needs a tensor with at least one dimension to split, got a 0-dim tensor")
    check_op_dtype(name, tensor.dtype)
    return _REDUCE_SCATTER.run(group, None, async_op, tensor, name)


def _reduce_scatter_fingerprint(tensor: torch.Tensor, name: str) -> tuple:
    agree = (name, codec.dtype_name(tensor.dtype), list(tensor.shape))
    return agree, f"reduce_scatter({_shown([tensor])}, op={name})"


def _reduce_scatter_body(res: Resolved, tensor: torch.Tensor, name: str, async_op: bool) -> Any:
    n, rows, rest = res.size, tensor.shape[0], tensor.shape[1:]
    q, r = divmod(rows, n)
    sizes = [q + 1] * r + [q] * (n - r)  # torch.tensor_split's chunk sizes
    width = sizes[0]
    if rows == n * width:
        source = contiguous(tensor)
    else:  # pad every chunk to the first (largest) one
        source = tensor.new_zeros((n * width, *rest))
        offset = 0
        for i, size in enumerate(sizes):
            source[i * width : i * width + size] = tensor[offset : offset + size]
            offset += size
    out = torch.empty((width, *rest), dtype=tensor.dtype, device=tensor.device)
    red, divide = _op(name, res)
    work = reduce_scatter_single(out, source, red, group=res.pg, async_op=async_op)

    def result() -> torch.Tensor:
        if divide:
            out.div_(n)
        return out[: sizes[res.group_rank]]

    return finish(result, [work], async_op)


def _reduce_scatter_check(res: Resolved, tensor: torch.Tensor, name: str) -> None:
    check_backend(res.entry.reductions, name, tensor.dtype)


_REDUCE_SCATTER = Collective(
    "reduce_scatter", _reduce_scatter_body, lambda tensor, name: tensor, _reduce_scatter_fingerprint, op_at=1,
    check=_reduce_scatter_check,
)
