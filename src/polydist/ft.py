"""Fault-tolerant training: this process's part in a job started with ``polydist run --fault-tolerant``.

Such a job is made of *replica groups*: ``polydist run --nproc-per-node 4
--fault-tolerant`` starts four, of one process each. Each replica group is a
torch.distributed world of its own (what :func:`polydist.get_rank` and
:func:`polydist.get_world_size` describe, and what ``group=None`` means), and
each holds a full copy of the model: the replica groups train one model
data-parallel, step by step (with ``--replica-group-size K``, FSDP2 shards the
model inside each replica group of K ranks: HSDP, see
:mod:`polydist.backends.torchft.sharded`), through the backend's engine: torchft on gloo
and nccl (:mod:`polydist.backends.torchft`), MPI's ULFM on ``mpi`` under Open
MPI (:mod:`polydist.backends.mpi4py.ft_manager`, whose manager answers to
the same calls). When a replica group is lost (killed, raised, frozen, hung)
the others discard the step in flight and go on with the survivors; a
replacement (started by the launcher, or spawned by the survivors on MPI)
receives the live state of a survivor (not a checkpoint) and joins.

What a training loop sees (the :func:`polydist.auto_model`,
:func:`~polydist.auto_optim` and :func:`~polydist.auto_dataloader` helpers do
it all when they find a job like this):

* ``optimizer.zero_grad()`` starts the step's quorum (who takes part);
* the model's backward averages the gradients over the replica groups of
  the quorum (the participants; fewer while one is down, so the global
  batch shrinks for those steps: each replica group keeps its own shard of
  the data);
* ``optimizer.step()`` applies them only when every live replica group has
  them all: a step during which a replica group was lost is **discarded**,
  never half applied, and :attr:`FaultTolerance.step` does not advance. A
  loop that takes its batch from ``step`` (as ``examples/train_digits.py``
  does) therefore **redoes** that step with the same data; a loop that
  iterates a loader moves on to its next batch.

:func:`fault_tolerance` returns this process's :class:`FaultTolerance`, or
None outside such a job.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import threading
import time
import urllib.parse
from datetime import timedelta
from typing import Any, Callable, Optional

from . import codec, context, live_world, settings
from .errors import NotInitializedError
from .launch import ft_events
from .launch.environment import detect, restart_count

__all__ = ["FaultTolerance", "fault_tolerance", "is_fault_tolerant"]

_DEFAULT_TIMEOUT = timedelta(seconds=60)  # torchft's; polydist run --timeout sets another
_START_WAIT = timedelta(minutes=5)  # how long the first replica groups wait for each other before step 0
_session: Optional["FaultTolerance"] = None
_store: Any = None  # the TCP store of a one-process replica group (its manager's, and its quorums' when primary)
_stopped = False


def is_fault_tolerant() -> bool:
    """Whether this process is a rank of a ``polydist run --fault-tolerant`` job (``$POLYDIST_FAULT_TOLERANT``)."""
    return bool(settings.FAULT_TOLERANT.read())


class FaultTolerance:
    """This process's part in a fault-tolerant job: its replica group, the job's step, the engine's manager.

    Attributes:
        replica_group: this replica group's index, ``0 <= replica_group <
            num_replica_groups``; a replacement takes the index of the group it replaces.
        num_replica_groups: how many replica groups the job was launched with.
        rank: this process's rank in the whole job: ``replica_group *
            group size + polydist.get_rank()``; kept by a replacement.
        world_size: ranks in the whole job as launched (``num_replica_groups * group size``).
        manager: the engine's manager, for what polydist does not wrap: torchft's
            ``Manager`` on gloo and nccl; on MPI,
            :class:`polydist.backends.mpi4py.ft_manager.UlfmManager`, which
            answers to the same calls.
    """

    def __init__(self, replica_group: int, num_replica_groups: int, group_rank: int, group_size: int,
                 manager: Any, transport: Any) -> None:  # fmt: skip
        self.replica_group, self.num_replica_groups = replica_group, num_replica_groups
        self.rank, self.world_size = replica_group * group_size + group_rank, num_replica_groups * group_size
        self.manager, self._transport, self._group_size = manager, transport, group_size
        self._lead = group_rank == 0  # rank 0 of the replica group logs for it (its ranks vote alike)
        self._quorum_id: Optional[int] = None
        self._discarded, self._failing_since, self._step_began = 0, 0.0, time.time()
        self._received: Optional[tuple] = None  # (bytes, seconds) of the last state received
        self._states: dict[str, Callable[[], Any]] = {}
        self._before_vote: list[Callable[[], None]] = []

    @property
    def step(self) -> int:
        """Steps the job has committed so far (a replacement learns it when it receives the live state)."""
        return self.manager.current_step()

    @property
    def participants(self) -> int:
        """Replica groups that take part in the current step (waits for the step's quorum)."""
        return self.manager.num_participants()

    def register_state(self, name: str, state_dict: Callable[[], Any], load_state_dict: Callable[[Any], None]) -> None:
        """Send ``state_dict()`` to a recovering replica group, which loads it with ``load_state_dict``.

        :func:`~polydist.auto_model` registers the model ("model") and
        :func:`~polydist.auto_optim` the optimizer ("optimizer"); register
        anything else the loop needs to go on alike on every replica group
        (a learning-rate scheduler, a data position), on every rank, before
        the first step. The state travels through polydist's safe codec, so
        it holds tensors, numbers, strings, bytes and containers of them;
        anything else raises ``TypeError`` on the sender. ``ValueError`` for
        a name already registered.
        """
        if name in self._states:
            raise ValueError(f"a state named {name!r} is already registered for fault tolerance")
        self.manager.register_state_dict_fn(name, load_state_dict, state_dict)
        self._states[name] = state_dict
        self._transport.required = frozenset(self._states)

    def before_vote(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` on this rank before each commit vote, after backward (every rank registers the same):
        :func:`~polydist.auto_model` with ``use_fsdp=True`` averages the gradient shards over the replica groups
        there. A failure it reports to the manager (``manager.report_error``) discards the step."""
        self._before_vote.append(fn)

    def start_step(self) -> None:
        """Start the next step (every rank, before the forward pass; the optimizer's ``zero_grad`` calls it):
        torchft's quorum of the replica groups taking part, run beside the forward pass. Every step asks for
        one, as torchft does: the quorum is where the replica groups agree on who takes part, so a replica
        group cannot skip it on its own (one that asks while another does not waits for it in the lighthouse
        while the other waits in the all-reduce)."""
        self._step_began = time.time()
        self.manager.start_quorum()

    def should_commit(self) -> bool:
        """torchft's commit vote for this step (every rank of the replica group calls it once a step, after
        backward): whether to apply the step. Logs what the launcher reports."""
        for fn in self._before_vote:
            fn()
        ok = self.manager.should_commit()
        if self._lead:
            self._log(ok)
        return ok

    def _log(self, ok: bool) -> None:
        m, replica = self.manager, self.replica_group
        step = m.current_step()  # after the vote: one more when the step was committed
        if not ok:  # the failed step first, then the quorum it leads to (MPI's shrink is part of the vote)
            error = m.errored()
            if not self._discarded:  # the first step a fault costs: the survivors' view goes into a dump
                self._failing_since = time.time()
                _dump_in_background(error)
            self._discarded += 1
            ft_events.record("failed", replica, step=step, error=_first_line(error), since=self._step_began)
        quorum = m._quorum_id  # torchft 0.2.0's attribute: the quorum this step ran in
        if quorum != self._quorum_id:
            self._quorum_id = quorum
            size = self.world_size // self.num_replica_groups  # torchft 0.2.0's _global_ranks: the quorum's ranks
            members = sorted({int(r) // size for r in (m._pg._global_ranks or ())})
            ft_events.record("quorum", replica, step=step - ok, participants=m.num_participants(), members=members,
                             since=self._step_began)
        if not ok:
            return
        if self._discarded:
            ft_events.record("recovered", replica, step=step - 1, lost=self._discarded, since=self._failing_since)
            self._discarded = 0
        if m._healing and self._received is not None:  # torchft 0.2.0: this step loaded a live state
            size, seconds = self._received
            ft_events.record("healed", replica, step=step, seconds=seconds, bytes=size)
            self._received = None

    def _on_received(self, size: int, seconds: float) -> None:
        self._received = (size, seconds)

    def digest(self) -> str:
        """SHA-256 of every registered state (model, optimizer, ...) of every rank of the replica group: equal on
        replica groups that hold the same. In a replica group of several ranks, a collective of the group (each
        holds its own shards under FSDP2)."""
        states = {name: fn() for name, fn in sorted(self._states.items())}
        from .backends.torchft.transport import plain

        mine = hashlib.sha256(codec.encode(plain(states))).hexdigest()
        if self._group_size == 1:
            return mine
        from .collectives.gather import all_gather

        return hashlib.sha256("".join(all_gather(mine)).encode()).hexdigest()

    def finish(self) -> None:
        """Log how this replica group ended (its step and :meth:`digest`) and stop the manager's servers."""
        digest = self.digest()  # every rank: a collective of the replica group when it has several
        if self._lead:
            ft_events.record("finished", self.replica_group, step=self.step, digest=digest)
        self.manager.shutdown(wait=False)


def _dump_in_background(error: Any) -> None:
    """This rank's flight-recorder dump (torch's records hold the all-reduce that failed), written beside the
    training, which goes on: ``polydist trace`` reads the survivors' view of a fault (reason "step discarded")."""
    from .trace.dump import DISCARDED, dump_trace

    cause = getattr(error, "original_exception", error)
    cause = cause if isinstance(cause, BaseException) else None
    threading.Thread(target=dump_trace, kwargs=dict(reason=DISCARDED, error=cause), daemon=True).start()


_CALLBACK = "Got the following error when running the callback: "  # how torch's futures wrap a callback's error


def _first_line(error: Any) -> str:
    """The reason a step failed, in one line: the error torchft's manager holds, without torch's wrapping."""
    if error is None:
        return "fewer replica groups than --min-replicas"
    text = str(getattr(error, "original_exception", error)).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return (line[len(_CALLBACK):] if line.startswith(_CALLBACK) else line)[:300]


def fault_tolerance() -> Optional[FaultTolerance]:
    """This process's :class:`FaultTolerance` in a ``polydist run --fault-tolerant`` job, else None.

    In such a job the first call (or :func:`polydist.initialize`, for
    replica groups of several ranks) joins it: torchft's manager starts and,
    on the job's first start, waits until every replica group has joined, so
    that step 0 has them all. Raises :class:`~polydist.NotInitializedError`
    when the replica group has several ranks and :func:`polydist.initialize`
    was not called; ``RuntimeError`` when torchft is not installed or the
    process was not started by ``polydist run --fault-tolerant``.
    """
    if _session is None and is_fault_tolerant():
        start()
    return _session


def _int_env(name: str) -> int:
    text = os.environ.get(name, "")
    if not text.strip().isdigit():
        raise RuntimeError(f"--fault-tolerant job without a valid ${name} ({text!r}): start it with polydist run")
    return int(text)


def _bind_host(lighthouse: str) -> str:
    """The address this process serves its replica group on: loopback when the lighthouse is on loopback (a
    single-node job), else this host's address on the route to the lighthouse."""
    host = urllib.parse.urlsplit(lighthouse).hostname or "127.0.0.1"
    if host.startswith("127.") or host in ("localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # no packet sent: just the route's source
        probe.connect((host, 9))
        return probe.getsockname()[0]


def start() -> None:
    """Join the fault-tolerant job (:func:`polydist.initialize`'s hook; nothing outside such a job), on the engine
    of the job's backend (its lifecycle's ``fault_tolerance``: torchft, or MPI's ULFM)."""
    global _session
    if _session is not None or not is_fault_tolerant():
        return
    from .backends import registry

    engine = registry.get(registry.requested_name()).lifecycle.fault_tolerance
    session = _start_ulfm() if engine == "ulfm" else _start_torchft()
    incarnation = restart_count()
    if session._lead:
        ft_events.record("started", session.replica_group, incarnation=incarnation)
        if engine != "ulfm":  # MPI's ranks start together; a replacement is merged in by the others
            _meet(session.replica_group, session.num_replica_groups, wait=incarnation == 0)
    _session = session


def _start_ulfm() -> FaultTolerance:
    """MPI's engine (:mod:`polydist.backends.mpi4py.ft_manager`): each rank a replica group of its own."""
    import json

    from .backends.mpi4py import ft_manager

    command = json.loads(settings.FT_COMMAND.read() or "[]") or [sys.executable, "-u", "-m", "polydist.launch.worker",
                                                                 *sys.argv]  # fmt: skip
    manager, replica, replicas = ft_manager.start(command)
    session = FaultTolerance(replica, replicas, 0, 1, manager, manager)
    manager._on_received = session._on_received

    def lost(lost_replica: int, how: str, replacement: Optional[int], of: int) -> None:
        if replacement is None:
            ft_events.record("given_up", lost_replica, rank=lost_replica, how=how, error="")
        else:
            ft_events.record("lost", lost_replica, rank=lost_replica, how=how, error="", replacement=replacement, of=of)

    manager.on_lost = lost
    return session


def _start_torchft() -> FaultTolerance:
    """torchft's engine (:mod:`polydist.backends.torchft`): replica groups of one or more ranks, a lighthouse."""
    try:
        from .backends.torchft import engine, transport
    except ImportError as exc:
        raise RuntimeError(f"--fault-tolerant needs torchft: pip install 'polydist[ft]' ({exc})") from None
    replica, replicas = _int_env("REPLICA_GROUP_ID"), _int_env("NUM_REPLICA_GROUPS")
    lighthouse = os.environ.get("TORCHFT_LIGHTHOUSE", "")
    if not lighthouse:
        raise RuntimeError("--fault-tolerant job without its lighthouse ($TORCHFT_LIGHTHOUSE): start it with polydist run")
    host = _bind_host(lighthouse)
    state, info = context.world(), detect()
    if state is not None:  # a replica group of several ranks: its manager meets on the group's store
        rank, size, timeout = state.rank, state.size, state.timeout
        if not info.master_addr or not info.master_port:
            raise RuntimeError("--fault-tolerant: the replica group's store is not known ($MASTER_ADDR, $MASTER_PORT)")
        store: tuple = (info.master_addr, info.master_port) if host == "127.0.0.1" else _store_on(host, rank)
    elif (info.world_size or 1) == 1:  # a replica group of one process, serial: a store of its own, on `host`
        import torch.distributed as dist

        global _store
        _store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
        rank, size, timeout, store = 0, 1, None, (host, _store.port)
    else:
        raise NotInitializedError("--fault-tolerant with replica groups of several ranks: call polydist.initialize() first")
    timeout = timeout or _timeout()
    ship = transport.SafeTransport(host, timeout)
    manager = engine.make_manager(
        replica=replica, group_rank=rank, group_size=size, store=store, lighthouse=lighthouse, host=host,
        timeout=timeout, min_replicas=settings.FT_MIN_REPLICAS.read() or 1, transport=ship,
        cuda=context.device().type == "cuda",
    )  # fmt: skip
    session = FaultTolerance(replica, replicas, rank, size, manager, ship)
    ship._on_received = session._on_received
    return session


def _store_on(host: str, rank: int) -> tuple:
    """A store for the replica group's manager on ``host``, served by its rank 0: on several nodes the other
    replica groups reach it (it is the cross-replica group's when this one leads a quorum), which they cannot
    do at the replica group's own store on loopback. Its port travels over the default group's store."""
    import torch.distributed as dist

    global _store
    default = dist.distributed_c10d._get_default_store()
    if rank == 0:
        _store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
        default.set("polydist/ft/manager_store", str(_store.port))
        return host, _store.port
    return host, int(default.get("polydist/ft/manager_store"))


def _meet(replica: int, replicas: int, wait: bool) -> None:
    """Say this replica group's manager runs; on the first start (``wait``), wait until every replica group's
    does (or its replacement's: one lost before it said so), so that step 0's quorum has them all."""
    address = settings.FT_START.read()
    if not address:
        return
    import torch.distributed as dist

    host, _, port = address.rpartition(":")
    store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False, timeout=_START_WAIT)
    store.set(f"started/{replica}", "1")
    if not wait:
        return
    try:
        store.wait([f"started/{r}" for r in range(replicas)], _START_WAIT)
    except Exception as exc:  # noqa: BLE001 - a replica group that never started: go on with the others
        print(f"polydist: replica group {replica}: not every replica group started within "
              f"{_START_WAIT.total_seconds():g} s ({exc}); starting without them", file=sys.stderr, flush=True)  # fmt: skip


def _timeout() -> timedelta:
    seconds = settings.TIMEOUT.read()  # polydist run --timeout
    return timedelta(seconds=seconds) if seconds else _DEFAULT_TIMEOUT


def stop() -> None:
    """Log how this replica group ended and stop the manager: :func:`polydist.finalize`'s hook, and the
    worker's when the program returns (nothing outside such a job; a second call does nothing).

    A program that ran under ``--fault-tolerant`` without ever joining (no
    ``auto_model``/``auto_optim``/:func:`fault_tolerance`) trained each
    replica group apart: said on stderr.
    """
    global _session, _stopped
    session, _session = _session, None
    if session is not None:
        _stopped = True
        if live_world.exiting:  # an error ended the program (the worker stops a finished one first): no end to log
            session.manager.shutdown(wait=False)
        else:
            session.finish()
    elif is_fault_tolerant() and not _stopped:
        _stopped = True
        print("polydist: this program ran under --fault-tolerant but never joined the fault-tolerant job (no "
              "auto_model/auto_optim, no polydist.fault_tolerance()): its replica groups trained apart",
              file=sys.stderr, flush=True)  # fmt: skip
