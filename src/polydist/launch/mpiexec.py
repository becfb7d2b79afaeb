"""Jobs under the installed MPI's ``mpiexec``: ``polydist run --backend mpi`` and ``polydist bench``.

MPI launches its own processes, so the MPI backend is started by MPI's
launcher rather than PyTorch's elastic agent. ``mpiexec`` is looked up next to
the Python interpreter first (where the ``mpich`` wheel installs it), then on
``PATH``. A rank that raises calls ``MPI_Abort`` (see
:func:`polydist.backends.mpi4py.install_abort_hook`), which makes ``mpiexec``
end every rank; before that it writes its traceback into the directory named by
``$POLYDIST_FAILURE_DIR`` (:mod:`polydist._failure_record`), from which :func:`run` reports the failing rank. A
rank that is killed writes nothing: :func:`run` watches the ranks' pids (from
their pid files, :func:`polydist.launch.process_setup.record_pid`) and names the one that ended first, else
the one ``mpiexec``'s report names. ``mpiexec`` dies with the process that runs
it (Linux), and takes its ranks down. Before a job ends on a failure, the
other ranks write their flight-recorder dumps (:mod:`polydist.trace.dump`): a
rank that raises asks them before ``MPI_Abort``; under Hydra, started with
``-disable-auto-cleanup``, :func:`run` asks them when a rank dies, then ends them.
Open MPI's ``mpiexec`` is told to place the ranks in order and to oversubscribe
(see :func:`run`); running it as root is left to the user's
``OMPI_ALLOW_RUN_AS_ROOT``/``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM``.
"""

from __future__ import annotations

import codecs
import os
import re
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Mapping, Optional, Sequence, TextIO

from torch.distributed.elastic.multiprocessing.api import SignalException

from .._failure_record import recorded_failures
from ..settings import FAILURE_DIR
from .liveness import NO_TRACEBACK, Watch, end_frozen, fate
from ..trace.dump import EXIT_NOTICES
from ..errors import WorkerFailedError
from . import rank_parent
from .process_setup import death_signal_setter, pids, rank_files, signal_name

__all__ = ["find", "run"]


def find() -> str:
    """Path of ``mpiexec``: beside ``sys.executable`` (a venv with the mpich wheel), else on ``PATH``.

    Raises:
        FileNotFoundError: no ``mpiexec`` anywhere, with the command that installs one.
    """
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise FileNotFoundError(
            "no mpiexec found beside the Python interpreter or on PATH; install one with: pip install mpi4py mpich"
        )
    return found


def run(argv: Sequence[str], nproc: int, *, env: Optional[Mapping[str, str]] = None) -> None:
    """Run ``mpiexec -n nproc ARGV...`` and wait for it.

    Args:
        argv: the command every rank runs (e.g. ``[sys.executable, "-m", ...]``).
        nproc: number of ranks, ≥ 1.
        env: environment of the ranks (default: this process's), to which
            ``$POLYDIST_FAILURE_DIR`` is added.

    Raises:
        WorkerFailedError: ``mpiexec`` exited non-zero; names the rank whose
            uncaught exception aborted the job, with its traceback, when one
            was recorded, else the rank ``mpiexec`` reports killed or crashed.
        ValueError: ``nproc`` < 1.
        FileNotFoundError: no ``mpiexec`` (see :func:`find`).
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive int, got {nproc!r}")
    launcher = find()
    flavor = _flavor(launcher)
    # Hydra (MPICH's and Intel MPI's mpiexec) SIGKILLs every rank the moment one dies; told not to,
    # it lets polydist ask the survivors for their flight-recorder dumps and end them itself. It still
    # SIGKILLs them at once when a rank of its own dies by a signal: each rank runs under a parent
    # (rank_parent.py) that exits normally instead.
    ends_ranks = flavor in ("mpich", "intelmpi") and _pidfds_work()
    options = ["-disable-auto-cleanup"] if ends_ranks else []
    if flavor == "openmpi":
        # Open MPI refuses more ranks than cores, and by default numbers the ranks of a node in the order
        # it spreads them over cores (rank 1 can get local rank 2): --nproc-per-node is the user's choice,
        # and ranks in order make local rank = rank on one node, as under Hydra and torchrun.
        options = ["--map-by", "slot:OVERSUBSCRIBE"]
    with tempfile.TemporaryDirectory(prefix="polydist-mpi-") as failures:
        parent = [sys.executable, "-I", "-S", rank_parent.__file__, failures] if ends_ranks else []
        command = [launcher, *options, "-n", str(nproc), *parent, *argv]
        child_env = dict(os.environ if env is None else env)
        child_env[FAILURE_DIR.name] = failures
        if ends_ranks and flavor == "mpich":  # only MPICH's Hydra then signals the survivors of an exit (SIGUSR1)
            open(os.path.join(failures, EXIT_NOTICES), "w").close()
        watch = _EndWatch(failures, nproc, ends_ranks)
        watch.start()
        try:
            code, tail = _call(command, child_env)
        finally:
            watch.stop()
        if code != 0:
            raise _failure_report(failures, code, tail, watch.first_failed())


def _flavor(launcher: str) -> str:
    """Which mpiexec ``launcher`` is, from its ``--version``: "mpich", "intelmpi" (both Hydra), "openmpi" or ""."""
    try:
        out = subprocess.run([launcher, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    if "Open MPI" in out:
        return "openmpi"
    if "Intel(R) MPI" in out:  # its Hydra names itself only: "Intel(R) MPI Library for Linux* OS, Version ..."
        return "intelmpi"
    return "mpich" if "HYDRA" in out else ""


def _pidfds_work() -> bool:
    """Whether Linux pidfds work here (:class:`_EndWatch` needs them to see a rank end)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


def _call(command: list, env: dict) -> tuple[int, str]:
    """Run ``command``, copying its stdout and stderr through; return its exit code and the last 16 KiB of both.

    mpiexec prints its report of a rank that died mixed with the ranks' output: Hydra on stdout, Open MPI
    on stderr.
    """

    tail = b""
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          preexec_fn=death_signal_setter()) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        streams = selectors.DefaultSelector()
        for pipe, copy in ((proc.stdout, _Copy(sys.stdout)), (proc.stderr, _Copy(sys.stderr))):
            streams.register(pipe.fileno(), selectors.EVENT_READ, copy)
        deadline, stopped_by = None, None  # after Ctrl-C or SIGTERM: when mpiexec is killed if it has not ended
        main = threading.current_thread() is threading.main_thread()  # where Python runs signal handlers
        previous = signal.signal(signal.SIGTERM, _raise_interrupt) if main else None
        while streams.get_map():
            try:
                ready = streams.select(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except KeyboardInterrupt as exc:  # on the launcher (kill -INT, SIGTERM) or the terminal's job
                stopped_by = getattr(exc, "signum", signal.SIGINT)
                proc.send_signal(stopped_by)
                deadline = time.monotonic() + _INTERRUPT_GRACE_S
                continue
            if deadline is not None and not ready and time.monotonic() >= deadline:
                proc.kill()
                break
            for key, _ in ready:
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    streams.unregister(key.fd)
                    continue
                key.data.write(chunk)
                tail = (tail + chunk)[-16384:]
        streams.close()
        if main:
            signal.signal(signal.SIGTERM, previous)
    if stopped_by is not None:
        raise SignalException(f"polydist run got {signal.Signals(stopped_by).name}", sigval=stopped_by)
    return proc.returncode, tail.decode("utf-8", "replace")


def _raise_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM while mpiexec runs: handled as Ctrl-C is (passed on to mpiexec, which ends the ranks)."""
    exc = KeyboardInterrupt()
    exc.signum = signum  # type: ignore[attr-defined]
    raise exc


class _Copy:
    """Writes bytes to a text stream: to its binary buffer when it has one, else decoded (captured, redirected)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.out = stream, getattr(stream, "buffer", None)
        self.text = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write(self, chunk: bytes) -> None:
        if self.out is not None:
            self.stream.flush()  # what this process wrote before, first
            self.out.write(chunk)
        else:
            self.stream.write(self.text.decode(chunk))
        self.stream.flush()


class _EndWatch(threading.Thread):
    """Notes the order in which the ranks' processes end, through Linux pidfds.

    mpiexec ends every rank once one dies, and Hydra's report then names any
    of them; a pidfd becomes readable the moment its process ends, before
    mpiexec has had time to end the others. ``order`` lists the ranks seen
    ending at each look of this thread (several at once on a busy machine).
    Without pidfds (not Linux, an old kernel) it stays empty. With
    ``ends_ranks`` (Hydra run with ``-disable-auto-cleanup``) it also ends
    the job when a rank fails: the others write their flight-recorder dumps
    (SIGUSR1), then are killed. It also watches that no rank stays stopped
    (:mod:`polydist.launch.liveness`): a frozen rank is noted in
    ``rank{N}.frozen``, the others dump, and it is killed, which ends the job
    as a dead rank does.
    """

    def __init__(self, folder: str, nproc: int, ends_ranks: bool = False) -> None:
        super().__init__(name="polydist-mpi-watch", daemon=True)
        self.folder, self.nproc, self.ends_ranks = folder, nproc, ends_ranks
        self.ending = False
        self.liveness = Watch()
        self.order: list[list[int]] = []
        self._wake_r, self._wake_w = os.pipe()

    def stop(self) -> None:
        os.write(self._wake_w, b"x")
        self.join(timeout=2)
        os.close(self._wake_w)

    def first_failed(self) -> list[int]:
        """The first ranks to end among those that did not finish their script (:func:`mark_done`)."""
        done = {r for r in range(self.nproc) if os.path.exists(os.path.join(self.folder, f"rank{r}.done"))}
        return next((g for g in ([r for r in group if r not in done] for group in self.order) if g), [])

    def _end_survivors(self) -> None:
        """A rank failed (under ``-disable-auto-cleanup``): the others dump their flight recorders, then are killed."""
        from ..trace.dump import peers_dump

        ended = {r for group in self.order for r in group}
        alive = {r: pid for r, pid in pids(self.folder).items() if r not in ended}
        if not _frozen(self.folder):  # else they dumped already, before the frozen rank was ended
            peers_dump(alive, self.folder)
        for pid in alive.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def run(self) -> None:
        if not hasattr(os, "pidfd_open"):
            return
        poller, ranks = select.poll(), {}  # pidfd -> rank
        poller.register(self._wake_r, select.POLLIN)
        watched: set[int] = set()
        try:
            while True:
                if len(watched) < self.nproc:  # ranks note their pids as they start
                    for rank, pid in pids(self.folder).items():
                        if rank in watched:
                            continue
                        watched.add(rank)
                        try:
                            fd = os.pidfd_open(pid)
                        except ProcessLookupError:  # it ended before it was watched
                            self.order.append([rank])
                            continue
                        ranks[fd] = rank
                        poller.register(fd, select.POLLIN)
                idle = None if not self.liveness.on or self.ending else _LIVENESS_POLL_MS
                ready = {fd for fd, _ in poller.poll(100 if len(watched) < self.nproc else idle)}
                if not self.ending:
                    self._check_liveness(set(ranks.values()))
                ended = sorted(ranks[fd] for fd in ready if fd in ranks)
                for fd in ready & ranks.keys():
                    poller.unregister(fd)
                if ended:
                    self.order.append(ended)
                    if self.ends_ranks and not self.ending and self.first_failed():
                        self.ending = True
                        self._end_survivors()
                if self._wake_r in ready:
                    return
        except OSError:  # pidfds refused (seccomp, an old kernel): no watch
            pass
        finally:
            for fd in (*ranks, self._wake_r):
                os.close(fd)

    def _check_liveness(self, running: set) -> None:
        if not self.liveness.on:
            return
        ended = {r for group in self.order for r in group}
        live = {r: pid for r, pid in pids(self.folder).items() if r in running and r not in ended}
        frozen = self.liveness.check(live)
        if frozen is None:
            return
        with open(os.path.join(self.folder, f"rank{frozen.rank}.frozen"), "w") as f:
            f.write(frozen.note())
        end_frozen(frozen, live, job_dir=self.folder)


_LIVENESS_POLL_MS = 250
_INTERRUPT_GRACE_S = 5.0  # after Ctrl-C, how long mpiexec may take to end its ranks before it is killed


def _frozen(folder: str) -> dict[int, str]:
    """``{rank: note}`` of the ranks the liveness watch ended (``rank{N}.frozen``)."""
    return rank_files(folder, ".frozen")


# A rank that died, as mpiexec reports it: MPICH's Hydra by pid, Open MPI by rank. Intel MPI's Hydra lists
# how each rank it lost ended, the ones it ended itself too: read only for the rank that ended first.
_IMPI_DEATH = re.compile(r"RANK (\d+) PID \d+ RUNNING AT (\S+)\s*=*\s*KILLED BY SIGNAL: (\d+ \([^)\n]*\))")
_HYDRA_DEATH = re.compile(r"PID (\d+) RUNNING AT (\S+)\s*=*\s*EXIT CODE: (-?\d+)")
_HYDRA_REASON = re.compile(r"EXIT STRING: ([^\n]+?)\s*$", re.MULTILINE)
# Open MPI 5 breaks its line before the signal: "... on node vm exited on\nsignal 9 (Killed)."
_OMPI_DEATH = re.compile(r"process rank (\d+) with PID (\d+) on node (\S+) exited on\s+([^\n]+?)\.?\s*$", re.MULTILINE)


def _killed_rank(failures: str, code: int, output: str, first: Sequence[int]) -> Optional[WorkerFailedError]:
    """The rank that died without a traceback (killed or crashed): the first to end, else mpiexec's report's."""
    by_rank = pids(failures)
    ranks = {pid: rank for rank, pid in by_rank.items()}
    pid, host, how, rank = None, None, None, None
    found = _OMPI_DEATH.search(output)
    if found:
        rank, pid, host, how = int(found[1]), int(found[2]), found[3], found[4]
    else:
        found = _HYDRA_DEATH.search(output)
        if found:
            pid, host, reason = int(found[1]), found[2], _HYDRA_REASON.search(output)
            how = reason[1] if reason else f"exit code {found[3]}"
            rank = ranks.get(pid)
    if first and rank not in first:  # mpiexec named a rank it stopped itself, or the rank's parent
        rank, how = first[0], None
        for found in _IMPI_DEATH.finditer(output):
            if int(found[1]) == rank:
                host, how = found[2], f"signal {found[3]}"
    number = rank_parent.signal_of(failures, by_rank[rank]) if rank in by_rank else None
    if number is not None:  # the rank's parent saw the signal; Hydra saw the parent's exit code
        how = f"killed by signal {number} ({signal_name(number)})"
    if rank is None:
        if pid is None:
            return None
        message = f"a process (pid {pid} on {host}) failed before it recorded its rank: {how}"
        return WorkerFailedError(f"{message} (mpiexec exit code {code})", {}, -1)
    where = f"pid {by_rank.get(rank, pid)}" + (f" on {host}" if host else "")
    also = f" (ranks {first} ended at the same moment)" if len(first) > 1 else ""
    lines = [
        f"rank {rank} ({where}) failed first{': ' + how if how else ''}{also}; mpiexec (exit code {code}) "
        "stopped the other ranks.",
        f"--- traceback of rank {rank} ---",
        "(no traceback: the process was killed, by someone or by the OS, or crashed in native code)",
    ]
    fate = {rank: f"{how}, pid {by_rank[rank]}"} if how and how.startswith("killed by") and rank in by_rank else {}
    return WorkerFailedError("\n".join(lines), {rank: (code, "")}, rank, fate)


def _failure_report(failures: str, code: int, output: str = "", first: Sequence[int] = ()) -> WorkerFailedError:
    recorded = recorded_failures(failures)
    frozen = _frozen(failures)
    if frozen:
        rank, note = sorted(frozen.items())[0]
        pid = pids(failures).get(rank)
        lines = [
            f"rank {rank} (pid {pid}) was {note}; the other ranks were stopped (mpiexec exit code {code}).",
            f"--- traceback of rank {rank} ---",
            NO_TRACEBACK,
        ]
        return WorkerFailedError("\n".join(lines), {rank: (code, "")}, rank, {rank: fate(note, pid)})
    if not recorded:
        killed = _killed_rank(failures, code, output, first)
        if killed is not None:
            return killed
        message = f"mpiexec exited with code {code} (no rank recorded an exception: a process died or exited non-zero)"
        return WorkerFailedError(message, {}, -1)
    root = next(iter(recorded))
    lines = [
        f"rank {root} failed first (mpiexec exit code {code}); MPI_Abort stopped the other ranks.",
        f"--- traceback of rank {root} ---",
        recorded[root].rstrip(),
    ]
    lines += [f"rank {r} also failed: {(tb.strip().splitlines() or [''])[-1]}" for r, tb in recorded.items() if r != root]
    return WorkerFailedError("\n".join(lines), {r: (code, tb) for r, tb in recorded.items()}, root)
