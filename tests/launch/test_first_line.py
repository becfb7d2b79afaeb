"""The first line a user reads names the culprit, for programs that never call polydist's functions: the
launcher's report starts with the trace's finding (a DDP program's stalled rank, a rank that had finished its
program), and a rank that raises in a program that made torch's MPI group itself ends the job at once.

The helpers and the time bound are tests/launch/test_failures.py's.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap

import pytest

from _world import mpiexec
from test_failures import SURVIVED, _ended_after, _mpi_env, _run, needs_mpi

pytestmark = pytest.mark.timeout(120)


TORCH_MPI_RAISES = textwrap.dedent(
    """
    import sys, time
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    import polydist  # noqa: F401 - its stand-in serves torch's "mpi" on a wheel without MPI

    dist.init_process_group("mpi", timeout=timedelta(seconds=60))
    for step in range(10):
        if dist.get_rank() == 1 and step == 5:
            with open(sys.argv[1], "w") as f:
                f.write(repr(time.time()))
            raise RuntimeError("deliberate failure on rank 1")
        dist.all_reduce(torch.ones(8))
    print("a waiting rank got past the failure", flush=True)
    """
)


@needs_mpi
def test_plain_mpiexec_ends_a_job_whose_program_made_torchs_mpi_group_itself(cli_env, tmp_path):
    """A program that never calls polydist (torch's init_process_group("mpi")) and raises on one rank: the job
    ends at once, not after the group's 60 s timeout, with the rank named and its dump written."""
    script, mark, trace = tmp_path / "job.py", tmp_path / "mark", tmp_path / "trace"
    script.write_text(TORCH_MPI_RAISES)
    env = _mpi_env(cli_env)
    env["POLYDIST_TRACE_DIR"] = str(trace)
    out = _run([mpiexec(), "-n", "2", sys.executable, str(script), str(mark)], env)
    elapsed = _ended_after(mark)
    assert out.returncode != 0
    assert SURVIVED not in out.stdout
    assert elapsed < 20, f"the job ended {elapsed:.1f} s after the failure: not aborted"
    with open(trace / "rank1.json") as f:
        assert json.load(f)["reason"] == "exception"
    if "polydist: rank 1" not in out.stderr and "Traceback" not in out.stderr:
        pytest.xfail("mpiexec dropped the aborting rank's output")  # as in test_plain_mpiexec_ends_job
    assert "polydist: rank 1 raised an uncaught exception; aborting the MPI job" in out.stderr


DDP_STALLS = textwrap.dedent(
    """
    import time
    from datetime import timedelta
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", timeout=timedelta(seconds=5))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear, self.step = torch.nn.Linear(4, 4), 0

        def forward(self, x):
            if dist.get_rank() == 1 and self.step == 3:
                time.sleep(120)  # STALLS
            return self.linear(x)

    model = Model()
    ddp = DDP(model)
    for step in range(6):
        model.step = step
        ddp(torch.ones(2, 4)).sum().backward()
    """
)


def test_the_report_of_a_plain_ddp_program_starts_with_the_rank_that_never_came(cli_env, tmp_path):
    """A DDP program that never calls polydist, rank 1 stalled in forward: the launcher's report starts with the
    trace's finding (the all-reduce, its number, the rank that never called it and where it is), not with the
    innocent rank whose collective timed out."""
    script = tmp_path / "ddp.py"
    script.write_text(DDP_STALLS)
    line = DDP_STALLS.splitlines().index(next(s for s in DDP_STALLS.splitlines() if "STALLS" in s)) + 1
    out = _run(["polydist", "run", "--nproc-per-node", "2", str(script)], cli_env)
    assert out.returncode == 1, out.stderr[-3000:]
    report = out.stderr[out.stderr.index("polydist run: job failed"):]
    first = report.splitlines()[0]
    assert re.match(r"polydist run: job failed: gloo:all_reduce #\d+ on \[0,1\]: rank 0 waited 5\.0 s and timed out", first), first
    assert f"rank 1 never called it — it is running user code at ddp.py:{line} (in function forward)" in first, first


LEAVES_EARLY = textwrap.dedent(
    """
    import torch, polydist as pd
    pd.initialize(timeout=30)
    for step in range(5):
        if pd.get_rank() == 1 and step == 2:
            break  # rank 1 leaves the loop early and ends its program normally
        pd.all_reduce(torch.ones(4))
    """
)


def test_the_report_says_a_rank_had_finished_its_program_while_the_others_waited(cli_env, tmp_path):
    script = tmp_path / "leaves.py"
    script.write_text(LEAVES_EARLY)
    out = _run(["polydist", "run", "--nproc-per-node", "2", str(script)], cli_env)
    assert out.returncode == 1, out.stderr[-3000:]
    first = out.stderr[out.stderr.index("polydist run: job failed"):].splitlines()[0]
    assert first.startswith("polydist run: job failed: all_reduce #3 on [0,1]: rank 0 failed"), first
    assert first.endswith("rank 1 never called it — it had finished its program (exit code 0)"), first


LEAVES_EARLY_ON_MPI = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    import polydist as pd

    if sys.argv[1] == "torch":  # the program's own group, torch's "mpi" (polydist's stand-in serves it)
        dist.init_process_group("mpi", timeout=timedelta(seconds=5))
    else:
        pd.initialize("mpi", timeout=5)
    for step in range(5):
        if dist.get_rank() == 1 and step == 2:
            break  # rank 1 leaves the loop early and ends its program normally
        dist.all_reduce(torch.ones(4))
    """
)


@needs_mpi
@pytest.mark.parametrize("launcher, program", [("run", "torch"), ("mpiexec", "torch"), ("mpiexec", "polydist")])
def test_on_mpi_the_watchdog_says_a_rank_had_finished_its_program(cli_env, tmp_path, launcher, program):
    """Rank 1 ends its program while rank 0 waits in an all_reduce it never called: the watchdog's error (the
    first thing a plain mpiexec job prints) says rank 1 had finished, not that it did not answer."""
    script = tmp_path / "leaves.py"
    script.write_text(LEAVES_EARLY_ON_MPI)
    if launcher == "run":
        out = _run(["polydist", "run", "--nproc-per-node", "2", "--backend", "mpi", str(script), program], cli_env)
    else:
        out = _run([mpiexec(), "-n", "2", sys.executable, str(script), program], _mpi_env(cli_env))
    assert out.returncode != 0
    line = next((s for s in out.stderr.splitlines() if "polydist: watchdog:" in s), None)
    assert line is not None, out.stderr[-3000:]
    assert "all_reduce #3 (float32 [4]; 16 B) on group [0, 1] timed out after 5 s on rank 0: ranks [1] did not arrive" in line
    assert "did not answer" not in line, line
    code = " (exit code 0)" if launcher == "run" else ""  # plain mpiexec: the exit handler cannot see the code
    assert f"last started: rank 0 #3, rank 1 #2; rank 1 had finished its program{code}." in line, line
    if launcher == "run":
        first = out.stderr[out.stderr.index("polydist run: job failed"):].splitlines()[0]
        assert first.endswith("rank 1 never called it — it had finished its program (exit code 0)"), first
