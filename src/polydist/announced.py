"""The world a launcher announced is the world you get: the check that a process group matches it.

A launcher that started several processes announced each one's rank and the
world size (:func:`polydist.environment.detect`). A process group with
another size or rank — MPI's world of one under torchrun, Horovod's under
Slurm, a group made with the wrong ``rank``/``world_size`` — would run
unrelated serial copies of the job, or mix ranks up, without an error.
:func:`check_group` raises :class:`~polydist.errors.WorldMismatchError`
instead, naming both figures, who said each, and what to do; it is called
by :func:`polydist.initialize`, on adopting a group the program or a
framework made, and by the ``mpi`` stand-in. :func:`check_mpi_can_join`
raises it before MPI starts, where MPI cannot see the announced world.

An announced world of one (``python script.py``, ``torchrun
--nproc-per-node 1``, ``srun -n 1``) is never checked: such a process may
start a world of its own (``torch.multiprocessing.spawn``).
"""

from __future__ import annotations

from .launch._launchers import UNNAMED, who
from .backends import registry
from .environment import ProcessInfo, mpi_initialized
from .errors import WorldMismatchError

__all__ = ["who", "announcement", "check_group", "check_mpi_can_join"]


def announcement(info: ProcessInfo) -> str:
    """What the launcher said, with its variables: "torchrun announced WORLD_SIZE=2, RANK=1"."""
    sources = dict(info.sources)
    said = ", ".join(f"{sources.get(key, key)}={getattr(info, key)}" for key in ("world_size", "rank"))
    return f"{who(info)} announced {said}"


def _advice(info: ProcessInfo, backend: str) -> str:
    said = registry.get(backend).lifecycle.launch_advice(info, who(info))
    if said is not None:
        return said
    return ("make the group with the launcher's rank and world size (polydist.initialize() or "
            "init_process_group(init_method='env://') without rank/world_size take them), or, if this process "
            f"is not one of {who(info)}'s ranks, unset its variables")


def _raise(info: ProcessInfo, backend: str, rank: int, size: int, outcome: str) -> None:
    raise WorldMismatchError(f"{announcement(info)}, but {outcome}: {_advice(info, backend)}",
                             launcher=info.launcher, announced=(info.rank, info.world_size), group=(rank, size),
                             backend=backend)


def check_group(info: ProcessInfo, backend: str, rank: int, size: int) -> None:
    """Raise :class:`~polydist.errors.WorldMismatchError` if the group (``rank`` of ``size``) is not the announced world.

    ``info``: what the launcher announced (:func:`polydist.environment.detect`);
    nothing is checked when it announced a world of one.
    """
    if not info.is_distributed or (rank, size) == (info.rank, info.world_size):
        return
    process = "process" if size == 1 else "processes"
    if size != info.world_size:
        outcome = f"the {backend} group has {size} {process} (this one is its rank {rank})"
    else:
        outcome = f"this process is rank {rank} of the {backend} group"
    _raise(info, backend, rank, size, outcome)


def check_mpi_can_join(info: ProcessInfo, backend: str) -> None:
    """Before MPI starts: raise if MPI would make this process a world of its own in a world the launcher announced.

    MPI sees only the ranks an MPI process manager started; under another
    launcher that announced several processes (torchrun, Slurm without
    ``--mpi``, Kubeflow, horovodrun) each process would start as MPI's
    rank 0 of 1. A launcher polydist cannot name ("env": ``RANK`` and
    ``WORLD_SIZE`` alone) might be an MPI that polydist does not know: its
    group is checked once made, by :func:`check_group`.
    """
    if info.is_distributed and info.mpi_flavor is None and info.launcher != UNNAMED and not mpi_initialized():
        _raise(info, backend, 0, 1, f"an {backend} group here would have 1 process (MPI sees no MPI launcher, "
                                    "so each process would be a world of its own)")
