"""Shims over torch.distributed API differences between the PyTorch versions polydist supports (>= 2.2)."""

from __future__ import annotations

import torch.distributed as dist

# PyTorch 2.13 renamed all_gather_into_tensor to all_gather_single and deprecated the old name.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
