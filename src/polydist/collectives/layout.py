"""Tensors as bytes with their dtype and shape: what the data-moving collectives exchange.

The metadata of a tensor (dtype, shape, and its elements when they fit in a
slot of :mod:`~polydist.collectives.frames`) travels first; :class:`Layout`
then says how every rank's tensor moves as bytes and how to cut the received
buffer back into tensors. Shared by :mod:`~polydist.collectives.gather` and
:mod:`~polydist.collectives.scatter`.
"""

from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .. import codec
from .frames import check_declared, decode_from
from .pipeline import contiguous

__all__ = ["TENSOR", "VALUE", "tensor_meta", "read_meta", "as_bytes", "Layout", "offsets_of"]

TENSOR, VALUE = b"T", b"V"


def tensor_meta(x: torch.Tensor, extra: list, limit: int, inline: bool = True) -> tuple[bytes, bool]:
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


def read_meta(data: bytes, rank: int, what: str, sizes: int = 0, raw: bool = True) -> list:
    """``[dtype, shape, *sizes, raw]`` from global rank ``rank``'s header, checked before anything is sized by it.

    ``sizes`` byte counts follow the shape (each at least the tensor's own
    bytes); ``raw`` is the elements or None. The dtype must be a torch dtype,
    the shape at most ``codec.MAX_DIMS`` non-negative ints whose bytes this
    machine could hold, ``raw`` bytes or None. Raises ``ValueError`` naming
    ``rank`` otherwise.
    """
    meta = decode_from(data, rank, what)
    try:
        if not isinstance(meta, list) or len(meta) != 2 + sizes + raw:
            raise ValueError(f"expected {2 + sizes + raw} fields, got {reprlib.repr(meta)}")
        itemsize = codec.torch_dtype(meta[0]).itemsize
        meta[1] = codec.check_shape(meta[1])
        nbytes = check_declared(math.prod(meta[1]) * itemsize, rank, what)
        for n in meta[2 : 2 + sizes]:
            if type(n) is not int or n < nbytes:
                raise ValueError(f"a byte count of {reprlib.repr(n)} for {nbytes} bytes of elements")
            check_declared(n, rank, what)
        if raw and not (meta[-1] is None or isinstance(meta[-1], bytes)):
            raise ValueError(f"elements must be bytes or None, got {type(meta[-1]).__name__}")
    except ValueError as exc:
        raise ValueError(f"{what}: rank {rank} sent a malformed tensor header: {exc}") from None
    return meta


def as_bytes(x: torch.Tensor) -> torch.Tensor:
    """The elements of ``x`` as a flat uint8 tensor (a view when ``x`` is contiguous).

    Data-moving collectives send bytes, so every dtype travels — also those a
    backend cannot reduce or even carry itself (gloo has no int16, uint16,
    uint32 or float8 transport).
    """
    return contiguous(x).reshape(-1).view(torch.uint8)


@dataclass
class Layout:
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
        return [elems[o : o + n].view(s) for o, n, s in zip(offsets_of(self.numels), self.numels, self.shapes)]


def offsets_of(sizes: list[int]) -> list[int]:
    out, total = [], 0
    for n in sizes:
        out.append(total)
        total += n
    return out
