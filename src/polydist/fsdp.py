"""``auto_model(model, use_fsdp=True)``: FSDP2 (``fully_shard``) over the world, on every backend.

Kept apart from :mod:`polydist.training` so that ``torch.distributed.fsdp``
and ``device_mesh`` are imported only by programs that shard.
"""

from __future__ import annotations


import torch
import torch.distributed as dist
from torch import nn

from .context import get_world_size

__all__ = ["shard", "is_sharded"]

# What auto_model forwards to every fully_shard call (torch 2.13's keyword-only parameters).
FULLY_SHARD_KWARGS = ("mesh", "reshard_after_forward", "shard_placement_fn", "mp_policy", "offload_policy", "ignored_params")


def is_sharded(model: nn.Module) -> bool:
    """True when ``fully_shard`` was applied to ``model`` (its class became an ``FSDPModule``)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard(model: nn.Module, dev: torch.device, fsdp_kwargs: dict) -> nn.Module:
    """Rank 0's parameters and buffers on every rank (all but DTensors), then ``fully_shard`` on each direct child that holds
    parameters and on ``model`` itself (FSDP2's recommended wrapping: one all-gather per child in forward,
    the root's own parameters with the root). Returns ``model``, sharded in place."""
    unknown = sorted(set(fsdp_kwargs) - set(FULLY_SHARD_KWARGS))
    if unknown:
        raise TypeError(f"auto_model(use_fsdp=True): unknown fully_shard argument(s) {unknown}; known: {list(FULLY_SHARD_KWARGS)}")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    kwargs = dict(fsdp_kwargs)
    if kwargs.get("mesh") is None:
        kwargs["mesh"] = init_device_mesh(dev.type, (get_world_size(),))
    # fully_shard keeps each rank's own chunk of its own copy: start from one copy, as DDP's constructor does.
    # DTensor parameters (already tensor-parallel) are shards by design, different on each rank: left alone.
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        for t in (*model.parameters(), *model.buffers()):
            if not isinstance(t, DTensor):
                dist.broadcast(t.data, src=0)
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, **kwargs)
    fully_shard(model, **kwargs)
    return model
