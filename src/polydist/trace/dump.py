"""Writing one rank's flight-recorder dump: its recent calls and every thread's Python stack.

A dump is written (format: :mod:`polydist.trace`)

- when a collective times out on this rank (the pipeline calls :func:`timed_out`);
- when the rank fails under ``polydist run`` or ``spawn`` (:func:`failed`, from the worker entry);
- on ``SIGUSR1``: the job goes on (``kill -USR1 PID`` on a rank that seems stuck);
- on ``SIGTERM`` when a polydist launcher set the trace directory: a launcher
  stops the surviving ranks of a failed job with it, and their dumps say where
  each one was; the rank then ends by SIGTERM as it would have;
- on request: :func:`dump_trace`.

Signals arrive while the main thread may be blocked inside a collective, in
C++, where Python runs no signal handler until the call returns. So the
signals also wake a watcher thread through :func:`signal.set_wakeup_fd`, and
the watcher writes the dump: ``sys._current_frames()`` shows the main thread
where it waits. Handlers are only installed where the program has none
(Python's default disposition) and only from the main thread.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from typing import Optional

from .. import context, settings
from ..backends import registry
from ..collectives.recorder import RECORDER, as_dict
from ..errors import WorldMismatchError
from . import history
from .pid_notes import note_pid
from .torch_records import torch_records

__all__ = ["dump_trace", "dump_path", "trace_dir", "timed_out", "failed", "peers_dump", "install_signal_handlers",
           "ignore_exit_notices", "mark_finished", "FORMAT", "VERSION", "DUMP_NOTE", "DISCARDED", "LEAVING"]  # fmt: skip

FORMAT, VERSION = "polydist-trace", 1
DISCARDED = "step discarded"  # the reason of a fault-tolerant job's dump when a lost peer made it discard a step
LEAVING = "exception, leaving alone"  # a fault-tolerant MPI rank's own failure: the others wait for it to be gone
QUICK = ("signal", "terminate", DISCARDED, LEAVING)  # dumps written without torch's symbolized stacks (see _write)
DUMP_NOTE = "flight recorder dump of this rank"  # how the note timed_out adds to an error begins
_lock = threading.RLock()  # one dump at a time; reentrant: a signal handler may run inside a dump, on its thread
_earlier: Optional[tuple] = None  # (error, traceback) of this process's last dump that had an error
_WATCHER = "polydist-trace-signals"


def trace_dir() -> str:
    """Where dumps go: ``$POLYDIST_TRACE_DIR`` (``polydist run --trace-dir``), else a folder of the job in the temp dir.

    The default, ``<tmp>/polydist-trace-<job>``, is named from the job's id
    (torchrun's ``TORCHELASTIC_RUN_ID``, Slurm's job and step), else from the
    parent process (the launcher that started every local rank).
    """
    chosen = settings.TRACE_DIR.read()
    if chosen:
        return chosen
    env = os.environ
    job = env.get("TORCHELASTIC_RUN_ID") or (
        f"slurm{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}" if "SLURM_JOB_ID" in env else f"ppid{os.getppid()}"
    )
    return os.path.join(tempfile.gettempdir(), f"polydist-trace-{job}")


def _who() -> dict:
    """This process's rank, world size, local rank and backend: from the live world, else the launcher's variables."""
    try:
        state = context.world()
    except WorldMismatchError:  # a group polydist does not adopt: the launcher's view below
        state = None
    if state is not None:
        from torch.distributed import get_backend

        try:
            backend = str(get_backend(state.pg))
        except (RuntimeError, ValueError):  # the group is being destroyed
            backend = None
        return dict(rank=state.rank, world_size=state.size, local_rank=state.layout.local_rank, backend=backend)
    info = registry.world.announced()  # never raises: contradicting variables read as serial, and a dump is written
    return dict(rank=info.rank, world_size=info.world_size, local_rank=info.local_rank, backend=None)


def _stacks() -> list:
    """Every thread's Python stack, outermost frame first, without the dump's own frames and thread."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main, me = threading.main_thread().ident, threading.get_ident()
    out = []
    for ident, frame in sys._current_frames().items():
        if names.get(ident) == _WATCHER:
            continue
        if ident == me:  # the dump's own frames: skip them, to the frame that asked for it
            while frame is not None and frame.f_code.co_filename == __file__:
                frame = frame.f_back
        frames = _frames(traceback.extract_stack(frame))
        out.append({"thread": names.get(ident, f"thread {ident}"), "ident": ident, "main": ident == main, "frames": frames})
    out.sort(key=lambda s: not s["main"])
    return out


def dump_path(folder: str, rank: int) -> str:
    """The file of ``rank``'s dump in ``folder``: ``rank<R>.json``."""
    return os.path.join(folder, f"rank{rank}.json")


def mark_finished() -> None:
    """Note in ``$POLYDIST_TRACE_DIR`` that this rank ended its program normally (``rank<R>.finished``): when
    another rank fails waiting for it, ``polydist trace`` and the launcher's report say it had finished, rather
    than "no dump". Only under a launcher that names the folder (polydist run); never raises."""
    folder = settings.TRACE_DIR.read()
    rank = _who()["rank"]
    if not folder or rank is None:
        return
    with contextlib.suppress(OSError):
        with open(os.path.join(folder, f"rank{rank}.finished"), "w"):
            pass


def _frames(summary: traceback.StackSummary) -> list:
    return [{"file": f.filename, "line": f.lineno, "function": f.name, "code": f.line or ""} for f in summary]


def dump_trace(path: Optional[str] = None, *, reason: str = "request", error: Optional[BaseException] = None) -> Optional[str]:
    """Write this rank's flight-recorder dump; returns the file written (None if it could not be).

    Args:
        path: a directory (the file is ``rank<R>.json`` in it, R the global
            rank) or a file name ending in ``.json``; default
            :func:`trace_dir`.
        reason: why ("request", "timeout", "exception", "signal", "terminate").
        error: the exception that caused the dump, if any; its type and
            message, and its traceback, go into the dump. A dump without
            one repeats the last error this process dumped (a launcher's
            SIGTERM that follows a timeout keeps the timeout's message).

    The file holds the calls the ring buffer keeps (the last
    ``$POLYDIST_TRACE_BUFFER``, oldest first; see :mod:`polydist.trace` for
    the format) and every thread's stack. It is written to a temporary file
    and renamed, so a reader never sees half a dump; a later dump of the same
    process replaces it and keeps what the earlier ones showed (:mod:`.history`).
    Never raises: a dump is written on error paths, where a full disk must not
    hide the error being reported (the reason goes to stderr). Any rank may
    call it at any time; no communication.
    """
    try:
        with _lock:
            return _write(path, reason, error)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        print(f"polydist: could not write the flight recorder's dump: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def _write(path: Optional[str], reason: str, error: Optional[BaseException]) -> str:
    global _earlier
    who = _who()
    records, dropped = RECORDER.records()
    if error is not None:
        _earlier = (
            f"{type(error).__name__}: {error}",
            "".join(traceback.format_exception(type(error), error, error.__traceback__)),
            _frames(traceback.extract_tb(error.__traceback__)),
        )
    # A later dump (a launcher's SIGTERM after the timeout) keeps the error an earlier one recorded.
    error_text, traceback_text, error_frames = _earlier if _earlier is not None else (None, None, [])
    data = {
        "format": FORMAT,
        "version": VERSION,
        **who,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "reason": reason,
        "time": time.time(),
        "error": error_text,
        "traceback": traceback_text,
        "error_frames": error_frames,
        "enabled": RECORDER.on,
        "dropped": dropped,
        "entries": [as_dict(r) for r in records],
        "stacks": _stacks(),
        # A dump asked for by a signal has a deadline (the launcher's grace before SIGKILL), and one of a step a
        # fault-tolerant job discarded is written while training goes on: torch's stacks take seconds to
        # symbolize, so only a rank's own error or timeout writes them (the ranks that waited).
        "torch": torch_records(stacks=reason not in QUICK),
    }
    target = path or trace_dir()
    if not target.endswith(".json"):
        target = dump_path(target, who["rank"])
    history.keep(target, data)  # "earlier": what this process's earlier dumps to the file showed
    folder = os.path.dirname(os.path.abspath(target))
    os.makedirs(folder, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=".dump-", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, default=str)
        os.replace(temp, target)
    except BaseException:
        os.unlink(temp)
        raise
    return target


def timed_out(exc: BaseException) -> None:
    """Dump after a collective timed out, and add where the dump is to ``exc``'s notes (shown with its traceback)."""
    path = dump_trace(reason="timeout", error=exc)
    exc._polydist_dumped = True  # type: ignore[attr-defined]  # failed() keeps this dump, whose reason says more
    if path is not None:
        note = f"{DUMP_NOTE}: {path} (read every rank's: polydist trace {os.path.dirname(path)})"
        if hasattr(exc, "add_note"):  # Python >= 3.11: shown under the error's traceback
            exc.add_note(note)
        else:
            print(f"polydist: {note}", file=sys.stderr, flush=True)


def failed(exc: BaseException) -> None:
    """Dump for an exception that ends this rank (the worker entry of ``polydist run`` and ``spawn`` calls it)."""
    if isinstance(exc, SystemExit) and exc.code in (0, None) or getattr(exc, "_polydist_dumped", False):
        return
    dump_trace(reason="exception", error=exc)


def peers_dump(pids: dict, job_dir: Optional[str] = None, wait_s: float = 2.0, folder: Optional[str] = None) -> None:
    """Send ``SIGUSR1`` to other ranks (``{rank: pid}``) and wait up to ``wait_s`` for their dumps to appear.

    For a job about to be ended at once (``MPI_Abort``, a frozen rank), whose
    other ranks would otherwise leave no trace. ``job_dir``: the ``polydist
    run --backend mpi`` job's folder (default ``$POLYDIST_FAILURE_DIR``), where
    a mark tells the ranks this SIGUSR1 is not Hydra's (see
    :func:`_hydra_notice`). ``folder``: where the ranks write their dumps
    (default :func:`trace_dir`).
    """
    start, folder, asked = time.time(), folder or trace_dir(), []
    job_dir = job_dir or settings.FAILURE_DIR.read()
    if job_dir and os.path.isdir(job_dir):
        open(os.path.join(job_dir, _REQUESTED), "w").close()
    for rank, pid in pids.items():
        try:
            os.kill(pid, signal.SIGUSR1)
            asked.append(rank)
        except (ProcessLookupError, PermissionError):  # already gone
            pass
    deadline = time.monotonic() + wait_s
    while asked and time.monotonic() < deadline:
        asked = [r for r in asked if not _written_since(dump_path(folder, r), start)]
        time.sleep(0.02)


def _written_since(path: str, start: float) -> bool:
    try:
        return os.stat(path).st_mtime >= start - 1  # mtime granularity
    except OSError:
        return False


# ---------------------------------------------------------------- signals

_mine: Optional[list] = None  # the signals whose handler is ours, once installed


def install_signal_handlers() -> None:
    """Dump on ``SIGUSR1``, and on ``SIGTERM`` when a polydist launcher set ``$POLYDIST_TRACE_DIR``.

    Called by the worker entry of ``polydist run`` and when a world is made
    (:mod:`polydist.live_world`); does nothing from a thread other than the
    main one, or for a signal that already has a handler. A later call puts
    our handlers back: MPICH's ``MPI_Init`` installs a SIGUSR1 handler of its
    own, in C, which Python's view of the handlers does not show.
    """
    global _mine
    if threading.current_thread() is not threading.main_thread():
        return
    if _mine is not None:
        for s in _mine:
            if signal.getsignal(s) is _on_signal:  # still ours as far as Python knows: make it so in C too
                signal.signal(s, _on_signal)
        return
    wanted = [signal.SIGUSR1] + ([signal.SIGTERM] if settings.TRACE_DIR.read() else [])
    _mine = [s for s in wanted if signal.getsignal(s) is signal.SIG_DFL]
    if not _mine:
        return
    for s in _mine:
        signal.signal(s, _on_signal)
    _start_watcher()
    if signal.SIGUSR1 in _mine:  # polydist trace --signal DIR finds this rank, and only this job's ranks
        note_pid(_who()["rank"])
    if _exit_notices_expected():  # any program under polydist's mpiexec, not only polydist run's worker entry
        atexit.register(ignore_exit_notices)


_watching = False  # the watcher thread writes the dumps; the Python-level handler only when it could not start


def _start_watcher() -> None:
    global _watching
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter
        os.close(read_fd), os.close(write_fd)
        return
    if previous != -1:  # the program (asyncio, a framework) has its own wakeup fd: leave it
        signal.set_wakeup_fd(previous)
        os.close(read_fd), os.close(write_fd)
        return
    _watching = True
    threading.Thread(target=_watch, args=(read_fd,), name=_WATCHER, daemon=True).start()


def _watch(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        for number in data:
            _act(number)


def _on_signal(number: int, frame: object) -> None:
    if not _watching:
        _act(number)


def _act(number: int) -> None:
    if number == signal.SIGUSR1:
        if not _hydra_notice():
            dump_trace(reason="signal")
    elif number == signal.SIGTERM:
        dump_trace(reason="terminate")
        _die_by(signal.SIGTERM)


_REQUESTED = "dumps-requested"
EXIT_NOTICES = "hydra-exit-notices"  # written by polydist.launch.mpiexec when MPICH's Hydra sends them


def _hydra_notice() -> bool:
    """Whether a SIGUSR1 is Hydra's notice that another rank exited, rather than a request for a dump.

    ``polydist run --backend mpi`` starts Hydra with ``-disable-auto-cleanup``
    (see :mod:`polydist.launch.mpiexec`), which then sends SIGUSR1 to every
    rank still running when one exits. Taken as such: a SIGUSR1 after another
    rank finished its script, unless polydist itself asked for dumps. A
    ``kill -USR1`` by hand still dumps while no rank has finished. Intel
    MPI's Hydra sends no such notices: there every SIGUSR1 asks for a dump.
    """
    folder = settings.FAILURE_DIR.read()
    if not folder or not os.path.isdir(folder) or not os.path.exists(os.path.join(folder, EXIT_NOTICES)):
        return False
    if os.path.exists(os.path.join(folder, _REQUESTED)):
        return False
    return any(name.endswith(".done") for name in os.listdir(folder))


def _exit_notices_expected() -> bool:
    """Whether this process runs under MPICH's Hydra started by :mod:`polydist.launch.mpiexec`, which signals exits."""
    folder = settings.FAILURE_DIR.read()
    return bool(folder) and os.path.exists(os.path.join(folder, EXIT_NOTICES))


def ignore_exit_notices() -> None:
    """Ignore SIGUSR1 from now on, when this rank is finishing (under ``polydist run --backend mpi``).

    Hydra's exit notices (see :func:`_hydra_notice`) may reach a rank during
    interpreter shutdown, when Python has put back the default action of
    SIGUSR1: ending the process, with a failed exit status. Called by the
    worker entry as the script ends, and at exit (``atexit``) by every
    process that installed the handlers under such a Hydra (``polydist
    bench``'s MPI ranks, for one: a rank that left first made the other die
    of a SIGUSR1 now and then).
    """
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGUSR1) in (_on_signal, signal.SIG_DFL):
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def _die_by(number: int) -> None:
    """End the process by signal ``number`` with its default action, from any thread (the exit status says so)."""
    libc = ctypes.CDLL(None)
    libc.signal(int(number), ctypes.c_void_p(0))  # SIG_DFL, process-wide; Python's signal.signal is main-thread only
    os.kill(os.getpid(), number)
    time.sleep(5)
    os._exit(128 + number)

