"""The ``mpi4py`` backend: MPI for torch.distributed on stock PyTorch wheels.

:mod:`~polydist.backends.mpi4py.process_group` is the ProcessGroup,
:mod:`~polydist.backends.mpi4py._mpi` turns tensors into MPI buffers and
holds the work handles, :mod:`~polydist.backends.mpi4py.job` is the
``mpi://`` rendezvous and abort-on-failure. This module registers the backend
with torch.distributed (:func:`register`, called when polydist is imported).
"""

from __future__ import annotations

import zlib
from typing import Any

import torch.distributed as dist

from . import _mpi, job
from .process_group import MPIProcessGroup

__all__ = ["BACKEND_NAME", "MPIProcessGroup", "available", "register"]

BACKEND_NAME = _mpi.BACKEND_NAME
available = _mpi.available


def _create(opts: Any, backend_options: Any = None) -> MPIProcessGroup:
    """torch.distributed's creator hook: one communicator per process group."""
    MPI = _mpi.mpi()
    world = MPI.COMM_WORLD
    ranks = list(opts.global_ranks_in_group or [])
    if not ranks or ranks == list(range(world.Get_size())):
        comm = world.Dup()
    else:
        # Create_group is collective over the members only, as use_local_synchronization
        # needs; a tag from the ranks keeps concurrent creations of different groups apart.
        tag = zlib.crc32(repr(ranks).encode()) % 32768
        comm = world.Create_group(world.Get_group().Incl(ranks), tag)
    if comm.Get_rank() != opts.group_rank or comm.Get_size() != opts.group_size:
        raise RuntimeError(
            f"{_mpi.BACKEND_NAME}: torch.distributed expects group rank {opts.group_rank} of {opts.group_size}, "
            f"MPI gives {comm.Get_rank()} of {comm.Get_size()}; the job's ranks must be MPI's COMM_WORLD ranks "
            "(launch with mpiexec and init_method='mpi://')"
        )
    return MPIProcessGroup(comm, opts.group_rank, opts.group_size)


_registered = False


def register() -> bool:
    """Register backend ``"mpi4py"`` and the ``mpi://`` init method with torch.distributed.

    Called when polydist is imported; does nothing (returns False) when
    mpi4py is not installed. Does not import mpi4py, so MPI is not started.
    """
    global _registered
    if _registered:
        return True
    if not _mpi.available() or not dist.is_available():
        return False
    if _mpi.BACKEND_NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(_mpi.BACKEND_NAME, _create, extended_api=True, devices=["cpu"])
    dist.register_rendezvous_handler("mpi", job.rendezvous)
    _registered = True
    return True
