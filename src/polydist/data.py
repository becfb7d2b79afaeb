"""Data for this rank: ``auto_dataloader`` and ``DistributedProxySampler`` (re-exported by :mod:`polydist.training`).

idist's API (``ignite.distributed.auto``); where polydist behaves differently
it says so and why. The distributed path is torch's ``DistributedSampler``,
whose epoch advances with each pass of the loader.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterator, Optional

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data.distributed import DistributedSampler

from . import ft
from .backends import registry
from .context import backend, device, get_nproc_per_node, get_rank, get_world_size, require_group

__all__ = ["auto_dataloader", "DistributedProxySampler"]


# ---------------------------------------------------------------- samplers


class _AutoEpoch:
    """Mixin for DistributedSampler subclasses: each pass of the owning loader is the next epoch.

    ``set_epoch(e)`` pins the next pass to epoch ``e`` (e.g. when resuming);
    the passes after it continue with ``e + 1, e + 2, ...``. The counter is
    advanced by :class:`_EpochLoader` when a pass starts, not by ``__iter__``
    — a DataLoader with workers iterates its sampler twice when it starts.
    """

    epoch: int
    _next_epoch = 0
    _pinned = False

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)  # type: ignore[misc]
        self._pinned = True

    def _begin_pass(self) -> None:
        if not self._pinned:
            super().set_epoch(self._next_epoch)  # type: ignore[misc]
        self._pinned = False
        self._next_epoch = self.epoch + 1


class _EpochSampler(_AutoEpoch, DistributedSampler):
    """torch's DistributedSampler whose epoch advances with each pass of its loader."""


class DistributedProxySampler(_AutoEpoch, DistributedSampler):
    """Split the indices of any sampler across ``num_replicas`` ranks, epoch by epoch.

    Each epoch, the wrapped ``sampler`` is drawn once with torch's global RNG
    seeded by ``seed + epoch`` *inside* ``torch.random.fork_rng`` — so
    samplers drawing from the global RNG (``RandomSampler``,
    ``WeightedRandomSampler``, ``SubsetRandomSampler`` without a generator)
    yield the same list on every rank and in every run for a given epoch, and
    the caller's global RNG state is left exactly as it was. The list is
    padded by repeating it from its start up to ``num_samples * num_replicas``
    entries (or cut to a multiple of ``num_replicas`` with ``drop_last``), as
    ``DistributedSampler`` does; rank ``r`` takes entries ``r, r +
    num_replicas, ...``. All ranks get the same count ``len(self)``, and
    their parts are disjoint apart from the padding. A sampler with its own
    generator must be seeded equally on every rank by the caller.

    The epoch is set with ``set_epoch`` as for ``DistributedSampler``; in a
    loader made by :func:`auto_dataloader` it also advances by itself with
    each pass (``set_epoch`` then pins the next pass).

    Args:
        sampler: a sampler (or any iterable of indices) with a constant
            ``len``; not already a ``DistributedSampler``.
        num_replicas: number of ranks; default the world size.
        rank: this rank among them, ``0 <= rank < num_replicas``; default the
            global rank.
        seed: added to the epoch to seed each draw; equal on all ranks.
        drop_last: drop the tail instead of padding.

    Raises ``TypeError`` for a sampler without ``__iter__``/``__len__`` or a
    DistributedSampler, ``ValueError`` for ``num_replicas < 1`` or a rank out
    of range (naming it), and ``ValueError`` when the sampler yields nothing
    while its length is not 0.

    Source: idist ``DistributedProxySampler``, which calls
    ``torch.manual_seed(epoch)`` and so reseeds the caller's global RNG, and
    pads with a second, different draw of the sampler.
    """

    def __init__(
        self,
        sampler: Any,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        *,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        # ignite.distributed's messages, so code matching them keeps working
        if isinstance(sampler, DistributedSampler):
            raise TypeError(f"Argument sampler must not be a distributed sampler already, got {type(sampler).__name__}")
        if not hasattr(sampler, "__iter__"):
            raise TypeError(f"Argument sampler should be instance of torch Sampler, but given: {type(sampler).__name__}")
        if not hasattr(sampler, "__len__"):
            raise TypeError(f"Argument sampler should have length (__len__), but given: {type(sampler).__name__}")
        num_replicas = get_world_size() if num_replicas is None else num_replicas
        rank = get_rank() if rank is None else rank
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is out of range for num_replicas={num_replicas}")
        # DistributedSampler only needs len() of its "dataset" to size the split.
        super().__init__(sampler, num_replicas=num_replicas, rank=rank, shuffle=False, seed=seed, drop_last=drop_last)
        self.sampler = sampler

    def __iter__(self) -> Iterator[int]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + self.epoch)
            indices = list(self.sampler)
        if not indices:
            if self.total_size:
                raise ValueError(f"the wrapped sampler yielded no indices but has len {len(self.sampler)}")
            return iter([])
        indices = (indices * math.ceil(self.total_size / len(indices)))[: self.total_size]
        return iter(indices[self.rank : self.total_size : self.num_replicas])


# ---------------------------------------------------------------- data loader


class _EpochLoader(DataLoader):
    """A DataLoader whose every pass (``iter``) starts its sampler's next epoch."""

    def __iter__(self):  # type: ignore[override]
        for sampler in (self.sampler, getattr(self.batch_sampler, "sampler", None)):
            if isinstance(sampler, _AutoEpoch):
                sampler._begin_pass()
                break
        return super().__iter__()


def _per_rank_batch(batch_size: int, world: int) -> int:
    per_rank = max(1, batch_size // world)
    if batch_size % world:
        warnings.warn(
            f"auto_dataloader: batch_size {batch_size} is not divisible by the world size {world}: "
            f"each rank loads {per_rank} samples per batch, a global batch of {per_rank * world}",
            stacklevel=4,
        )
    return per_rank


def auto_dataloader(dataset: Dataset, *, seed: Optional[int] = None, **kwargs: Any) -> Any:
    """A ``torch.utils.data.DataLoader`` over ``dataset`` for this rank; ``kwargs`` are DataLoader's.

    Rules when the world size W > 1 (serial: W = 1 and they change nothing):

    * ``batch_size`` is the **global** batch: each rank loads
      ``max(1, batch_size // W)`` samples per batch; when W does not divide
      it, a ``UserWarning`` gives the resulting global batch. Absent, the
      DataLoader default of 1 per rank applies.
    * ``num_workers`` is the budget of a **node**: when it is at least
      ``nproc_per_node``, each process gets ``ceil(num_workers /
      nproc_per_node)`` loader workers, so a node runs about as many workers
      as one process would have; a smaller budget is kept as it is in every
      process, as idist does (2 workers on a 4-process node stay 2).
    * No ``sampler``: a ``DistributedSampler`` (``shuffle`` as given, default
      True as for ``DistributedSampler`` and idist — pass ``shuffle=False``
      for evaluation; ``drop_last`` passed on; seed ``seed`` or 0).
      Rank ``r`` gets entries ``r, r+W, ...`` of the epoch's order, padded
      by wrapping so all ranks get equally many samples and batches. A
      ``shuffle=False`` (evaluation) loader keeps the data set's order and
      its ranks together cover every sample (padding repeats a few).
    * A ``DistributedSampler`` of the user's: used as it is, epochs included
      (the user calls ``set_epoch``, as with plain DDP); a ``UserWarning``
      when its ``rank`` or ``num_replicas`` is not this process's.
    * Another ``sampler``: wrapped in :class:`DistributedProxySampler`.
    * ``batch_sampler``: used as it is, with a ``UserWarning`` (it must
      already split the data across ranks); ``IterableDataset``: no sampler
      (the data set must yield different data on each rank).

    Epochs advance by themselves: with the samplers made here, each pass over
    the returned loader (each ``iter(loader)``, a ``for`` loop) is the next
    epoch, 0, 1, 2, ... The shuffled order is therefore a function of
    ``(seed, epoch)`` alone, the same on all ranks, different each epoch.
    Every rank must iterate the loader equally often (DDP requires it anyway).
    ``loader.sampler.set_epoch(e)`` pins the next pass to epoch ``e`` and
    numbering continues from there — one call when resuming at epoch ``e``.

    ``seed`` (keyword-only, polydist): with a seed, the distributed samplers
    are used at every world size, serial included (W = 1, where ``shuffle``
    then also defaults to True), so a run's data order does not depend on W
    and a run resumed on another world size sees the same epochs; without
    one, a serial run gets a plain DataLoader (``shuffle`` default False).

    At any world size: ``pin_memory`` defaults to True when
    :func:`polydist.device` is CUDA and is forced to False otherwise
    (pinning needs CUDA; on xla-tpu ``pin_memory=True`` warns, in idist's
    words); ``persistent_workers`` defaults to True when there are workers
    (no worker restart each epoch).

    Returns a DataLoader (a subclass whose ``__iter__`` advances the epoch
    when one of the samplers above is used); on xla-tpu at world size > 1,
    torch_xla's ``MpDeviceLoader`` over it (batches on the XLA device; its
    ``sampler`` is the loader's), as idist. Raises what DataLoader raises
    for bad arguments; :class:`polydist.NotInitializedError` when launched on
    several ranks without a process group.

    Under ``polydist run --fault-tolerant`` (see :mod:`polydist.ft`) the
    rules above apply to the whole job's ranks, not to the replica group's:
    W is :attr:`~polydist.FaultTolerance.world_size` and each replica group
    takes its own shard (rank :attr:`~polydist.FaultTolerance.rank`), so
    ``batch_size`` stays the job's global batch; while a replica group is
    down, its shard of those steps is not trained on (the global batch
    shrinks).

    Source: idist ``auto_dataloader``. Differences: epochs advance without
    ``set_epoch``; ``seed``; a batch_size below W gives 1 per rank instead of
    W times the intended global batch; persistent workers only with workers
    (idist sets them always, which DataLoader rejects with 0).
    """
    world = get_world_size() if require_group() is not None else 1
    lifecycle = registry.get(backend()).lifecycle
    if lifecycle.pin_memory_refused is not None and kwargs.get("pin_memory"):
        warnings.warn(lifecycle.pin_memory_refused, stacklevel=2)
    session = ft.fault_tolerance()
    if session is not None:  # every replica group takes its own shard: the job's ranks, not the replica group's
        return _loader(dataset, seed, kwargs, session.world_size, session.rank)
    return lifecycle.wrap_loader(_loader(dataset, seed, kwargs, world, get_rank()), world)


def _loader(dataset: Dataset, seed: Optional[int], kwargs: dict, world: int, rank: int) -> DataLoader:
    if world > 1:
        if kwargs.get("batch_size") is not None and "batch_sampler" not in kwargs:
            kwargs["batch_size"] = _per_rank_batch(kwargs["batch_size"], world)
        workers = kwargs.get("num_workers") or 0
        if workers and workers >= (nproc := get_nproc_per_node()):
            kwargs["num_workers"] = -(-workers // nproc)
    if kwargs.get("num_workers"):
        kwargs.setdefault("persistent_workers", True)
    kwargs["pin_memory"] = bool(kwargs.get("pin_memory", True)) and device().type == "cuda"

    if "batch_sampler" in kwargs:
        if world > 1:
            warnings.warn(  # ignite.distributed's wording
                "Found batch_sampler in provided kwargs. Please, make sure that it is compatible "
                "with distributed configuration: it is used as it is, so it must split the data across ranks",
                stacklevel=3,
            )
        return DataLoader(dataset, **kwargs)
    if isinstance(dataset, IterableDataset) or (world == 1 and seed is None):
        return DataLoader(dataset, **kwargs)

    sampler = kwargs.get("sampler")
    if isinstance(sampler, DistributedSampler):  # ignite.distributed's warnings, word for word
        if sampler.rank != rank:
            warnings.warn(f"Found distributed sampler with rank={sampler.rank}, but process rank is {rank}", stacklevel=3)
        if sampler.num_replicas != world:
            warnings.warn(
                f"Found distributed sampler with num_replicas={sampler.num_replicas}, but world size is {world}",
                stacklevel=3,
            )
    if sampler is None:
        shuffle = bool(kwargs.pop("shuffle", True))
        drop_last = bool(kwargs.get("drop_last", False))
        if not hasattr(dataset, "__len__"):
            raise TypeError(f"auto_dataloader needs a dataset with __len__ or an IterableDataset, got {type(dataset)}")
        sampler = _EpochSampler(
            dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed or 0, drop_last=drop_last  # type: ignore[arg-type]
        )
    elif not isinstance(sampler, DistributedSampler):
        sampler = DistributedProxySampler(sampler, num_replicas=world, rank=rank, seed=seed or 0)
    kwargs["sampler"] = sampler
    return _EpochLoader(dataset, **kwargs)

