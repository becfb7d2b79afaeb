"""Shims over torch.distributed API differences between the PyTorch versions polydist supports (>= 2.2)."""

from __future__ import annotations

import torch.distributed as dist

# PyTorch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor to *_single and deprecated the old names.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
