"""benchmarks/fault.py, one short run: an exception raised inside the main job's training loop (gloo) is announced
as a restart, the job resumes from its checkpoint, finishes (exit 0) and trains the model of the uninterrupted run.

About 30 s on 2 cores: make test-heavy runs it (restarts and resuming are proven in make test by
tests/launch/test_restarts.py and tests/training/test_checkpoint.py)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

FAULT = os.path.join(ROOT, "benchmarks", "fault.py")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="the benchmark finds the workers in /proc")
@pytest.mark.heavy
@pytest.mark.timeout(120)
def test_an_exception_in_the_loop_is_survived_and_reported(cli_env, tmp_path):
    out = tmp_path / "fault.json"
    cmd = [sys.executable, FAULT, "--backends", "gloo", "--runs", "1", "--faults", "1", "--kinds", "exception",
           "--epochs", "6", "--hidden", "256", "--seed", "3", "--job-timeout", "90", "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "run 0: exit 0" in done.stdout and "restart 1: exception" in done.stdout, done.stdout

    (backend,) = json.loads(out.read_text())["backends"]
    summary, (run,) = backend["summary"], backend["runs"]
    assert summary["completed"] == summary["same_model"] == summary["same_accuracy"] == 1
    assert run["accuracy"] == backend["reference"]["accuracy"] and run["exit_code"] == 0
    (fault,) = run["faults"]
    (announced,) = run["announcements"]
    assert announced["restart"] == 1 and announced["of"] == 3 and announced["restarting_line"]
    assert announced["rank"] == fault["rank"] and announced["exit_code"] == 1 and fault["blamed"]
    assert "failed first, with exit code 1" in announced["line"]
    # The fault hit mid-epoch after the last save, and the restart resumed from that save.
    assert 0 <= fault["lost"] < 1 and fault["resumed"] == int(fault["at"])
    assert fault["detect_s"] > 0 and fault["recover_s"] > fault["detect_s"]
