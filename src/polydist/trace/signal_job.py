"""``polydist trace --signal DIR``: ask the live ranks of one job, and of that job only, for their dumps.

Each rank of a job whose launcher names a trace directory (``polydist run``
sets ``$POLYDIST_TRACE_DIR``) notes its pid there when it starts
(``rank<R>.pid``, :func:`.pid_notes.note_pid`). :func:`signal_job` sends ``SIGUSR1`` to
each noted pid whose process still runs with that same trace directory in its
environment, and waits for their dumps; the job goes on. A pid that another
process took since, the ranks of other jobs, ``mpiexec`` and the launchers
are never signalled (``pkill -USR1 -f polydist.launch.worker`` hits them all,
and ``SIGUSR1`` ends a process that does not handle it).
"""

from __future__ import annotations

import os
from typing import Optional

from .. import settings
from .dump import peers_dump
from .pid_notes import PID_FILE

__all__ = ["live_ranks", "signal_job"]


def _environ(pid: int) -> Optional[dict]:
    """The environment process ``pid`` started with (Linux's /proc), or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    pairs = (item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
    return dict(pairs)


def live_ranks(folder: str) -> tuple[dict, list]:
    """``({rank: pid}, notes)``: the ranks noted in ``folder`` whose process runs with ``folder`` as its trace
    directory; a note (one line) for each noted rank left out, and why."""
    live, notes, here = {}, [], os.path.realpath(folder)
    for name in sorted(os.listdir(folder)):
        found = PID_FILE.fullmatch(name)
        if not found:
            continue
        rank = int(found.group(1))
        try:
            with open(os.path.join(folder, name)) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            notes.append(f"rank {rank}: {name} holds no pid")
            continue
        env = _environ(pid)
        theirs = env.get(settings.TRACE_DIR.name) if env is not None else None
        if env is None:
            notes.append(f"rank {rank}: pid {pid} is not running (or not readable)")
        elif theirs is None or os.path.realpath(theirs) != here:
            notes.append(f"rank {rank}: pid {pid} is now another process, not this job's rank: not signalled")
        else:
            live[rank] = (pid, env.get(settings.FAILURE_DIR.name))
    return live, notes


def signal_job(folder: str, wait_s: float = 5.0) -> list:
    """Send ``SIGUSR1`` to the live ranks noted in ``folder`` and wait up to ``wait_s`` for their dumps there;
    returns what was done, one line each. ``OSError`` when ``folder`` cannot be read."""
    live, notes = live_ranks(folder)
    if not live:
        return notes + [f"no live rank of a job noted in {folder} (rank<R>.pid): nothing signalled"]
    job_dirs = {job for _, job in live.values() if job}  # polydist run --backend mpi: the dumps are asked for
    peers_dump({rank: pid for rank, (pid, _) in live.items()}, job_dir=next(iter(job_dirs), None), wait_s=wait_s,
               folder=folder)  # fmt: skip
    ranks = ", ".join(str(r) for r in sorted(live))
    return notes + [f"asked rank(s) {ranks} for their dumps (SIGUSR1); the job goes on"]
