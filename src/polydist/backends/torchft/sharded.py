"""FSDP2 under ``--fault-tolerant``: each replica group shards the model, the replica groups average the shards (HSDP).

Inside a replica group of several ranks the model is sharded with FSDP2
(``fully_shard`` over the group: its reduce-scatter averages the gradients
within the group). Rank r of every replica group then holds the same shard,
and the engine's manager connects exactly those ranks (torchft runs one
manager per group rank; its group is the replicate dimension). Before each
commit vote, every rank averages its gradient shards over the replica groups
taking part in the step (:func:`average_gradients`): one all-reduce per
dtype, through :func:`~polydist.backends.torchft.wrappers.average`, the path
of DDP's hook (a failed all-reduce fails the step, never the program). It
runs after backward, not overlapped with it.

The live state a recovering replica group receives holds each rank's own
shards (:func:`~polydist.backends.torchft.transport.plain` sends a DTensor's
local shard): rank r of the recovering group receives from
rank r of a live one, whose layout is the same; :func:`model_state`'s loader
and :func:`load_optimizer` put them back into the DTensors, checking what came
(bytes from another process are hostile until checked).

Source of the design: torchft's HSDP (``torchft.device_mesh``'s replicate
dimension managed by the ``Manager``), done here after FSDP2's own
reduce-scatter instead of inside a managed device mesh.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch.distributed.tensor import DTensor

from .wrappers import average

__all__ = ["average_gradients", "load_optimizer", "model_state"]


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a view: writing to it writes the DTensor); any other tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def average_gradients(manager: Any, params: Iterable[torch.nn.Parameter]) -> None:
    """Average the gradients of ``params`` (their local shards, in place) over the replica groups of the step.

    One flat buffer per (dtype, device): every parameter's local gradient
    (zeros where it has none) and, after them, one flag per parameter (1 when
    it has a gradient). A parameter without a gradient here gets one when
    another replica group had one (the flags' sum), so that every replica
    group applies the same update; one that none had keeps ``None``. On a
    failed all-reduce the gradients are left as they are and the manager
    holds the error: the commit vote that follows discards the step.
    """
    kinds: dict = {}
    for p in params:
        if p.requires_grad:
            kinds.setdefault((p.dtype, p.device), []).append(p)
    for (dtype, dev), group in kinds.items():
        grads = [None if p.grad is None else _local(p.grad) for p in group]
        pieces = [g.reshape(-1) if g is not None else torch.zeros(_local(p).numel(), dtype=dtype, device=dev)
                  for p, g in zip(group, grads)]  # fmt: skip
        flags = torch.tensor([g is not None for g in grads], dtype=dtype, device=dev)
        flat = average(manager, torch.cat([*pieces, flags])).wait()
        if manager.errored():
            return
        offset = 0
        for p, g, had in zip(group, grads, flat[-len(group):].tolist()):
            shard = _local(p)
            piece = flat[offset:offset + shard.numel()].view_as(shard)
            offset += shard.numel()
            if g is None and had > 0:
                p.grad = torch.zeros_like(p)
                g = _local(p.grad)
            if g is not None:
                g.copy_(piece)


def model_state(model: torch.nn.Module) -> tuple[Callable[[], dict], Callable[[Any], None]]:
    """The state functions of a model sharded by FSDP2, for :meth:`polydist.ft.FaultTolerance.register_state`:
    one returns the local shards of its parameters and its buffers (by name, as in ``state_dict``), the other
    copies such a state sent by a live replica group into them, in place.

    Both work on the tensors the model holds *now*, sharded (call it right after ``fully_shard``), not
    through ``model.state_dict()``: torchft reads the state on its quorum thread while the forward pass runs,
    and FSDP2's ``state_dict`` hook would reshard parameters under it. The loader raises ``ValueError``
    naming the entry when a name or a shape differs (bytes from another process are hostile until checked).
    """
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}

    def state() -> dict:
        return {name: _local(t).detach() for name, t in tensors.items()}

    def load(sent: Any) -> None:
        if not isinstance(sent, dict) or set(sent) != set(tensors):
            names = sorted(set(sent) ^ set(tensors)) if isinstance(sent, dict) else type(sent).__name__
            raise ValueError(f"the live replica group's model state does not match this model's: {names}")
        with torch.no_grad():
            for name, value in sent.items():
                target = _local(tensors[name])
                if not isinstance(value, torch.Tensor) or value.shape != target.shape:
                    got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                    raise ValueError(f"the live replica group's model state gives {name!r} as {got}, "
                                     f"this rank's shard is {tuple(target.shape)}")  # fmt: skip
                target.copy_(value)

    return state, load


def load_optimizer(optimizer: torch.optim.Optimizer) -> Callable[[Any], None]:
    """A loader of ``optimizer.state_dict()`` as it travels (DTensors as their local shards) into ``optimizer``:
    its ``load_state_dict``, then each per-parameter tensor of a DTensor parameter's shape made a DTensor of that
    parameter's mesh and placements again (the optimizer's step mixes them with the DTensor gradients)."""

    def load(state: Any) -> None:
        optimizer.load_state_dict(state)
        for group in optimizer.param_groups:
            for p in group["params"]:
                if not isinstance(p, DTensor) or p not in optimizer.state:
                    continue
                own = optimizer.state[p]
                for key, value in own.items():
                    if isinstance(value, torch.Tensor) and not isinstance(value, DTensor) and value.dim() and \
                            value.shape == p.to_local().shape:  # fmt: skip
                        own[key] = DTensor.from_local(value, p.device_mesh, p.placements, run_check=False,
                                                      shape=p.shape, stride=p.stride())  # fmt: skip

    return load
