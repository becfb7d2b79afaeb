"""A rank SIGKILLed or frozen (SIGSTOP) in a plain torch.distributed job on gloo: ``polydist trace`` names the absent
rank, the operation the other waited in with its sequence number, and where it waited (file:line), from torch's own
records in the dumps (issue: the first line users read after a hang).

Each job runs ``tests/trace/_absent_rank.py`` on 2 ranks under ``polydist run``; 10-20 s each on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = [pytest.mark.system, pytest.mark.timeout(150)]

JOB = os.path.join(ROOT, "tests", "trace", "_absent_rank.py")
CALL_LINE = next(n for n, text in enumerate(open(JOB), 1) if "# THE CALL" in text)
STEP = 3  # _absent_rank.STEP: rank 1 goes away before its all_reduce #STEP+1


def _job(mode: str, tmp_path, cli_env, **env) -> tuple:
    trace = tmp_path / "trace"
    env = {**{k: v for k, v in cli_env.items() if not k.startswith(("POLYDIST_", "TORCH_FR"))}, **env}
    job = subprocess.run([sys.executable, "-m", "polydist", "run", "--nproc-per-node", "2", "--trace-dir", str(trace),
                          JOB, mode], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert job.returncode != 0 and "rank 1" in job.stderr, job.stdout[-2000:] + job.stderr[-3000:]
    found = subprocess.run([sys.executable, "-m", "polydist", "trace", str(trace), "--json"], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    return json.loads(found.stdout), trace


def _check(found: dict) -> dict:
    """The finding names rank 1 absent and where rank 0 waited in all_reduce #STEP+1; returns rank 0's waiter."""
    assert found["missing"] == [1], found["text"]
    [stuck] = found["stuck"]
    assert (stuck["collective"], stuck["seq"], stuck["group"]) == ("gloo:all_reduce", STEP + 1, [0, 1]), found["text"]
    [waiter] = stuck["waiting"]
    assert waiter["rank"] == 0 and waiter["call"]["line"] == CALL_LINE, found["text"]
    [line] = [t for t in found["text"] if t.startswith("gloo:all_reduce")]
    assert line.startswith(f"gloo:all_reduce #{STEP + 1} on [0,1]: rank 0 "), line
    assert f" at _absent_rank.py:{CALL_LINE}" in line and "an unknown place" not in line, line
    assert line.endswith("; no dump from rank 1"), line
    return waiter


def test_a_sigkilled_rank_is_named_absent_and_the_other_failed_where_it_waited(tmp_path, cli_env):
    found, _ = _job("kill", tmp_path, cli_env)
    waiter = _check(found)
    assert waiter["call"]["state"] == "failed" and "Connection" in waiter["call"]["error"], found["text"]


def test_a_frozen_rank_is_named_absent_and_the_others_signal_dump_is_kept(tmp_path, cli_env):
    """The launcher asks rank 0 for a dump (SIGUSR1) while it waits, then ends the job: rank 0 dumps again on its
    lost peer and on SIGTERM; the last dump still holds what the first showed."""
    found, trace = _job("stop", tmp_path, cli_env, POLYDIST_FROZEN_AFTER="2", HANG_TIMEOUT="60")
    _check(found)
    with open(trace / "rank0.json") as f:
        dump = json.load(f)
    signal_dump = [e for e in dump.get("earlier", []) if e["reason"] == "signal"]
    assert signal_dump and signal_dump[0]["torch_waiting"], dump.get("earlier")  # it showed rank 0 waiting
    assert found["ranks"][0]["reasons"][0] == "signal", found["ranks"][0]
