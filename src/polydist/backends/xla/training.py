"""What ``auto_model``, ``auto_optim`` and ``auto_dataloader`` do on xla-tpu, as ``ignite.distributed`` does there.

The registry entry offers this module as the backend's training wrappers
(:meth:`~polydist.backends.registry.Lifecycle.training`): no DDP; rank 0's
parameters broadcast (``xm.collective_broadcast``, as torch_xla's
``xm.broadcast_master_param``); the optimizer's ``step`` goes through
``xm.optimizer_step`` (gradients all-reduced, averaged over the replicas,
then the step), at every world size as idist wraps it; the loader is wrapped
in torch_xla's ``MpDeviceLoader`` at world size > 1, and ``pin_memory`` is
refused with idist's warning.
"""

from __future__ import annotations

from typing import Any

import torch

from .process_group import xla_device, xm

__all__ = ["broadcast_parameters", "DistributedOptimizer", "wrap_loader", "PIN_MEMORY_REFUSED"]

PIN_MEMORY_REFUSED = (  # ignite.distributed's words, which its tests match
    "Found incompatible options: xla support and pin_memory args equal True. "
    "Argument `pin_memory=False` will be used to construct data loader."
)


def broadcast_parameters(state: dict, root_rank: int = 0) -> None:
    """Overwrite every tensor of ``state`` (a ``state_dict()``, on the XLA device) in place with ``root_rank``'s."""
    tensors = [t for t in state.values() if isinstance(t, torch.Tensor)]
    if tensors:
        xm().collective_broadcast(tensors, root_ordinal=root_rank)


class _XlaStep:
    """The step of an optimizer wrapped by :func:`DistributedOptimizer`."""

    wrapped_optimizer: torch.optim.Optimizer  # idist's attribute name (its tests look for it)
    _step_kwargs: dict

    def step(self, closure: Any = None) -> Any:
        """``xm.optimizer_step``: all-reduce the gradients (averaged over the replicas), then the wrapped step."""
        return xm().optimizer_step(self.wrapped_optimizer, optimizer_args={"closure": closure} if closure else {},
                                   **self._step_kwargs)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, **step_kwargs: Any) -> torch.optim.Optimizer:  # noqa: N802
    """``optimizer`` seen as an instance of a subclass whose ``step`` is ``xm.optimizer_step``.

    The wrapper and ``optimizer`` share one set of attributes (parameter
    groups, state, hooks): a learning-rate change or ``load_state_dict`` on
    either is seen by both. ``isinstance(wrapper, type(optimizer))`` holds
    and ``wrapper.wrapped_optimizer`` is ``optimizer``, as with idist's
    wrapper (which fails on ignite 0.5.4+ with ``TypeError: super(type,
    obj)``). ``step_kwargs`` go to ``xm.optimizer_step`` (``barrier``,
    ``pin_layout``, ``groups``).
    """
    base = type(optimizer)
    cls = type(base.__name__, (_XlaStep, base), {"wrapped_optimizer": optimizer, "_step_kwargs": dict(step_kwargs)})
    wrapper = object.__new__(cls)
    wrapper.__dict__ = optimizer.__dict__  # one optimizer, seen two ways
    return wrapper


def wrap_loader(loader: Any, world_size: int) -> Any:
    """torch_xla's ``MpDeviceLoader`` over ``loader`` (batches land on the XLA device) at world size > 1, as idist."""
    if world_size <= 1:
        return loader
    from torch_xla.distributed.parallel_loader import MpDeviceLoader

    wrapped = MpDeviceLoader(loader, xla_device())
    wrapped.sampler = loader.sampler  # idist sets it: code reads loader.sampler.set_epoch
    return wrapped
