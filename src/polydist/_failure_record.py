"""A failed rank's record for ``polydist run --backend mpi``: its traceback in the job's folder, read back by the launcher.

Under ``mpiexec`` a rank that fails cannot hand its error to its launcher as
torch's elastic agent's workers do: ``MPI_Abort`` ends every rank at once,
and a watchdog ends its process with ``os._exit``. So, before it goes, it
writes the text into the folder ``$POLYDIST_FAILURE_DIR`` names (made by
:func:`polydist.launch.mpiexec.run`) as ``rank{N}.txt``, and the launcher
names the rank whose record came first, with its traceback.

Written by whatever ends a rank for a failure, on any backend: the MPI
backend's abort (:func:`polydist.backends.mpi4py.job.fail`), the Python
groups' watchdog and debug mode's leaving check
(:func:`polydist.backends.watchdog.end_process`); read by the launcher
(:mod:`polydist.launch.mpiexec`). Hence here, below both the backends and the
launcher, beside the package's other plumbing: it uses only the standard
library and :mod:`polydist.settings`. (The folder's other files, a rank's
pid and its ``done`` mark, are written by the launcher's own worker entry:
:mod:`polydist.launch.process_setup`.)
"""

from __future__ import annotations

import os

from .settings import FAILURE_DIR

__all__ = ["record_failure", "recorded_failures"]


def record_failure(rank: int, text: str) -> None:
    """Leave this rank's traceback where ``polydist run`` looks for it (``$POLYDIST_FAILURE_DIR``)."""
    folder = FAILURE_DIR.read()
    if folder and os.path.isdir(folder):
        with open(os.path.join(folder, f"rank{rank}.txt"), "w", encoding="utf-8") as f:
            f.write(text)


def recorded_failures(folder: str) -> dict[int, str]:
    """``{rank: traceback}`` of the records in ``folder``, the first failure first (by the files' times)."""
    files = [n for n in os.listdir(folder) if n.startswith("rank") and n.endswith(".txt")]
    files.sort(key=lambda n: os.path.getmtime(os.path.join(folder, n)))  # first failure first
    recorded = {}
    for name in files:
        with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
            recorded[int(name[4:-4])] = f.read()
    return recorded
