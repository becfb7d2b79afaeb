"""The world a launcher announced is the world you get: the check that a process group matches it.

A launcher that started several processes announced each one's rank and the
world size (:func:`polydist.launch.environment.detect`). A process group with
another size or rank — MPI's world of one under torchrun, Horovod's under
Slurm, a group made with the wrong ``rank``/``world_size`` — would run
unrelated serial copies of the job, or mix ranks up, without an error.
:func:`check_group` raises :class:`~polydist.errors.WorldMismatchError`
instead, naming both figures, who said each, and what to do; it is called
by :func:`polydist.initialize`, on adopting a group the program or a
framework made, and by the ``mpi`` stand-in; :func:`refuse` raises it where
a backend knows before joining that its group would not be that world (MPI
under a launcher that is not MPI's). Backends sit below ``launch/``, so they
reach both through :data:`polydist.backends.registry.world`, which
:mod:`polydist._wiring` points here.

An announced world of one (``python script.py``, ``torchrun
--nproc-per-node 1``, ``srun -n 1``) is never checked: such a process may
start a world of its own (``torch.multiprocessing.spawn``).
"""

from __future__ import annotations

from ..backends import registry
from ..errors import WorldMismatchError
from ._launchers import who
from .environment import ProcessInfo

__all__ = ["who", "announcement", "check_group", "refuse"]


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

    ``info``: what the launcher announced (:func:`polydist.launch.environment.detect`);
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


def refuse(info: ProcessInfo, backend: str, outcome: str) -> None:
    """Raise :class:`~polydist.errors.WorldMismatchError` before joining: a ``backend`` group here would be
    ``outcome`` ("an mpi group here would have 1 process (...)") instead of the announced world."""
    _raise(info, backend, 0, 1, outcome)
