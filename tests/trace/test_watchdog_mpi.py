"""torch.distributed programs on polydist's ``mpi`` group: every operation recorded once, bounded by the timeout.

A plain ``torch.distributed`` program (``tests/trace/_torch_hang.py``) imports polydist only for the
``mpi`` backend. Its operations, whoever calls them (the program, DDP, FSDP2), enter polydist's flight
recorder and comms profile, and one that runs past the group's timeout ends the job with an error naming
the operation, its sequence number and the rank that never arrived, under mpiexec and ``polydist run``;
``polydist trace`` then names the stuck rank and the collective.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from _world import mpi_job_env, mpiexec
from conftest import ROOT, _mpi_missing

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(bool(_mpi_missing()), reason=_mpi_missing() or "-")]

JOB = os.path.join(ROOT, "tests", "trace", "_torch_hang.py")
GRACE_S = 8.0  # past the timeout: the watchdog's check, the other ranks' answers, the dumps, MPI_Abort (loaded CI)


def _run(mode: str, cli_env, tmp_path, *, launcher: str = "mpiexec", timeout_s: float = 3, busy_s: float = 60) -> tuple:
    """Run the job on 2 ranks; returns (exit code, output, seconds from rank 0's WAITING to the job's end)."""
    env = {k: v for k, v in mpi_job_env(cli_env).items() if not k.startswith("POLYDIST_")}
    env.update(HANG_TIMEOUT=str(timeout_s), HANG_BUSY=str(busy_s), PYTHONUNBUFFERED="1")
    trace = tmp_path / "trace"
    if launcher == "mpiexec":
        env["POLYDIST_TRACE_DIR"] = str(trace)
        command = [mpiexec(), "-n", "2", sys.executable, JOB, mode]
    else:
        command = ["polydist", "run", "--nproc-per-node", "2", "--backend", "mpi", "--trace-dir", str(trace), JOB, mode]
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)  # fmt: skip
    try:
        out, _ = job.communicate(timeout=150)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    ended = time.time()
    waiting = [float(line.split()[-1]) for line in out.splitlines() if "WAITING " in line]  # [rank0]: under polydist run
    return job.returncode, out, (ended - waiting[0]) if waiting else None


def _tagged(out: str, tag: str) -> list:
    """The JSON values rank 0 printed after ``tag``. mpiexec merges the ranks' output by writes, not lines: the other
    rank's text ("rank 1 finished", whose newline print writes apart) may come before or after one on its line."""
    first = json.JSONDecoder().raw_decode
    return [first(line[line.index(tag) + len(tag):])[0] for line in out.splitlines() if tag in line]


def _trace(tmp_path) -> str:
    done = subprocess.run([sys.executable, "-m", "polydist", "trace", str(tmp_path / "trace")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    return done.stdout + done.stderr


def _check_timed_out(code: int, out: str, took, timeout_s: float, collective: str, seq: int) -> None:
    assert code != 0, out
    assert took is not None and took < timeout_s + GRACE_S, (took, out)
    assert f"CollectiveTimeoutError: {collective} #{seq} " in out, out
    assert "on group [0, 1] timed out after" in out and "ranks [1] did not arrive; ranks [0] were waiting" in out, out
    assert f"rank 0 #{seq}, rank 1 #{seq - 1}" in out, out  # each rank's last started operation
    assert "cannot be cancelled" in out and "MPI_Abort" in out, out
    assert "finished" not in out, out


def test_torch_all_reduce_past_its_timeout_ends_the_job_under_mpiexec(cli_env, tmp_path):
    """The table's scenario: init_process_group("mpi", timeout=3 s), rank 1 busy for 60 s."""
    code, out, took = _run("all_reduce", cli_env, tmp_path)
    _check_timed_out(code, out, took, 3, "all_reduce", 2)
    report = _trace(tmp_path)
    assert "dumps from 2 of 2 ranks" in report, report
    assert "all_reduce #2 on [0,1]: rank 0 waited" in report and "rank 1 never called it" in report, report
    assert "busy_rank_1" in report, report  # where rank 1 was: its stack in its dump


def test_each_operation_recorded_once_and_profiled_without_false_alarm(cli_env, tmp_path):
    """torch.distributed, polydist and DDP calls: one record each, numbered alike; profile rows with bandwidth; a
    send recorded once, without a number.

    Rank 0 first waits 2 s (longer than the watchdog's check interval, shorter than the 4 s timeout)."""
    code, out, _ = _run("once", cli_env, tmp_path, timeout_s=4, busy_s=2)
    assert code == 0 and "watchdog" not in out, out
    records, rows = _tagged(out, "RECORD "), _tagged(out, "ROW ")
    [send] = [r for r in records if r["collective"] == "send"]  # point-to-point: recorded, not numbered
    assert send["seq"] is None and send["shapes"] == [[3]] and send["state"] == "completed", records
    seqs = [r["seq"] for r in records if r["seq"] is not None]
    assert seqs == sorted(set(seqs)), records  # one record per operation, numbered by the group's count
    mine = [r for r in records if r["file"] == JOB]
    reduces = [r for r in mine if r["collective"] == "all_reduce"]
    assert [r["shapes"] for r in reduces[:2]] == [[[256]], [[256]]], records  # torch's and polydist's call, once each
    assert all(r["op"] == "SUM" and r["state"] == "completed" for r in reduces), records
    assert [r["shapes"] for r in reduces[2:]] == [[[10]]], records  # DDP's gradient bucket: weight 8 + bias 2
    assert {"all_gather", "broadcast"} <= {r["collective"] for r in mine}, records  # DDP's construction
    reduce_rows = [row for row in rows if row["collective"] == "all_reduce"]  # one per size bucket
    assert sum(row["calls"] for row in reduce_rows) == 3 and all(row["partial"] == 0 for row in reduce_rows), rows
    assert all(row["algbw_GBps"] > 0 and row["busbw_GBps"] > 0 for row in reduce_rows), rows
    assert {"all_gather", "broadcast"} <= {row["collective"] for row in rows}, rows


@pytest.mark.heavy
def test_torch_all_reduce_past_its_timeout_under_polydist_run(cli_env, tmp_path):
    code, out, took = _run("all_reduce", cli_env, tmp_path, launcher="polydist", timeout_s=10)
    _check_timed_out(code, out, took, 10, "all_reduce", 2)
    assert "rank 1 never called it" in _trace(tmp_path)


@pytest.mark.heavy
@pytest.mark.parametrize(("mode", "collective", "seq"), [("ddp", "all_reduce", 5), ("fsdp2", "all_gather_into_tensor", 2)])
def test_training_step_with_a_stalled_rank_ends_the_job(mode, collective, seq, cli_env, tmp_path):
    """DDP: rank 1 stalls in its forward, rank 0 waits in the gradient all_reduce; FSDP2: in the all-gather."""
    code, out, took = _run(mode, cli_env, tmp_path, timeout_s=5)
    _check_timed_out(code, out, took, 5, collective, seq)
    report = _trace(tmp_path)
    assert f"{collective} #{seq} on [0,1]: rank 0 waited" in report and "rank 1 never called it" in report, report
