"""The main job (examples/train_digits.py) at small settings: accuracy, agreement across world sizes."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from _world import mpi_job_env
from conftest import ROOT, _mpi_missing

pytestmark = pytest.mark.timeout(240)

EXAMPLE = os.path.join(ROOT, "examples", "train_digits.py")
SMALL = ["--epochs", "8"]


def _accuracy(stdout: str) -> float:
    match = re.search(r"final test accuracy: (0\.\d{4})", stdout)
    assert match, stdout
    return float(match.group(1))


@pytest.fixture(scope="module")
def two_ranks(cli_env):
    out = subprocess.run(["polydist", "run", "--nproc-per-node", "2", EXAMPLE, *SMALL], env=cli_env,
                         capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_two_ranks_learn_and_stay_identical(two_ranks):
    assert "world size 2, backend gloo" in two_ranks
    assert _accuracy(two_ranks) >= 0.93  # 8 epochs; the default 30 reach >= 0.95
    assert "[rank0]: parameters identical on all 2 ranks" in two_ranks
    assert "final test accuracy" not in two_ranks.replace("[rank0]: final test accuracy", "")  # rank 0 only
    # The progress bar: rank 0's, one line (a redraw through the launcher's pipe would be a line of its own).
    bars = [line for line in two_ranks.replace("\r", "\n").splitlines() if "epochs:" in line]
    assert len(bars) == 1 and bars[0].startswith("[rank0]: epochs: 100%|") and "8/8" in bars[0], bars


def test_serial_run_matches_two_ranks(two_ranks, cli_env):
    out = subprocess.run([sys.executable, EXAMPLE, *SMALL], env=cli_env, capture_output=True, text=True,
                         timeout=200)
    assert out.returncode == 0, out.stderr
    assert "world size 1" in out.stdout
    # Same global batch and sample order for any world size: the same model up to rounding.
    assert abs(_accuracy(out.stdout) - _accuracy(two_ranks)) <= 0.01


def test_batch_size_not_divisible_fails_cleanly(cli_env):
    out = subprocess.run(["polydist", "run", "--nproc-per-node", "2", EXAMPLE, "--epochs", "1", "--batch-size", "65"],
                         env=cli_env, capture_output=True, text=True, timeout=200)
    assert out.returncode == 1
    assert "--batch-size 65 is not divisible by the world size 2" in out.stderr


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py is not installed")
def test_mpi_backend_reaches_the_same_accuracy(two_ranks, cli_env):
    """Issue 4: `--backend mpi` (mpi4py on this stock wheel, under mpiexec) trains the same model as gloo."""
    out = subprocess.run(["polydist", "run", "--backend", "mpi", "--nproc-per-node", "2", EXAMPLE, *SMALL],
                         env=mpi_job_env(cli_env), capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr
    assert "world size 2, backend mpi4py" in out.stdout
    assert "[rank0]: parameters identical on all 2 ranks" in out.stdout
    assert _accuracy(out.stdout) == _accuracy(two_ranks)


@pytest.mark.mpi_smoke
@pytest.mark.skipif(bool(_mpi_missing()), reason=_mpi_missing() or "-")
def test_main_job_on_mpi(cli_env):
    """make demo's job on `--backend mpi`, under the MPI beside this Python (MPICH; Open MPI, Intel MPI in their runs)."""
    out = subprocess.run(["polydist", "run", "--backend", "mpi", "--nproc-per-node", "2", EXAMPLE],
                         env=mpi_job_env(cli_env), capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr
    assert "world size 2, backend mpi4py" in out.stdout
    assert "[rank0]: final test accuracy: 0.9694" in out.stdout  # as make demo's gloo run
    assert "[rank0]: parameters identical on all 2 ranks" in out.stdout


@pytest.mark.skipif(bool(_mpi_missing()), reason=_mpi_missing() or "-")
def test_fsdp_on_mpi_reaches_the_same_accuracy(two_ranks, cli_env):
    """Issue 27: `--fsdp` (FSDP2 via auto_model(use_fsdp=True)) on `--backend mpi` learns as gloo's run does."""
    out = subprocess.run(["polydist", "run", "--backend", "mpi", "--nproc-per-node", "2", EXAMPLE, *SMALL, "--fsdp"],
                         env=mpi_job_env(cli_env), capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr
    assert "world size 2, backend mpi4py" in out.stdout and "FSDP2 fully_shard (--fsdp)" in out.stdout
    assert "[rank0]: parameters identical on all 2 ranks" in out.stdout
    assert abs(_accuracy(out.stdout) - _accuracy(two_ranks)) <= 0.01
