"""Hangs and failures, for real: the flight recorder's dumps and ``polydist trace`` on jobs that go wrong (issue 14).

Each test runs ``tests/trace/_scenario.py MODE`` on 3 ranks under ``polydist run`` (gloo, with a
collective timeout) or ``polydist run --backend mpi`` (MPI has no timeout: the test sends SIGUSR1
to every rank, as a user would, then ends the job), then reads the dumps with ``polydist trace
--json`` and checks that it names the right ranks, collective, sequence number and source lines.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from _world import mpi_flavor, mpi_job_env
from conftest import ROOT, _mpi_missing

pytestmark = pytest.mark.timeout(150)

SCENARIO = os.path.join(ROOT, "tests", "trace", "_scenario.py")
TIMEOUT_S = "5"  # gloo's collective timeout in these jobs
needs_mpi = pytest.mark.skipif(bool(_mpi_missing()), reason=_mpi_missing() or "-")
BACKENDS = ["gloo", pytest.param("mpi", marks=needs_mpi)]


def _line(marker: str) -> int:
    """The line of ``_scenario.py`` that holds ``marker`` (so the tests follow edits of the job)."""
    with open(SCENARIO) as f:
        for number, text in enumerate(f, 1):
            if marker in text:
                return number
    raise AssertionError(f"{marker!r} not in {SCENARIO}")


def _env(cli_env, folder) -> dict:
    env = {k: v for k, v in mpi_job_env(cli_env).items() if not k.startswith("POLYDIST_")}  # Open MPI: as root too
    env.update(SCENARIO_DIR=str(folder), PYTHONUNBUFFERED="1")
    return env


def _wait_for(paths, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            raise AssertionError(f"not written within {limit_s} s: {[p for p in paths if not os.path.exists(p)]}")
        time.sleep(0.05)


def _pids(folder) -> list:
    _wait_for([folder / f"pid{r}" for r in range(3)], 60)
    return [int((folder / f"pid{r}").read_text()) for r in range(3)]


def _signal_dumps(folder, trace_dir, ranks=(0, 1, 2)) -> None:
    """SIGUSR1 to ``ranks`` once they reached the interesting point; wait for their dumps."""
    pids = _pids(folder)
    time.sleep(1.0)  # let the others enter the collective they will wait in
    for r in ranks:
        os.kill(pids[r], signal.SIGUSR1)
    _wait_for([trace_dir / f"rank{r}.json" for r in ranks], 30)


def _end(job: subprocess.Popen, folder) -> None:
    """End a job that hangs (MPI): the launcher's process group, and every rank."""
    pids = _pids(folder)
    os.killpg(job.pid, signal.SIGKILL)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _job(mode: str, backend: str, tmp_path, cli_env, then=None) -> tuple:
    """Run the scenario; ``then(job, folder, trace_dir)`` while it runs. Returns (exit code, output, trace dir)."""
    folder, trace_dir = tmp_path, tmp_path / "trace"
    command = ["polydist", "run", "--nproc-per-node", "3", "--backend", backend, "--trace-dir", str(trace_dir)]
    command += ["--timeout", TIMEOUT_S] if backend == "gloo" else []
    job = subprocess.Popen(
        [*command, SCENARIO, mode],
        env=_env(cli_env, folder),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        if then is not None:
            then(job, folder, trace_dir)
        out, _ = job.communicate(timeout=90)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    return job.returncode, out, trace_dir


def _trace(trace_dir) -> dict:
    """``polydist trace DIR --json``, through the command line."""
    out = subprocess.run(
        [sys.executable, "-m", "polydist", "trace", str(trace_dir), "--json"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode in (0, 1), out.stderr
    found = json.loads(out.stdout)
    found["text"] = "\n".join(found["text"])
    return found


def _waiting(stuck: dict) -> list:
    return sorted(w["rank"] for w in stuck["waiting"])


# ---------------------------------------------------------------- a rank that never arrives


@pytest.mark.parametrize("backend", BACKENDS)
def test_rank_in_a_python_loop_is_shown_at_its_loop_line(backend, tmp_path, cli_env):
    def then(job, folder, trace_dir):
        if backend == "mpi":  # no timeout: dump by hand, then end the hang
            _signal_dumps(folder, trace_dir)
            _end(job, folder)

    code, out, trace_dir = _job("loop", backend, tmp_path, cli_env, then)
    assert code != 0
    found = _trace(trace_dir)
    [stuck] = found["stuck"]
    assert (stuck["collective"], stuck["seq"], stuck["group"]) == ("all_reduce", 5, [0, 1, 2])
    assert _waiting(stuck) == [0, 2]
    assert {w["call"]["line"] for w in stuck["waiting"]} == {_line("rank 1 is spinning")}
    [other] = stuck["others"]
    assert (other["rank"], other["relation"], other["kind"]) == (1, "never called", "user code")
    assert other["site"]["line"] == _line("the loop line") and other["site"]["function"] == "spin_forever"
    assert other["last"]["collective"] == "barrier" and other["last"]["seq"] == 4
    text = found["text"]
    assert "rank 1 never called it" in text and f"_scenario.py:{_line('the loop line')}" in text, text
    if backend == "gloo":
        assert "CollectiveTimeoutError" in out and "did not arrive" in out
        assert f"read them with: polydist trace {trace_dir}" in out


@pytest.mark.parametrize("backend", BACKENDS)
def test_killed_rank_has_no_dump_and_the_others_show_where_they_wait(backend, tmp_path, cli_env):
    code, out, trace_dir = _job("kill", backend, tmp_path, cli_env)
    assert code == 1, out
    assert "rank 1" in out and ("SIGKILL" in out or "signal 9" in out), out
    found = _trace(trace_dir)
    assert found["missing"] == [1]
    [stuck] = found["stuck"]
    assert (stuck["collective"], stuck["seq"]) == ("all_reduce", 5)
    assert _waiting(stuck) == [0, 2]
    assert "no dump from rank 1" in found["text"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_rank_that_raises_dumps_its_error_and_the_others_theirs(backend, tmp_path, cli_env):
    code, out, trace_dir = _job("raise", backend, tmp_path, cli_env)
    assert code == 1, out
    assert sorted(os.path.basename(p) for p in glob.glob(str(trace_dir / "rank*.json"))) == [
        "rank0.json", "rank1.json", "rank2.json",
    ]
    with open(trace_dir / "rank1.json") as f:
        dump = json.load(f)
    assert dump["reason"] == "exception" and dump["error"] == "RuntimeError: rank 1 gives up"
    assert dump["error_frames"][-1]["line"] == _line('raise RuntimeError("rank 1 gives up")')
    found = _trace(trace_dir)
    [stuck] = found["stuck"]
    assert (stuck["collective"], stuck["seq"]) == ("all_reduce", 5) and _waiting(stuck) == [0, 2]


# ---------------------------------------------------------------- ranks that disagree (gloo: they time out; MPI: they hang)


@pytest.mark.parametrize(
    "mode, odd, called, backend",
    [
        ("skip", 2, "barrier", "gloo"),
        ("order", 1, "broadcast", "gloo"),
        pytest.param("skip", 2, "barrier", "mpi", marks=needs_mpi),  # MPI: hangs, dumped by SIGUSR1
    ],
)
def test_first_disagreement_is_named(mode, odd, called, backend, tmp_path, cli_env):
    if backend == "mpi" and mpi_flavor() == "intelmpi":
        pytest.skip("Intel MPI completes rank 2's barrier against the others' all_reduce (MPI leaves mismatched "
                    "collectives undefined): rank 2 finishes its script instead of hanging, and dumps nothing")
    def then(job, folder, trace_dir):
        if backend == "mpi":
            _signal_dumps(folder, trace_dir)
            _end(job, folder)

    code, out, trace_dir = _job(mode, backend, tmp_path, cli_env, then)
    assert code != 0 and (backend == "mpi" or "CollectiveTimeoutError" in out), out
    found = _trace(trace_dir)
    first = found["disagreements"][0]
    assert first["seq"] == 5 and first["group"] == [0, 1, 2]
    calls = {int(r): c["collective"] for r, c in first["calls"].items()}
    assert calls == {r: (called if r == odd else "all_reduce") for r in range(3)}
    assert f"rank {odd} called {called}(" in found["text"], found["text"]


# ---------------------------------------------------------------- a healthy job: a dump on request, and it goes on


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigusr1_dumps_a_healthy_job_which_goes_on(backend, tmp_path, cli_env):
    def then(job, folder, trace_dir):
        _signal_dumps(folder, trace_dir)
        (folder / "go").touch()

    code, out, trace_dir = _job("healthy", backend, tmp_path, cli_env, then)
    assert code == 0, out
    assert out.count("finished: [81.0, 81.0, 81.0, 81.0]") == 3
    found = _trace(trace_dir)
    assert found["healthy"] and not found["stuck"] and not found["missing"]
    assert {r["reason"] for r in found["ranks"]} == {"signal"}
    assert all(r["calls"] == 4 for r in found["ranks"])  # 3 all_reduce + 1 barrier before the dump


# ---------------------------------------------------------------- the comms profile of the main job


def test_profile_of_the_main_job(tmp_path, cli_env):
    command = ["polydist", "run", "--nproc-per-node", "2", "--profile-comms", "--trace-dir", str(tmp_path / "trace")]
    out = subprocess.run(
        [*command, os.path.join(ROOT, "examples", "train_digits.py"), "--epochs", "2"],
        env=_env(cli_env, tmp_path), capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line.removeprefix("[rank0]: ") for line in out.stdout.splitlines() if line.startswith("[rank0]: ")]
    assert not any(line.startswith("[rank1]: # polydist comms profile") for line in out.stdout.splitlines())
    [head] = [line for line in lines if line.startswith("# polydist comms profile")]
    total = int(head.split("; ")[1].split()[0])  # "...; 78 collective calls, 0 point-to-point"
    rows = {}
    for line in lines[lines.index(head) + 2:]:
        if not line or line.startswith("#"):
            break
        cells = line.split()
        rows[(cells[0], cells[2])] = int(cells[3])  # (collective, size bucket) -> calls
    assert sum(rows.values()) == total
    # gradients (a flat float32 buffer of ~17 K parameters) are all-reduced once per step
    assert max(calls for (name, _), calls in rows.items() if name == "all_reduce") >= 2 * 20
    assert "final test accuracy" in out.stdout
    assert not os.path.exists(tmp_path / "trace" / "rank0.json")  # no dump on a healthy run
