"""The MPI smoke tests (marker ``mpi_smoke``) under Open MPI and Intel MPI, as well as under the venv's MPICH.

Each runtime is a venv of its own beside the main one (``make mpi-runtimes``, tools/mpi_runtime.sh): its
Python has that runtime's mpiexec beside it and mpi4py loads its libmpi. This test runs the smoke tests
in a pytest of that Python: collectives and point-to-point on 3 ranks, launcher detection under the real
mpiexec, abort on failure, ``polydist run --backend mpi`` and the main job. ``make test-openmpi`` and
``make test-impi`` run every MPI test under the runtime instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from _world import mpi_flavor
from conftest import ROOT

RUNTIMES = {"openmpi": "Open MPI", "impi": "Intel MPI"}
SMOKE_FILES = ["tests/backends/mpi4py/test_mpi.py", "tests/backends/mpi4py/test_lean.py", "tests/launch/test_environment.py",
               "tests/training/test_main_job.py"]  # fmt: skip
SMOKE_TESTS = 14  # the tests marked mpi_smoke in SMOKE_FILES: all of them must pass, none skip


@pytest.mark.timeout(480)
@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_mpi_smoke_under_another_runtime(runtime, cli_env):
    if mpi_flavor() != "mpich":
        pytest.skip(f"this pytest already runs under {mpi_flavor() or 'no MPI'} (make test-openmpi, make test-impi)")
    python = os.path.join(sys.prefix, "mpi", runtime, "bin", "python")
    if not os.path.exists(os.path.join(sys.prefix, "mpi", runtime, ".installed")):
        pytest.skip(f"{RUNTIMES[runtime]} is not installed beside {sys.prefix} (make mpi-runtimes)")
    command = [python, "-m", "pytest", "-m", "mpi_smoke", "-p", "no:cacheprovider", "-q", "-rs", *SMOKE_FILES]
    env = {k: v for k, v in cli_env.items() if not k.startswith(("PYTEST_", "POLYDIST_TEST_"))}
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=450)
    report = out.stdout[-8000:] + out.stderr[-2000:]
    assert out.returncode == 0, report
    summary = out.stdout.strip().splitlines()[-1]
    assert re.search(rf"\b{SMOKE_TESTS} passed\b", summary) and "skipped" not in summary, report
