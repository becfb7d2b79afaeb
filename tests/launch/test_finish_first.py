"""A rank that finishes first breaks nobody's operation: ``finalize`` (and ``spawn``'s end of the function)
waits, on the job's store, until every rank has finished before it tears the world down.

On Horovod, a rank's shutdown ends every rank's Horovod: the ranks outside a subgroup used to return and
shut Horovod down while the members still ran the subgroup's all_reduce ("Horovod has been shut down").
The gloo test checks the same wait where it is cheap to see.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

import polydist as pd
from conftest import _horovod_missing

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def importable(monkeypatch):
    """The spawned processes unpickle this file's functions by module name: give them its folder."""
    tests = os.path.dirname(HERE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [HERE, tests, os.environ.get("PYTHONPATH")])))


def _late_finisher(local_rank: int, late_s: float) -> tuple:
    """Rank 1 reaches finalize ``late_s`` after the others; rank 3 leaves at once as a process exit does (no
    waiting, after an error, say); each rank returns how long its finalize took."""
    rank = pd.get_rank()
    if rank == 1:
        time.sleep(late_s)
    start = time.monotonic()
    if rank == 3:
        from polydist import context

        context.leave(wait=False)  # what the exit of a process that never called finalize does
    else:
        pd.finalize()
    return rank, time.monotonic() - start


@pytest.mark.timeout(120)
def test_finalize_waits_for_the_rank_that_finishes_last(importable):
    took = dict(pd.spawn("gloo", _late_finisher, args=(2.0,), nproc_per_node=4, timeout=60))
    assert took[0] >= 1.5 and took[2] >= 1.5, took  # they waited for rank 1
    assert took[1] < 1.5, took  # the last to arrive did not
    assert took[3] < 1.5, took  # a rank leaving without waiting does not wait
    assert max(took.values()) < 30, took  # and nobody waited out the timeout for it: it counted itself out


def _subgroup_reduces(local_rank: int, rounds: int) -> float:
    """Every rank makes the subgroup [0, 1]; only its members reduce on it, while ranks 2 and 3 return."""
    group = pd.new_group([0, 1])
    total = 0.0
    if pd.get_rank() in (0, 1):
        for _ in range(rounds):
            total += float(pd.all_reduce(torch.ones(1000), group=group)[0])
            time.sleep(0.01)
    return total


@pytest.mark.skipif(bool(_horovod_missing()), reason=_horovod_missing() or "-")
@pytest.mark.timeout(900)
def test_horovod_ranks_outside_a_subgroup_finish_first_10_times(importable, monkeypatch):
    monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "1")
    for run in range(10):
        got = pd.spawn("horovod", _subgroup_reduces, args=(20,), nproc_per_node=4)
        assert got == [40.0, 40.0, 0.0, 0.0], f"run {run + 1} of 10: {got}"


def test_the_launchers_turn_torchs_flight_recorder_on_unless_the_user_set_it(monkeypatch):
    from polydist.launch import process_setup

    for variable in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "OMP_NUM_THREADS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # leave this process's threads alone
    process_setup.worker_setup()
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == str(process_setup.FR_ENTRIES)
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    process_setup.worker_setup()
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == "0"
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE")
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "50")
    process_setup.worker_setup()
    assert "TORCH_FR_BUFFER_SIZE" not in os.environ


_EXIT_WITHOUT_FINALIZE = """
import time
import polydist as pd
pd.initialize("mpi")
pd.all_reduce(1)
if pd.get_rank() == 1:
    time.sleep(0.5)  # rank 0, serving the store, reaches its exit first
"""


@pytest.mark.timeout(120)
def test_an_mpi_job_that_never_calls_finalize_exits_quietly(tmp_path):
    """At exit, rank 0 keeps the store it serves until the other ranks have counted out of the finalize barrier:
    a rank whose last add met a closed store made torch print "recvValue failed ... Did the remote server shutdown
    or crash?" at the end of the job."""
    from _world import mpi_job_env, mpiexec

    if not mpiexec():
        pytest.skip("no mpiexec beside this Python (pip install mpich)")
    script = tmp_path / "job.py"
    script.write_text(_EXIT_WITHOUT_FINALIZE)
    done = subprocess.run([mpiexec(), "-n", "2", sys.executable, str(script)], env=mpi_job_env(dict(os.environ)),
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    closed_store = ("recvValue failed", "Connection was likely closed")
    assert not any(words in done.stderr for words in closed_store), done.stderr[-3000:]
