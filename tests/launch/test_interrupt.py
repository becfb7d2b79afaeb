"""Ctrl-C and SIGTERM end a polydist run job within seconds, one line per rank at most: no launcher traceback,
no rank's traceback, no torch elastic log lines, no rank left behind. The job is benchmarks/interrupt.py's."""

from __future__ import annotations

import os
import sys

import pytest

from conftest import ROOT, _mpi_missing

pytestmark = pytest.mark.timeout(200)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from interrupt import one  # noqa: E402

needs_mpi = pytest.mark.skipif(bool(_mpi_missing()), reason=_mpi_missing() or "-")


def _check(row: dict, code: int, per_rank: int) -> None:
    text = "\n".join(row["output"])
    assert row["exit_code"] == code, text
    assert row["leftover_ranks"] == 0, text
    assert row["seconds"] < 15, text
    assert "Traceback" not in text and "SignalException" not in text, text
    assert not any(line.startswith(("W1", "E1", "I1")) for line in row["output"]), text  # torch elastic's log lines
    rank_lines = [line for line in row["output"] if line.startswith("[rank")]
    assert len(rank_lines) <= per_rank * 2, text
    assert any(line.startswith("polydist run: stopped by ") for line in row["output"]), text


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_polydist_run_ends_on_ctrl_c_and_sigterm_with_a_line_per_rank(tmp_path, how):
    row = one("gloo", how, 2, str(tmp_path))
    _check(row, 130 if how == "ctrl-c" else 143, 1)
    if how == "ctrl-c":  # each rank says where its own code was
        assert sum("interrupted (KeyboardInterrupt) at " in line and "loop.py:" in line for line in row["output"]) == 2


@needs_mpi
@pytest.mark.parametrize("how", ["sigint", "sigterm"])
def test_polydist_run_backend_mpi_ends_on_sigint_and_sigterm(tmp_path, how):
    row = one("mpi", how, 2, str(tmp_path))
    _check(row, 130 if how == "sigint" else 143, 2)  # the rank's line, and MPI_Abort's own
