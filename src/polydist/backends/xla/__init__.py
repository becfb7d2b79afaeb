"""The ``xla-tpu`` backend: torch_xla (TPUs, or ``PJRT_DEVICE=CPU``) as a torch.distributed backend.

:mod:`~polydist.backends.xla.process_group` is the ProcessGroup over
torch_xla's collectives, :mod:`~polydist.backends.xla.training` the
optimizer wrapper and data loader that ``ignite.distributed`` uses on XLA.
This module declares the registry entry (``xla-tpu``, and idist's other
spelling ``xla``), registers the backend and its ``xla-tpu://`` rendezvous
with torch.distributed when torch_xla is installed (:func:`register`, called
when polydist is imported, without importing torch_xla), and starts
processes for :func:`polydist.spawn` with torch_xla's own launcher
(``xmp.spawn``). Rank and world size are always the XLA runtime's
(``torch_xla.runtime.global_ordinal()`` / ``world_size()``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from datetime import timedelta
from typing import Any, Callable, Iterator, Optional

import torch.distributed as dist

from ... import ops
from .. import registry
from ..store import check_requested
from . import training
from .process_group import BACKEND_NAME, XlaProcessGroup, xla_device

__all__ = ["BACKEND_NAME", "XlaProcessGroup", "available", "register", "start_processes", "rendezvous"]

URL = "xla-tpu://"


def available() -> bool:
    """Whether torch_xla is installed (not imported: that starts nothing, but takes seconds)."""
    try:
        return importlib.util.find_spec("torch_xla") is not None
    except (ImportError, ValueError):
        return False


def _runtime() -> Any:
    import torch_xla.runtime as xr

    return xr


def _create(opts: Any, backend_options: Any = None) -> XlaProcessGroup:
    """torch.distributed's creator hook: the group over every XLA replica.

    Raises:
        NotImplementedError: a subgroup.
        RuntimeError: torch's rank or size differs from the XLA runtime's.
    """
    xr = _runtime()
    ranks = list(opts.global_ranks_in_group or [])
    if ranks and ranks != list(range(xr.world_size())):
        raise no_subgroups(ranks)
    if xr.global_ordinal() != opts.group_rank or xr.world_size() != opts.group_size:
        raise RuntimeError(
            f"{BACKEND_NAME}: torch.distributed expects rank {opts.group_rank} of {opts.group_size}, the XLA runtime "
            f"has {xr.global_ordinal()} of {xr.world_size()}; use init_method={URL!r}"
        )
    return XlaProcessGroup(opts.group_rank, opts.group_size)._configured(opts)


def no_subgroups(ranks: list) -> NotImplementedError:
    """The error for a group of ``ranks`` (fewer than the world) on the xla-tpu backend."""
    return NotImplementedError(
        f"group {ranks}: the {BACKEND_NAME} backend has no subgroups (torch_xla's collectives are called by every "
        "replica, torch creates a group on its members only); use the world group"
    )


def rendezvous(url: str, timeout: timedelta = timedelta(minutes=10), **kwargs: Any) -> Iterator[tuple]:
    """The ``xla-tpu://`` init method: rank and world size from the XLA runtime.

    World size 1: a process-local store (nothing to meet). Larger worlds: the
    TCP store of torch_xla's own ``xla://`` init method (rank 0 serves it at
    ``MASTER_ADDR``, else the TPU master worker or localhost; ``MASTER_PORT``,
    else 12355). Raises ``ValueError`` when the caller asked for another rank
    or world size than the runtime's.
    """
    xr = _runtime()
    rank, size = xr.global_ordinal(), xr.world_size()
    check_requested(url, rank, size, "xla-tpu", "the XLA runtime", "xmp.spawn or torch_xla.launch")
    if size == 1:
        store = dist.HashStore()
    else:  # untested here: PJRT's CPU client cannot run several processes (torch_xla #9089)
        import torch_xla.distributed.xla_backend  # noqa: F401 - registers torch_xla's xla:// rendezvous

        store = next(dist.rendezvous("xla://", timeout=timeout))[0]
    yield (store, rank, size)
    raise RuntimeError("the xla-tpu:// rendezvous cannot be repeated; start new processes")


def _xla_worker(index: int, work: "_Work") -> None:
    work()


def start_processes(work: Callable[[], Any], nproc_per_node: int, nnodes: int) -> list:
    """:func:`polydist.spawn` on xla-tpu: ``work()`` in each process torch_xla's ``xmp.spawn`` starts.

    ``nproc_per_node`` 1 runs ``work`` in this process (as ``xmp.spawn(nprocs=1)``
    does) and returns ``[its result]``; any other value means every XLA device
    of this host, one process each (torch_xla's PJRT runtime accepts no other
    count), each checking that the runtime made ``nproc_per_node`` of them,
    and returns ``[None] * nproc_per_node`` (``xmp.spawn`` returns no results).
    Several hosts (a TPU pod) run the same program on every host; torch_xla's
    runtime finds them.

    Raises:
        ValueError: ``nnodes`` > 1 (start the program on every host instead),
            before any process starts.
    """
    if nnodes != 1:
        raise ValueError(
            f"nnodes={nnodes}: spawn with backend {BACKEND_NAME!r} starts the processes of this host only; on a TPU "
            "pod run the same program on every host (gcloud compute tpus tpu-vm ssh --worker=all), whose XLA "
            "runtime finds the others"
        )
    import torch_xla.distributed.xla_multiprocessing as xmp

    job = _Work(work, nproc_per_node)
    xmp.spawn(_xla_worker, args=(job,), nprocs=1 if nproc_per_node == 1 else None)
    return [job.result] if nproc_per_node == 1 else [None] * nproc_per_node


class _Work:
    """``work``, run only where the XLA runtime started ``nproc_per_node`` processes on this host; keeps its
    result (read back when it ran in this process). Picklable, for ``xmp.spawn``'s processes."""

    def __init__(self, work: Callable[[], Any], nproc_per_node: int) -> None:
        self.work, self.nproc_per_node, self.result = work, nproc_per_node, None

    def __call__(self) -> None:
        made = _runtime().local_process_count()
        if made != self.nproc_per_node:
            raise ValueError(
                f"nproc_per_node={self.nproc_per_node}, but torch_xla started {made} processes on this host (one per "
                "XLA device, the only count its PJRT runtime accepts besides 1)"
            )
        self.result = self.work()


def adopt() -> bool:
    """Make the xla-tpu group in a program that chose XLA itself, without communicating.

    idist treats every process with torch_xla installed as an XLA world (its
    ``create_from_context``); polydist does so where the program imported
    torch_xla and either picked its device (``PJRT_DEVICE``, as torch_xla's
    docs have TPU and CPU users export) or already started its runtime
    (``torch_xla.device()``, an XLA tensor), so that a program with
    torch_xla merely installed stays serial. False (nothing done) otherwise.
    """
    xla = sys.modules.get("torch_xla")
    if xla is None or not (os.environ.get("PJRT_DEVICE") or xla._XLAC._xla_runtime_is_initialized()):
        return False
    register()
    xr = _runtime()
    dist.init_process_group(BACKEND_NAME, store=dist.HashStore(), rank=xr.global_ordinal(), world_size=xr.world_size())
    return True


register = registry.registrar(BACKEND_NAME, available, _create, "xla-tpu", rendezvous)
"""Register backend ``"xla-tpu"`` and the ``xla-tpu://`` init method; False when torch_xla is not installed."""


_MISSING = "torch_xla is not installed (make test-xla makes a venv with it)"


class _XlaLifecycle(registry.Installable):
    """torch_xla's runtime starts, numbers and connects the processes; idist's optimizer step and loader."""

    init_url = URL
    starts_processes = True
    training_at_every_size = True
    pin_memory_refused = training.PIN_MEMORY_REFUSED

    def launch_advice(self, info: Any, who: str) -> Optional[str]:
        return (f"torch_xla's runtime, not {who}, starts and numbers XLA processes, so each process {who} started "
                f"is a world of its own here: start them with polydist.spawn({BACKEND_NAME!r}, fn, "
                "nproc_per_node=N) (torch_xla's xmp.spawn) or torch_xla.launch, or use gloo (nccl on GPUs)")

    def start_processes(self, work: Callable[[], Any], nproc_per_node: int, nnodes: int) -> list:
        return start_processes(work, nproc_per_node, nnodes)

    def adopt(self) -> bool:
        return adopt()

    def compute_device(self) -> Any:
        return xla_device()

    def training(self) -> Any:
        return training

    def wrap_loader(self, loader: Any, world_size: int) -> Any:
        return training.wrap_loader(loader, world_size)


class _XlaSpelling(_XlaLifecycle):
    """idist's other spelling ``xla``: a group is made as ``xla-tpu``, whose entry alone adopts a runtime."""

    def adopt(self) -> bool:
        return False


# Byte buffers on the CPU (the direct calls' contract), tensors computed on torch_xla.device().
# xm.all_reduce's numeric types (not uint16/32/64); AND/OR/XOR, bool and complex gathered and reduced on every rank (process_group.py).
XLA = registry.declare(registry.Backend(
    BACKEND_NAME, mover=registry.DIRECT, no_subgroups=no_subgroups, point_to_point=False, model_name="xla-dist",
    lifecycle=_XlaLifecycle(BACKEND_NAME, register, _MISSING), torch_devices=("cpu", "xla"),
    reductions=ops.Reductions(
        BACKEND_NAME, registry.MPI_DTYPES - registry.UNSIGNED_WIDE,
        source="polydist's xla-tpu group (backends/xla/process_group.py): xm.all_reduce's types",
    ),
))
# ignite.distributed's other spelling: a group is made as xla-tpu. torch's own "xla" is torch_xla's backend, not
# polydist's: what torch says of it stands (torch_devices=None).
registry.declare(dataclasses.replace(
    XLA, name="xla", reductions=None, listed=False, lifecycle=_XlaSpelling(BACKEND_NAME, register, _MISSING),
    torch_devices=None,
))

__all__ += ["xla_device", "no_subgroups", "URL", "XLA"]
