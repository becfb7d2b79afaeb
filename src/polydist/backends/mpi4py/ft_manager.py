"""MPI's engine for ``polydist run --fault-tolerant --backend mpi``: ULFM on Open MPI, with torchft's manager's face.

Every MPI rank is a replica group of one process. The manager keeps a
communicator of the live ranks (at first a duplicate of ``COMM_WORLD`` with
``MPI.ERRORS_RETURN``) and offers what :mod:`polydist.ft` and the training
wrappers (:mod:`polydist.backends.torchft.wrappers`) call on torchft's
``Manager``, under the same names, so that one program, one session and one
DDP hook serve both engines:

* ``start_quorum()`` (the optimizer's ``zero_grad``): when ranks were lost
  and their replacements are due, start spawning one, beside the training
  (:class:`~polydist.backends.mpi4py.ft_growth.Growth`: the survivors go on
  meanwhile); at the step after the one whose vote says every live rank's
  spawn succeeded, switch to the communicator merged with it and send it the
  live state: a broadcast from the first live rank, in polydist's codec
  (never pickle), of every registered state and the step;
* the DDP hook's all-reduce (``_pg.allreduce``): ``MPI_Allreduce`` (SUM) on
  the live communicator, on a thread of its own (so that it overlaps
  backward); a lost rank makes it fail with ``MPI_ERR_PROC_FAILED`` (or
  ``MPI_ERR_REVOKED``) on the others;
* ``should_commit()``: the vote (``MPI_Comm_agree``) on "no rank saw an
  error this step" (and on whether every live rank's spawn of a replacement
  has ended: :class:`_Growth`), over the live ranks; on a failure the
  survivors revoke and shrink the communicator
  (:func:`~polydist.backends.mpi4py.ulfm.shrink`)
  and discard the step.

A hung or stopped rank is declared failed by Open MPI's failure detector,
whose timeout the launcher sets to the collective timeout: a rank that makes
no MPI progress for that long (a stopped process, a rank stuck outside MPI)
is taken for lost, as a collective would have timed out on gloo.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import socket
import sys
import time
from datetime import timedelta
from typing import Any, Callable, NoReturn, Optional

import numpy as np
import torch

from ... import codec, settings
from ...collectives.recorder import RECORDER
from ..watchdog import GroupTag
from . import _mpi, ft_growth, ulfm
from .ft_growth import DONE, GROWN, Growth

__all__ = ["UlfmManager", "start"]

REPLICA = settings.FT_REPLICA.name  # in a replacement's environment: the replica group it replaces
_START_S = 60.0  # how long the live ranks, at the end, wait for a replacement to start (Python, torch, MPI_Init: 3-8 s)


class _Work:
    """An all-reduce, as torchft's process groups return one: ``get_future()``, completed by the lane's thread."""

    def __init__(self) -> None:
        self._future: torch.futures.Future = torch.futures.Future()

    def get_future(self) -> torch.futures.Future:
        return self._future


class _LiveRanks:
    """The manager's "process group": the live communicator, and the replica groups it holds (``_global_ranks``)."""

    def __init__(self, manager: "UlfmManager") -> None:
        self._manager = manager
        # One thread runs the all-reduces in order, so that a bucket's runs while backward computes the next
        # (MPI_THREAD_MULTIPLE, mpi4py's default); DDP waits for them all before the commit vote's agree.
        self._lane = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="polydist-ft-mpi")

    @property
    def _global_ranks(self) -> list:
        return list(self._manager.replicas_of)

    def allreduce(self, tensors: list, opts: Any) -> _Work:
        """SUM ``tensors[0]`` in place over the live ranks; recorded in polydist's flight recorder, as the
        Python groups' operations are (``polydist trace`` then shows it, and its failure)."""
        (tensor,) = tensors
        MPI = _mpi.mpi()
        buffer = tensor.detach().numpy() if tensor.device.type == "cpu" and tensor.is_contiguous() else None
        if buffer is None:
            raise TypeError(f"the MPI fault-tolerant all-reduce takes contiguous CPU tensors, got {tensor.device} "
                            f"(contiguous: {tensor.is_contiguous()})")  # fmt: skip
        manager = self._manager
        record = RECORDER.start(manager.tag(), "all_reduce", manager._seq, "SUM", None, tensor, True) if RECORDER.on else None
        manager._seq += 1
        work, comm = _Work(), manager._comm

        def run() -> None:
            try:
                comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
            except BaseException as exc:  # noqa: BLE001 - the hook reports it; the step fails, never backward
                if record is not None:
                    RECORDER.fail(record, exc)
                work.get_future().set_exception(exc)
                return
            if record is not None:
                RECORDER.end(record)
            work.get_future().set_result([tensor])

        self._lane.submit(run)
        return work


class UlfmManager:
    """torchft's ``Manager`` surface over ULFM (see the module docstring); one per process.

    Args:
        comm: the live ranks' communicator (``MPI.ERRORS_RETURN``).
        replicas_of: the replica group of each rank of ``comm``, in rank order.
        replica: this process's replica group.
        step: the job's committed steps (a replacement's, from the state it received).
        command: how to start a replacement (the worker's command line).
        replacements: how many times each replica group may be replaced (``--max-restarts``).
    """

    def __init__(self, comm: Any, replicas_of: list, replica: int, step: int, command: list, replacements: int) -> None:
        self._comm, self.replicas_of, self.replica = comm, list(replicas_of), replica
        self._step, self._command, self._budget = step, command, replacements
        self._errored: Optional[BaseException] = None
        self._quorum_id, self._healing, self._quorum_future = 0, False, True  # torchft's names (read by polydist.ft)
        self._pg = _LiveRanks(self)
        self._states: dict[str, tuple] = {}  # name -> (state_dict, load_state_dict)
        self._lost: list = []  # replica groups lost and not replaced yet
        self._replaced: dict[int, int] = {}  # replica group -> replacements started
        self._pending: Optional[bytes] = None  # a replacement's state, received at its first step
        self.required: frozenset = frozenset()  # as SafeTransport's: the states a received one must hold
        self._on_received: Optional[Callable[[int, float], None]] = None
        # (replica group, how, number of its replacement or None when they ran out, replacements allowed)
        self.on_lost: Optional[Callable[[int, str, Optional[int], int], None]] = None
        self._pids: list = []  # (host, pid) of each rank of the communicator: see _learn_pids
        self._tag: Optional[GroupTag] = None
        self._seq = 0  # the all-reduces so far, for the records
        self._growth: Optional[Growth] = None  # a replacement being spawned
        self._switch = False  # the last vote found the spawn done on every live rank: merge at the next step
        # Between steps (loading, building the model, evaluating) the failure detector's heartbeats go on
        self._heartbeats = ulfm.Heartbeats() if _mpi.mpi().Query_thread() == _mpi.mpi().THREAD_MULTIPLE else None

    def tag(self) -> GroupTag:
        """The live ranks as polydist's flight recorder names a group: their replica groups, this one's."""
        if self._tag is None or self._tag.ranks != tuple(self.replicas_of):
            self._tag = GroupTag(tuple(self.replicas_of), self.replica, settings.TIMEOUT.read())
        return self._tag

    # ---------------------------------------------------------------- torchft's Manager, as polydist calls it

    def register_state_dict_fn(self, name: str, load_state_dict: Callable, state_dict: Callable) -> None:
        self._states[name] = (state_dict, load_state_dict)

    def current_step(self) -> int:
        return self._step

    def num_participants(self) -> int:
        return self._comm.Get_size()

    def is_participating(self) -> bool:
        return True

    def errored(self) -> Optional[BaseException]:
        return self._errored

    def report_error(self, exc: BaseException) -> None:
        self._errored = exc

    def wait_quorum(self) -> None:
        pass

    def start_quorum(self) -> None:
        """The step begins: its error is forgotten; lost replica groups with replacements left are replaced and
        a replacement's first step loads the state it received."""
        self._errored, self._healing = None, False
        if self._heartbeats is not None:
            self._heartbeats.pause()  # within a step the detector judges this rank as it is
        if self._pending is not None:
            self._load(self._pending)
            self._pending, self._healing = None, True
        if self._switch:
            self._switch, growth, self._growth = False, self._growth, None
            try:
                self._join(growth)
            except Exception as exc:  # noqa: BLE001 - the replacement is lost again: this step's vote says so
                print(f"polydist: replica group {growth.replica} could not be replaced ({type(exc).__name__}: {exc})",
                      file=sys.stderr, flush=True)  # fmt: skip
                self._errored = exc
        due = [r for r in self._lost if self._replaced.get(r, 0) < self._budget]
        if self._growth is None and due:  # one at a time; the same on every live rank (the votes decided it)
            replica = due[0]
            self._lost.remove(replica)
            self._replaced[replica] = self._replaced.get(replica, 0) + 1
            # OMP_NUM_THREADS: the live ranks' share of the cores (a spawned process counts one local rank, and
            # took them all: 2 OpenMP threads among 4 busy ranks on 2 cores hung in MKL's sgemm, 2 runs of 8)
            env = {REPLICA: str(replica), settings.RESTART_COUNT.name: str(self._replaced[replica]),
                   "OMP_NUM_THREADS": str(torch.get_num_threads())}  # fmt: skip
            self._growth = Growth(self._comm, replica, self._command, env, host=self._spawn_host())

    def should_commit(self, timeout: Optional[timedelta] = None) -> bool:
        """The vote of every live rank on this step; on a failure, the survivors shrink and the step is discarded."""
        growth = self._growth
        bits = (1 if self._errored is None else 0) | (growth.vote_bits() if growth is not None else 0)
        try:
            got = ulfm.agree_bits(self._comm, bits)
        except ulfm.AgreementError as exc:  # raised on every live rank alike
            self._errored, got = self._errored or exc, 0
        ok = bool(got & 1)
        if growth is not None and (not ok or got & DONE):  # the same decision on every live rank
            if ok and got & GROWN:
                self._switch = True
            else:  # it failed somewhere, or the live ranks change: try again from the new communicator
                self._give_up(growth, again=True)
        if not ok:  # the vote is the same on every live rank: all of them shrink, lost ranks or not
            self._shrink()
        else:
            self._step += 1
        if self._heartbeats is not None:
            self._heartbeats.resume()
        return ok

    def shutdown(self, wait: bool = True) -> None:
        """The job ends: a replacement still joining is told to leave (nobody is left to give it the state)."""
        if self._growth is not None:  # waited for longer than a step's timeout: a replacement whose spawn is cut
            # short fails in MPI_Init against a job gone (Open MPI: "OPAL ERROR: Not supported", dpm.c), and the
            # spawn still under way holds this rank's MPI_Finalize
            self._give_up(self._growth, again=False, seconds=max(settings.TIMEOUT.read() or 0.0, _START_S))

    # ---------------------------------------------------------------- failures and replacements

    def _learn_pids(self) -> None:
        """Collective: where each rank runs, so that a rank declared lost while alive (hung outside MPI: Open MPI's
        detector saw no progress for the timeout) can be ended; it would otherwise hold mpiexec for ever."""
        self._pids = self._comm.allgather((socket.gethostname(), os.getpid()))

    def _spawn_host(self) -> Optional[str]:
        """Where a replacement starts: on a job spread over several hosts, the spawning rank's own (the first
        live rank's). Open MPI 5's spawn onto another host of the job fails in its runtime (PMIX_ERROR in prted's
        pmix_server_dyn.c, then a crashed replacement or mpiexec: 3 of 3 tries on two hosts; open-mpi/ompi#12601,
        #13521), and the host that lost a rank may be gone. Short name: Open MPI strips the domain by default."""
        if len({host for host, _ in self._pids}) < 2:
            return None  # one host: Open MPI's own mapping, as before
        name = socket.gethostname()
        return name if name.replace(".", "").isdigit() else name.split(".")[0]

    def _end(self, ranks: list) -> None:
        here = socket.gethostname()
        for host, pid in (self._pids[r] for r in ranks if r < len(self._pids)):
            if host == here and pid != os.getpid():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def _shrink(self) -> None:
        old = self._comm
        self._comm, lost = ulfm.shrink(old)
        if self._comm.Get_rank() == 0:
            self._end(lost)  # dead already, or hung: either way out of the job
        self._pids = [p for i, p in enumerate(self._pids) if i not in lost]
        gone = [self.replicas_of[r] for r in lost]
        self.replicas_of = [r for i, r in enumerate(self.replicas_of) if i not in lost]
        self._quorum_id += 1
        self._lost += gone
        for replica in gone:
            if self.on_lost is not None and self._comm.Get_rank() == 0:  # one survivor tells the launcher
                done = self._replaced.get(replica, 0)
                self.on_lost(replica, "a process failure, MPI_ERR_PROC_FAILED", done + 1 if done < self._budget else None, self._budget)

    def _give_up(self, growth: Growth, again: bool, seconds: float = 0.0) -> None:
        """Drop ``growth``: its spawn is waited for (bounded: ``seconds``, else the live ranks' timeout), its
        replacement told to leave; with ``again``, its replica group is due again (while replacements are left)."""
        growth.wait(seconds or settings.TIMEOUT.read() or 60.0)
        growth.give_up()
        self._growth, self._switch = None, False
        if again:
            self._lost.append(growth.replica)

    def _join(self, growth: Growth) -> None:
        """Switch to the communicator merged with ``growth``'s replacement (last) and send it the header and
        the state."""
        merged, replica = growth.merged, growth.replica
        self._comm, self.replicas_of = merged, self.replicas_of + [replica]
        self._quorum_id += 1
        _send(merged, codec.encode({"replicas_of": self.replicas_of, "step": self._step, "quorum": self._quorum_id,
                                    "replaced": self._replaced}))  # fmt: skip
        _send(merged, codec.encode({"step": self._step, "states": {n: _plain(sd()) for n, (sd, _) in self._states.items()}}))
        self._learn_pids()

    def _load(self, payload: bytes) -> None:
        start = time.perf_counter()
        got = codec.decode(payload)
        states = got.get("states") if isinstance(got, dict) else None
        step = got.get("step") if isinstance(got, dict) else None
        if not isinstance(states, dict) or not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"the live state sent to replica group {self.replica} is not one: {type(got).__name__}")
        missing = sorted(self.required - set(states))
        if missing:
            raise ValueError(f"the live state sent to replica group {self.replica} lacks {missing}")
        for name, (_, load) in self._states.items():
            load(states[name])
        self._step = step
        if self._on_received is not None:
            self._on_received(len(payload), time.perf_counter() - start)


def _plain(obj: Any) -> Any:
    from ..torchft.transport import plain  # both engines' rule, mappings as dicts (here: it imports torchft)

    return plain(obj)


def _send(comm: Any, payload: bytes) -> None:
    """Broadcast ``payload`` from rank 0: its length, then its bytes."""
    MPI = _mpi.mpi()
    comm.Bcast([np.array([len(payload)], dtype=np.int64), MPI.INT64_T], root=0)
    comm.Bcast([np.frombuffer(bytearray(payload), dtype=np.uint8), MPI.BYTE], root=0)  # mpi4py wants it writable


def _receive(comm: Any, limit: int = 1 << 34) -> bytes:
    MPI = _mpi.mpi()
    size = np.zeros(1, dtype=np.int64)
    comm.Bcast([size, MPI.INT64_T], root=0)
    if int(size[0]) == ft_growth.LEAVE:
        return b""
    if not 0 < int(size[0]) <= limit:
        raise ValueError(f"the live replica groups announced {int(size[0])} bytes of state; accepted: 1 to {limit}")
    data = np.empty(int(size[0]), dtype=np.uint8)
    comm.Bcast([data, MPI.BYTE], root=0)
    return data.tobytes()


def start(command: list) -> tuple:
    """Join the job: ``(manager, replica group, replica groups launched)``.

    A process mpiexec started takes its ``COMM_WORLD`` rank as its replica group; a replacement merges with
    the ranks that spawned it and learns the job's layout and step from them (its state comes at its first
    step). ``command``: the worker's command line, for the replacements this process may start.

    Raises:
        RuntimeError: ULFM is not usable here (:func:`~polydist.backends.mpi4py.ulfm.support`'s reason).
    """
    MPI = _mpi.mpi()
    replacements = settings.FT_REPLACEMENTS.read()
    replicas = int(os.environ.get("NUM_REPLICA_GROUPS") or MPI.COMM_WORLD.Get_size())
    if ulfm.is_replacement():
        comm = ulfm.join_parent()
        try:
            payload = _receive(comm)
        except MPI.Exception as exc:  # revoked: the live ranks gave this replacement up (the job ended first...)
            _given_up(exc.Get_error_string().strip(), finalize=False)
        if not payload:  # LEAVE: the same, told by the handshake
            ft_growth.leave(comm)
            _given_up("told to leave", finalize=True)  # nothing of MPI's is pending with the others
        header = _header(codec.decode(payload))
        replica = settings.FT_REPLICA.read()
        if replica is None:
            raise RuntimeError(f"a replacement started without ${REPLICA}: start fault-tolerant MPI jobs with polydist run")
        manager = UlfmManager(comm, header["replicas_of"], replica, header["step"], command, replacements)
        manager._quorum_id, manager._replaced = header["quorum"], dict(header["replaced"])
        manager._pending = _receive(comm)  # loaded at its first step, once the program registered its states
        manager._learn_pids()
        return manager, replica, replicas
    reason = ulfm.support()
    if reason is not None:
        raise RuntimeError(reason)
    comm = MPI.COMM_WORLD.Dup()
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    manager = UlfmManager(comm, list(range(comm.Get_size())), comm.Get_rank(), 0, command, replacements)
    manager._learn_pids()
    return manager, comm.Get_rank(), replicas


def _given_up(why: str, finalize: bool) -> NoReturn:
    """A replacement the live ranks gave up before sending it the state leaves (exit code 0), saying ``why``;
    with ``MPI_Finalize`` where ``finalize`` (else without: a revoke may leave MPI's calls pending)."""
    print(f"polydist: replica group {settings.FT_REPLICA.read()}: the live ranks gave this replacement up before "
          f"sending it the state ({why}); leaving", file=sys.stderr, flush=True)
    if finalize:
        ulfm.finalize()
    os._exit(0)


def _header(header: Any) -> dict:
    """The job's layout as the live ranks sent it to a replacement; ``ValueError`` if it is not one."""
    ints = lambda xs: all(isinstance(x, int) and not isinstance(x, bool) for x in xs)  # noqa: E731
    ok = (isinstance(header, dict) and isinstance(header.get("replicas_of"), list) and ints(header["replicas_of"])
          and ints([header.get("step"), header.get("quorum")]) and isinstance(header.get("replaced"), dict)
          and ints(header["replaced"]) and ints(header["replaced"].values()))  # fmt: skip
    if not ok:
        raise ValueError(f"the live ranks sent this replacement no job layout it can read: {type(header).__name__}")
    return header
