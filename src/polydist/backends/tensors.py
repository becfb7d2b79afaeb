"""Tensor plumbing shared by polydist's Python process groups (mpi4py, horovod): flat buffers in, outputs out."""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["unflatten", "byte_counts"]


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
            raise ValueError(f"all_to_all_single: {what} dim 0 ({rows}) is not divisible by the group size {size}")
        splits = [rows // size] * size
    if len(splits) != size or sum(splits) != rows:
        raise ValueError(f"all_to_all_single: {what} split sizes {list(splits)} do not split dim 0 ({rows}) into {size}")
    return [s * row_bytes for s in splits]
