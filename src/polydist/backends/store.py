"""A TCP store for a job whose ranks already talk through another library (MPI, Horovod).

torch.distributed wants a store (``new_group``, DDP and barriers use it); jobs
launched by ``mpiexec`` or ``horovodrun`` have no MASTER_ADDR/MASTER_PORT to
meet at. Rank 0 serves one instead and announces its port through the job's
own transport: host names are gathered as fixed-size byte rows and the port
travels as a plain integer, so nothing another rank sends is unpickled.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Callable
from urllib.parse import parse_qsl, urlparse

import numpy as np
import torch.distributed as dist

from .._hosts import host_names, host_row
from .._torch import loopback_store_server

__all__ = ["check_requested", "serve_store"]


def check_requested(url: str, rank: int, size: int, scheme: str, source: str, launcher: str) -> None:
    """Raise ``ValueError`` when the init method's URL asks for another rank or world size than the job has.

    torch appends the ``rank``/``world_size`` given to ``init_process_group``
    to the URL (``-1``: not given).
    """
    asked = dict(parse_qsl(urlparse(url).query))
    for key, mine in (("rank", rank), ("world_size", size)):
        if key in asked and int(asked[key]) not in (-1, mine):
            raise ValueError(
                f"{scheme}:// rendezvous: {key}={asked[key]} was requested but {source} has {key}={mine}; "
                f"under {launcher} leave rank and world_size to it"
            )


def serve_store(
    rank: int,
    size: int,
    timeout: timedelta,
    all_gather_rows: Callable[[np.ndarray], np.ndarray],
    broadcast_port: Callable[[int], int],
    scheme: str,
) -> "dist.TCPStore":
    """Rank 0's TCP store, reached by every rank of the job.

    Args:
        rank, size: this process's rank and the world size, from the job's transport.
        timeout: how long the store waits for a rank.
        all_gather_rows: gathers every rank's ``HOST_BYTES`` uint8 row (``[size, HOST_BYTES]``, rank order).
        broadcast_port: rank 0's integer to every rank.
        scheme: the init method's name, for error messages (``"mpi"``, ``"horovod"``).

    The store listens on loopback when every rank is on one host, else on
    every interface of rank 0's host (its fully qualified name). It returns
    on every rank only once every rank has connected: rank 0's store does not
    wait for the others (it must exist before its port is announced), and a
    rank 0 that went on alone could finish its program and take the store
    with it while a slow rank was still connecting, leaving that rank retrying
    for the whole timeout (``spawn("horovod", fn, nproc_per_node=4)`` with an
    ``fn`` that does not communicate).

    Raises:
        ValueError: rank 0 announced a port outside 1..65535 (a corrupt or hostile value).
    """
    hosts = host_names(all_gather_rows(host_row(socket.gethostname())))
    host = "127.0.0.1" if len(set(hosts)) == 1 else socket.getfqdn(hosts[0])
    store = None
    if rank == 0 and host == "127.0.0.1":  # one host: listen on loopback only
        store = loopback_store_server(size, timeout)
    elif rank == 0:
        store = dist.TCPStore(host, 0, size, is_master=True, timeout=timeout, wait_for_workers=False)
    port = broadcast_port(store.port if store is not None else 0)
    if not 0 < port < 65536:
        raise ValueError(f"{scheme}:// rendezvous: rank 0 announced an invalid store port {port}")
    if store is None:
        store = dist.TCPStore(host, port, size, is_master=False, timeout=timeout)
    all_gather_rows(host_row(socket.gethostname()))  # a barrier: every rank has connected to the store
    return store
