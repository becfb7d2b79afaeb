"""What an MPI job needs besides the process group: the ``mpi://`` rendezvous and abort on failure.

``mpi://`` lets any backend (``mpi4py``, and gloo under ``mpiexec``) start
without MASTER_ADDR/MASTER_PORT: rank and world size come from
``COMM_WORLD``, and rank 0's TCP store port travels over MPI. MPI collectives
have no timeout, so :func:`install_abort_hook` turns an uncaught exception on
one rank into ``MPI_Abort`` of the whole job instead of a hang.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from datetime import timedelta
from typing import Any, Iterator
from urllib.parse import parse_qsl, urlparse

import numpy as np
import torch.distributed as dist

from ..._state import HOST_BYTES, host_names, host_row
from ..._torch import loopback_store_server
from ...settings import FAILURE_DIR
from . import _mpi

__all__ = ["rendezvous", "install_abort_hook", "fail", "record_failure", "abort"]


def _rendezvous_address(comm: Any) -> str:
    """Where rank 0's store listens: loopback when the job is on one host, else rank 0's host name.

    Host names travel as fixed-size byte buffers, not through mpi4py's
    pickle-based lowercase calls: nothing another rank sends is unpickled.
    """
    every = np.empty((comm.Get_size(), HOST_BYTES), dtype=np.uint8)
    comm.Allgather(host_row(socket.gethostname()), every)
    hosts = host_names(every)
    return "127.0.0.1" if len(set(hosts)) == 1 else socket.getfqdn(hosts[0])


def rendezvous(url: str, timeout: timedelta = timedelta(minutes=10), **kwargs: Any) -> Iterator[tuple]:
    """The ``mpi://`` init method: rank and world size from ``COMM_WORLD``, a TCP store on rank 0.

    No MASTER_ADDR/MASTER_PORT needed: rank 0 binds a free port and broadcasts
    it over MPI. Any backend can use it (gloo under mpiexec too).
    """
    comm = _mpi.mpi().COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    asked = dict(parse_qsl(urlparse(url).query))  # torch adds the rank/world_size it was given
    for key, mine in (("rank", rank), ("world_size", size)):
        if key in asked and int(asked[key]) not in (-1, mine):
            raise ValueError(
                f"mpi:// rendezvous: {key}={asked[key]} was requested but MPI's COMM_WORLD has {key}={mine}; "
                "under mpiexec leave rank and world_size to MPI"
            )
    host = _rendezvous_address(comm)
    store = None
    if rank == 0 and host == "127.0.0.1":  # one host: listen on loopback only
        store = loopback_store_server(size, timeout)
    elif rank == 0:
        store = dist.TCPStore(host, 0, size, is_master=True, timeout=timeout, wait_for_workers=False)
    announced = np.array([store.port if store is not None else 0], dtype=np.int64)
    comm.Bcast(announced, root=0)  # a plain integer buffer, not a pickle
    port = int(announced[0])
    if not 0 < port < 65536:
        raise ValueError(f"mpi:// rendezvous: rank 0 announced an invalid store port {port}")
    if store is None:
        store = dist.TCPStore(host, port, size, is_master=False, timeout=timeout)
    yield (store, rank, size)
    raise RuntimeError("the mpi:// rendezvous cannot be repeated (e.g. to restart a job); start a new mpiexec")


def install_abort_hook() -> None:
    """Make an uncaught exception on this rank print its traceback and abort the whole MPI job.

    Without it, the other ranks would wait forever in their next collective
    (MPI has no timeout). The hook replaces whatever hook was set (PyTorch's
    prints "[rankN]:" prefixes, which ``polydist run`` already adds): it
    prints a line naming the rank, the traceback, and calls ``MPI_Abort``.
    Idempotent; does nothing without mpi4py.
    """
    if not _mpi.available() or getattr(sys.excepthook, "_polydist_abort", False):
        return

    def hook(kind: Any, value: Any, tb: Any) -> None:
        rank = _mpi.mpi().COMM_WORLD.Get_rank()
        text = "".join(traceback.format_exception(kind, value, tb))
        sys.stderr.write(f"polydist: rank {rank} raised an uncaught exception; aborting the MPI job\n{text}")
        fail(rank, value, text, 1)

    hook._polydist_abort = True  # type: ignore[attr-defined]
    sys.excepthook = hook


# Called as hook(exc) before MPI_Abort ends the job, by the layers above this one:
# polydist.trace.dump writes this rank's flight-recorder dump, polydist run's worker
# asks the other ranks of the node for theirs.
before_abort: list = []


def fail(rank: int, exc: BaseException, text: str, code: int) -> None:
    """End the MPI job for ``exc`` on this rank: its traceback for ``polydist run``, the hooks, ``MPI_Abort``."""
    record_failure(rank, text)
    for hook in before_abort:
        hook(exc)
    abort(code)


def record_failure(rank: int, text: str) -> None:
    """Leave this rank's traceback where ``polydist run`` looks for it (``$POLYDIST_FAILURE_DIR``)."""
    folder = FAILURE_DIR.read()
    if folder and os.path.isdir(folder):
        with open(os.path.join(folder, f"rank{rank}.txt"), "w", encoding="utf-8") as f:
            f.write(text)


def abort(code: int) -> None:
    """Flush this rank's output and end every rank of the MPI job with ``code`` (``MPI_Abort``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    # mpiexec exits on MPI_Abort, sometimes before forwarding the traceback just written
    # (about 1 run in 15 under load); a moment's pause lets it through.
    time.sleep(0.1)
    _mpi.mpi().COMM_WORLD.Abort(code)


