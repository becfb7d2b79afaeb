"""``polydist trace --signal DIR``: the live ranks of one job, and no other process, are asked for their dumps."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from polydist.trace.signal_job import live_ranks, signal_job

pytestmark = pytest.mark.timeout(180)

JOB = os.path.join(ROOT, "tests", "trace", "_gloo_hang.py")


def test_a_pid_another_process_took_or_a_bad_pid_file_is_never_signalled(tmp_path, monkeypatch):
    monkeypatch.delenv("POLYDIST_TRACE_DIR", raising=False)
    other = subprocess.Popen(["sleep", "60"], env={"PATH": os.environ["PATH"]})  # SIGUSR1 would end it
    try:
        (tmp_path / "rank0.pid").write_text(f"{other.pid}\n")
        (tmp_path / "rank1.pid").write_text("not a pid\n")
        (tmp_path / "rank2.pid").write_text("999999999\n")
        assert live_ranks(str(tmp_path))[0] == {}
        lines = signal_job(str(tmp_path), wait_s=0.1)
        assert f"rank 0: pid {other.pid} is now another process, not this job's rank: not signalled" in lines
        assert "rank 1: rank1.pid holds no pid" in lines and "rank 2: pid 999999999 is not running" in lines[2]
        assert lines[-1].startswith("no live rank of a job noted in") and other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_the_ranks_of_a_hung_job_write_their_dumps_and_the_job_goes_on(tmp_path, cli_env):
    """DDP on gloo, rank 1 stalled in forward (60 s timeout): --signal gets both ranks' dumps at once, and polydist
    trace names the rank that never called the all-reduce while rank 0 still waits in it."""
    trace_dir = tmp_path / "trace"
    env = {k: v for k, v in cli_env.items() if not k.startswith(("POLYDIST_", "TORCH_FR"))}
    job = subprocess.Popen(["polydist", "run", "--nproc-per-node", "2", "--timeout", "60", "--trace-dir",
                            str(trace_dir), JOB, "ddp"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while len(live_ranks(str(trace_dir))[0] if trace_dir.exists() else {}) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(8)  # the third step: rank 1 asleep in forward, rank 0 in DDP's all-reduce
        found = subprocess.run([sys.executable, "-m", "polydist", "trace", "--signal", str(trace_dir), "--json"],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        if job.poll() is not None:
            pytest.fail(f"the job ended before the test signalled it: {job.communicate()[0][-3000:]}")
        assert "asked rank(s) 0, 1 for their dumps (SIGUSR1); the job goes on" in found.stderr, found.stderr
        result = json.loads(found.stdout)
        assert [json.loads((trace_dir / f"rank{r}.json").read_text())["reason"] for r in (0, 1)] == ["signal"] * 2
        [stuck] = result["stuck"]
        assert [w["rank"] for w in stuck["waiting"]] == [0] and stuck["waiting"][0]["call"]["state"] != "failed"
        assert [o["rank"] for o in stuck["others"]] == [1], result["text"]
        assert job.poll() is None  # the job goes on
    finally:
        os.killpg(job.pid, signal.SIGTERM)
        job.communicate(timeout=60)
