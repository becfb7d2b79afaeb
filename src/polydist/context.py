"""The current process's distributed context: backend, ranks and node layout.

There is one process-wide context. It exists after :func:`initialize`, or is
adopted implicitly from a process group the user created with
``torch.distributed.init_process_group``. Without either the process is
serial: world size 1, rank 0, and every collective returns its input's value.
polydist never writes environment variables, so :func:`finalize` has nothing
of the user's to undo.
"""

from __future__ import annotations

import atexit
import os
import socket
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional, Union

import torch
import torch.distributed as dist

from .backends import mpi4py as mpi4py_backend
from .backends import mpi_job
from .environment import ProcessInfo, detect
from .errors import NotInitializedError

__all__ = [
    "initialize",
    "finalize",
    "is_initialized",
    "get_rank",
    "get_world_size",
    "get_local_rank",
    "get_nproc_per_node",
    "get_nnodes",
    "get_node_rank",
    "is_main_process",
    "backend",
    "device",
    "hostname",
    "available_backends",
    "show_config",
]

Timeout = Union[float, int, timedelta, None]

TIMEOUT_ENV = "POLYDIST_TIMEOUT"  # seconds; exported by ``polydist run --timeout``
# Joining waits for every rank to start (seconds each, on a loaded machine), so a short
# collective timeout is applied only once the group exists (gloo and nccl can change it).
_JOIN_TIMEOUT_FLOOR = timedelta(minutes=2)
_collective_timeout: Optional[timedelta] = None


@dataclass(frozen=True)
class _Layout:
    """Node layout of the job, as seen from this process."""

    local_rank: int
    nproc_per_node: int
    nnodes: int
    node_rank: int


@dataclass
class _Context:
    owns_group: bool  # polydist created the default group, so finalize() destroys it
    layout: _Layout


_ctx: Optional[_Context] = None


# ---------------------------------------------------------------- set-up


def _as_timedelta(timeout: Timeout) -> Optional[timedelta]:
    if timeout is None:
        text = os.environ.get(TIMEOUT_ENV, "").strip()
        if not text:
            return None
        try:
            seconds = float(text)
        except ValueError:
            seconds = 0.0
        if not 0 < seconds < float("inf"):
            raise ValueError(f"${TIMEOUT_ENV} must be a positive number of seconds, got {text!r}")
        return timedelta(seconds=seconds)
    if isinstance(timeout, timedelta):
        if timeout <= timedelta(0):
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be a positive number of seconds or a timedelta, got {timeout!r}")
    return timedelta(seconds=float(timeout))


def collective_timeout() -> Optional[timedelta]:
    """The collective timeout :func:`initialize` applied (None: PyTorch's default); subgroups get it too."""
    return _collective_timeout


def _resolve_backend(name: Optional[str]) -> str:
    if name is None:
        name = os.environ.get("POLYDIST_BACKEND") or None
    if name is None:
        cuda = torch.cuda.is_available() and dist.is_nccl_available()
        return "nccl" if cuda else "gloo"
    if not isinstance(name, str):
        raise TypeError(f"backend must be a string such as 'gloo' or 'nccl', got {name!r}")
    lowered = name.lower()
    known = {b.lower() for b in dist.Backend.backend_list} | {"mpi"}
    if lowered not in known:
        raise ValueError(f"unknown backend {name!r}; available here: {', '.join(available_backends())}")
    if lowered == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs CUDA devices, and none is visible to this process")
    if lowered == "mpi" and not dist.is_mpi_available():
        if not mpi4py_backend.register():
            raise ValueError(
                "backend 'mpi' needs PyTorch built with MPI or the mpi4py package: pip install mpi4py mpich"
            )
        return mpi4py_backend.BACKEND_NAME  # stock wheels: MPI through mpi4py
    return lowered


def _layout_from_env(info: ProcessInfo) -> Optional[_Layout]:
    """The node layout the launcher exported, if complete and about this group."""
    if info.launcher == "serial" or dist.get_rank() != info.rank or dist.get_world_size() != info.world_size:
        return None
    fields = (info.local_rank, info.local_world_size, info.nnodes, info.node_rank)
    if any(f is None for f in fields):
        return None
    return _Layout(*fields)  # type: ignore[arg-type]


def _layout_from_hostnames() -> _Layout:
    """Derive the layout by gathering every rank's host name (a collective)."""
    hosts: list = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, hostname())
    me = hosts[dist.get_rank()]
    nodes = list(dict.fromkeys(hosts))  # in order of first appearance
    return _Layout(
        local_rank=hosts[: dist.get_rank()].count(me),
        nproc_per_node=hosts.count(me),
        nnodes=len(nodes),
        node_rank=nodes.index(me),
    )


def _single_node_guess() -> _Layout:
    return _Layout(local_rank=dist.get_rank(), nproc_per_node=dist.get_world_size(), nnodes=1, node_rank=0)


def initialize(
    backend: Optional[str] = None,
    *,
    init_method: Optional[str] = None,
    timeout: Timeout = None,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    **kwargs: Any,
) -> None:
    """Join the distributed job, or stay serial when there is none.

    Args:
        backend: "gloo", "nccl", "mpi" or any backend registered with
            ``torch.distributed.Backend.register_backend`` (any case). ``None``
            takes ``$POLYDIST_BACKEND`` (set by ``polydist run --backend``), else
            "nccl" when CUDA is visible, else "gloo".
        init_method: a ``torch.distributed`` init method URL (``env://``,
            ``tcp://host:port``, ``file:///path``). ``None`` uses ``env://``
            when a launcher exported ``MASTER_ADDR``/``MASTER_PORT``.
        timeout: collective timeout, seconds (float) or ``timedelta``: how
            long a collective waits for the other ranks before raising
            :class:`~polydist.CollectiveTimeoutError`, which names the ranks
            that did not arrive (see :mod:`polydist.timeouts`). Applies to the
            world and to the groups polydist creates. ``None`` takes
            ``$POLYDIST_TIMEOUT`` (seconds, set by ``polydist run --timeout``),
            else PyTorch's default (30 min on gloo, 10 min on nccl). On gloo
            and nccl, joining the group waits at least 2 min whatever the
            timeout, so slow-starting ranks do not fail the rendezvous. MPI
            collectives have no timeout (the MPI standard has none): on the
            ``mpi`` backend a rank that raises ends the job with
            ``MPI_Abort`` and a rank that dies is ended by ``mpiexec``.
        rank, world_size: override what the launcher exported.
        **kwargs: passed on to ``torch.distributed.init_process_group``.

    Behaviour:
        * A process group that already exists (the user called
          ``init_process_group``) is adopted as it is; ``finalize`` then leaves
          it alone.
        * With no launcher, no ``backend``, no ``rank``/``world_size`` and no
          ``init_method``, the process stays serial (nothing is created).
        * ``initialize("gloo")`` in a plain ``python`` process creates a
          world-size-1 group, so DDP code can run unchanged.
        * With ``nccl`` the current CUDA device is set to the local rank.
        * Environment variables are read, never written.

    Raises:
        ValueError: unknown or unavailable ``backend``; a backend different
            from that of an existing group; a bad ``timeout`` or
            ``$POLYDIST_TIMEOUT``; ``world_size``
            > 1 with no way to rendezvous (no ``init_method``, no
            ``MASTER_ADDR``/``MASTER_PORT``).
    """
    global _ctx
    td = _as_timedelta(timeout)
    if dist.is_initialized():
        current = dist.get_backend()
        if backend is not None and backend.lower() != str(current).lower():
            raise ValueError(f"a process group with backend {current!r} already exists; cannot initialize {backend!r}")
        if _ctx is None:
            _ctx = _Context(owns_group=False, layout=_layout_from_env(detect()) or _layout_from_hostnames())
        return

    info = detect()
    explicit = backend is not None or init_method is not None or rank is not None or world_size is not None
    if not explicit and not info.is_distributed and not os.environ.get("POLYDIST_BACKEND"):
        return  # serial: no launcher, nothing asked for
    name = _resolve_backend(backend)
    group_kwargs: dict = dict(backend=name, **kwargs)
    if td is not None:
        settable = name in ("gloo", "nccl") and hasattr(dist.distributed_c10d, "_set_pg_timeout")
        group_kwargs["timeout"] = max(td, _JOIN_TIMEOUT_FLOOR) if settable else td
        group_kwargs["_collective_timeout"] = td
    if init_method is None and _meets_through_mpi(name, info):
        init_method = "mpi://"  # rank and world size come from MPI itself
    if init_method is not None:
        group_kwargs["init_method"] = init_method
    if name == "mpi" or init_method == "mpi://":
        if rank is not None or world_size is not None:
            group_kwargs.update(rank=-1 if rank is None else rank, world_size=-1 if world_size is None else world_size)
        _init(group_kwargs, info)
        return
    rank = info.rank if rank is None else rank
    world_size = info.world_size if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is outside world_size={world_size}")
    group_kwargs.update(rank=rank, world_size=world_size)
    if init_method is not None:
        pass
    elif info.master_addr and info.master_port:
        exported = os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")
        # env:// when the launcher exported the address (torchrun's agent may already host the
        # store there); tcp:// when detection derived it (Slurm: first host of the node list).
        group_kwargs["init_method"] = "env://" if exported else f"tcp://{info.master_addr}:{info.master_port}"
    elif world_size == 1:
        group_kwargs["store"] = dist.HashStore()  # nothing to meet: no port, no file
    else:
        raise ValueError(
            f"world_size={world_size} but no way to rendezvous: pass init_method "
            "(e.g. 'tcp://HOST:PORT') or launch with polydist run / torchrun, which set MASTER_ADDR/MASTER_PORT"
        )
    if name == "nccl" and info.local_rank is not None:
        torch.cuda.set_device(info.local_rank)
    _init(group_kwargs, info)


def _meets_through_mpi(name: str, info: ProcessInfo) -> bool:
    """Rendezvous over MPI: the mpi4py backend, or any backend in an MPI job (also srun --mpi) without MASTER_ADDR."""
    if name == mpi4py_backend.BACKEND_NAME:
        return True
    return info.mpi_flavor is not None and not info.master_addr and mpi4py_backend.register()


def _warn_if_gloo_offers_loopback(backend: str, info: ProcessInfo) -> None:
    """Warn before a multi-node gloo job that would fail after a long wait with "Connection refused".

    gloo offers the other ranks the address this host name resolves to; on
    Debian (127.0.1.1) and in many containers that is loopback, which ranks
    on other hosts cannot reach. Only a warning: nodes may share one host.
    """
    if backend != "gloo" or (info.nnodes or 1) < 2 or os.environ.get("GLOO_SOCKET_IFNAME"):
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


def _init(group_kwargs: dict, info: ProcessInfo) -> None:
    global _ctx, _collective_timeout
    td = group_kwargs.pop("_collective_timeout", None)
    _warn_if_gloo_offers_loopback(group_kwargs["backend"], info)
    dist.init_process_group(**group_kwargs)
    if td is not None and td != group_kwargs["timeout"]:
        dist.distributed_c10d._set_pg_timeout(td)  # joined with the floor; collectives wait td
    _collective_timeout = td
    if group_kwargs.get("init_method") == "mpi://" or group_kwargs["backend"] == "mpi":
        # MPI collectives have no timeout: an uncaught exception must end the job.
        mpi_job.install_abort_hook()
    _ctx = _Context(owns_group=True, layout=_layout_from_env(info) or _layout_from_hostnames())
    atexit.unregister(_finalize_at_exit)  # once, however often the job is re-initialized
    atexit.register(_finalize_at_exit)


def _finalize_at_exit() -> None:
    """Destroy the group polydist created if the program did not call :func:`finalize`.

    PyTorch 2.13 with gloo often aborts at interpreter exit when the default
    group is still alive ("terminate called without an active exception",
    SIGABRT), which a launcher then reports as a failed rank.
    """
    if _ctx is not None and _ctx.owns_group:
        finalize()


def finalize() -> None:
    """Leave the job: destroy the process group polydist created.

    A group the user created and polydist adopted is left as it is. Cached
    subgroups are forgotten. Environment variables are never touched. Calling
    it when serial or twice is harmless.
    """
    global _ctx, _collective_timeout
    from . import _common, debug, groups, timeouts  # they build on context; import here to keep the layering one-way

    groups.clear_cache()
    debug.reset()
    timeouts.reset()
    _common.release_scratch()
    if _ctx is not None and _ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()
    _ctx = None
    _collective_timeout = None


# ---------------------------------------------------------------- state


def _context() -> Optional[_Context]:
    """The live context, adopting a user-made group on first sight."""
    global _ctx
    if not (dist.is_available() and dist.is_initialized()):
        _ctx = None  # the group was destroyed behind our back
        return None
    if _ctx is None:
        # Implicit adoption may happen on one rank only, so no collective here.
        _ctx = _Context(owns_group=False, layout=_layout_from_env(detect()) or _single_node_guess())
    return _ctx


def is_initialized() -> bool:
    """True when a process group exists (created by polydist or adopted)."""
    return _context() is not None


def require_group() -> bool:
    """For collectives: True when distributed, False when serial.

    Raises:
        NotInitializedError: a launcher started several processes but no
            process group exists yet (serial results would be wrong).
    """
    if _context() is not None:
        return True
    info = detect()
    if info.is_distributed:
        raise NotInitializedError(
            f"this process is rank {info.rank} of {info.world_size} (launched by {info.launcher}) "
            "but no process group exists: call polydist.initialize() first"
        )
    return False


# ---------------------------------------------------------------- queries


def get_rank() -> int:
    """Global rank of this process: the group's, else the launcher's, else 0."""
    return dist.get_rank() if _context() is not None else detect().rank


def get_world_size() -> int:
    """Number of processes in the job: the group's, else the launcher's, else 1."""
    return dist.get_world_size() if _context() is not None else detect().world_size


def _layout() -> _Layout:
    ctx = _context()
    if ctx is not None:
        return ctx.layout
    info = detect()
    return _Layout(
        local_rank=info.local_rank if info.local_rank is not None else info.rank,
        nproc_per_node=info.local_world_size if info.local_world_size is not None else info.world_size,
        nnodes=info.nnodes if info.nnodes is not None else 1,
        node_rank=info.node_rank if info.node_rank is not None else 0,
    )


def get_local_rank() -> int:
    """Rank of this process among the processes on its node (0 when serial)."""
    return _layout().local_rank


def get_nproc_per_node() -> int:
    """Number of processes on this process's node (1 when serial)."""
    return _layout().nproc_per_node


def get_nnodes() -> int:
    """Number of nodes (hosts) in the job (1 when serial)."""
    return _layout().nnodes


def get_node_rank() -> int:
    """Index of this process's node, 0 ≤ node rank < nnodes (0 when serial)."""
    return _layout().node_rank


def is_main_process() -> bool:
    """True on global rank 0."""
    return get_rank() == 0


def backend() -> Optional[str]:
    """Backend name of the default process group ("gloo", "nccl", ...), or None when serial."""
    return str(dist.get_backend()) if _context() is not None else None


def device() -> torch.device:
    """The device this rank computes on.

    ``cuda:<local rank>`` with the nccl backend; ``cpu`` with gloo, mpi and
    other CPU backends; when serial, ``cuda`` if a GPU is visible, else ``cpu``.
    """
    name = backend()
    if name == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    if name is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def hostname() -> str:
    """This machine's host name (``socket.gethostname()``)."""
    return socket.gethostname()


def available_backends() -> tuple[str, ...]:
    """Backends usable in this process: built into this PyTorch and, for nccl, with CUDA visible."""
    names = []
    if dist.is_gloo_available():
        names.append("gloo")
    if dist.is_nccl_available() and torch.cuda.is_available():
        names.append("nccl")
    if dist.is_mpi_available():
        names.append("mpi")
    builtin = {"gloo", "nccl", "mpi", "ucc", "xccl", "undefined", "fake"}
    names.extend(b for b in dist.Backend.backend_list if b not in builtin and b not in names)
    return tuple(names)


def show_config() -> dict:
    """Print the distributed configuration of this process and return it as a dict."""
    config = {
        "backend": backend(),
        "device": str(device()),
        "hostname": hostname(),
        "world_size": get_world_size(),
        "rank": get_rank(),
        "local_rank": get_local_rank(),
        "nproc_per_node": get_nproc_per_node(),
        "nnodes": get_nnodes(),
        "node_rank": get_node_rank(),
        "launcher": detect().launcher,
        "available_backends": list(available_backends()),
    }
    width = max(map(len, config))
    print("\n".join(f"{key:<{width}} : {value}" for key, value in config.items()), flush=True)
    return config
