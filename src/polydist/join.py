"""How a process joins a world: the backend, the rendezvous, the timeout, and the node layout.

:func:`polydist.initialize` asks :func:`group_kwargs` what to pass to
``torch.distributed.init_process_group`` — the only place where the
launcher's environment decides anything, so contradictory variables raise
here — and :func:`create` makes the group. The layout functions say which
node each rank is on, from the launcher's variables or, failing that, by
gathering host names.
"""

from __future__ import annotations

import os
import socket
import warnings
from datetime import timedelta
from typing import NamedTuple, Optional, Union

import torch
import torch.distributed as dist

from . import _torch, settings
from ._hosts import HOST_BYTES, host_names, host_row
from ._state import Layout
from .backends import registry
from .environment import ProcessInfo, launcher, restart_count

registry.discover()  # every backend's entry (the polydist.backends entry points), before a name is resolved

__all__ = [
    "Timeout",
    "available_backends",
    "as_timedelta",
    "resolve_backend",
    "other_name_of",
    "group_kwargs",
    "create",
    "launcher",
    "model_name_of",
    "layout_from_env",
    "layout_from_hostnames",
    "single_node_guess",
]

Timeout = Union[float, int, timedelta, None]

# Joining waits for every rank to start (seconds each, on a loaded machine), so a short
# collective timeout is applied only once the group exists (gloo and nccl can change it).
JOIN_TIMEOUT_FLOOR = timedelta(minutes=2)
SINGLE_NODE_PORT = 15000  # ignite.distributed's default when RANK/WORLD_SIZE come without MASTER_ADDR/MASTER_PORT


def as_timedelta(timeout: Timeout) -> Optional[timedelta]:
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


def resolve_backend(name: Optional[str]) -> str:
    if name is None:
        name = settings.BACKEND.read()
    if name is None:
        return registry.default_name()
    if not isinstance(name, str):
        raise TypeError(f"backend must be a string such as {registry.GLOO.name!r} or {registry.NCCL.name!r}, got {name!r}")
    lowered = name.lower()
    entry = registry.get(lowered)
    resolved = entry.resolve(name) if entry.resolve is not None else lowered  # may register it, or raise
    if resolved not in {b.lower() for b in dist.Backend.backend_list}:
        raise ValueError(  # "Backend should be one of": ignite.distributed's words, which its users match
            f"Unknown backend {name!r}. Available backends: {', '.join(available_backends())} (Backend should be one "
            "of these; another must be installed and registered with torch.distributed.Backend.register_backend)"
        )
    if not entry.device_visible():
        raise ValueError(f"backend {lowered!r} needs {entry.device.upper()} devices, and none is visible to this process")
    return resolved


def other_name_of(name: str) -> str:
    """The backend a group asked for as ``name`` has, as far as its entry says without raising (idist's "xla": "xla-tpu")."""
    entry = registry.get(name.lower())
    try:
        return entry.resolve(name) if entry.resolve is not None else name.lower()
    except ValueError:  # not installed: no group of it can exist
        return name.lower()


def layout_from_env(info: ProcessInfo) -> Optional[Layout]:
    """The node layout the launcher exported, if complete and about this group."""
    if info.launcher == "serial" or dist.get_rank() != info.rank or dist.get_world_size() != info.world_size:
        return None
    fields = (info.local_rank, info.local_world_size, info.nnodes, info.node_rank)
    if any(f is None for f in fields):
        return None
    return Layout(*fields)  # type: ignore[arg-type]


def comm_device(backend_name: Optional[str]) -> torch.device:
    """The device a group of backend ``backend_name`` communicates on: where its byte buffers must live.

    ``cuda:<current device>`` for nccl (which moves CUDA tensors only), else
    ``cpu``: the backend's registry entry says. :func:`polydist.device` and every group's
    :class:`~polydist.groups.Resolved` use it.
    """
    return registry.get(backend_name).comm_device()


def model_name_of(backend_name: str) -> str:
    """``polydist.model_name()`` of a world on backend ``backend_name`` ("native-dist", "horovod-dist"): its registry entry says."""
    return registry.get(backend_name).model_name


def layout_from_hostnames() -> Layout:
    """Derive the layout by gathering every rank's host name (a collective).

    Names travel as fixed-size byte rows, not through ``all_gather_object``:
    nothing another rank sends is unpickled.
    """
    dev = comm_device(str(dist.get_backend()))
    every = torch.empty(dist.get_world_size() * HOST_BYTES, dtype=torch.uint8, device=dev)
    _torch.all_gather_single(every, torch.from_numpy(host_row(socket.gethostname())).to(dev))
    hosts = host_names(every.cpu().numpy())
    me = hosts[dist.get_rank()]
    nodes = list(dict.fromkeys(hosts))  # in order of first appearance
    return Layout(
        local_rank=hosts[: dist.get_rank()].count(me),
        nproc_per_node=hosts.count(me),
        nnodes=len(nodes),
        node_rank=nodes.index(me),
    )


def single_node_guess() -> Layout:
    return Layout(local_rank=dist.get_rank(), nproc_per_node=dist.get_world_size(), nnodes=1, node_rank=0)


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
    name = resolve_backend(backend)
    group_kwargs: dict = dict(backend=name, **kwargs)
    if td is not None:
        settable = _torch.can_set_timeout(name)
        group_kwargs["timeout"] = max(td, JOIN_TIMEOUT_FLOOR) if settable else td
        group_kwargs["_collective_timeout"] = td
    entry = registry.get(name)
    host = registry.rendezvous_for(entry, info) if init_method is None else None
    if host is not None:  # rank and world size come from that backend's job (MPI, horovodrun)
        if host.check_join is not None:
            host.check_join(info, (backend or name).lower())  # before it starts: a world of one under torchrun
        init_method = host.init_url
    defaulted = init_method == "env://" and not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"))
    if defaulted:  # idist's env:// defaults MASTER_ADDR/MASTER_PORT; torch's would raise: the chain below picks
        init_method = None
    if init_method is not None:
        group_kwargs["init_method"] = init_method
    if entry.ranks_from_backend or registry.by_init_url(init_method) is not None:
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


def _warn_if_gloo_offers_loopback(backend: str, info: ProcessInfo) -> None:
    """Warn before a multi-node gloo job that would fail after a long wait with "Connection refused".

    gloo offers the other ranks the address this host name resolves to; on
    Debian (127.0.1.1) and in many containers that is loopback, which ranks
    on other hosts cannot reach. Only a warning: nodes may share one host.
    """
    if not registry.get(backend).offers_host_address or (info.nnodes or 1) < 2 or os.environ.get("GLOO_SOCKET_IFNAME"):
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


def create(group_kwargs: dict, info: ProcessInfo) -> Optional[timedelta]:
    """Create the default group from :func:`group_kwargs`; return the collective timeout it applied."""
    td = group_kwargs.pop("_collective_timeout", None)
    at = group_kwargs.pop("_store", None)
    if at is not None:
        group_kwargs["store"] = at.open(group_kwargs["rank"], group_kwargs["world_size"],
                                        group_kwargs.get("timeout", JOIN_TIMEOUT_FLOOR))
    _warn_if_gloo_offers_loopback(group_kwargs["backend"], info)
    dist.init_process_group(**group_kwargs)
    if td is not None and td != group_kwargs["timeout"]:
        _torch.set_default_timeout(td)  # joined with the floor; collectives wait td
    entry = registry.get(group_kwargs["backend"])
    joined = {registry.by_init_url(group_kwargs.get("init_method")), entry if entry.ranks_from_backend else None}
    for hook in {e.after_join for e in joined if e is not None and e.after_join is not None}:
        hook()  # MPI's: collectives without a timeout, so an uncaught exception must end the job
    return td


def available_backends() -> tuple[str, ...]:
    """Backends usable in this process: built into this PyTorch and, for nccl, with CUDA visible."""
    return registry.available_names()
