"""The current process's distributed context, as the program sees it: :func:`initialize` and the queries.

Without a group the process is serial: world size 1, rank 0, and every
collective returns its input's value. Inside a live group, rank and world
size come from the group, never from environment variables; the environment
is read to create a group, and to answer queries before one exists.
polydist never writes environment variables, so :func:`finalize` has nothing
of the user's to undo. The live world's state, made here, adopted or left
(:func:`finalize`, :func:`world`, :func:`require_group`, re-exported here):
:mod:`polydist.live_world`; the end of a group polydist made:
:mod:`polydist.teardown`. ignite's other names (``model_name``, ``sync``,
...): :mod:`polydist.compat`; gloo's exit workaround: ``polydist._at_exit``.
"""

from __future__ import annotations

import socket
from typing import Any, Optional

import torch
import torch.distributed as dist

from . import _torch, default_group, live_world, rendezvous, settings
from ._state import Layout, World
from .launch.environment import ProcessInfo, detect, launcher
from .backends import registry
from .live_world import check_announced, world
from .live_world import finalize, leave, require_group  # noqa: F401 - polydist.context's names, re-exported
from .node_layout import layout_from_env, layout_from_hostnames

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
    "set_local_rank",
]

_local_rank_hint: Optional[int] = None  # set_local_rank(), for user-made groups without LOCAL_RANK

# A hook of the modules that build on this one (which therefore cannot be imported here), called with no
# argument at the end of initialize() and filled in one place, polydist._wiring.
on_initialized: list = []


# ---------------------------------------------------------------- set-up


def initialize(
    backend: Optional[str] = None,
    *,
    init_method: Optional[str] = None,
    timeout: rendezvous.Timeout = None,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    **kwargs: Any,
) -> None:
    """Join the distributed job, or stay serial when there is none.

    Args:
        backend: "gloo", "nccl", "mpi", "horovod" (under ``horovodrun``; see
            the Choosing a backend guide) or any backend registered with
            ``torch.distributed.Backend.register_backend`` (any case). ``None``
            takes ``$POLYDIST_BACKEND`` (set by ``polydist run --backend``), else
            "nccl" when CUDA is visible, else "gloo".
        init_method: a ``torch.distributed`` init method URL (``env://``,
            ``tcp://host:port``, ``file:///path``). ``None`` uses ``env://``
            when a launcher exported ``MASTER_ADDR``/``MASTER_PORT``; without
            them (``None`` or ``env://``), ranks whose launcher set
            ``RANK``/``WORLD_SIZE`` on one node meet at 127.0.0.1:15000 (rank
            0's store on loopback), as ``ignite.distributed`` does (its
            ``setup_env_vars``); ``env://`` with explicit ``rank``/``world_size``
            meets there too.
        timeout: collective timeout, seconds (float) or ``timedelta``: how
            long a collective waits for the other ranks before raising
            :class:`~polydist.CollectiveTimeoutError`, which names the ranks
            that did not arrive (see :mod:`polydist.collectives.timeouts`). Applies to the
            world and to the groups polydist creates. ``None`` takes
            ``$POLYDIST_TIMEOUT`` (seconds, set by ``polydist run --timeout``),
            else PyTorch's default (30 min on gloo, 10 min on nccl). On gloo
            and nccl, joining the group waits at least 2 min whatever the
            timeout, so slow-starting ranks do not fail the rendezvous. MPI
            itself has no collective timeout: on the ``mpi`` backend
            polydist's watchdog bounds every operation by it (it names the
            missing ranks, writes the dumps, then ``MPI_Abort``), a rank that
            raises ends the job with ``MPI_Abort`` and a rank that dies is
            ended by ``mpiexec``.
        rank: this process's rank, overriding what the launcher exported.
        world_size: the number of ranks, overriding what the launcher exported.
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
        * Under ``polydist run --fault-tolerant`` the world is the process's
          replica group (:mod:`polydist.ft`): with replica groups of one
          process (the default, and always on MPI) the process stays serial.
        * The world a launcher announced is the world you get: when it
          announced several processes, a group with another size or rank
          (``initialize("mpi")`` under torchrun, whose workers MPI would
          each make a world of one) raises rather than running apart.
          ``rank``/``world_size`` given here are taken as they are.

    Raises:
        WorldMismatchError: the group, or for MPI the group MPI would make,
            is not the world the launcher announced (its message names both,
            who said each, and what to do); no group is left behind.
        ValueError: unknown or unavailable ``backend``; a backend different
            from that of an existing group; a bad ``timeout`` or
            ``$POLYDIST_TIMEOUT``; ``world_size``
            > 1 on several nodes with no way to rendezvous (no
            ``init_method``, no ``MASTER_ADDR``/``MASTER_PORT``); backend
            "horovod" in ranks another launcher than ``horovodrun`` started.
    """
    td = rendezvous.as_timedelta(timeout)
    state = world()
    if state is not None:
        current = dist.get_backend(state.pg)
        if backend is not None and registry.resolved_name(backend) != str(current).lower():
            raise ValueError(f"a process group with backend {current!r} already exists; cannot initialize {backend!r}")
        if not state.layout_known:  # adopted: learn the layout here, where every rank calls
            state.layout, state.layout_known = layout_from_env(launcher()) or layout_from_hostnames(), True
        return

    if settings.FAULT_TOLERANT.read() and settings.FT_GROUP_SIZE.read() == 1:
        return  # polydist run --fault-tolerant: each process is a replica group of its own (polydist.ft), serial
    info = detect()
    group_kwargs = rendezvous.group_kwargs(backend, init_method, td, rank, world_size, kwargs, info)
    if group_kwargs is None:
        return  # serial: no launcher, nothing asked for
    _init(group_kwargs, info, announced=info if rank is None and world_size is None else None)


def _init(group_kwargs: dict, info: ProcessInfo, announced: Optional[ProcessInfo]) -> None:
    """Create the group; ``announced``: the launcher's world it must be (None: the caller chose rank and size)."""
    timeout = default_group.create(group_kwargs, info)
    if announced is not None:
        check_announced(announced, _torch.default_pg(), owned=True)
    layout = layout_from_env(info) or layout_from_hostnames()
    live_world.made(World(_torch.default_pg(), owns_group=True, layout=layout, timeout=timeout))
    for hook in on_initialized:  # every rank is here, so a hook may communicate
        hook()


# ---------------------------------------------------------------- queries


def is_initialized() -> bool:
    """True when a process group exists (created by polydist or adopted)."""
    return world() is not None


def get_rank() -> int:
    """Global rank of this process: the group's, else the launcher's, else 0."""
    state = world()
    return state.rank if state is not None else launcher().rank


def get_world_size() -> int:
    """Number of processes in the job: the group's, else the launcher's, else 1."""
    state = world()
    return state.size if state is not None else launcher().world_size


def _layout() -> Layout:
    state = world()
    if state is not None:
        return state.layout
    info = launcher()
    return Layout(
        local_rank=info.local_rank if info.local_rank is not None else info.rank,
        nproc_per_node=info.local_world_size if info.local_world_size is not None else info.world_size,
        nnodes=info.nnodes if info.nnodes is not None else 1,
        node_rank=info.node_rank if info.node_rank is not None else 0,
    )


def get_local_rank() -> int:
    """Rank of this process among the processes on its node (0 when serial).

    In a group the user created without a launcher's ``LOCAL_RANK``, the
    value given to :func:`set_local_rank` if any, else a single-node guess.
    """
    state = world()
    if state is not None and not state.layout_known and _local_rank_hint is not None:
        return _local_rank_hint
    return _layout().local_rank


def set_local_rank(index: int) -> None:
    """Tell polydist this process's local rank, for a group the user created without ``LOCAL_RANK`` set.

    A launcher's ``LOCAL_RANK`` still wins. Source: ``ignite.distributed.set_local_rank``.

    Raises:
        ValueError: ``index`` not a non-negative int.
    """
    global _local_rank_hint
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"set_local_rank takes a non-negative int, got {index!r}")
    _local_rank_hint = index


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
    state = world()
    return str(dist.get_backend(state.pg)) if state is not None else None


def device() -> torch.device:
    """The device this rank computes on.

    ``cuda:<local rank>`` with the nccl backend; ``xla:0`` (``torch_xla.device()``) with xla-tpu; ``cpu``
    with gloo, mpi and other CPU backends; when serial, ``cuda`` if a GPU is visible, else ``cpu``.
    """
    name = backend()
    if name is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    entry = registry.get(name)
    compute = entry.lifecycle.compute_device()
    return compute if compute is not None else entry.comm_device()


def available_backends() -> tuple[str, ...]:
    """Backends usable in this process: built into this PyTorch and, for nccl, with CUDA visible; then every
    other backend registered with ``torch.distributed.Backend.register_backend`` (polydist's ``mpi4py``, ...)."""
    return registry.available_names()


def hostname() -> str:
    """This machine's host name (``socket.gethostname()``)."""
    return socket.gethostname()


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
        "launcher": launcher().launcher,
        "available_backends": list(available_backends()),
    }
    width = max(map(len, config))
    print("\n".join(f"{key:<{width}} : {value}" for key, value in config.items()), flush=True)
    return config
