"""The ``horovod`` backend: Horovod (``horovod.torch``) as a torch.distributed backend.

:mod:`~polydist.backends.horovod.process_group` is the ProcessGroup,
:mod:`~polydist.backends.horovod.job` the ``horovod://`` rendezvous,
:mod:`~polydist.backends.horovod.spawn` ``spawn`` through ``horovod.run``. This
module registers both with torch.distributed (:func:`register`, called when
polydist is imported, without importing Horovod) when Horovod is installed;
``make horovod`` builds it (see the "Choosing a backend" guide).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Optional

from ... import ops
from .. import registry
from . import job
from .process_group import BACKEND_NAME, HorovodProcessGroup, hvd
from .spawn import start_processes

__all__ = ["BACKEND_NAME", "HorovodProcessGroup", "available", "hvd", "no_subgroups", "register"]


def available() -> bool:
    """Whether Horovod's PyTorch binding is installed (not imported: that loads its C++ library)."""
    try:
        return importlib.util.find_spec("horovod.torch") is not None
    except (ImportError, ValueError):
        return False


def _create(opts: Any, backend_options: Any = None) -> HorovodProcessGroup:
    """torch.distributed's creator hook: the group over Horovod's global process set, or a subgroup's set.

    A subgroup's process set must have been registered on every rank first
    (:func:`polydist.new_group`, whose non-members register it too): torch
    calls this hook on the members only, and a set that only they added would
    wait for the others forever.

    Raises:
        NotImplementedError: a subgroup without dynamic process sets, or one
            ``torch.distributed.new_group`` asked for directly.
        RuntimeError: torch's rank or size differs from Horovod's.
    """
    h = job.start()
    ranks = list(opts.global_ranks_in_group or [])
    if ranks and ranks != list(range(h.size())):
        error = no_subgroups(ranks)
        if error is not None:
            raise error
        found = job.registered_set(ranks)
        if found is None:
            raise NotImplementedError(
                f"group {ranks}: a Horovod process set must be added by every rank of the job, and "
                "torch.distributed.new_group creates the group on its members only; call polydist.new_group "
                f"({ranks}) on every rank instead"
            )
        return HorovodProcessGroup(opts.group_rank, opts.group_size, found)._configured(opts)
    if h.rank() != opts.group_rank or h.size() != opts.group_size:
        raise RuntimeError(
            f"{BACKEND_NAME}: torch.distributed expects rank {opts.group_rank} of {opts.group_size}, Horovod has "
            f"{h.rank()} of {h.size()}; launch with horovodrun and init_method='horovod://'"
        )
    return HorovodProcessGroup(h.rank(), h.size())._configured(opts)


def no_subgroups(ranks: list) -> Optional[NotImplementedError]:
    """The error for a group of ``ranks`` (fewer than the world) on the horovod backend; None when Horovod's
    dynamic process sets are on (``HOROVOD_DYNAMIC_PROCESS_SETS=1`` before ``hvd.init``)."""
    if job.dynamic_sets():
        return None
    return NotImplementedError(
        f"group {ranks}: the {BACKEND_NAME} backend has no subgroups without Horovod's dynamic process sets; set "
        "HOROVOD_DYNAMIC_PROCESS_SETS=1 before Horovod starts (every operation then costs more: see the backend "
        "guide), use the world group, or the gloo or mpi backend"
    )


register = registry.registrar(BACKEND_NAME, available, _create, "horovod", job.rendezvous)
"""Register backend ``"horovod"`` and the ``horovod://`` init method; False when Horovod is not installed."""


class _HorovodLifecycle(registry.Installable):
    """horovodrun (or ``horovod.run``) starts the ranks; they meet over ``horovod://``; Horovod's own wrappers."""

    init_url = "horovod://"
    starts_processes = True

    def check_join(self, info: Any, name: str) -> None:
        """Raise ``ValueError`` in ranks another launcher started: Horovod would see a world of one there."""
        if info.is_distributed and info.launcher != "horovod":
            raise ValueError(
                f"backend 'horovod' needs its ranks started by horovodrun (or polydist.spawn / horovod.run); this "
                f"process is rank {info.rank} of {info.world_size} started by {info.launcher}, which Horovod cannot "
                "join: launch with horovodrun -np N python script.py"
            )

    def launch_advice(self, info: Any, who: str) -> Optional[str]:
        if info.launcher == "horovod":
            return None
        return (f"Horovod sees only the ranks horovodrun started (horovodrun -np {info.world_size} python SCRIPT); "
                f"use gloo (nccl on GPUs) under {who}")

    def start_processes(self, work: Any, nproc_per_node: int, nnodes: int) -> list:
        return start_processes(work, nproc_per_node, nnodes)

    def adopt(self) -> bool:
        return job.adopt()

    def after_destroy(self) -> None:
        job.stop()

    def add_group(self, ranks: list, every_rank: bool) -> None:
        job.process_set(ranks, every_rank=every_rank)

    def training(self) -> Any:
        return hvd()


# Horovod's own dtypes natively, the rest gathered and reduced by torch on the CPU, which has no min/max
# for uint16/32/64 (measured on torch 2.13). No point-to-point; subgroups are process sets that every rank
# registers, only with dynamic process sets; idist's "horovod-dist".
HOROVOD = registry.declare(registry.Backend(
    BACKEND_NAME, no_subgroups=no_subgroups, point_to_point=False, mover=registry.DIRECT, model_name="horovod-dist",
    lifecycle=_HorovodLifecycle(BACKEND_NAME, register, "Horovod is not installed (make horovod builds it)"),
    torch_devices=("cpu",),
    reductions=ops.Reductions(
        BACKEND_NAME, registry.MPI_DTYPES,
        refused={"MIN": registry.UNSIGNED_WIDE, "MAX": registry.UNSIGNED_WIDE},
        source="polydist's horovod group (backends/horovod/process_group.py); torch's CPU min/max kernels",
    ),
))
