"""A tensor's dtype and shape alone, ahead of its elements: the header of broadcast's safe mode and of a debug-mode send.

It is :mod:`~polydist.collectives.pieces`' header, the one tensor header
polydist sends: the 64-byte header of the tensor's piece, followed, for a
tensor of more than four dims, by the rest of its dims as a piece's body
starts with them — byte for byte the first bytes of the piece
:meth:`Piece.tensor <polydist.collectives.pieces.Piece.tensor>` would make.
Only the elements then travel apart, in a ``torch.distributed`` call of
their own into a tensor of that dtype and shape (so a broadcast of a known
tensor needs no header at all). The header itself rides as the payload of a
value frame (:mod:`~polydist.collectives.frames`).

A header comes from another rank: :func:`decode` checks it (pieces'
:func:`~polydist.collectives.pieces.read` and
:func:`~polydist.collectives.pieces.shape_of`) before anything is sized by it.
"""

from __future__ import annotations

import torch

from .pieces import HEADER, TENSOR, Piece, read, shape_of

__all__ = ["encode", "decode"]


def encode(x: torch.Tensor) -> bytes:
    """``x``'s header. Raises ``TypeError`` naming the dtype for one with no wire code (a quantized tensor)."""
    piece = Piece.described(x)
    if piece.error is not None:
        raise piece.error
    return piece.header() + piece.body


def decode(data: bytes, rank: int, what: str) -> tuple[torch.dtype, list[int]]:
    """The ``(dtype, shape)`` global rank ``rank``'s header declares, checked before anything is sized by it.

    Raises:
        ValueError: naming ``rank``: not a tensor header (too short, a wrong
            magic, another kind), an unknown dtype, more dims than
            ``codec.MAX_DIMS``, negative dims, or a size that is not the
            shape's or beyond this machine's memory.
    """
    if len(data) < HEADER:
        raise ValueError(f"{what}: rank {rank} sent a malformed header: {len(data)} bytes, not a tensor header")
    h = read(data[:HEADER], rank, what)
    if h.kind != TENSOR:
        raise ValueError(f"{what}: rank {rank} sent a malformed header: kind {h.kind}, not a tensor")
    return h.dtype, shape_of(h, data[HEADER:], h.length, what)
