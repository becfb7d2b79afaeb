"""Restarts as a launcher shows them: announcements, the reruns of jobs whose launcher cannot restart.

PyTorch's elastic agent (``polydist run``, ``spawn``, torchrun) restarts its
workers itself and tells them the count in ``TORCHELASTIC_RESTART_COUNT``.
``mpiexec`` has no restart: ``polydist run --backend mpi --max-restarts N``
runs the whole MPI job again (:func:`rerun`), counting in
``$POLYDIST_RESTART_COUNT``. Workers read either with
:func:`polydist.launch.environment.restart_count`.
"""

from __future__ import annotations

import sys
from typing import Callable

from ..errors import WorkerFailedError

__all__ = ["check_max_restarts", "rerun", "announce", "exhausted"]

def check_max_restarts(value: object) -> int:
    """``value`` as a restart budget: a non-negative int, else ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_restarts must be a non-negative int, got {value!r}")
    return value


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
    one is raised, saying that the restarts were all made. ``ValueError``
    for a bad ``max_restarts``, before ``start`` is called.
    """
    check_max_restarts(max_restarts)
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
