"""Liveness beside the timeout: polydist's launchers name a frozen worker within seconds.

A worker that is *stopped* — ``SIGSTOP``, a job-control stop, a debugger's
trace stop — sits in a collective's peers forever: on gloo until the
collective timeout (30 minutes by default), on MPI until polydist's
watchdog's (MPI itself has none). Each of polydist's launchers (the elastic engine behind ``polydist
run`` and ``spawn``/``Parallel``, and ``polydist run --backend mpi``) runs a
:class:`Watch` over the workers of its node: a worker whose process state
stays ``T`` (stopped) or ``t`` (trace stop) for
:data:`~polydist.settings.FROZEN_AFTER` seconds (``POLYDIST_FROZEN_AFTER``,
default 10; 0 turns the watch off) is frozen. The launcher then asks the other
ranks for their flight-recorder dumps (``SIGUSR1``, :func:`polydist.trace.dump.peers_dump`),
ends the frozen worker with ``SIGKILL``, and the job ends as it does when a
worker dies — or restarts, under ``--max-restarts`` — with a report naming
the frozen rank, for how long, and how it was seen (:func:`note_of`).

Why the kernel's process state is the heartbeat: it is read by the launcher
from ``/proc/PID/stat``, outside the worker, so it depends on nothing the
worker runs — not its main thread, not its GIL, not a thread of its own. A
rank in minutes of pure Python, in a C extension that holds the GIL, or in
``time.sleep(60)`` is running or sleeping (``R``/``S``/``D``), never ``T``: it
is never called frozen. A heartbeat thread inside the worker would need the
GIL to beat (a long C call holding it would look frozen), and one in native
code would keep beating in a rank wedged in native code, telling nothing the
kernel does not; a stopped process runs no thread at all, so its silence is
exactly the state the kernel reports.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Mapping, Optional

from .. import settings

__all__ = ["Watch", "Frozen", "process_state", "seen", "fate", "note_of", "end_frozen", "NO_TRACEBACK"]

STOPPED = ("T", "t")  # stopped by a signal; stopped by a tracer (ptrace)
_SEEN = {"T": "stopped (process state T)", "t": "in a trace stop (process state t)"}
NO_TRACEBACK = "(no traceback: the process was stopped; the other ranks' flight-recorder dumps say where each waited)"
_NOTES: dict[int, str] = {}  # pid -> how it was found frozen, for the failure report


def process_state(pid: int) -> Optional[str]:
    """The one-letter state of process ``pid`` from ``/proc/PID/stat`` (``R``, ``S``, ``D``, ``T``, ``t``,
    ``Z``, ...); None when it is gone or there is no ``/proc`` (then nothing is ever called frozen)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    end = stat.rfind(b")")  # the command name may hold spaces and parentheses: the state follows the last ')'
    return stat[end + 2 : end + 3].decode("ascii", "replace") if end > 0 else None


def seen(state: str) -> str:
    """``stopped (process state T)`` for a stopped process's state letter."""
    return _SEEN.get(state, f"process state {state}")


class Frozen:
    """A worker found frozen: its rank, pid, state letter and how long it has been so (seconds)."""

    __slots__ = ("rank", "pid", "state", "seconds")

    def __init__(self, rank: int, pid: int, state: str, seconds: float) -> None:
        self.rank, self.pid, self.state, self.seconds = rank, pid, state, seconds

    def note(self) -> str:
        return (
            f"frozen: {seen(self.state)} for {self.seconds:.1f} s, seen by the launcher in "
            f"/proc/{self.pid}/stat (bound: POLYDIST_FROZEN_AFTER={self.bound():g} s); polydist ended it with "
            "SIGKILL after asking the other ranks for their flight-recorder dumps"
        )

    @staticmethod
    def bound() -> float:
        return settings.FROZEN_AFTER.read() or 0.0


class Watch:
    """Which workers have stayed stopped for ``after`` seconds (default: :data:`~polydist.settings.FROZEN_AFTER`).

    Call :meth:`check` often (each launcher polls every 0.1–0.25 s) with the
    live workers ``{rank: pid}``; it returns the first one found frozen, else None.
    """

    def __init__(self, after: Optional[float] = None) -> None:
        self.after = Frozen.bound() if after is None else after
        self._since: dict[int, float] = {}  # pid -> when it was first seen stopped
        self._reported: set[int] = set()  # found frozen once: not again while it is being ended

    @property
    def on(self) -> bool:
        return self.after > 0

    def check(self, pids: Mapping[int, int]) -> Optional[Frozen]:
        if not self.on:
            return None
        now, found = time.monotonic(), None
        live = set(pids.values())
        for pid in [p for p in self._since if p not in live]:
            del self._since[pid]
        for rank, pid in sorted(pids.items()):
            if pid in self._reported:
                continue
            state = process_state(pid)
            if state not in STOPPED:
                self._since.pop(pid, None)
                continue
            seconds = now - self._since.setdefault(pid, now)
            if found is None and seconds >= self.after:
                found = Frozen(rank, pid, state, seconds)
                self._reported.add(pid)
        return found


def end_frozen(frozen: Frozen, others: Mapping[int, int], folder: Optional[str] = None, job_dir: Optional[str] = None) -> None:
    """Have the ``others`` (``{rank: pid}``) write their dumps into ``folder``, then SIGKILL the frozen worker.

    The note saying how it was found is kept for :func:`note_of`. SIGKILL is
    the one signal a stopped process acts on without being continued.
    """
    from ..trace.dump import peers_dump  # the launcher's error path only

    _NOTES[frozen.pid] = frozen.note()
    sys.stderr.write(f"polydist: rank {frozen.rank} (pid {frozen.pid}) is {frozen.note()}\n")
    sys.stderr.flush()
    peers_dump({r: p for r, p in others.items() if p != frozen.pid}, job_dir, folder=folder)
    try:
        os.kill(frozen.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def fate(note: str, pid: Optional[int]) -> str:
    """A frozen rank's fate for a report's first line, from its :meth:`Frozen.note` (kept as text: in the launcher,
    in the job's folder): the note's first clause and the pid, ``frozen: stopped (process state T) for 3.1 s, pid N``."""
    return f"{note.split(',')[0]}, pid {pid}"


def note_of(pid: Optional[int]) -> Optional[str]:
    """How worker ``pid`` was found frozen and ended (:meth:`Frozen.note`), or None when it was not."""
    return _NOTES.get(pid) if pid is not None else None
