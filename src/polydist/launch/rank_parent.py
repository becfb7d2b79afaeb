"""The parent of each rank under Hydra: ``python rank_parent.py DIR COMMAND...`` runs COMMAND, exits as it did.

Why: MPICH's Hydra proxy SIGKILLs every rank of a node the moment one of its
children ends *by a signal* (``src/pm/hydra/proxy/pmip.c``: ``if
(WIFSIGNALED(ret_status)) PMIP_bcast_signal(SIGKILL)``), even under
``-disable-auto-cleanup``. A rank killed by the OOM killer or by hand then
takes the others down within a millisecond, before they can write their
flight-recorder dumps, so ``polydist trace`` could not show where they
waited. This process is the proxy's child instead of the rank: it starts the
rank, and when the rank is killed by signal N it exits normally with status
128 + N (the shell's convention) and notes the signal in ``DIR/pid<PID>.signal``
(DIR: the job's folder of failures), where :mod:`polydist.launch.mpiexec` reads
it for its report. The survivors then live until polydist has asked
them for their dumps and ended them itself.

Signals: Hydra sends its signals (SIGUSR1 exit notices, SIGINT/SIGTERM on
Ctrl-C) to the process group, which the rank shares with this process; this
process ignores them and lets the rank act. If this process is killed, Hydra
kills the group, the rank with it.

It is run by file path, with ``python -I -S``: it imports neither polydist nor
torch, only the standard library, so it costs a few milliseconds and megabytes.
"""

from __future__ import annotations

import os
import signal
import sys

# Delivered to the whole process group by Hydra (or a terminal): the rank acts on them, this process waits.
_LEFT_TO_THE_RANK = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGPIPE")


def main(argv: list) -> int:
    """``argv``: DIR COMMAND...; run COMMAND as a child; return its exit status, or 128 + N if signal N ended it."""
    if len(argv) < 2:
        print("usage: rank_parent.py DIR COMMAND [ARG...]", file=sys.stderr)
        return 2
    folder, argv = argv[0], argv[1:]
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)  # exec failed; the OSError's traceback went to stderr
    for name in _LEFT_TO_THE_RANK:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    _close_pmi_fd()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        _note_signal(folder, pid, number)
        return 128 + number
    return os.waitstatus_to_exitcode(status)


def _close_pmi_fd() -> None:
    """Close this process's copy of Hydra's PMI socket (``$PMI_FD``): Hydra must see it close when the rank ends."""
    fd = os.environ.get("PMI_FD", "")
    if fd.isdigit():
        try:
            os.close(int(fd))
        except OSError:
            pass


def _note_signal(folder: str, pid: int, number: int) -> None:
    if os.path.isdir(folder):
        with open(os.path.join(folder, f"pid{pid}.signal"), "w") as f:
            f.write(str(number))


def signal_of(folder: str, pid: int) -> int | None:
    """The signal that killed process ``pid`` of a job, as its :func:`main` noted it in ``folder``; else None."""
    try:
        with open(os.path.join(folder, f"pid{pid}.signal")) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
