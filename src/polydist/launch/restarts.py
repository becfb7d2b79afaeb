"""Restarts: how many a job's workers have had, and the reruns of jobs whose launcher cannot restart.

PyTorch's elastic agent (``polydist run``, ``spawn``, torchrun) restarts its
workers itself and tells them the count in ``TORCHELASTIC_RESTART_COUNT``.
``mpiexec`` has no restart: ``polydist run --backend mpi --max-restarts N``
runs the whole MPI job again (:func:`rerun`), counting in
``$POLYDIST_RESTART_COUNT``.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Mapping, Optional

from ..errors import WorkerFailedError
from ..settings import RESTART_COUNT

__all__ = ["restart_count", "rerun", "announce", "exhausted"]

_ELASTIC_COUNT = "TORCHELASTIC_RESTART_COUNT"


def restart_count(env: Optional[Mapping[str, str]] = None) -> int:
    """How many times the launcher restarted this job's workers before this run of them: 0 on the first run.

    Read from the launcher's environment (``os.environ`` by default), so it
    works before :func:`polydist.initialize`. Under an elastic agent
    (``polydist run --max-restarts``, ``spawn(max_restarts=...)``, torchrun)
    it is the count of this node's agent, ``$TORCHELASTIC_RESTART_COUNT``:
    restarts after failures only (a node joining restarts the workers
    without counting). Under ``polydist run --backend mpi --max-restarts``
    it is ``$POLYDIST_RESTART_COUNT``. Elsewhere 0.

    Each node's agent counts its own restarts, so after a membership change
    the nodes disagree (a node that joined later says 0): before deciding
    something collective on it, such as whether to resume, agree with
    ``all_reduce(restart_count(), op="MAX")``.

    Raises:
        ValueError: the variable is set but not a non-negative integer, naming it.
    """
    env = os.environ if env is None else env
    count = RESTART_COUNT.read(env)
    if count is None:
        text = env.get(_ELASTIC_COUNT, "").strip()
        if not text:
            return 0
        try:
            count = int(text)
        except ValueError:
            raise ValueError(f"${_ELASTIC_COUNT}={text!r} is not valid: expected a whole number") from None
    if count < 0:
        raise ValueError(f"restart count {count} is negative")
    return count


def announce(done: int, most: int, report: str) -> None:
    """Tell the launcher's stderr that every worker restarts: restart ``done`` of ``most``, after ``report``."""
    sys.stderr.write(
        f"polydist: restart {done} of {most}: {report}\n"
        f"polydist: restarting every worker (restart {done} of {most}, {most - done} left)\n"
    )
    sys.stderr.flush()


def exhausted(max_restarts: int) -> str:
    """The first line of a failure report once restarts were allowed and all made ("" when none were)."""
    return f"after {max_restarts} restart{'s' if max_restarts > 1 else ''} (all made):" if max_restarts else ""


def rerun(start: Callable[[int], None], max_restarts: int) -> None:
    """Call ``start(restarts_so_far)`` until it returns, at most ``max_restarts`` more times after a failure.

    Each :class:`~polydist.WorkerFailedError` but the last is announced on
    stderr (the failed rank and its traceback, the restart count); the last
    one is raised, saying that the restarts were all made.
    """
    for done in range(max_restarts + 1):
        try:
            start(done)
            return
        except WorkerFailedError as exc:
            if done == max_restarts:
                if max_restarts:
                    raise WorkerFailedError(f"{exhausted(max_restarts)}\n{exc}", exc.failures, exc.root_rank) from None
                raise
            announce(done + 1, max_restarts, str(exc))
