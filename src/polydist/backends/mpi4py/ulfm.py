"""MPI's User Level Failure Mitigation (ULFM) for the mpi4py backend: survive a lost rank without a restart.

Semantics: ULFM's (the MPI Forum fault tolerance working group's proposal; Open MPI 5's ``MPIX_Comm_*``
under ``mpiexec --with-ft ulfm``, its "User-Level Fault Mitigation" docs and ``MPIX_Comm_revoke``,
``_shrink``, ``_agree`` man pages), through mpi4py 4's ``Comm.Revoke``, ``Shrink``, ``Agree``,
``Get_failed``, ``Ack_failed``. A failure reaches a rank as ``MPI.Exception`` of class
``ERR_PROC_FAILED`` (``_PENDING``), or ``ERR_REVOKED`` once another rank revoked the communicator.
Recovery: :func:`shrink`, :func:`agree` (the commit vote), :func:`grow` with :func:`join_parent` in
the replacements. Communicators here need ``MPI.ERRORS_RETURN``. MPI-level only: no torch.

mpi4py defines the methods under every MPI: without ULFM (the MPICH and Intel MPI wheels) it uses
stand-ins (``Revoke`` raises ``NotImplementedError``, ``Shrink`` is ``Dup``, ``Agree`` an all-reduce)
and the three error classes equal ``ERR_UNKNOWN``; Open MPI started without ``--with-ft`` runs the
calls but never returns from ``Shrink`` of a revoked communicator. :func:`support` tells them apart.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, Iterator, Mapping, Optional, Sequence

__all__ = [
    "AgreementError", "Heartbeats", "agree", "agree_bits", "finalize", "grow", "is_process_failure", "is_replacement",
    "join_parent",
    "keep_progress", "progressing", "launcher_options", "launcher_support", "shrink", "support",
]

RESTART_ADVICE = "restart from checkpoints instead (polydist run --max-restarts N)"
_OMPI_FT_KEYVAL = 12  # Open MPI 5's mpi.h: MPI_FT (mpi-ext.h's MPIX_FT), the predefined key after MPI_WIN_MODEL
_AGREE_TRIES = 8  # each failed try acknowledges at least one more failed rank: a bound, not a timeout


class AgreementError(RuntimeError):
    """:func:`agree` could not reach an agreement among the live ranks."""


def _mpi() -> Any:
    from mpi4py import MPI  # importing it initializes MPI: never at module level

    return MPI


def _library(MPI: Any) -> str:
    """The MPI library in a few words: "Open MPI v5.0.11", "MPICH 5.0.2", "Intel(R) MPI Library 2021.19.0 ..."."""
    first = MPI.Get_library_version().strip("\0 \n").splitlines()[0].split(",")[0]
    return " ".join(first.replace("Version:", "").split())


def _ft_enabled(MPI: Any) -> Optional[bool]:
    """Open MPI's MPI_FT attribute on COMM_WORLD: whether this job runs with ULFM on; None where not Open MPI."""
    if not _library(MPI).startswith("Open MPI"):
        return None
    address = MPI.COMM_WORLD.Get_attr(_OMPI_FT_KEYVAL)  # an unknown key to mpi4py: the address of a C int
    if type(address) is not int or address == 0:
        return None
    flag = ctypes.c_int.from_address(address).value
    return bool(flag) if flag in (0, 1) else None


def support(comm: Any = None) -> Optional[str]:
    """None when ULFM works in this process on ``comm`` (default ``COMM_WORLD``), else why not, in one line.

    Collective over ``comm``. Runs each ULFM call once on a freed-after duplicate with
    ``MPI.ERRORS_RETURN`` (milliseconds); returns, never aborts or hangs, under MPICH, Intel MPI and
    Open MPI without ULFM. The reason names the library (``MPI.Get_library_version``) and the restart path.

    Raises:
        mpi4py.MPI.Exception: duplicating ``comm`` failed.
    """
    MPI = _mpi()
    comm = MPI.COMM_WORLD if comm is None else comm

    def refuse(what: str) -> str:
        return f"ULFM fault tolerance is not usable with {_library(MPI)}: {what}; {RESTART_ADVICE}"

    if _ft_enabled(MPI) is False:
        return refuse("this job was started without it (start it with mpiexec --with-ft ulfm)")
    dup = comm.Dup()
    dup.Set_errhandler(MPI.ERRORS_RETURN)
    steps = (  # (call, its check); identical on every rank of one library, so no rank is left waiting
        ("MPI_Comm_get_failed", lambda: dup.Get_failed().Free(), lambda _: True),
        ("MPI_Comm_ack_failed", lambda: dup.Ack_failed(dup.Get_size()), lambda _: True),
        ("MPI_Comm_agree", lambda: dup.Agree(1), lambda flag: flag == 1),
        ("MPI_Comm_revoke", dup.Revoke, lambda _: dup.Is_revoked()),  # the first call no stand-in fakes
        ("MPI_Comm_shrink", lambda: _size_freed(dup.Shrink()), lambda size: 0 < size <= dup.Get_size()),
    )
    try:
        for step, call, check in steps:
            if not check(call()):
                return refuse(f"{step} gave a wrong result")
    except NotImplementedError:
        return refuse(f"{step} is not implemented")
    except MPI.Exception as exc:
        return refuse(f"{step} failed ({exc.Get_error_string().strip()})")
    finally:
        dup.Free()
    return None


def _size_freed(comm: Any) -> int:
    size = comm.Get_size()
    comm.Free()
    return size


def launcher_support(mpiexec: str) -> Optional[str]:
    """None when the MPI of ``mpiexec`` (a path, or a name on PATH) has ULFM, else why not, in one line.

    For launchers, before any rank starts (no ``MPI_Init``; about 50 ms): ``ompi_info --parsable`` beside
    ``mpiexec`` must list ``options:ft_mpi_support:yes``. Without ``ompi_info`` there (MPICH's and Intel
    MPI's Hydra) it is refused, named from its ``--version``.
    """
    where = mpiexec if os.sep in mpiexec else (shutil.which(mpiexec) or mpiexec)
    for folder in dict.fromkeys(os.path.dirname(p) for p in (os.path.abspath(where), os.path.realpath(where))):
        info = os.path.join(folder, "ompi_info")
        if os.access(info, os.X_OK):
            if "options:ft_mpi_support:yes" in _output([info, "--parsable"]).splitlines():
                return None
            return f"Open MPI at {folder} was built without ULFM (ompi_info: FT MPI support no); {RESTART_ADVICE}"
    lines = [line.strip() for line in _output([where, "--version"]).splitlines() if line.strip()]
    if lines and lines[0].startswith("HYDRA"):  # MPICH's Hydra gives only its version
        name = " ".join(["MPICH"] + [line.split()[-1] for line in lines if line.startswith("Version:")][:1])
    else:
        name = lines[0] if lines else f"the MPI of {where}"
    return f"{name} has no usable ULFM (fault tolerance needs Open MPI 5, mpiexec --with-ft ulfm); {RESTART_ADVICE}"


def launcher_options(detector_timeout: Optional[float] = None) -> list:
    """Open MPI ``mpiexec`` options that turn ULFM on; with ``detector_timeout`` (seconds), its failure detector.

    The detector declares a rank failed (a frozen one: ``SIGSTOP``, a hung host) when its heartbeats,
    every ``timeout / 4`` s, stop for that long. They go out only while the rank is in MPI: a rank
    computing longer is declared failed too (and aborts itself) unless it runs :func:`keep_progress`.
    Open MPI 5.0.11's threaded detector would avoid that but hangs ``MPI_Finalize``, so it stays off.
    ``async_mpi_finalize`` skips the PMIx fence that begins ``MPI_Finalize``: after a lost rank it
    sometimes never completed (2 of 45 jobs); ULFM's finalize flushes with a barrier of its own.
    ``coll ^han,cuda``: Open MPI picks its hierarchical collectives (``han``; ``cuda`` where built) for a
    communicator that spans nodes, and they are not fault-tolerant: with a rank of 4 on two hosts killed,
    each survivor's ``MPI_Allreduce`` returned ``MPI_SUCCESS`` with a partial sum, the vote committed
    the step and the replicas' states drifted apart (open-mpi/ompi#13915, open); ``tuned`` serves instead.
    """
    options = ["--with-ft", "ulfm", "--mca", "async_mpi_finalize", "true", "--mca", "coll", "^han,cuda"]
    if detector_timeout is not None:
        if not detector_timeout > 0:
            raise ValueError(f"detector_timeout must be > 0 seconds, got {detector_timeout!r}")
        options += ["--mca", "mpi_ft_detector", "true", "--mca", "mpi_ft_detector_period", f"{detector_timeout / 4:g}",
                    "--mca", "mpi_ft_detector_timeout", f"{detector_timeout:g}"]  # fmt: skip
    return options


def keep_progress(interval: float = 0.05) -> "Heartbeats":
    """Turn MPI's progress engine every ``interval`` seconds from a daemon thread, until the returned
    :class:`Heartbeats`' ``stop()`` (or :func:`finalize`, or the interpreter's exit).

    Keeps the failure detector's heartbeats going while the rank computes outside MPI (an ``Iprobe`` on
    ``COMM_SELF`` progresses every transport). ``interval``: well under the detector's period.

    Raises:
        RuntimeError: MPI was not initialized with ``MPI_THREAD_MULTIPLE`` (mpi4py's default).
    """
    return Heartbeats(grace=math.inf, interval=interval)


class Heartbeats:
    """Open MPI's failure detector's heartbeats kept going while this rank is between training steps.

    The detector takes a rank that turns no MPI progress for its timeout for failed, even one that computes:
    every rank building its model and loading data before the first step would be declared failed by
    the others. Between :meth:`pause` (a step begins) and :meth:`resume` (it ended) the detector judges
    the rank as it is; outside steps a thread turns the progress engine (an ``Iprobe`` on ``COMM_SELF``
    every ``interval`` seconds), for at most ``grace`` seconds per stretch, so that a rank hung outside
    any step is still declared failed, ``grace`` plus the timeout later. Starts resumed; stopped by
    :meth:`stop`, :func:`finalize` or the interpreter's exit.

    Raises:
        RuntimeError: MPI was not initialized with ``MPI_THREAD_MULTIPLE``.
    """

    def __init__(self, grace: float = 120.0, interval: float = 0.05) -> None:
        MPI = _mpi()
        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise RuntimeError("Heartbeats need MPI_THREAD_MULTIPLE (mpi4py.rc.thread_level = 'multiple')")
        self._grace, self._since, self._on = grace, time.monotonic(), True
        self._stop = threading.Event()

        def run() -> None:
            while not self._stop.wait(interval):
                if self._on and time.monotonic() - self._since < self._grace:
                    MPI.COMM_SELF.Iprobe()

        self._thread = threading.Thread(target=run, name="ulfm-heartbeats", daemon=True)
        self._thread.start()
        # Stopped before mpi4py's MPI_Finalize (a C-level exit hook, run after atexit's): no MPI call may overlap it.
        atexit.register(self.stop)
        _HEARTBEATS.add(self)

    def pause(self) -> None:
        self._on = False

    def resume(self) -> None:
        self._since, self._on = time.monotonic(), True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        _HEARTBEATS.discard(self)
        atexit.unregister(self.stop)


_HEARTBEATS: set = set()  # the live ones, which finalize() stops


def finalize() -> None:
    """``MPI_Finalize`` now, the heartbeats going on until just before it. Idempotent.

    At interpreter exit the heartbeats stop with the ``atexit`` handlers, and mpi4py's
    ``MPI_Finalize`` comes only after the interpreter's teardown: seconds on a loaded machine,
    during which the others' failure detector (timeout: the collective timeout) declared a
    finished rank failed, and ULFM's finalize then hung the job (2 of 10 runs)."""
    for heartbeats in list(_HEARTBEATS):
        heartbeats.stop()
    MPI = _mpi()
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()


@contextlib.contextmanager
def progressing(interval: float = 0.05) -> Iterator[None]:
    """:func:`keep_progress` for the duration of a ``with`` block: around an MPI call that blocks without turning
    the progress engine (``MPI_Comm_spawn``'s root waits on the runtime while the new processes start)."""
    heartbeats = keep_progress(interval)
    try:
        yield
    finally:
        heartbeats.stop()


def is_process_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is mpi4py's ``MPI.Exception`` of class ``ERR_PROC_FAILED``, ``ERR_PROC_FAILED_PENDING`` or
    ``ERR_REVOKED`` (a rank failed, or another rank revoked the communicator). False for anything else, and under
    an MPI without ULFM, where mpi4py makes the three ``ERR_UNKNOWN``."""
    MPI = sys.modules.get("mpi4py.MPI")  # not imported: no such exception exists, and importing would start MPI
    if MPI is None or not isinstance(exc, MPI.Exception):
        return False
    classes = {MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED} - {MPI.ERR_UNKNOWN}
    return exc.Get_error_class() in classes


def shrink(comm: Any) -> tuple:
    """Revoke ``comm`` and shrink it to its live ranks; returns ``(new communicator, lost ranks of comm)``.

    Collective over the survivors, each calling it once it saw a failure (:func:`is_process_failure`):
    the revoke fails the pending and later operations on ``comm`` everywhere, so all of them get here.
    The survivors keep their order; the new communicator has ``MPI.ERRORS_RETURN``. Lost are the ranks
    of ``comm`` missing from it, as the shrink agreed: the same sorted list on every survivor
    (``Get_failed`` is only what this rank knows). A frozen rank blocks the shrink until it is killed or
    the failure detector declares it; one failing during the shrink may stay a member (its failure then
    shows on the new communicator). ``comm`` stays revoked: free it when done.

    Raises:
        NotImplementedError: this MPI has no ULFM (:func:`support` says so first).
        mpi4py.MPI.Exception: ``comm`` is not a valid communicator (ULFM's shrink
            itself never raises ``ERR_PROC_FAILED`` or ``ERR_REVOKED``).
    """
    MPI = _mpi()
    comm.Revoke()  # allowed on a revoked communicator: any survivor may be first
    new = comm.Shrink()
    new.Set_errhandler(MPI.ERRORS_RETURN)
    old_group, new_group = comm.Get_group(), new.Get_group()
    kept = MPI.Group.Translate_ranks(new_group, list(range(new.Get_size())), old_group)
    old_group.Free()
    new_group.Free()
    return new, sorted(set(range(comm.Get_size())) - set(kept))


def agree(comm: Any, flag: bool) -> bool:
    """The commit vote: the AND of ``flag`` over the live ranks of ``comm``, the same on each of them.

    Collective over the live ranks, also on a revoked communicator. ``MPI_Comm_agree`` leaves out a
    rank that failed before contributing and then raises ``ERR_PROC_FAILED`` on every rank alike; the
    failure is acknowledged (``Ack_failed``) and the vote taken again, over the ranks still alive.

    Raises:
        AgreementError: no agreement after repeated failures, or an MPI error
            other than a process failure (named in the message).
    """
    return agree_bits(comm, 1 if flag else 0) == 1


def agree_bits(comm: Any, bits: int) -> int:
    """:func:`agree` on several flags at once: the bitwise AND of ``bits`` (a non-negative int below 2**31)
    over the live ranks, the same on each of them (``MPI_Comm_agree`` ANDs its integer bit by bit)."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits < 1 << 31:
        raise ValueError(f"bits must be an int in [0, 2**31), got {bits!r}")
    MPI = _mpi()
    for _ in range(_AGREE_TRIES):
        try:
            return comm.Agree(bits)
        except MPI.Exception as exc:
            if exc.Get_error_class() != MPI.ERR_PROC_FAILED or MPI.ERR_PROC_FAILED == MPI.ERR_UNKNOWN:
                raise AgreementError(f"MPI_Comm_agree failed: {exc.Get_error_string().strip()}") from exc
            comm.Ack_failed(comm.Get_size())  # raised on every live rank alike, so all retry together
    raise AgreementError(f"MPI_Comm_agree kept failing: ranks failed during each of {_AGREE_TRIES} tries")


def grow(comm: Any, n: int, command: str, args: Sequence[str] = (), env: Optional[Mapping[str, str]] = None,
         info: Optional[Mapping[str, str]] = None, root: int = 0) -> Any:  # fmt: skip
    """Spawn ``n`` replacements running ``command args`` and merge them with ``comm``'s ranks.

    Collective over ``comm`` (``MPI_Comm_spawn`` from ``root``, ``MPI_Intercomm_merge``); each
    replacement calls :func:`join_parent`. Returns an intracommunicator (``MPI.ERRORS_RETURN``) of
    ``comm.Get_size() + n`` ranks: ``comm``'s in their order, then the replacements. ``env`` joins their
    environment (Open MPI 5's ``PMIX_ENVAR`` spawn key; the older ``env`` prints a deprecation notice);
    ``info``: more spawn keys, e.g. ``{"map_by": "slot:oversubscribe"}``. Takes a second or more.

    Raises:
        ValueError: ``n`` < 1.
        mpi4py.MPI.Exception: the spawn failed, or only some of the ``n`` started.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    MPI = _mpi()
    spawn_info = MPI.Info.Create()
    keys = {**(info or {}), **({"PMIX_ENVAR": "\n".join(f"{k}={v}" for k, v in env.items())} if env else {})}
    for key, value in keys.items():
        spawn_info.Set(key, str(value))
    errcodes: list = []
    try:
        # The root waits in the runtime (PMIx) for seconds while the replacements start, without heartbeats: Open
        # MPI's failure detector would declare it failed after its timeout.
        with progressing() if MPI.Query_thread() == MPI.THREAD_MULTIPLE else contextlib.nullcontext():
            inter = comm.Spawn(command, list(args), maxprocs=n, info=spawn_info, root=root, errcodes=errcodes)
    finally:
        spawn_info.Free()
    failed = [code for code in errcodes if code != MPI.SUCCESS]
    if failed:
        raise MPI.Exception(failed[0])
    inter.Set_errhandler(MPI.ERRORS_RETURN)
    merged = inter.Merge(high=False)  # the low group first: the survivors, in their order
    merged.Set_errhandler(MPI.ERRORS_RETURN)
    return merged


def is_replacement() -> bool:
    """Whether :func:`grow` started this process (``MPI_Comm_get_parent`` is not ``COMM_NULL``)."""
    MPI = _mpi()
    return MPI.Comm.Get_parent() != MPI.COMM_NULL


def join_parent() -> Any:
    """In a replacement: merge with the ranks that spawned it (collective with their :func:`grow`).

    Returns the merged communicator (``MPI.ERRORS_RETURN``), the replacements last.

    Raises:
        RuntimeError: this process was not spawned (:func:`is_replacement` is False).
    """
    MPI = _mpi()
    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        raise RuntimeError("join_parent: this process was not started by MPI_Comm_spawn, so it replaces no rank")
    parent.Set_errhandler(MPI.ERRORS_RETURN)
    merged = parent.Merge(high=True)  # high: after the survivors
    merged.Set_errhandler(MPI.ERRORS_RETURN)
    return merged


def _output(command: list) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout + done.stderr
