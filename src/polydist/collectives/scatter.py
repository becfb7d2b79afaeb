"""scatter and all_to_all of any shapes, dtypes and Python values.

Item ``i`` of a list goes to group rank ``i``. Each item travels as a
piece (:mod:`~polydist.collectives.pieces`): its dtype and shape, or its
encoding as a value, in a header beside its bytes, moved by
:mod:`~polydist.collectives.exchange` — one call when the sizes repeat.
Errors found on the sending rank (a wrong list length, a value the codec
cannot take) travel as failure pieces instead of the items, so every rank
that receives from it raises and none is left waiting. Every call takes
the one path of :mod:`~polydist.collectives.pipeline`.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..context import device
from ..groups import GroupLike, Resolved
from . import frames
from .exchange import all_to_all_pieces, scatter_pieces
from .pieces import VALUE, Piece, item_of, raise_failures
from .pipeline import Collective, check_list, done

__all__ = ["scatter", "all_to_all"]


def _pieces(xs: Any, size: int, allow_pickle: Optional[bool], dev: torch.device, name: str, what: str) -> list[Piece]:
    """One piece per rank of the group: tensors as tensors (any dtype each), anything else as a value.

    A bad list, or an item the codec cannot take, becomes a failure piece
    for every rank instead: nothing of the list is sent, and every receiver
    raises the same exception type.
    """
    try:
        items = check_list(xs, size, name, what)
    except (TypeError, ValueError) as e:
        return [Piece.failure(e)] * size
    pieces = []
    for item in items:
        if isinstance(item, torch.Tensor) and item.layout == torch.strided:
            pieces.append(Piece.tensor(item, dev))
            continue
        payload = frames.encode(item, allow_pickle)
        if isinstance(payload, frames.Failure):
            return [Piece.failure(payload.error)] * size
        pieces.append(Piece.value(payload))
    return pieces


# ---------------------------------------------------------------- scatter


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
            tensors of any shapes and dtypes, or any values the codec takes,
            mixed freely (a tensor item arrives as a tensor). Elsewhere:
            ignored (pass None).
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
    pieces = _pieces(xs, res.size, allow_pickle, res.device, "scatter", "on src") if here else None
    header, body = scatter_pieces(res, pieces, src, "scatter")
    if here:
        raise_failures([], [], "scatter", pieces[res.group_rank])
        return done(xs[res.group_rank], async_op)
    return done(item_of(header, body, "scatter", device(), allow_pickle), async_op)


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
            every rank); ``ValueError`` for an item refused for its depth or
            text.

    Source: ``torch.distributed.all_to_all`` / ``all_to_all_single`` (which
    need the receive shapes up front; this does not).
    """
    return _ALL_TO_ALL.run(group, None, async_op, tensors, allow_pickle)


def _all_to_all_body(res: Resolved, xs: Any, allow_pickle: Optional[bool], async_op: bool) -> Any:
    pieces = _pieces(xs, res.size, allow_pickle, res.device, "all_to_all", "item i goes to rank i")
    got = all_to_all_pieces(res, pieces, "all_to_all")
    headers, bodies = got.plan.headers, got.bodies
    raise_failures(headers, bodies, "all_to_all", pieces[0])
    values_to = device() if any(h.kind == VALUE for h in headers) else None  # where tensors inside values land
    return done([item_of(h, b, "all_to_all", values_to, allow_pickle) for h, b in zip(headers, bodies)], async_op)


_ALL_TO_ALL = Collective(
    "all_to_all",
    _all_to_all_body,
    lambda xs, allow_pickle: [check_list(xs, 1, "all_to_all", "item i goes to rank i")[0]],
    lambda xs, allow_pickle: ((), "all_to_all()"),
)
