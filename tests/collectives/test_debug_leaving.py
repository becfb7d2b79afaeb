"""Debug mode: a rank that leaves while the others wait in a collective it never called (torch's own calls).

The program calls ``torch.distributed.all_reduce`` itself (no fingerprint: torch runs it) and rank 1 skips
one of a loop of equal calls, then calls ``polydist.finalize()`` (or just exits). Every rank must learn it
within seconds, the collective, its number and the skipping rank named — not wait out the group's timeout.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(180)

_PROGRAM = '''
import sys, datetime, torch, torch.distributed as dist, polydist as pd
backend, end = sys.argv[1:3]
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
r = dist.get_rank()
for step in range(4):
    if r == 1 and step == 2:
        continue  # rank 1 skips one all_reduce; every call has the same shape
    dist.all_reduce(torch.full((2,), float(step)))
if end == "finalize":
    try:
        pd.finalize()
    except pd.CollectiveMismatchError as exc:
        print(f"rank {r} raised CollectiveMismatchError: {exc}", flush=True)
        sys.exit(3)
'''

_NAMED = "all_reduce #4 on group [0, 1] (torch's numbering): rank 1 never called it"


def _run(tmp_path, cli_env, backend: str, end: str):
    from _world import mpi_job_env, mpiexec
    from conftest import _mpi_missing

    script = tmp_path / "skip.py"
    script.write_text(_PROGRAM)
    env = dict(cli_env, POLYDIST_DEBUG="1", PYTHONUNBUFFERED="1")
    if backend == "mpi":
        if _mpi_missing():
            pytest.skip(_mpi_missing())
        command = [mpiexec(), "-n", "2", sys.executable, str(script), "mpi", end]
        env = mpi_job_env(env)
    else:
        command = [sys.executable, "-m", "polydist", "run", "--nproc-per-node", "2", str(script), "gloo", end]
    start = time.monotonic()
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=150)
    return out, out.stdout + out.stderr, time.monotonic() - start


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_debug_a_rank_that_finalizes_past_a_torch_collective_names_it_on_every_rank(backend, cli_env, tmp_path):
    out, text, took = _run(tmp_path, cli_env, backend, "finalize")
    assert out.returncode != 0, text
    # the skipping rank raises from finalize(), the waiting rank prints the same error and ends
    assert f"rank 1 raised CollectiveMismatchError: {_NAMED} — it left (finalize() at skip.py:" in text, text
    assert f"polydist: debug: CollectiveMismatchError: {_NAMED}" in text, text
    assert "while rank 0 waits in it" in text
    assert took < 45, f"{took:.1f} s: the waiting rank waited out the group's timeout (60 s)"


def test_debug_a_rank_that_exits_past_a_torch_collective_names_it_on_every_rank(cli_env, tmp_path):
    out, text, took = _run(tmp_path, cli_env, "gloo", "exit")
    assert out.returncode != 0, text
    lines = [line for line in text.splitlines() if f"polydist: debug: CollectiveMismatchError: {_NAMED} — it left (exit)" in line]
    assert {line.split("]")[0] for line in lines} >= {"[rank0", "[rank1"}, text  # printed by both ranks
    assert took < 45, f"{took:.1f} s"
