"""Tensor plumbing shared by polydist's Python process groups (mpi4py, horovod, xla): flat buffers in, outputs out."""

from __future__ import annotations

import functools
from typing import Sequence

import torch

from ..errors import InvalidArgumentError

__all__ = ["unflatten", "byte_counts", "overlaps", "apart", "own_slot", "Contiguous", "bytes_of", "reduce_rows"]


def unflatten(flat: torch.Tensor, outs: list, by_bytes: bool = False) -> None:
    """Copy consecutive pieces of ``flat`` into ``outs`` (a byte view when ``by_bytes``)."""
    offset = 0
    for o in outs:
        n = o.nbytes if by_bytes else o.numel()
        piece = flat[offset : offset + n]
        o.copy_(piece.view(o.dtype).view(o.shape) if by_bytes else piece.view(o.shape))
        offset += n


def byte_counts(t: torch.Tensor, splits: Sequence[int], size: int, what: str) -> list[int]:
    """Per-rank byte counts of ``t`` split along dim 0 by ``splits`` (equal when empty)."""
    rows = t.shape[0] if t.dim() else 1
    row_bytes = t.nbytes // rows if rows else 0
    if not splits:
        if rows % size:
            raise InvalidArgumentError(f"all_to_all_single: {what} dim 0 ({rows}) is not divisible by the group size {size}")
        splits = [rows // size] * size
    if len(splits) != size or sum(splits) != rows:
        raise InvalidArgumentError(f"all_to_all_single: {what} split sizes {list(splits)} do not split dim 0 ({rows}) into {size}")
    return [s * row_bytes for s in splits]


# ---------------------------------------------------------------- aliasing

# torch.distributed's callers may pass inputs that alias their outputs: FSDP2 all-gathers in
# place (its input is this rank's slice of the output, torch.ops.fsdp.all_gather_copy_in), and any
# caller may hand views of one buffer to all_gather_into_tensor or reduce_scatter_tensor. MPI forbids
# overlapping send and receive buffers unless the send buffer is MPI_IN_PLACE (MPI 4.1, 2.3 and 6.1).


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The byte range ``[start, end)`` that ``t``'s elements occupy (strides are never negative in torch)."""
    start = t.data_ptr()
    if t.is_contiguous():  # the common case, without walking the strides in Python (about 2 us)
        return start, start + t.nbytes
    extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return start, start + (extent + 1) * t.element_size()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` may share memory (their byte ranges intersect; conservative for strided views)."""
    if a.numel() == 0 or b.numel() == 0 or (not (a.is_cpu and b.is_cpu) and a.device != b.device):
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def apart(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """``src``, or a contiguous copy of it when it overlaps ``dst``: what a send buffer must be where MPI has no in-place form."""
    return src.clone(memory_format=torch.contiguous_format) if overlaps(src, dst) else src


def own_slot(inp: torch.Tensor, out: torch.Tensor, rank: int) -> bool:
    """True when contiguous ``inp`` is exactly slot ``rank`` of contiguous ``out`` (bytes ``rank * inp.nbytes`` on):
    the layout of an in-place all-gather, which MPI runs with ``MPI_IN_PLACE``."""
    return (
        inp.numel() > 0 and inp.is_contiguous() and out.is_contiguous()
        and inp.data_ptr() == out.data_ptr() + rank * inp.nbytes
    )  # fmt: skip


class Contiguous:
    """``with Contiguous(t) as c``: ``t`` as a contiguous tensor to hand to a transport, copied back on exit.

    Contiguous tensors are used as they are; others go through a copy, as gloo
    does for the non-contiguous tensors it accepts. The copy back happens only
    when ``write_back`` and the block raised nothing.
    """

    __slots__ = ("t", "c", "write_back")

    def __init__(self, t: torch.Tensor, write_back: bool = True) -> None:
        self.t, self.write_back = t, write_back
        self.c = t if t.is_contiguous() else t.contiguous()

    def __enter__(self) -> torch.Tensor:
        return self.c

    def __exit__(self, *exc: object) -> None:
        if self.write_back and self.c is not self.t and exc[0] is None:
            self.t.copy_(self.c)


def bytes_of(t: torch.Tensor) -> torch.Tensor:
    """Contiguous ``t``'s memory as a flat uint8 tensor (a view; a new empty one when ``t`` has no elements)."""
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


# ---------------------------------------------------------------- reductions done locally, outputs checked

_BITWISE = {"AND": torch.bitwise_and, "OR": torch.bitwise_or, "XOR": torch.bitwise_xor}


def reduce_rows(rows: torch.Tensor, name: str, dtype: torch.dtype) -> torch.Tensor:
    """Reduce ``rows`` (``[world size, n]``, rank order) along dim 0, as the backends define ``name`` on ``dtype``:
    what a Python group does with every rank's data gathered where its transport cannot reduce it."""
    if name == "SUM":
        return rows.sum(0).to(dtype)  # wraps around in the dtype as gloo does; bool: any
    if name == "AVG":
        return (rows.sum(0) / rows.shape[0]).to(dtype)
    if name == "PRODUCT":
        return rows.prod(0).to(dtype)
    if name == "MIN":
        return rows.amin(0)
    if name == "MAX":
        return rows.amax(0)
    return functools.reduce(_BITWISE[name], rows)  # AND/OR/XOR
