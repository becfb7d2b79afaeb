"""A tensor's dtype and shape as codec bytes: the header of broadcast's safe mode and of point-to-point tensors.

(The any-shape gathers, scatters and all-to-all carry theirs in the
fixed binary headers of :mod:`~polydist.collectives.pieces`.)
"""

from __future__ import annotations

import math
import reprlib

import torch

from .. import codec
from .frames import check_declared, decode_from

__all__ = ["tensor_meta", "read_meta"]


def tensor_meta(x: torch.Tensor) -> bytes:
    """``[dtype, shape]`` of ``x``, encoded."""
    return codec.encode([codec.dtype_name(x.dtype), list(x.shape)])


def read_meta(data: bytes, rank: int, what: str) -> list:
    """``[dtype, shape]`` from global rank ``rank``'s header, checked before anything is sized by it.

    The dtype must be a torch dtype, the shape at most ``codec.MAX_DIMS``
    non-negative ints whose bytes this machine could hold. Raises
    ``ValueError`` naming ``rank`` otherwise.
    """
    meta = decode_from(data, rank, what)
    try:
        if not isinstance(meta, list) or len(meta) != 2:
            raise ValueError(f"expected 2 fields, got {reprlib.repr(meta)}")
        itemsize = codec.torch_dtype(meta[0]).itemsize
        meta[1] = codec.check_shape(meta[1])
        check_declared(math.prod(meta[1]) * itemsize, rank, what)
    except ValueError as exc:
        raise ValueError(f"{what}: rank {rank} sent a malformed tensor header: {exc}") from None
    return meta
