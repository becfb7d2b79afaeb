"""Making the default process group from :func:`polydist.rendezvous.group_kwargs`, and what follows at once."""

from __future__ import annotations

import os
import socket
import warnings
from datetime import timedelta
from typing import Optional

import torch.distributed as dist

from . import _torch
from .backends import registry
from .launch.environment import ProcessInfo
from .rendezvous import JOIN_TIMEOUT_FLOOR

__all__ = ["create"]


def _warn_if_gloo_offers_loopback(backend: str, info: ProcessInfo) -> None:
    """Warn before a multi-node gloo job that would fail after a long wait with "Connection refused".

    gloo offers the other ranks the address this host name resolves to; on
    Debian (127.0.1.1) and in many containers that is loopback, which ranks
    on other hosts cannot reach. Only a warning: nodes may share one host.
    """
    if (not registry.get(backend).lifecycle.offers_host_address or (info.nnodes or 1) < 2
            or os.environ.get("GLOO_SOCKET_IFNAME")):
        return
    master = info.master_addr or ""
    try:
        mine = socket.gethostbyname(socket.gethostname())
        if not mine.startswith("127.") or socket.gethostbyname(master).startswith("127."):
            return
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # no packet: just the route's source
            probe.connect((master, info.master_port or 1))
            route = probe.getsockname()[0]
    except OSError:
        return
    warnings.warn(
        f"host name {socket.gethostname()!r} resolves to loopback {mine}, so gloo would offer the other nodes an "
        f"address they cannot reach; set GLOO_SOCKET_IFNAME to the interface that reaches {master} "
        f"(the one with address {route})",
        RuntimeWarning,
        stacklevel=3,
    )


creating = False  # inside create()'s init_process_group


def create(group_kwargs: dict, info: ProcessInfo) -> Optional[timedelta]:
    """Create the default group from :func:`polydist.rendezvous.group_kwargs`; return the collective timeout it
    applied. Then the lifecycle of each backend whose rendezvous the ranks met by (or that gave them their ranks)
    runs its :meth:`~polydist.backends.registry.Lifecycle.after_join`."""
    td = group_kwargs.pop("_collective_timeout", None)
    at = group_kwargs.pop("_store", None)
    if at is not None:
        group_kwargs["store"] = at.open(group_kwargs["rank"], group_kwargs["world_size"],
                                        group_kwargs.get("timeout", JOIN_TIMEOUT_FLOOR))
    _warn_if_gloo_offers_loopback(group_kwargs["backend"], info)
    global creating
    creating = True  # polydist's own group: not one to adopt as the program's (polydist._wiring)
    try:
        dist.init_process_group(**group_kwargs)
    finally:
        creating = False
    if td is not None and td != group_kwargs["timeout"]:
        _torch.set_default_timeout(td)  # joined with the floor; collectives wait td
    entry = registry.get(group_kwargs["backend"])
    by_url = registry.by_init_url(group_kwargs.get("init_method"))
    joined = {by_url, entry if entry.lifecycle.ranks_from_backend else None}
    for met in joined - {None}:
        met.lifecycle.after_join()  # MPI's: collectives without a timeout, so an uncaught exception must end the job
    return td
