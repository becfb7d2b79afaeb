"""Jobs under the installed MPI's ``mpiexec``: ``polydist run --backend mpi`` and ``polydist bench``.

MPI launches its own processes, so the MPI backend is started by MPI's
launcher rather than PyTorch's elastic agent. ``mpiexec`` is looked up next to
the Python interpreter first (where the ``mpich`` wheel installs it), then on
``PATH``. A rank that raises calls ``MPI_Abort`` (see
:func:`polydist.backends.mpi4py.install_abort_hook`), which makes ``mpiexec``
end every rank; before that it writes its traceback into the directory named by
``$POLYDIST_FAILURE_DIR``, from which :func:`run` reports the failing rank.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import Mapping, Optional, Sequence, TextIO

from .errors import WorkerFailedError

__all__ = ["find", "run", "prefix_output", "FAILURE_DIR_ENV"]

FAILURE_DIR_ENV = "POLYDIST_FAILURE_DIR"


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
            was recorded.
        ValueError: ``nproc`` < 1.
        FileNotFoundError: no ``mpiexec`` (see :func:`find`).
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive int, got {nproc!r}")
    command = [find(), "-n", str(nproc), *argv]
    with tempfile.TemporaryDirectory(prefix="polydist-mpi-") as failures:
        child_env = dict(os.environ if env is None else env)
        child_env[FAILURE_DIR_ENV] = failures
        code = subprocess.call(command, env=child_env)
        if code != 0:
            raise _failure_report(failures, code)


def _failure_report(failures: str, code: int) -> WorkerFailedError:
    files = [n for n in os.listdir(failures) if n.startswith("rank") and n.endswith(".txt")]
    files.sort(key=lambda n: os.path.getmtime(os.path.join(failures, n)))  # first failure first
    recorded = {}
    for name in files:
        with open(os.path.join(failures, name), encoding="utf-8", errors="replace") as f:
            recorded[int(name[4:-4])] = f.read()
    if not recorded:
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
