"""How :mod:`~polydist.collectives.pieces` move: all_gather, gather, scatter and all_to_all of pieces.

Each function takes this rank's piece(s) and returns what arrived as a
:class:`~polydist.collectives.mover.Received`: the checked headers (a cached
:class:`~polydist.collectives.pieces.Plan`) and the bodies, flat uint8
tensors of exactly each header's length. The group's mover does the moving,
chosen once per resolved group (the same on every rank) by its backend's
registry entry (:attr:`Backend.mover <polydist.backends.declaration.Backend.mover>`,
read into :attr:`Resolved.direct <polydist.groups.Resolved>`): the
:class:`~polydist.collectives.mover.DirectMover` for polydist's Python
groups (mpi4py, horovod, the ``mpi`` stand-in), the
:class:`~polydist.collectives.slots.SlotMover` for every other backend.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..groups import Resolved
from .mover import DirectMover, Into, Mover, Received, joined
from .pieces import Header, Piece
from .slots import SLOTS

__all__ = ["Received", "mover", "all_gather_pieces", "gather_pieces", "scatter_pieces", "all_to_all_pieces", "joined"]


def mover(res: Resolved) -> Mover:
    """The group's mover, chosen on first use (by ``res.direct``, which its registry entry decided), kept on ``res``."""
    m = res.mover
    if m is None:
        m = res.mover = DirectMover(res.direct) if res.direct is not None else SLOTS
    return m


def all_gather_pieces(res: Resolved, piece: Piece, what: str, views: bool = True, into: Optional[Into] = None) -> Received:
    """Every member's piece, in group-rank order (:meth:`Mover.all_gather <polydist.collectives.mover.Mover.all_gather>`)."""
    return (res.mover or mover(res)).all_gather(res, piece, what, views, into)


def gather_pieces(res: Resolved, piece: Piece, dst: int, what: str, into: Optional[Into] = None) -> Optional[Received]:
    """Every member's piece on global rank ``dst`` (group-rank order); None elsewhere."""
    return (res.mover or mover(res)).gather(res, piece, dst, what, into)


def scatter_pieces(res: Resolved, pieces: Optional[list[Piece]], src: int, what: str) -> tuple[Header, torch.Tensor]:
    """Piece ``i`` of ``src``'s list, on group rank ``i`` (``pieces`` is read on ``src`` only)."""
    return (res.mover or mover(res)).scatter(res, pieces, src, what)


def all_to_all_pieces(res: Resolved, pieces: list[Piece], what: str) -> Received:
    """``pieces[i]`` of every rank lands on group rank ``i``; returns what this rank received, in group-rank order."""
    return (res.mover or mover(res)).all_to_all(res, pieces, what)
