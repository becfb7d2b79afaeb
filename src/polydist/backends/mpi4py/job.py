"""What an MPI job needs besides the process group: the ``mpi://`` rendezvous and abort on failure.

``mpi://`` lets any backend (``mpi4py``, and gloo under ``mpiexec``) start
without MASTER_ADDR/MASTER_PORT: rank and world size come from
``COMM_WORLD``, and rank 0's TCP store port travels over MPI. MPI itself has
no collective timeout (polydist's watchdog bounds each operation by the
group's, 30 minutes by default), so :func:`install_abort_hook` turns an
uncaught exception on one rank into ``MPI_Abort`` of the whole job at once.
:func:`mpi_job` decides whether this process is a rank of an MPI job at all.
"""

from __future__ import annotations

import signal
import sys
import time
import traceback
from datetime import timedelta
from typing import Any, Iterator, Optional

import numpy as np

from ..._failure_record import record_failure
from .. import registry
from ..store import check_requested, serve_store
from . import _mpi

__all__ = ["mpi_initialized", "mpi_job", "rendezvous", "world_store", "install_abort_hook", "fail", "abort"]


def mpi_initialized() -> bool:
    """Whether this program has already started MPI (imported ``mpi4py.MPI``, which calls ``MPI_Init``) and not ended it.

    Looks at ``sys.modules`` only, so it never starts MPI itself.
    """
    module = sys.modules.get("mpi4py.MPI")
    return module is not None and module.Is_initialized() and not module.Is_finalized()


def mpi_job(info: Optional[Any] = None) -> bool:
    """Whether this process is a rank of an MPI job: the one place that decides it.

    True when an MPI process manager started this process as one of its ranks
    (``info.mpi_flavor``: MPICH's Hydra, Open MPI, Intel MPI, MVAPICH,
    ``srun --mpi=pmi2/pmix``) or the program already initialized MPI; False
    under any other launcher (torchrun's workers inherit the variables of an
    ``mpiexec`` that started torchrun, but are not its ranks) and in a plain
    ``python`` process. ``info``: what the launcher announced (a
    :class:`polydist.launch.environment.ProcessInfo`; None: ask
    :data:`registry.world <polydist.backends.registry.world>`). polydist's
    ``mpi`` stand-in answers ``torch.distributed.is_mpi_available()`` with
    it, so a framework that prefers MPI when it is available (Accelerate's
    multi-CPU path) picks it only where MPI can see the job's ranks.
    """
    return (info or registry.world.announced()).mpi_flavor is not None or mpi_initialized()


def rendezvous(url: str, timeout: timedelta = timedelta(minutes=10), **kwargs: Any) -> Iterator[tuple]:
    """The ``mpi://`` init method: rank and world size from ``COMM_WORLD``, a TCP store on rank 0.

    No MASTER_ADDR/MASTER_PORT needed: rank 0 binds a free port and broadcasts
    it over MPI. Any backend can use it (gloo under mpiexec too).
    """
    comm = _mpi.mpi().COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    check_requested(url, rank, size, "mpi", "COMM_WORLD", "mpiexec")
    yield (world_store(comm, timeout), rank, size)
    raise RuntimeError("the mpi:// rendezvous cannot be repeated (e.g. to restart a job); start a new mpiexec")


def world_store(comm: Any, timeout: timedelta) -> Any:
    """Rank 0's TCP store, its port announced over ``comm`` (every rank of COMM_WORLD calls it)."""
    rank, size = comm.Get_rank(), comm.Get_size()

    def all_gather_rows(row: np.ndarray) -> np.ndarray:
        every = np.empty((size, row.size), dtype=np.uint8)
        comm.Allgather(row, every)
        return every

    def broadcast_port(port: int) -> int:
        announced = np.array([port], dtype=np.int64)
        comm.Bcast(announced, root=0)  # a plain integer buffer, not a pickle
        return int(announced[0])

    return serve_store(rank, size, timeout, all_gather_rows, broadcast_port, "mpi")


def progress() -> bool:
    """Let MPI move this rank's messages, if MPI is up (nothing otherwise; MPI is not started for it).
    Returns whether MPI is up (a :data:`polydist.teardown.while_leaving` hook: call again).

    Open MPI moves messages only inside MPI calls ("weak progress", which the
    MPI standard's progress rule allows): a send that has completed here may
    still need a later call of this rank before its receiver, on another host,
    gets all of it. An ``Iprobe`` is such a call, and receives nothing.
    """
    mpi = _mpi.MPI
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Iprobe()
        return True
    return False


def install_abort_hook() -> None:
    """Make an uncaught exception on this rank print its traceback and abort the whole MPI job.

    Without it, the other ranks would wait in their next collective until the
    group's timeout (MPI has none of its own; polydist's watchdog applies the
    group's). Installed wherever the world's MPI group is created
    (``polydist.initialize``, or the program's own
    ``init_process_group("mpi")``). The hook replaces whatever hook was set
    (PyTorch's prints "[rankN]:" prefixes, which ``polydist run`` already
    adds): it prints a line naming the rank, the traceback, and calls
    ``MPI_Abort``; after Ctrl-C (``KeyboardInterrupt``) one line only.
    Idempotent; does nothing without mpi4py.
    """
    if not _mpi.available() or getattr(sys.excepthook, "_polydist_abort", False):
        return

    def hook(kind: Any, value: Any, tb: Any) -> None:
        rank = _mpi.mpi().COMM_WORLD.Get_rank()
        if issubclass(kind, KeyboardInterrupt):  # Ctrl-C: every rank got it; one line each, not a traceback
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # mpiexec forwards a second one: not mid-abort
            sys.stderr.write(f"polydist: rank {rank} interrupted ({kind.__name__}); ending the MPI job\n")
            abort(130)
            return  # MPICH's MPI_Abort returns under polydist run (-disable-auto-cleanup): the launcher ends it
        text = "".join(traceback.format_exception(kind, value, tb))
        sys.stderr.write(f"polydist: rank {rank} raised an uncaught exception; aborting the MPI job\n{text}")
        fail(rank, value, text, 1)

    hook._polydist_abort = True  # type: ignore[attr-defined]
    sys.excepthook = hook


# Called as hook(exc) before MPI_Abort ends the job, by the layers above this one:
# polydist.trace.dump writes this rank's flight-recorder dump, polydist run's worker
# asks the other ranks of the node for theirs.
before_abort: list = []
# Called as hook() by abort(), whatever the cause: the watchdog, whose exit note must not say the program finished.
on_abort: list = []


def fail(rank: int, exc: BaseException, text: str, code: int) -> None:
    """End the MPI job for ``exc`` on this rank: its traceback for ``polydist run``, the hooks, ``MPI_Abort``."""
    record_failure(rank, text)
    for hook in before_abort:
        hook(exc)
    abort(code)


def abort(code: int) -> None:
    """Flush this rank's output and end every rank of the MPI job with ``code`` (``MPI_Abort``)."""
    for hook in on_abort:  # MPICH's MPI_Abort returns under polydist run: exit handlers still run after it
        hook()
    sys.stdout.flush()
    sys.stderr.flush()
    # mpiexec exits on MPI_Abort, sometimes before forwarding the traceback just written
    # (about 1 run in 15 under load); a moment's pause lets it through.
    time.sleep(0.1)
    _mpi.mpi().COMM_WORLD.Abort(code)


