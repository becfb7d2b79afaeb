"""The scenario table of docs/howto/debugging-a-hang.md, produced by tests: every launcher (``polydist run``,
``mpiexec``, torchrun) x backend (gloo, mpi) x program that never calls polydist (plain ``torch.distributed``,
DDP, FSDP2) x what happens to rank 1 at step 2 (it stalls, raises, is killed, is frozen) — 2 ranks, a 5 s
collective timeout, the program of ``_hang_scenario.py``.

Each scenario asserts that the first line of the report names rank 1 and what happened, and writes that line
to ``build/hang-table/`` (``tools/hang_table.py`` puts them into the docs). The report is ``polydist run``'s;
under ``mpiexec`` and torchrun, which print no report of their own, the first line polydist's code in the job
printed (``polydist: ...``), else the finding of ``polydist trace`` on the job's dumps.

The whole table is marked ``hang_table`` (``make hang-table``, about 15 minutes on 2 cores); ``make test`` runs
the scenarios of :data:`QUICK`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from _world import mpiexec
from conftest import ROOT, _mpi_missing
from test_failures import _mpi_env

pytestmark = pytest.mark.timeout(150)

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_hang_scenario.py")
OUT = os.path.join(ROOT, "build", "hang-table")
LAUNCHERS, BACKENDS = ("polydist run", "mpiexec", "torchrun"), ("gloo", "mpi")
PROGRAMS, FAULTS = ("torch", "ddp", "fsdp2"), ("stall", "raise", "kill", "freeze")
LIMIT_S = 30  # a job still running then is hung: 5 s timeout, start-up and the reports take 5-20 s
QUICK = {("polydist run", "gloo", "torch", "kill"), ("mpiexec", "mpi", "ddp", "stall"),
         ("torchrun", "gloo", "ddp", "stall"),  # the program's own group adopted (POLYDIST_TRACE_DIR)
         ("mpiexec", "gloo", "torch", "freeze")}  # gloo over mpi://: the rank that timed out aborts the MPI job
# What naming rank 1 looks like: the rank that never called the operation, did not arrive, raised, was killed or
# frozen, failed first, or left no dump (killed) where the others waited.
CULPRIT = re.compile(
    r"rank 1 never called it|ranks \[1\] did not arrive|no dump from rank 1\b|"
    r"\brank 1\b[^;]{0,120}?\b(raised|frozen|killed|failed first|exited|exit code)"
)
# The scenarios whose first line does not name rank 1, and why (the table shows their lines as they are).
GAPS: dict = {("mpiexec", backend, program, "kill"): "MPICH's mpiexec ends every rank at once when one is killed, "
              "often before any writes a dump; its own BAD TERMINATION lines name the rank"
              for backend in BACKENDS for program in PROGRAMS}  # fmt: skip
# The scenarios whose job is still running after LIMIT_S, and why (the table says so; the others must end).
HANGS: dict = {("torchrun", "gloo", program, "freeze"): "torchrun stops the other ranks with SIGTERM, which a "
               "stopped rank does not act on, and waits 30 s before SIGKILL; nothing watches the process state"
               for program in PROGRAMS}  # fmt: skip


def _scenarios() -> list:
    out = []
    for launcher in LAUNCHERS:
        for backend in BACKENDS:
            if launcher == "torchrun" and backend == "mpi":
                continue  # one row: test_torchrun_refuses_mpi
            for program in PROGRAMS:
                for fault in FAULTS:
                    key = (launcher, backend, program, fault)
                    marks = [] if key in QUICK else [pytest.mark.hang_table]
                    if backend == "mpi" or launcher == "mpiexec":
                        marks.append(pytest.mark.skipif(bool(_mpi_missing()), reason=_mpi_missing() or "-"))
                    if key in GAPS:
                        marks.append(pytest.mark.xfail(reason=GAPS[key], strict=False))
                    out.append(pytest.param(*key, marks=marks, id="-".join(key).replace(" ", "_")))
    return out


def _command(launcher: str, backend: str, args: list, trace: str) -> list:
    if launcher == "polydist run":
        return ["polydist", "run", "--nproc-per-node", "2", "--backend", backend, "--trace-dir", trace, PROGRAM, *args]
    if launcher == "mpiexec":
        return [mpiexec(), "-n", "2", sys.executable, PROGRAM, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", PROGRAM, *args]


def _job(launcher: str, backend: str, program: str, fault: str, env: dict, tmp_path) -> dict:
    """Run the scenario; end whatever it left (a frozen rank that nothing watched); what the user reads."""
    trace, pids = str(tmp_path / "trace"), tmp_path / "pids"
    pids.mkdir()
    env = dict(_mpi_env(env) if launcher == "mpiexec" else env, POLYDIST_TRACE_DIR=trace, POLYDIST_FROZEN_AFTER="3")
    start = time.monotonic()
    proc = subprocess.Popen(_command(launcher, backend, [backend, program, fault, str(pids)], trace), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=LIMIT_S)
        hung = False
    except subprocess.TimeoutExpired:  # a rank left waiting that nothing ends: the row says so
        hung = True
    seconds = time.monotonic() - start
    for pid in [proc.pid] + [int(p.name) for p in pids.iterdir()]:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
    if hung:
        out, err = proc.communicate()  # what it had printed is kept across the first call's timeout
    return dict(code=proc.returncode, seconds=round(seconds, 1), stderr=err, stdout=out, trace=trace, env=env, hung=hung)


def first_line(launcher: str, job: dict) -> str:
    """The first line of the report (see the module docstring), without the ranks' ``[rankN]:`` prefixes."""
    lines = [re.sub(r"^(\[rank\d+\]:\s*)+", "", s) for s in job["stderr"].splitlines()]
    if launcher == "polydist run":
        return next((s for s in lines if s.startswith("polydist run: job failed")), "(no report)")
    own = next((s for s in lines if s.startswith("polydist: ")), None)
    if own is not None:
        return own
    read = subprocess.run(["polydist", "trace", job["trace"]], env=job["env"], capture_output=True, text=True, timeout=60)
    return "polydist trace: " + (read.stdout.strip().splitlines()[-1] if read.stdout.strip() else read.stderr.strip())


def _shown(line: str, tmp: str) -> str:
    return line.replace(tmp + os.sep, "").replace(tmp, "DIR")


def _write(key: tuple, line: str, job: dict, named: bool, tmp: str) -> None:
    os.makedirs(OUT, exist_ok=True)
    row = dict(zip(("launcher", "backend", "program", "fault"), key), line=_shown(line, tmp), seconds=job["seconds"],
               exit_code=job["code"], named=named, gap=GAPS.get(key))  # fmt: skip
    with open(os.path.join(OUT, "-".join(key).replace(" ", "_") + ".json"), "w") as f:
        json.dump(row, f, ensure_ascii=False)


@pytest.mark.parametrize("launcher, backend, program, fault", _scenarios())
def test_the_first_report_line_names_the_culprit(cli_env, tmp_path, launcher, backend, program, fault):
    if launcher == "torchrun" and shutil.which("torchrun", path=cli_env["PATH"]) is None:
        pytest.skip("torchrun is not installed")
    job = _job(launcher, backend, program, fault, cli_env, tmp_path)
    assert job["code"] != 0, job["stderr"][-3000:]
    line = first_line(launcher, job)
    if job["hung"]:
        line = f"(the job was still running after {LIMIT_S} s; ended by the test) {line}"
    named = CULPRIT.search(line) is not None
    _write((launcher, backend, program, fault), line, job, named, str(tmp_path))
    assert named, f"{line}\n--- stderr:\n{job['stderr'][-4000:]}"
    key = (launcher, backend, program, fault)
    assert not job["hung"] or key in HANGS, f"still running after {LIMIT_S} s\n--- stderr:\n{job['stderr'][-4000:]}"


@pytest.mark.hang_table
def test_torchrun_refuses_mpi(cli_env, tmp_path):
    """torchrun's workers are not MPI's ranks: torch's "mpi" there would make each a world of one, so it is
    refused before MPI starts, naming why."""
    job = _job("torchrun", "mpi", "torch", "stall", cli_env, tmp_path)
    assert job["code"] != 0
    lines = [re.sub(r"^(\[rank\d+\]:\s*)+", "", s) for s in job["stderr"].splitlines()]
    line = next((s.strip() for s in lines if s.strip().startswith("polydist.errors.WorldMismatchError")), "(none)")
    _write(("torchrun", "mpi", "any", "any"), line, job, False, str(tmp_path))
    assert line.startswith("polydist.errors.WorldMismatchError: "), job["stderr"][-3000:]
