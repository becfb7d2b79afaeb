"""What a rank about to abort the MPI job writes, and when (no processes).

torch's ``init_process_group`` wraps the excepthook in place in one that holds what the hooks inside it write
in a buffer until they return: after ``MPI_Abort``, when a plain ``mpiexec`` may have ended with its output.
polydist's abort hook is installed inside it (by the ``mpi://`` rendezvous, or the MPI group's creation), so it
writes through, and puts the finding of :data:`polydist.backends.mpi4py.explain_abort` before its own line.
The jobs: tests/launch/test_hang_table.py (mpiexec, gloo).
"""

from __future__ import annotations

import io
import sys

from polydist.backends import mpi4py


def _torch_like(inner):
    """torch's ``_distributed_excepthook``: the inner hook writes into a buffer, shown once it returns."""

    def outer(*args):
        held, sys.stderr = sys.stderr, io.StringIO()
        try:
            inner(*args)
        finally:
            buffered, sys.stderr = sys.stderr.getvalue(), held
        sys.stderr.write(buffered)

    return outer


def test_the_finding_and_the_abort_line_are_written_through_before_the_abort(monkeypatch):
    stream, seen_at_abort = io.StringIO(), []

    def abort_hook(kind, value, tb):  # job.install_abort_hook's: its line, then MPI_Abort
        sys.stderr.write(f"polydist: rank 0 raised an uncaught exception; aborting the MPI job\n{value}\n")
        seen_at_abort.append(stream.getvalue())

    abort_hook._polydist_abort = True
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(sys, "excepthook", abort_hook)
    monkeypatch.setattr(mpi4py, "explain_abort", [lambda exc: None, lambda exc: f"rank 1 never called it ({exc})"])
    mpi4py._explain_first()
    mpi4py._explain_first()  # idempotent
    assert sys.excepthook._polydist_explains and sys.excepthook._polydist_abort
    _torch_like(sys.excepthook)(RuntimeError, RuntimeError("Timed out waiting 5000ms"), None)
    assert seen_at_abort == [
        "polydist: rank 1 never called it (Timed out waiting 5000ms)\n"
        "polydist: rank 0 raised an uncaught exception; aborting the MPI job\nTimed out waiting 5000ms\n"
    ]
    assert stream.getvalue() == seen_at_abort[0]  # nothing held back for later, nothing twice


def test_an_explainer_that_fails_leaves_the_abort_as_it_was(monkeypatch):
    stream = io.StringIO()

    def abort_hook(kind, value, tb):
        sys.stderr.write("polydist: rank 0 raised an uncaught exception; aborting the MPI job\n")

    def broken(exc):
        raise OSError("no trace folder")

    abort_hook._polydist_abort = True
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(sys, "excepthook", abort_hook)
    monkeypatch.setattr(mpi4py, "explain_abort", [broken])
    mpi4py._explain_first()
    sys.excepthook(KeyError, KeyError("x"), None)
    assert stream.getvalue() == "polydist: rank 0 raised an uncaught exception; aborting the MPI job\n"


def test_no_explainer_without_the_abort_hook(monkeypatch):
    def plain(kind, value, tb):
        pass

    monkeypatch.setattr(sys, "excepthook", plain)
    mpi4py._explain_first()
    assert sys.excepthook is plain  # fault-tolerant jobs, or no MPI: nothing to put a line before
