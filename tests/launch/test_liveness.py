"""Liveness beside the timeout (issue 29): a worker stopped with SIGSTOP is named within the bound under each
launcher polydist controls, after the others wrote their flight-recorder dumps; busy workers are never flagged.

Every job runs with ``POLYDIST_FROZEN_AFTER`` set short (the default is 10 s).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from polydist.launch import liveness

from conftest import _mpi_missing

pytestmark = pytest.mark.timeout(180)

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_frozen_job.py")
BOUND_S = 2.0
SLACK_S = 20.0  # a loaded 2-core machine: the dumps' wait, the launcher stopping the others, interpreter exits


def _job(cli_env, tmp_path, how, mode="stop", extra=(), nproc=2, bound=BOUND_S):
    mark, trace = tmp_path / "mark", tmp_path / "trace"
    env = dict(cli_env, POLYDIST_FROZEN_AFTER=str(bound), PYTHONUNBUFFERED="1", NPROC=str(nproc))
    if how == "spawn":
        env["POLYDIST_TRACE_DIR"] = str(trace)
        command = [sys.executable, JOB, mode, str(mark), how]
    else:
        backend = ["--backend", "mpi"] if how == "mpi" else []
        command = [sys.executable, "-m", "polydist", "run", *backend, *extra, "--nproc-per-node", str(nproc),
                   "--trace-dir", str(trace), JOB, mode, str(mark), how]
    if how == "mpi":
        from _world import mpi_job_env

        env = mpi_job_env(env)
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=150)
    ended = time.time()
    stopped = float(mark.read_text()) if mark.exists() else None
    return out, out.stdout + out.stderr, (ended - stopped if stopped else None), trace


@pytest.mark.parametrize("how", ["spawn", "run", "mpi"])
def test_a_stopped_worker_is_named_within_the_bound_after_the_others_dumped(how, cli_env, tmp_path):
    if how == "mpi" and _mpi_missing():
        pytest.skip(_mpi_missing())
    out, text, after_s, trace = _job(cli_env, tmp_path, how)
    assert out.returncode != 0, text
    assert "rank 1 (" in text and "was frozen: stopped (process state T) for " in text, text
    seconds = float(text.split("was frozen: stopped (process state T) for ")[1].split(" s")[0])
    assert BOUND_S <= seconds < BOUND_S + 1.0, text  # named at the bound, not later
    assert "seen by the launcher in /proc/" in text and "POLYDIST_FROZEN_AFTER=2 s" in text
    if how != "spawn":  # polydist run's report starts with the dumps' finding: rank 1 left none, being frozen
        first = next(s for s in text.splitlines() if s.startswith("polydist run: job failed"))
        assert re.search(r"; no dump from rank 1 \(frozen: stopped \(process state T\) for \d+\.\d s, pid \d+\)$",
                         first), first  # fmt: skip
    assert after_s is not None and after_s < BOUND_S + SLACK_S, (after_s, text)
    dump = json.loads((trace / "rank0.json").read_text())  # the other rank's dump: where it waited
    last = dump["entries"][-1]
    assert dump["rank"] == 0 and last["collective"] == "all_reduce" and last["group"] == [0, 1], last
    assert last["state"] != "completed" or last["end"] - last["start"] >= BOUND_S, last  # waiting for rank 1
    assert not (trace / "rank1.json").exists()  # the stopped rank could not write one


def test_under_max_restarts_a_stopped_worker_leads_to_a_restart(cli_env, tmp_path):
    out, text, _, _ = _job(cli_env, tmp_path, "run", extra=["--max-restarts", "1"])
    assert out.returncode == 0, text
    assert "polydist: restart 1 of 1: rank 1 (" in text and "was frozen: stopped (process state T)" in text, text
    assert "rank 0 completed after the restart" in text and "rank 1 completed after the restart" in text


def test_busy_workers_are_never_called_frozen(cli_env, tmp_path):
    # pure Python, a C call holding the GIL, time.sleep: 3 s each against a bound of 0.5 s
    out, text, _, _ = _job(cli_env, tmp_path, "spawn", mode="busy", nproc=3, bound=0.5)
    assert out.returncode == 0, text
    assert "frozen" not in text
    for r in range(3):
        assert f"rank {r} busy ok 6" in text, text


# ------------------------------------------------------------ the watch itself, on a child process


def test_watch_flags_a_stopped_process_only_after_the_bound_and_forgets_a_continued_one():
    # it says when it has started: while Python starts it may be in D (disk sleep), seen once in CI
    child = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        watch = liveness.Watch(after=0.3)
        assert liveness.process_state(child.pid) in ("S", "R")
        assert watch.check({5: child.pid}) is None
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(0.1)
        assert liveness.process_state(child.pid) == "T"
        assert watch.check({5: child.pid}) is None  # stopped, but not yet for the bound
        time.sleep(0.4)
        frozen = watch.check({5: child.pid})
        assert frozen is not None and (frozen.rank, frozen.pid, frozen.state) == (5, child.pid, "T")
        assert frozen.seconds >= 0.3
        assert watch.check({5: child.pid}) is None  # reported once, not again while the launcher ends it
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(0.1)
        watch = liveness.Watch(after=0.3)
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(0.1)
        assert watch.check({5: child.pid}) is None  # the clock starts
        time.sleep(0.2)
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(0.1)
        assert watch.check({5: child.pid}) is None  # running again: the clock is dropped
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(0.2)
        assert watch.check({5: child.pid}) is None  # stopped 0.6 s in all, but only 0.2 s since it ran
    finally:
        child.kill()
        child.wait()


def test_watch_is_off_at_zero_and_ignores_processes_that_are_gone():
    assert not liveness.Watch(after=0).on and liveness.Watch(after=0).check({0: os.getpid()}) is None
    assert liveness.process_state(2**22 + 12345) is None
    assert liveness.Watch(after=0.1).check({0: 2**22 + 12345}) is None


def test_process_state_reads_past_a_command_name_with_parentheses(tmp_path):
    script = tmp_path / "a) T (b.py"
    script.write_text("import time; time.sleep(30)")
    child = subprocess.Popen([sys.executable, str(script)])
    try:
        time.sleep(0.2)
        assert liveness.process_state(child.pid) in ("S", "R")
    finally:
        child.kill()
        child.wait()
