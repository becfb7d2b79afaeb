"""The ``horovod`` backend: Horovod (``horovod.torch``) as a torch.distributed backend.

:mod:`~polydist.backends.horovod.process_group` is the ProcessGroup,
:mod:`~polydist.backends.horovod.job` the ``horovod://`` rendezvous. This
module registers both with torch.distributed (:func:`register`, called when
polydist is imported, without importing Horovod) when Horovod is installed;
``make horovod`` builds it (see the "Choosing a backend" guide).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Optional

import torch.distributed as dist

from ... import ops
from ...environment import ProcessInfo
from .. import registry
from . import job
from .process_group import BACKEND_NAME, HorovodProcessGroup, hvd

__all__ = ["BACKEND_NAME", "HorovodProcessGroup", "available", "hvd", "no_subgroups", "register"]


def available() -> bool:
    """Whether Horovod's PyTorch binding is installed (not imported: that loads its C++ library)."""
    try:
        return importlib.util.find_spec("horovod.torch") is not None
    except (ImportError, ValueError):
        return False


def _create(opts: Any, backend_options: Any = None) -> HorovodProcessGroup:
    """torch.distributed's creator hook: the group over Horovod's global process set.

    Raises:
        NotImplementedError: a subgroup (Horovod's process sets cannot be added by its members alone).
        RuntimeError: torch's rank or size differs from Horovod's.
    """
    h = job.start()
    ranks = list(opts.global_ranks_in_group or [])
    if ranks and ranks != list(range(h.size())):
        raise no_subgroups(ranks)
    if h.rank() != opts.group_rank or h.size() != opts.group_size:
        raise RuntimeError(
            f"{BACKEND_NAME}: torch.distributed expects rank {opts.group_rank} of {opts.group_size}, Horovod has "
            f"{h.rank()} of {h.size()}; launch with horovodrun and init_method='horovod://'"
        )
    return HorovodProcessGroup(h.rank(), h.size())


def no_subgroups(ranks: list) -> NotImplementedError:
    """The error for a group of ``ranks`` (fewer than the world) on the horovod backend."""
    return NotImplementedError(
        f"group {ranks}: the {BACKEND_NAME} backend has no subgroups (a Horovod process set must be added by every "
        "rank of the job, torch creates a group on its members only); use the world group, or the gloo or mpi backend"
    )


register = registry.registrar(BACKEND_NAME, available, _create, "horovod", job.rendezvous)
"""Register backend ``"horovod"`` and the ``horovod://`` init method; False when Horovod is not installed."""


def _resolve(name: str) -> str:
    if not register():
        raise ValueError(
            f"Unknown backend {name!r}: Horovod is not installed (make horovod builds it). "
            f"Backend should be one of {', '.join(registry.available_names())}"  # ignite's words
        )
    return BACKEND_NAME


def _check_join(info: ProcessInfo, name: str) -> None:
    """Raise ``ValueError`` in ranks another launcher started: Horovod would see a world of one there."""
    if info.is_distributed and info.launcher != "horovod":
        raise ValueError(
            f"backend 'horovod' needs its ranks started by horovodrun (or polydist.spawn / horovod.run); this "
            f"process is rank {info.rank} of {info.world_size} started by {info.launcher}, which Horovod cannot "
            "join: launch with horovodrun -np N python script.py"
        )


def _advice(info: ProcessInfo, who: str) -> Optional[str]:
    if info.launcher == "horovod":
        return None
    return (f"Horovod sees only the ranks horovodrun started (horovodrun -np {info.world_size} python SCRIPT); "
            f"use gloo (nccl on GPUs) under {who}")


# Horovod's own dtypes natively, the rest gathered and reduced by torch on the CPU, which has no min/max
# for uint16/32/64 (measured on torch 2.13). No point-to-point; no subgroups; idist's "horovod-dist".
HOROVOD = registry.declare(registry.Backend(
    BACKEND_NAME, no_subgroups=no_subgroups, point_to_point=False, init_url="horovod://", resolve=_resolve,
    mover=registry.DIRECT, check_join=_check_join, model_name="horovod-dist", training=hvd, launch_advice=_advice,
    register=register, adopt=job.adopt,
    reductions=ops.Reductions(
        BACKEND_NAME, registry.MPI_DTYPES,
        refused={"MIN": registry.UNSIGNED_WIDE, "MAX": registry.UNSIGNED_WIDE},
        source="polydist's horovod group (backends/horovod/process_group.py); torch's CPU min/max kernels",
    ),
))
