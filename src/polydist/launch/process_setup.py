"""What runs inside a worker process that a polydist launcher started: its set-up and how it fails.

The launcher side is :mod:`~polydist.launch.elastic` (``spawn``, ``Parallel``,
``polydist run``) and :mod:`~polydist.launch.mpiexec` (``polydist run
--backend mpi``); the worker's entry point is :mod:`~polydist.launch.worker`.
Here: the per-worker defaults, dying with the launcher, making a failure
report well (its dump, its error file), and, under mpiexec, the files a rank
leaves in ``$POLYDIST_FAILURE_DIR`` for its launcher (``rank{N}.pid``,
``rank{N}.done``) and its prefixed output.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import sys
import time
import traceback
from typing import Callable, Iterator, Optional, TextIO

import torch
from torch.distributed.elastic.multiprocessing.errors import get_error_handler

from .. import _torch
from ..backends import leaving
from . import group_timeout
from .environment import detect
from ..settings import FAILURE_DIR, TRACE_DIR
from ..trace.dump import failed
from ..trace.records import is_library

__all__ = [
    "worker_setup", "death_signal_setter", "die_with_parent", "worker_errors", "dump_when_uncaught", "interrupted",
    "adopt_own_groups",
    "PEER_GONE",
    "record_pid", "mark_done", "pids", "rank_files", "prefix_output",
]  # fmt: skip

FR_ENTRIES = 2000  # torch's flight-recorder entries per process by default under polydist's launchers

# How a rank's error reads when a peer failed first (the launcher blames the peer, not this rank).
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "remote worker")
_PEER_GONE_GRACE_S = 3  # how long a rank that lost a peer waits for the launcher to notice that peer


def worker_setup() -> None:
    """Per-worker defaults: one share of the CPU cores for intra-op threads; torch's flight recorder on;
    ``polydist run --timeout`` as the default of the groups the program creates (:mod:`.group_timeout`).

    Like torchrun, avoid oversubscription when several workers share a node;
    an explicit ``OMP_NUM_THREADS`` wins. torch's flight recorder keeps the
    last ``TORCH_FR_BUFFER_SIZE`` operations of gloo and nccl, whoever calls
    them (DDP, FSDP2), for polydist's dumps (:mod:`polydist.trace.dump`):
    set to :data:`FR_ENTRIES` unless the user set it (or its older name
    ``TORCH_NCCL_TRACE_BUFFER_SIZE``) — torch 2.13's own default, so a change
    only on versions whose default is off; its cost is within the noise
    (benchmarks/torch_fr_cost.py). Set before the process group exists,
    when torch reads it.
    """
    if _torch.FR_BUFFER_SIZE not in os.environ and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ:
        os.environ[_torch.FR_BUFFER_SIZE] = str(FR_ENTRIES)
    if "OMP_NUM_THREADS" not in os.environ:
        local = detect().local_world_size or 1  # any launcher's count: mpiexec exports no LOCAL_WORLD_SIZE
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(local, 1)))
    global _in_worker
    _in_worker = True
    group_timeout.apply()  # polydist run --timeout: also for the groups the program creates without polydist
    leaving.start()  # debug mode: a rank that leaves while others wait in a call it skipped, also without polydist


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def death_signal_setter() -> Optional[Callable[[], int]]:
    """``prctl(PR_SET_PDEATHSIG, SIGKILL)`` for the calling process, as a function; None off Linux.

    Resolved now, so the function is also safe to run between fork and exec
    (as a ``subprocess`` ``preexec_fn``).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # a libc without prctl: run unguarded
        return None
    return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def die_with_parent(parent_pid: Optional[int] = None) -> None:
    """Have the kernel SIGKILL this process when its parent (the launcher) dies; Linux only.

    torch's elastic agent starts each worker in a session of its own, so a
    launcher killed with SIGKILL, which cannot stop them, would leave them
    running — blocked in a collective for up to its timeout. Uses
    ``prctl(PR_SET_PDEATHSIG, SIGKILL)``. ``parent_pid``: the pid the parent
    had (None: any parent but init); if the parent already died before this
    call (the process was reparented), exit at once. Does nothing elsewhere
    than Linux.
    """
    arm = death_signal_setter()
    if arm is None or arm() != 0:
        return
    parent = os.getppid()
    reparented = parent != parent_pid if parent_pid is not None else parent == 1
    if reparented:  # the parent died before prctl took effect
        sys.stderr.write(f"polydist: the launcher (pid {parent_pid or 'unknown'}) is gone; this worker exits\n")
        sys.stderr.flush()
        os._exit(1)


@contextlib.contextmanager
def worker_errors() -> Iterator[None]:
    """Around a worker's own code (inside torch's ``@record``): make its failures report well.

    * Any failure writes this rank's flight-recorder dump (:mod:`polydist.trace.dump`).
    * A non-zero ``sys.exit`` is recorded like an exception (torch's
      ``@record`` lets it pass), so the launcher shows where it was called.
    * A lost connection to a peer ("Connection closed by peer": a failed
      peer, seen sometimes before the peer's own exit) pauses this rank 3 s
      before re-raising. The launcher stops it meanwhile, so the peer is
      reported as the cause (torch's spawn reports only the first process to
      exit), and this rank is not stopped halfway through writing its error
      file (which torch's agent would then fail to read).
    """
    try:
        yield
    except BaseException as exc:
        failed(exc)  # the flight recorder's dump of this rank, first: the launcher may stop it any moment now
        if isinstance(exc, SystemExit) and exc.code not in (0, None):
            get_error_handler().record_exception(exc)
        if isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in PEER_GONE):
            time.sleep(_PEER_GONE_GRACE_S)
        raise


def interrupted(exc: BaseException) -> str:
    """One line for a rank stopped by Ctrl-C (``KeyboardInterrupt``): where its own code was, instead of a
    traceback of the launcher's and the library's frames above and below it."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not is_library(f.filename)] or frames[-1:]  # the rule polydist trace's places use
    at = f" at {own[-1].filename}:{own[-1].lineno} (in {own[-1].name})" if own else ""
    return f"interrupted ({type(exc).__name__}){at}"


def dump_when_uncaught() -> None:
    """With ``$POLYDIST_TRACE_DIR`` set, an uncaught exception writes this rank's dump, under any launcher.

    ``polydist run``'s worker entry and ``spawn`` dump a failing rank
    themselves (:func:`worker_errors`); torchrun, srun or a Kubeflow pod start
    the program as it is, so this hook, installed when polydist makes or
    adopts the world (wired in :mod:`polydist._wiring`), writes the dump
    (:func:`polydist.trace.dump.failed`) once the hook in place (torch's,
    which prefixes ``[rankN]:``) printed the traceback. Not where the
    MPI group's abort hook is in place: it writes the dump itself. A non-zero
    ``sys.exit`` or ``os._exit`` raises nothing that reaches the hook.
    """
    hooked = getattr(sys.excepthook, "_polydist_dump", False) or getattr(sys.excepthook, "_polydist_abort", False)
    if hooked or not TRACE_DIR.read():
        return
    previous = sys.excepthook

    def hook(kind, value, tb):  # type: ignore[no-untyped-def]
        previous(kind, value, tb)  # the traceback first: the launcher may stop a rank that lost a peer any moment
        failed(value)

    hook._polydist_dump = True  # type: ignore[attr-defined]
    sys.excepthook = hook


_TIMED_OUT = ("Timed out waiting",)  # gloo's words for a collective that timed out (a peer never came)
_ASK_PEERS_S = 2.0  # how long a rank about to abort the job waits for the others' dumps


def finding_before_abort(exc: BaseException) -> Optional[str]:
    """For a rank about to end the MPI job (``MPI_Abort``) under a launcher that prints no report of its own
    (plain ``mpiexec``), with ``$POLYDIST_TRACE_DIR`` set, for ``exc`` that another rank caused (a gloo
    collective timed out, or a peer's connection was lost): the first finding of the job's dumps, which names
    that rank, else None.

    Writes this rank's dump, asks the other live ranks noted in the trace directory for theirs (``SIGUSR1``,
    up to 2 s; a stopped rank writes none), and says of a rank that left none, on this host, whether its
    process is stopped (``/proc/PID/stat``): ``no dump from rank 1 (frozen: stopped (process state T), pid
    N)``. The abort kills the others at once: the dumps are asked for while they live. Not under ``polydist
    run``, whose launcher reports the finding itself."""
    folder = TRACE_DIR.read()
    if not folder or FAILURE_DIR.read() or not any(m in str(exc) for m in PEER_GONE + _TIMED_OUT):
        return None
    failed(exc)  # first: mpiexec may end this rank any moment (a peer was killed)
    exc._polydist_dumped = True  # type: ignore[attr-defined]  # the abort's own hook need not write it again
    from ..trace.analyze import diagnose, load  # the reader: only once the job fails
    from ..trace.dump import peers_dump
    from ..trace.signal_job import live_ranks
    from .liveness import STOPPED, process_state, seen

    peers = {rank: pid for rank, (pid, _) in live_ranks(folder)[0].items() if pid != os.getpid()}
    peers_dump(peers, wait_s=_ASK_PEERS_S, folder=folder)
    states = {rank: process_state(pid) for rank, pid in peers.items()}
    fates = {rank: f"frozen: {seen(state)}, pid {peers[rank]}" for rank, state in states.items() if state in STOPPED}
    return diagnose(load(folder), fates).headline()


_in_worker = False  # polydist run's worker or spawn's process: its own entry dumps and installs the handlers


def adopt_own_groups(adopt: Callable[[], object]) -> None:
    """With ``$POLYDIST_TRACE_DIR`` set, outside polydist's own launchers: the program's own
    ``init_process_group`` (or one made before polydist was imported) is adopted at once (``adopt``:
    :func:`polydist.live_world.world`), so that a program that imports polydist and calls none of its functions,
    under torchrun, mpiexec or srun, gets the same dumps as one that calls polydist: on SIGUSR1, on the
    launcher's SIGTERM and on an uncaught exception (hooks wired in :mod:`polydist._wiring`). Its rank writes
    nothing it would not have written without polydist; a group polydist cannot adopt (not the launcher's
    world) is left as it is, with one line on stderr. Idempotent."""
    c10d = getattr(torch.distributed, "distributed_c10d", None)
    if not TRACE_DIR.read() or c10d is None or getattr(c10d.init_process_group, "_polydist_adopts", False):
        return
    init = c10d.init_process_group

    def adopted() -> None:
        if _in_worker:
            return
        try:
            adopt()
        except Exception as exc:  # noqa: BLE001 - a diagnostic aid must not change the program's outcome
            print(f"polydist: no dumps for this process group ({type(exc).__name__}: {str(exc).splitlines()[0]})",
                  file=sys.stderr, flush=True)  # fmt: skip

    @functools.wraps(init)
    def init_process_group(*args, **kwargs):  # type: ignore[no-untyped-def]
        init(*args, **kwargs)
        adopted()

    init_process_group._polydist_adopts = True  # type: ignore[attr-defined]
    c10d.init_process_group = torch.distributed.init_process_group = init_process_group
    if _torch.default_pg() is not None:  # polydist imported after the program made its group
        adopted()


# ------------------------------------------------------------ under mpiexec: files for the launcher, prefixed output


def record_pid(rank: int) -> None:
    """Note this rank's pid in ``$POLYDIST_FAILURE_DIR``, so :func:`polydist.launch.mpiexec.run` can name it if it is killed."""
    folder = FAILURE_DIR.read()
    if folder and os.path.isdir(folder):
        path = os.path.join(folder, f"rank{rank}.pid")
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)  # whole, for the watch that reads it


def mark_done(rank: int) -> None:
    """Note in ``$POLYDIST_FAILURE_DIR`` that this rank's script finished, so its exit is not taken for a failure."""
    folder = FAILURE_DIR.read()
    if folder and os.path.isdir(folder):
        open(os.path.join(folder, f"rank{rank}.done"), "w").close()


def rank_files(folder: str, suffix: str) -> dict[int, str]:
    """``{rank: text}`` of the files ``rank{N}{suffix}`` in ``folder``."""
    found = {}
    for name in os.listdir(folder):
        if name.startswith("rank") and name.endswith(suffix):
            with open(os.path.join(folder, name)) as f:
                found[int(name[4 : -len(suffix)])] = f.read()
    return found


def signal_name(number: int) -> str:
    """``"SIGKILL"`` for 9; ``"signal N"`` for a number this platform does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def pids(folder: str) -> dict[int, int]:
    """``{rank: pid}`` from the pid files in ``folder``."""
    return {rank: int(text) for rank, text in rank_files(folder, ".pid").items()}


class _Prefixed:
    """A text stream that writes whole lines, each starting with ``prefix``.

    mpiexec merges all ranks' output into one stream; whole-line writes keep
    lines from different ranks from interleaving mid-line.
    """

    def __init__(self, stream: TextIO, prefix: str) -> None:
        self._stream, self._prefix, self._partial = stream, prefix, ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        if lines:
            self._stream.write("".join(f"{self._prefix}{line}\n" for line in lines))
            self._stream.flush()
        return len(text)

    def flush(self) -> None:
        if self._partial:
            self._stream.write(self._prefix + self._partial)
            self._partial = ""
        self._stream.flush()

    def __getattr__(self, name: str):  # fileno, isatty, encoding, ...
        return getattr(self._stream, name)


def prefix_output(prefix: str) -> None:
    """Prefix every line this process writes to ``sys.stdout``/``sys.stderr`` (Python-level writes)."""
    sys.stdout = _Prefixed(sys.stdout, prefix)  # type: ignore[assignment]
    sys.stderr = _Prefixed(sys.stderr, prefix)  # type: ignore[assignment]
