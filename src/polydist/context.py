"""The current process's distributed context: the live world's lifecycle and the queries about it.

This module owns the state of the live world (:class:`polydist._state.World`):
it is made by :func:`initialize`, or adopted from a process group the user
created with ``torch.distributed.init_process_group``, and replaced as a whole
whenever torch's default group changes identity. Without a group the process
is serial: world size 1, rank 0, and every collective returns its input's
value. Inside a live group, rank and world size come from the group, never
from environment variables; the environment is read to create a group, and
to answer queries before one exists. polydist never writes environment
variables, so :func:`finalize` has nothing of the user's to undo. ignite's
other names (``model_name``, ``sync``, ...): :mod:`polydist.compat`; gloo's
exit workaround: ``polydist._at_exit``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from . import _at_exit, _torch, default_group, rendezvous, settings
from ._state import Layout, World
from .launch.announced import check_group
from .launch.environment import ProcessInfo, detect, launcher
from .backends import registry
from .errors import NotInitializedError, WorldMismatchError
from .node_layout import layout_from_env, layout_from_hostnames, single_node_guess

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

_world: Optional[World] = None  # the live world's state; see world()
_local_rank_hint: Optional[int] = None  # set_local_rank(), for user-made groups without LOCAL_RANK


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
    global _world
    timeout = default_group.create(group_kwargs, info)
    if announced is not None:
        _check_announced(announced, _torch.default_pg(), owned=True)
    layout = layout_from_env(info) or layout_from_hostnames()
    _world = World(_torch.default_pg(), owns_group=True, layout=layout, timeout=timeout)
    _world_made()
    for hook in on_initialized:  # every rank is here, so a hook may communicate
        hook()


def _check_announced(info: ProcessInfo, pg: "dist.ProcessGroup", owned: bool) -> None:
    """Raise :class:`~polydist.errors.WorldMismatchError` if ``pg`` is not the world ``info`` announced;
    a group polydist made (``owned``) is destroyed first, so none is left behind."""
    try:
        check_group(info, str(dist.get_backend(pg)), pg.rank(), pg.size())
    except WorldMismatchError:
        if owned:
            dist.destroy_process_group()
        raise


# Hooks of the modules that build on this one (which therefore cannot be imported
# here), called with no argument and filled in one place, polydist._wiring.
# on_world_made: whenever a world is made or adopted, from any thread;
# on_initialized: at the end of initialize(); on_finalize: in finalize(), while the group lives;
# while_leaving: over and over while finalize waits for the other ranks on the store (MPI's progress); a hook
# returns whether it wants to be called again (False: finalize waits on the store alone).
on_world_made: list = []
on_initialized: list = []
on_finalize: list = []
exiting = False  # set at interpreter exit before the hooks run: a program that gets there did not finalize
while_leaving: list = []


def _world_made() -> None:
    _at_exit.arm(_leave_at_exit)
    for hook in on_world_made:
        hook()


def _leave_at_exit() -> None:
    """At exit: :func:`finalize` a group polydist created and not finalized; forget any other (``polydist._at_exit``).

    Without waiting for the other ranks: the process may be ending for an
    error, and its peers, waiting in a collective with it, must see it go.
    """
    global _world, exiting
    exiting = True
    if _world is not None and _world.owns_group:
        leave(wait=False)
    _world = None


def finalize() -> None:
    """Leave the job: wait until every rank has called it, then destroy the process group polydist created.

    A rank that finishes first must not tear the world down under ranks still
    communicating: Horovod's shutdown ends every rank's Horovod (a subgroup's
    all_reduce on the others then fails with "Horovod has been shut down"), and
    the rank that serves the job's TCP store takes the store with it. So, in a
    world of several ranks that polydist created, each rank waits here, on the
    store (not on the transport, which may be busy), for every rank to arrive,
    at most the world's collective timeout; past it, a warning on stderr and the
    group is destroyed anyway. Every rank must therefore call it (as
    ``spawn`` and ``Parallel`` do when the function returns); the exit of a
    process that did not (an error) does not wait, but counts itself out, so
    that the ranks waiting here go on at once instead of waiting out the timeout.

    A group the user created and polydist adopted is left as it is, without
    waiting (torch's ``destroy_process_group`` does not wait either). A group
    polydist made over a runtime the program started (``hvd.init()``) is
    destroyed without waiting: its store is the process's own, so the ranks
    cannot meet there, and the runtime, which the program owns, stays up. Cached
    subgroups are forgotten. Environment variables are never touched. Calling
    it when serial or twice is harmless.

    In debug mode (``POLYDIST_DEBUG=1``) the other ranks learn that this one
    leaves; if any waits in a collective this rank never called, it raises
    :class:`~polydist.CollectiveMismatchError` (:mod:`polydist.collectives.debug`).
    """
    if _world is None and dist.is_available() and dist.is_initialized():
        with contextlib.suppress(WorldMismatchError):
            world()  # the program's own group: adopted, so that finalize's hooks (debug mode's check) see it
    leave(wait=True)


def leave(wait: bool) -> None:
    """:func:`finalize`, waiting for the other ranks only when ``wait`` (False on error paths: peers stuck in a
    collective with this rank must see it go, not wait for it in turn)."""
    global _world
    if _world is not None:
        for hook in on_finalize:
            hook()
    try:
        state = world()
    except WorldMismatchError:
        state = None  # a group polydist would not adopt: not its to destroy
    _world = None  # its groups, sequence numbers and buffers go with it
    if state is not None and state.owns_group:
        meet = state.size > 1 and state.store_shared  # else nobody to wait for, or no store to meet on
        if meet and wait:
            _wait_for_every_rank(state)
        elif meet:  # counted out in a thread of its own: a store that does not answer must not hold the exit
            out = threading.Thread(target=_wait_for_every_rank, args=(state, False), daemon=True)
            out.start()
            out.join(_COUNT_OUT_S)
        dist.destroy_process_group()
        registry.after_destroy_all()  # a backend's runtime that initialize() started (Horovod)


_leaves = 0  # finalize barriers so far in this process: the same count on every rank of a job
_COUNT_OUT_S = 2.0  # how long an exit without waiting may spend counting itself out on the store
_LOOK_S = 0.02  # between looks at the store while finalize waits
_LAST_OUT_S = 10.0  # how long a rank waits for the others to read the store before it may take it down


def _wait_for_every_rank(state: World, wait: bool = True) -> None:
    """Return when every rank of ``state``'s world has reached :func:`finalize` (a barrier on the job's store).

    Each rank adds itself to a counter; the last to arrive sets a key the
    others wait for. Then each says it has left, and every rank waits (briefly)
    for all to have left, so that the rank serving the store does not close it
    while a peer still waits for its answer. Without ``wait`` (at exit, after
    an error) the rank only counts itself in and out, so that peers already
    in :func:`finalize` need not wait out the timeout for a rank that is gone;
    rank 0 then still waits (at most ``_COUNT_OUT_S``) for the others to have
    counted out before its exit takes the store down.
    """
    global _leaves
    _leaves += 1
    run = ".".join(os.environ.get(k, "") for k in ("TORCHELASTIC_RESTART_COUNT", settings.RESTART_COUNT.name))
    key = f"polydist/finalize/{run}/{_leaves}"
    limit = state.timeout.total_seconds() if state.timeout else _torch.group_timeout(state.pg) or 1800.0
    try:
        store = _torch.default_store()
        if store.add(key, 1) == state.size:
            store.set(f"{key}/all", b"1")
        if wait:
            _wait_key(store, f"{key}/all", limit)
    except Exception as exc:  # noqa: BLE001 - a rank gone, a store gone: leave anyway, as before
        if wait:
            print(f"polydist: finalize: rank {state.rank} did not see every rank of the world of {state.size} reach "
                  f"finalize within {limit:g} s ({type(exc).__name__}: {str(exc)[:200]}); destroying the group "
                  f"anyway", file=sys.stderr, flush=True)  # fmt: skip
        return
    try:
        if store.add(f"{key}/out", 1) < state.size:
            # Rank 0 usually serves the store (polydist's rendezvous, torch's env:// without an agent): at exit too it
            # waits, briefly, for the others to be done with it, so that their last add does not meet a closed store.
            if wait:
                store.wait([f"{key}/out/all"], timedelta(seconds=_LAST_OUT_S))
            elif state.rank == 0:  # looks, not a wait: torch's store prints two warnings when a wait times out,
                deadline = time.monotonic() + _COUNT_OUT_S  # and at exit after an error that may well happen
                while not store.check([f"{key}/out/all"]) and time.monotonic() < deadline:
                    time.sleep(_LOOK_S)
        else:
            store.set(f"{key}/out/all", b"1")
    except Exception:  # noqa: BLE001 - every rank arrived; the store's host may already be gone
        pass


def _wait_key(store: Any, key: str, limit: float) -> None:
    """Wait at most ``limit`` s for ``key`` on ``store``, running :data:`while_leaving` between short looks.

    Not one ``store.wait``: a transport with weak progress (Open MPI) may
    complete this rank's part of its last collective while a peer's part still
    needs this rank's MPI calls to arrive (seen across two hosts: host 0's ranks
    out of an all_gather and waiting here, host 1's still in it, for ever).
    Without a hook that asks to be called again (every backend but a live
    MPI), it is one ``store.wait``: no look at the store every
    ``_LOOK_S`` from every rank, which at scale loads the store's host.
    """
    deadline = time.monotonic() + limit
    while not store.check([key]):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{key} not set within {limit:g} s")
        if not any([hook() for hook in while_leaving]):  # a list: every hook runs
            store.wait([key], timedelta(seconds=remaining))
            return
        time.sleep(_LOOK_S)


# ---------------------------------------------------------------- state


def world() -> Optional[World]:
    """The live world's state, or None when there is no process group.

    Every collective asks, so the common case is one identity check. A new
    default group (the user's own ``init_process_group``, or a destroy and
    re-init behind polydist's back) gets a fresh state; its layout is guessed
    without communicating, since adoption may happen on one rank only. With
    no group but a runtime the program started itself — Horovod
    (``hvd.init()``), or torch_xla with its device in use, which idist
    treats as an xla-tpu world — its backend's group is made, without
    communicating either (:func:`polydist.backends.registry.adopt_any`);
    ``finalize`` destroys it and leaves the runtime running.

    Raises:
        WorldMismatchError: the group is not the world a launcher announced
            (e.g. a framework's MPI world of one under torchrun); it is not
            adopted, so every polydist call raises the same.
    """
    global _world
    pg = _torch.default_pg()
    state = _world
    if state is not None and state.pg is pg:
        return state
    owns = False
    if pg is None:
        _world = None  # the group was destroyed behind our back
        if not registry.adopt_any():  # a runtime the program started (hvd.init(), an XLA device): make its group
            return None
        pg, owns = _torch.default_pg(), True
    info = launcher()
    _check_announced(info, pg, owned=owns)  # a group is adopted only if it is the job's
    env = layout_from_env(info)
    # A group made over the program's runtime has a process-local store (made without communicating): no meeting there.
    _world = World(pg, owns_group=owns, layout=env or single_node_guess(), timeout=None, layout_known=env is not None,
                   store_shared=not owns)
    _world_made()
    return _world


def is_initialized() -> bool:
    """True when a process group exists (created by polydist or adopted)."""
    return world() is not None


def require_group() -> Optional[World]:
    """For collectives: the live world, or None when serial.

    Raises:
        NotInitializedError: a launcher started several processes but no
            process group exists yet (serial results would be wrong).
    """
    state = _world
    if state is not None and state.pg is _torch.default_pg():  # every collective asks: the common case inline
        return state
    state = world()
    if state is not None:
        return state
    info = launcher()
    if info.is_distributed:
        raise NotInitializedError(
            f"this process is rank {info.rank} of {info.world_size} (launched by {info.launcher}) "
            "but no process group exists: call polydist.initialize() first"
        )
    return None


# ---------------------------------------------------------------- queries


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
