"""benchmarks/soak.py under ``polydist run`` on 3 ranks: a short run of every kind of call passes and reports,
and a mismatch injected at one step is caught (named, exit code 1)."""

import json
import os
import subprocess
import sys

import pytest

from _world import mpiexec
from conftest import ROOT

SOAK = os.path.join(ROOT, "benchmarks", "soak.py")
KINDS = {"all_reduce", "reduce", "reduce_scatter", "broadcast", "all_gather", "gather", "scatter", "all_to_all",
         "barrier", "send_recv", "in_flight"}  # fmt: skip


def _soak(cli_env, backend, *argv):
    cmd = [sys.executable, "-m", "polydist", "run", "--no-prefix", "--nproc-per-node", "3", "--backend", backend,
           "--timeout", "30", SOAK, "--ops", "150", "--seed", "5", "--max-bytes", "65536", *argv]  # fmt: skip
    return subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=35, cwd=ROOT)


@pytest.mark.timeout(40)
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_every_kind_checked_and_reported(cli_env, tmp_path, backend):
    if backend == "mpi" and not mpiexec():
        pytest.skip("no mpiexec beside this Python (pip install mpich)")
    out = tmp_path / "soak.json"
    done = _soak(cli_env, backend, "--json", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("# soak: 150 ops on 3 ranks") == 1  # rank 0 only
    assert "mismatches: 0" in done.stdout and "RSS growth after warm-up" in done.stdout
    doc = json.loads(out.read_text())
    assert doc["ok"] and doc["mismatches"] == [] and doc["meta"]["world_size"] == 3
    assert sum(k["ops"] for k in doc["kinds"]) == 150 and {k["kind"].split("/")[0] for k in doc["kinds"]} == KINDS
    assert sum(k["subgroup"] for k in doc["kinds"]) > 0 and sum(k["async"] for k in doc["kinds"]) > 0
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2] and all(r["rss_end_MiB"] > 0 for r in doc["ranks"])


@pytest.mark.timeout(40)
def test_an_injected_mismatch_is_caught(cli_env):
    done = _soak(cli_env, "gloo", "--inject-mismatch", "42")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "MISMATCH step 42 " in done.stdout
    summary = done.stdout[done.stdout.index("# soak:") :]
    assert "mismatches: 0" not in summary and "\n  step 42 " in summary  # listed under the table, with its rank
