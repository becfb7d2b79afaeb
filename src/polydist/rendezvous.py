"""How the ranks of a new world meet: the arguments of ``init_process_group`` and the store they meet at.

:func:`polydist.initialize` asks :func:`group_kwargs` what to pass to
``torch.distributed.init_process_group`` — the only place where the
launcher's environment decides anything, so contradictory variables raise
here; :mod:`polydist.default_group` then makes the group.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import NamedTuple, Optional, Union

import torch
import torch.distributed as dist

from . import _torch, settings
from .backends import registry
from .launch.environment import ProcessInfo, restart_count

__all__ = ["Timeout", "as_timedelta", "group_kwargs", "JOIN_TIMEOUT_FLOOR", "SINGLE_NODE_PORT"]

Timeout = Union[float, int, timedelta, None]

# Joining waits for every rank to start (seconds each, on a loaded machine), so a short
# collective timeout is applied only once the group exists (gloo and nccl can change it).
JOIN_TIMEOUT_FLOOR = timedelta(minutes=2)
SINGLE_NODE_PORT = 15000  # ignite.distributed's default when RANK/WORLD_SIZE come without MASTER_ADDR/MASTER_PORT


def as_timedelta(timeout: Timeout) -> Optional[timedelta]:
    """The collective timeout ``initialize(timeout=...)`` asks for (None: ``POLYDIST_TIMEOUT``, else none).

    Raises ``ValueError`` naming a value that is not a positive finite number of seconds or timedelta.
    """
    if timeout is None:
        seconds = settings.TIMEOUT.read()
        return None if seconds is None else timedelta(seconds=seconds)
    if isinstance(timeout, timedelta):
        if timeout <= timedelta(0):
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be a positive number of seconds or a timedelta, got {timeout!r}")
    return timedelta(seconds=float(timeout))


def group_kwargs(
    backend: Optional[str],
    init_method: Optional[str],
    td: Optional[timedelta],
    rank: Optional[int],
    world_size: Optional[int],
    kwargs: dict,
    info: ProcessInfo,
) -> Optional[dict]:
    """The arguments of ``init_process_group`` for :func:`polydist.initialize`; None: stay serial.

    ``td`` is the collective timeout; it rides along as ``_collective_timeout``
    for :func:`create`. Raises ``ValueError`` as documented by ``initialize``.
    """
    explicit = backend is not None or init_method is not None or rank is not None or world_size is not None
    if not explicit and not info.is_distributed and not settings.BACKEND.read():
        return None  # serial: no launcher, nothing asked for
    name = registry.resolve(backend)
    group_kwargs: dict = dict(backend=name, **kwargs)
    if td is not None:
        settable = registry.timeout_settable(name)
        group_kwargs["timeout"] = max(td, JOIN_TIMEOUT_FLOOR) if settable else td
        group_kwargs["_collective_timeout"] = td
    entry = registry.get(name)
    host = registry.rendezvous_for(entry, info) if init_method is None else None
    if host is not None:  # rank and world size come from that backend's job (MPI, horovodrun)
        host.lifecycle.check_join(info, (backend or name).lower())  # before it starts: a world of one under torchrun
        init_method = host.lifecycle.init_url
    defaulted = init_method == "env://" and not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"))
    if defaulted:  # idist's env:// defaults MASTER_ADDR/MASTER_PORT; torch's would raise: the chain below picks
        init_method = None
    if init_method is not None:
        group_kwargs["init_method"] = init_method
    if entry.lifecycle.ranks_from_backend or registry.by_init_url(init_method) is not None:
        if rank is not None or world_size is not None:
            group_kwargs.update(rank=-1 if rank is None else rank, world_size=-1 if world_size is None else world_size)
        return group_kwargs
    launched = info.is_distributed and rank is None and world_size is None  # rank and size from a launcher
    rank = info.rank if rank is None else rank
    world_size = info.world_size if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is outside world_size={world_size}")
    group_kwargs.update(rank=rank, world_size=world_size)
    if init_method is not None:
        pass
    elif info.master_addr and info.master_port and _serves_loopback_store(info):
        # An elastic agent that does not share its store (polydist's restartable jobs) leaves rank 0
        # to serve one; torch's env:// would listen on every interface, this listens on loopback only.
        group_kwargs["_store"] = _StoreAt("127.0.0.1", info.master_port, serve=True)
    elif info.master_addr and info.master_port and (attempt := _restart_on_shared_store()):
        group_kwargs["_store"] = _StoreAt(info.master_addr, info.master_port, prefix=f"/polydist/attempt_{attempt}")
    elif info.master_addr and info.master_port:
        exported = os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")
        # env:// when the launcher exported the address (torchrun's agent may already host the
        # store there); tcp:// when detection derived it (Slurm: first host of the node list).
        group_kwargs["init_method"] = "env://" if exported else f"tcp://{info.master_addr}:{info.master_port}"
    elif world_size == 1:
        group_kwargs["store"] = dist.HashStore()  # nothing to meet: no port, no file
    elif (launched or defaulted) and (info.nnodes or 1) == 1:
        # Launched ranks (or env:// asked for) without an address to meet at, on one node: ignite.distributed's
        # default, 127.0.0.1:15000 (a fixed port, so two such jobs on one host collide, as there).
        group_kwargs["_store"] = _StoreAt("127.0.0.1", SINGLE_NODE_PORT, serve=True)
    else:
        raise ValueError(
            f"world_size={world_size} but no way to rendezvous: pass init_method "
            "(e.g. 'tcp://HOST:PORT') or launch with polydist run / torchrun, which set MASTER_ADDR/MASTER_PORT"
        )
    if entry.device == "cuda" and info.local_rank is not None:
        torch.cuda.set_device(info.local_rank)
    return group_kwargs


class _StoreAt(NamedTuple):
    """The TCP store a group meets at, when polydist rather than torch's init_method opens it.

    With ``serve``, rank 0 serves it, listening on loopback only (``host`` is
    127.0.0.1), and the others connect; else every rank connects to a store
    someone else serves. ``prefix``: its keys are under this prefix.
    """

    host: str
    port: int
    serve: bool = False
    prefix: str = ""

    def open(self, rank: int, size: int, wait: timedelta) -> "dist.Store":
        if self.serve and rank == 0:
            store = _torch.loopback_store_server(size, wait, self.port)
        else:
            store = dist.TCPStore(self.host, self.port, size, is_master=False, timeout=wait)
        return dist.PrefixStore(self.prefix, store) if self.prefix else store


def _restart_on_shared_store() -> int:
    """The restart count of a restarted elastic worker that meets on its agent's shared store (torchrun's); else 0.

    That store outlives each generation of workers, and torch's env://
    rendezvous no longer prefixes its keys by attempt, so a restarted
    generation reads its predecessors' gloo addresses and fails with
    "Connection refused" (torchrun --max-restarts, torch 2.13). polydist
    prefixes the keys by attempt, as torch did before.
    """
    return restart_count() if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" else 0


def _serves_loopback_store(info: ProcessInfo) -> bool:
    """Whether rank 0 of this elastic worker group must serve the store, at a loopback address."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "False" and info.master_addr in ("127.0.0.1", "localhost")
