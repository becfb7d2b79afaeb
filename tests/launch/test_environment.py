"""Launcher detection: every launcher simulated by an environment dict, then the real ones installed here."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from polydist import cli
from polydist.launch import environment
from polydist.launch import _launchers
from polydist.launch.environment import ProcessInfo, detect, expand_nodelist, slurm_port
from _world import mpi_flavor, mpi_job_env

BIN = os.path.dirname(sys.executable)
ENVIRONMENT_PY = os.path.abspath(environment.__file__)
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "MV2_", "MPI_LOCAL", "HYDI_", "HYDRA_", "I_MPI_", "SLURM_",
                     "HOROVOD_", "PET_", "TORCHELASTIC_", "POLYDIST_", "GROUP_", "LOCAL_WORLD_SIZE", "ROLE_")


def layout(info: ProcessInfo) -> tuple:
    return (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size, info.node_rank,
            info.nnodes)


def srun(procid, localid, nodeid, ntasks=4, per_node="2(x2)", nnodes=2, **extra):
    """A task started by srun, as slurmstepd describes it (step variables, and the job-level ones srun also sets)."""
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(localid),
           "SLURM_NODEID": str(nodeid), "SLURM_NTASKS": str(ntasks), "SLURM_NNODES": str(nnodes),
           "SLURM_TASKS_PER_NODE": per_node, "SLURM_JOB_NODELIST": "node[01-02]"}
    env.update(extra)
    return env


HYDRA = {"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_FD": "9"}
OPENMPI = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_NODE_RANK": "1"}
HOROVOD = {"HOROVOD_RANK": "5", "HOROVOD_SIZE": "8", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "4",
           "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.9"}
TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
            "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "r1"}
KUBEFLOW = {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
            "PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456", "PET_NPROC_PER_NODE": "1",
            "PET_NNODES": "3", "PET_NODE_RANK": "1", "KUBERNETES_SERVICE_HOST": "10.96.0.1"}


# ------------------------------------------------------------ no launcher


def test_serial():
    info = detect({})
    assert layout(info) == ("serial", 0, 1, 0, 1, 0, 1) and not info.is_distributed
    assert info.master_addr is None and info.mpi_flavor is None and info.note is None


def test_serial_keeps_explicit_master_address():
    info = detect({"MASTER_ADDR": "h", "MASTER_PORT": "1234"})
    assert (info.launcher, info.master_addr, info.master_port) == ("serial", "h", 1234)


@pytest.mark.parametrize("step", [None, "4294967294", "4294967290", "4294967295"])  # none, batch, interactive, extern
def test_slurm_allocation_without_srun_is_serial_and_says_why(step):
    # What a batch script or salloc shell sees: the job's task count and SLURM_PROCID=0, but it is one process.
    env = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "8",
           "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "n[1-2]"}
    if step is not None:
        env["SLURM_STEP_ID"] = step
    info = detect(env)
    assert layout(info) == ("serial", 0, 1, 0, 1, 0, 1) and info.job_id == "77"
    assert "srun" in info.note and "SLURM_STEP_ID" in info.note


def test_torchrun_settings_without_torchrun_are_serial():
    info = detect({"PET_NPROC_PER_NODE": "4", "PET_NNODES": "2"})
    assert info.launcher == "serial" and "torchrun" in info.note


@pytest.fixture
def bare_environ(monkeypatch):
    """os.environ without launcher variables, restored afterwards."""
    for name in list(os.environ):
        if name.startswith(LAUNCHER_PREFIXES) or name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                           "MASTER_PORT"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_detect_reads_os_environ_and_never_writes_it(bare_environ):
    monkeypatch = bare_environ
    for name, value in srun(2, 0, 1).items():
        monkeypatch.setenv(name, value)
    before = dict(os.environ)
    assert layout(detect()) == ("slurm", 2, 4, 0, 2, 1, 2)
    assert dict(os.environ) == before


# ------------------------------------------------------------ torchrun, polydist run, spawn, plain RANK


def test_torchrun():
    info = detect(TORCHRUN)
    assert layout(info) == ("torchrun", 3, 4, 1, 2, 1, 2)
    assert (info.master_addr, info.master_port, info.job_id) == ("10.1.2.3", 29500, "r1")
    assert dict(info.sources)["rank"] == "RANK" and dict(info.sources)["nnodes"] == "GROUP_WORLD_SIZE"
    assert detect({**TORCHRUN, "POLYDIST_LAUNCHER": "run"}).launcher == "polydist"


def test_one_node_gives_node_layout_without_group_variables():
    info = detect({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert layout(info) == ("env", 1, 2, 1, 2, 0, 1)


def test_plain_rank_and_world_size_leave_the_rest_unknown():
    info = detect({"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "a", "MASTER_PORT": "5"})
    assert layout(info) == ("env", 1, 4, None, None, None, None) and info.master_addr == "a"


# ------------------------------------------------------------ Slurm


def test_srun_two_nodes():
    info = detect(srun(3, 1, 1))
    assert layout(info) == ("slurm", 3, 4, 1, 2, 1, 2)
    assert (info.master_addr, info.master_port, info.job_id) == ("node01", slurm_port(4242, 0), "4242")
    assert dict(info.sources)["local_world_size"] == "SLURM_TASKS_PER_NODE[1]"


@pytest.mark.parametrize(
    "per_node, procid, localid, nodeid, local_world_size",
    [("3,1", 0, 0, 0, 3), ("3,1", 2, 2, 0, 3), ("3,1", 3, 0, 1, 1),  # never world_size // nnodes
     ("2(x3),1", 5, 1, 2, 2), ("2(x3),1", 6, 0, 3, 1), ("1,2(x2)", 0, 0, 0, 1)],
)
def test_srun_nodes_with_different_task_counts(per_node, procid, localid, nodeid, local_world_size):
    counts = _launchers.TASK_COUNT.findall(per_node)
    ntasks = sum(int(n) * int(r or 1) for n, r in counts)
    nnodes = sum(int(r or 1) for _, r in counts)
    info = detect(srun(procid, localid, nodeid, ntasks=ntasks, per_node=per_node, nnodes=nnodes))
    assert layout(info) == ("slurm", procid, ntasks, localid, local_world_size, nodeid, nnodes)


def test_srun_step_variables_beat_the_jobs():
    # srun --preserve-env keeps the job's SLURM_NTASKS/SLURM_TASKS_PER_NODE; the STEP_ ones describe this step.
    env = srun(1, 1, 0, ntasks=8, per_node="4(x2)", SLURM_STEP_NUM_TASKS="2", SLURM_STEP_NUM_NODES="1",
               SLURM_STEP_TASKS_PER_NODE="2", SLURM_STEP_NODELIST="node02", SLURM_STEP_ID="3")
    info = detect(env)
    assert layout(info) == ("slurm", 1, 2, 1, 2, 0, 1)
    assert (info.master_addr, info.master_port) == ("node02", slurm_port(4242, 3))


def test_srun_old_spellings_and_ntasks_per_node():
    env = {"SLURM_JOBID": "9", "SLURM_STEPID": "0", "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
           "SLURM_NPROCS": "4", "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NODELIST": "gpu-a[07-08]"}
    info = detect(env)
    assert layout(info) == ("slurm", 2, 4, 0, 2, 1, 2) and info.master_addr == "gpu-a07" and info.job_id == "9"


def test_srun_master_variables_override_derived_ones():
    info = detect(srun(0, 0, 0, MASTER_ADDR="10.0.0.1", MASTER_PORT="29400"))
    assert (info.master_addr, info.master_port) == ("10.0.0.1", 29400)
    assert dict(info.sources)["master_port"] == "MASTER_PORT"


def test_slurm_port_is_deterministic_and_below_ephemeral_ports():
    ports = {slurm_port(job, step) for job in range(1, 3000, 7) for step in range(3)}
    assert min(ports) >= 15000 and max(ports) < 32768
    assert slurm_port(123456, 0) == slurm_port(123456, 0) != slurm_port(123456, 1)


@pytest.mark.parametrize(
    "nodelist, hosts",
    [("login5", ["login5"]),
     ("node[01-03,07],gpu-a[1-2],login5", ["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2", "login5"]),
     ("n[08-10]", ["n08", "n09", "n10"]), ("n[8-10]", ["n8", "n9", "n10"]), ("c[001-002]-ib", ["c001-ib", "c002-ib"]),
     ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]), ("a1,b[3]", ["a1", "b3"])],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts
    assert detect(srun(0, 0, 0, SLURM_JOB_NODELIST=nodelist)).master_addr == hosts[0]


@pytest.mark.parametrize("nodelist", ["", "node[1-3", "node1-3]", "a,,b", "a,", "n[3-1]", "n[]", "n[a-b]", "n[1-2]]",
                                      "n[[1]]", "n[1,]"])
def test_malformed_nodelist_is_named(nodelist):
    with pytest.raises(ValueError, match="not a Slurm node list"):
        expand_nodelist(nodelist)


# ------------------------------------------------------------ MPI


@pytest.mark.parametrize(
    "env, flavor, expected",
    [(HYDRA, "mpich", ("mpi", 1, 4, 1, 2, None, None)),
     ({**HYDRA, "I_MPI_ROOT": "/opt/intel/mpi"}, "intelmpi", ("mpi", 1, 4, 1, 2, None, None)),
     ({"PMI_RANK": "1", "PMI_SIZE": "2"}, "pmi", ("mpi", 1, 2, None, None, None, None)),  # MPICH's gforker
     # OMPI_COMM_WORLD_NODE_RANK=1 counts processes on the node across jobs: it is not the node index.
     (OPENMPI, "openmpi", ("mpi", 5, 8, 1, 4, None, None)),
     ({"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "2", "MV2_COMM_WORLD_LOCAL_RANK": "0",
       "MV2_COMM_WORLD_LOCAL_SIZE": "2"}, "mvapich", ("mpi", 0, 2, 0, 2, 0, 1))],
)
def test_mpi_launchers(env, flavor, expected):
    info = detect(env)
    assert layout(info) == expected and info.mpi_flavor == flavor
    assert info.master_addr is None and info.master_port is None  # polydist meets through MPI itself


def test_mpi_uses_master_variables_when_set():
    info = detect({**HYDRA, "MASTER_ADDR": "h0", "MASTER_PORT": "29501"})
    assert (info.launcher, info.master_addr, info.master_port) == ("mpi", "h0", 29501)


# ------------------------------------------------------------ Horovod, Kubeflow


def test_horovodrun_gloo():
    info = detect(HOROVOD)
    # HOROVOD_CROSS_RANK ranks hosts per local rank, the node index only on even hosts: left to the process group.
    assert layout(info) == ("horovod", 5, 8, 1, 4, None, None) and info.master_addr is None


def test_horovodrun_over_mpirun():
    info = detect({**HOROVOD, **OPENMPI})
    assert layout(info) == ("horovod", 5, 8, 1, 4, None, None) and info.mpi_flavor == "openmpi"


def test_kubeflow_pod_with_one_process():
    info = detect(KUBEFLOW)
    assert layout(info) == ("kubeflow", 1, 3, 0, 1, 1, 3)
    assert (info.master_addr, info.master_port) == ("job-master-0", 23456)
    for nproc, nnodes in (("auto", "3"), ("1", "1:4")):  # nproc chosen by torchrun; elastic node range
        assert layout(detect({**KUBEFLOW, "PET_NPROC_PER_NODE": nproc, "PET_NNODES": nnodes}))[0] == "kubeflow"


def test_kubeflow_before_nproc_per_node_is_plain_env():
    info = detect({k: v for k, v in KUBEFLOW.items() if not k.startswith("PET_")})
    assert layout(info) == ("env", 1, 3, None, None, None, None) and info.master_addr == "job-master-0"


# ------------------------------------------------------------ nesting: the innermost launcher describes the process


def test_torchrun_started_by_srun():
    env = {**srun(1, 1, 0), **TORCHRUN}  # one srun task per node runs torchrun: SLURM_* describe the agent
    info = detect(env)
    assert layout(info) == ("torchrun", 3, 4, 1, 2, 1, 2) and info.job_id == "r1" and info.master_addr == "10.1.2.3"


def test_torchrun_inside_mpiexec_and_kubeflow():
    assert layout(detect({**HYDRA, **TORCHRUN}))[0] == "torchrun"
    assert detect({**HYDRA, **TORCHRUN}).mpi_flavor is None  # the workers are not MPI ranks
    env = {**KUBEFLOW, "PET_NPROC_PER_NODE": "2", **TORCHRUN}
    assert layout(detect(env)) == ("torchrun", 3, 4, 1, 2, 1, 2)


def test_mpirun_inside_slurm_allocation():
    # mpirun started one daemon per node with srun (2 tasks); rank 5 of 8 inherits its daemon's SLURM_*.
    env = {**srun(1, 0, 1, ntasks=2, per_node="1(x2)"), **OPENMPI}
    info = detect(env)
    assert layout(info) == ("mpi", 5, 8, 1, 4, None, None) and info.master_addr is None


@pytest.mark.parametrize("mpi, flavor", [({"PMIX_RANK": "3", "PMIX_NAMESPACE": "slurm.pmix.4242.0"}, "pmix"),
                                         ({"PMI_RANK": "3", "PMI_SIZE": "4", "PMI_FD": "5"}, "pmi")])
def test_srun_with_pmi_starts_mpi_ranks_itself(mpi, flavor):
    info = detect({**srun(3, 1, 1), **mpi})
    assert layout(info) == ("slurm", 3, 4, 1, 2, 1, 2) and info.mpi_flavor == flavor
    assert info.master_addr == "node01"


def test_wrapper_exporting_rank_from_slurm_agrees():
    info = detect({**srun(2, 0, 1), "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0"})
    assert layout(info) == ("slurm", 2, 4, 0, 2, 1, 2)


# ------------------------------------------------------------ contradictions name the variables


@pytest.mark.parametrize(
    "env, named",
    [({"RANK": "0"}, ["RANK=0", "WORLD_SIZE"]),
     ({"WORLD_SIZE": "2"}, ["WORLD_SIZE=2", "RANK"]),
     ({"RANK": "2", "WORLD_SIZE": "2"}, ["RANK=2", "WORLD_SIZE=2"]),
     ({"RANK": "0", "WORLD_SIZE": "0"}, ["WORLD_SIZE=0"]),
     ({"RANK": "x", "WORLD_SIZE": "2"}, ["RANK='x'"]),
     ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"},
      ["LOCAL_RANK=3", "LOCAL_WORLD_SIZE=2"]),
     ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "4"}, ["LOCAL_WORLD_SIZE=4", "WORLD_SIZE=2"]),
     ({**TORCHRUN, "GROUP_RANK": "2"}, ["GROUP_RANK=2", "GROUP_WORLD_SIZE=2"]),
     ({"RANK": "1", "WORLD_SIZE": "2", "PMI_RANK": "0", "PMI_SIZE": "2"}, ["RANK=1", "PMI_RANK=0"]),
     ({**OPENMPI, "RANK": "5", "WORLD_SIZE": "6"}, ["OMPI_COMM_WORLD_SIZE=8", "WORLD_SIZE=6"]),
     ({**HOROVOD, **OPENMPI, "OMPI_COMM_WORLD_RANK": "4"}, ["HOROVOD_RANK=5", "OMPI_COMM_WORLD_RANK=4"]),
     # As many MPI ranks as srun tasks, but rank 0 runs on the node of task 1: no nesting explains it.
     ({**srun(1, 0, 1, ntasks=2, per_node="1(x2)"), **dict(OPENMPI, OMPI_COMM_WORLD_RANK="0",
       OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_RANK="0", OMPI_COMM_WORLD_LOCAL_SIZE="1")},
      ["OMPI_COMM_WORLD_RANK=0", "SLURM_PROCID=1"]),
     ({"RANK": "1", "WORLD_SIZE": "4", **srun(2, 0, 1)}, ["SLURM_PROCID=2", "RANK=1"]),
     (srun(4, 0, 1), ["SLURM_PROCID=4", "SLURM_NTASKS=4"]),
     (srun(3, 1, 2), ["SLURM_NODEID=2", "SLURM_NNODES=2"]),
     (srun(3, 1, 1, per_node="3,1"), ["SLURM_LOCALID=1", "SLURM_TASKS_PER_NODE[1]=1"]),
     (srun(0, 0, 0, per_node="2,1"), ["SLURM_TASKS_PER_NODE='2,1'", "SLURM_NTASKS=4"]),
     (srun(0, 0, 0, nnodes=3), ["SLURM_TASKS_PER_NODE='2(x2)'", "SLURM_NNODES=3"]),
     (srun(0, 0, 0, per_node="2(3)"), ["SLURM_TASKS_PER_NODE='2(3)'"]),
     (srun(0, 0, 0, SLURM_JOB_NODELIST="node[1-"), ["SLURM_JOB_NODELIST='node[1-'"]),
     (srun(0, 0, 0, SLURM_JOB_ID="abc"), ["SLURM_JOB_ID='abc'"]),
     ({"PMIX_RANK": "1"}, ["PMIX_RANK=1", "world size"]),
     ({**KUBEFLOW, "PET_NPROC_PER_NODE": "4"}, ["PET_NPROC_PER_NODE=4", "RANK=1", "WORLD_SIZE=3", "torchrun"]),
     ({**KUBEFLOW, "PET_NODE_RANK": "2"}, ["PET_NODE_RANK=2", "RANK=1"]),
     ({**TORCHRUN, "MASTER_PORT": "70000"}, ["MASTER_PORT=70000"]),
     ({**TORCHRUN, "MASTER_PORT": "http"}, ["MASTER_PORT='http'"])],
)
def test_contradictions_name_the_variables(env, named):
    with pytest.raises(ValueError) as excinfo:
        detect(env)
    for text in named:
        assert text in str(excinfo.value), (text, str(excinfo.value))


# ------------------------------------------------------------ real launchers

# Ranks load environment.py (and the standard-library-only modules it imports) without the package's
# __init__: torch's ~2 s import per rank would dominate these tests. The hydra and polydist info tests run the full package.
PROBE = """
import dataclasses, importlib, json, os, sys, types
package = types.ModuleType("polydist")  # the package without its __init__, which imports torch
package.__path__ = [os.path.dirname(os.path.dirname(sys.argv[1]))]
sys.modules["polydist"] = package
module = importlib.import_module("polydist.launch.environment")
with open(os.path.join(sys.argv[2], f"{os.getpid()}.json"), "w") as f:  # a file each: launchers mix stdout lines
    json.dump(dataclasses.asdict(module.detect()), f)
"""


@pytest.fixture
def clean_env(cli_env):
    """cli_env without any launcher's variables inherited from wherever pytest runs (Open MPI: allowed as root)."""
    return mpi_job_env({k: v for k, v in cli_env.items() if not k.startswith(LAUNCHER_PREFIXES)})


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "probe.py").write_text(PROBE)
    return [str(tmp_path / "probe.py"), ENVIRONMENT_PY, str(tmp_path / "out")]


def _records(cmd, env, count):
    """Run cmd, whose last argument is the folder where each rank writes its detect() as JSON; sorted by rank."""
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    files = [os.path.join(cmd[-1], name) for name in os.listdir(cmd[-1])]
    assert len(files) == count, out.stdout + out.stderr
    return sorted((json.loads(pathlib.Path(path).read_text()) for path in files), key=lambda r: r["rank"])


def _launcher(name):
    path = os.path.join(BIN, name)
    if not os.path.exists(path):
        pytest.skip(f"{name} is not installed beside {sys.executable} (pip install mpich)")
    return path


@pytest.mark.mpi_smoke
@pytest.mark.timeout(120)
def test_real_mpiexec(clean_env, probe):
    """MPICH's or Intel MPI's Hydra (PMI_*, I_MPI_*), or Open MPI (OMPI_COMM_WORLD_*, PMIX_*), as make test-* installs."""
    code = ("import dataclasses, json, os, sys; from polydist.launch.environment import detect; "  # as users import it
            "json.dump(dataclasses.asdict(detect()), open(os.path.join(sys.argv[1], f'{os.getpid()}.json'), 'w'))")
    records = _records([_launcher("mpiexec"), "-n", "2", sys.executable, "-c", code, probe[-1]], clean_env, 2)
    assert mpi_flavor() in ("mpich", "openmpi", "intelmpi")
    for rank, r in enumerate(records):
        assert (r["launcher"], r["mpi_flavor"], r["rank"], r["world_size"]) == ("mpi", mpi_flavor(), rank, 2)
        assert (r["local_rank"], r["local_world_size"], r["node_rank"], r["nnodes"]) == (rank, 2, 0, 1)
        assert r["master_addr"] is None and r["master_port"] is None


@pytest.mark.timeout(60)
def test_real_mpiexec_gforker(clean_env, probe):
    records = _records([_launcher("mpiexec.gforker"), "-n", "2", sys.executable, *probe], clean_env, 2)
    assert [(r["launcher"], r["mpi_flavor"], r["rank"], r["world_size"], r["local_rank"]) for r in records] == [
        ("mpi", "pmi", 0, 2, None), ("mpi", "pmi", 1, 2, None)]  # gforker exports no local rank


@pytest.mark.timeout(120)
def test_real_torchrun(clean_env, probe):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *probe]
    records = _records(cmd, clean_env, 2)
    assert records[0]["job_id"] == records[1]["job_id"] and records[0]["master_port"] == records[1]["master_port"]
    for rank, r in enumerate(records):
        assert (r["launcher"], r["rank"], r["world_size"], r["local_rank"], r["local_world_size"]) == (
            "torchrun", rank, 2, rank, 2)
        assert (r["node_rank"], r["nnodes"], r["mpi_flavor"]) == (0, 1, None) and r["master_addr"]


@pytest.mark.timeout(120)
def test_real_torchrun_inside_mpiexec(clean_env, probe):
    # The workers inherit PMI_RANK=0/PMI_SIZE=1 of the one MPI rank that runs torchrun: torchrun's values win.
    cmd = [_launcher("mpiexec"), "-n", "1", sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", *probe]
    records = _records(cmd, clean_env, 2)
    assert [(r["launcher"], r["rank"], r["world_size"], r["mpi_flavor"]) for r in records] == [
        ("torchrun", 0, 2, None), ("torchrun", 1, 2, None)]


def test_polydist_info_serial_and_on_contradictions(bare_environ, capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "launcher" in out and "serial" in out and "world_size" in out and "(no launcher)" in out
    bare_environ.setenv("SLURM_JOB_ID", "77")
    assert cli.main(["info"]) == 0 and "not an srun task" in capsys.readouterr().out  # the note
    bare_environ.setenv("RANK", "x")
    bare_environ.setenv("WORLD_SIZE", "2")
    assert cli.main(["info"]) == 1 and "RANK='x'" in capsys.readouterr().err


@pytest.mark.mpi_smoke
@pytest.mark.timeout(120)
def test_real_polydist_info_under_mpiexec(clean_env):
    cmd = [_launcher("mpiexec"), "-n", "2", os.path.join(BIN, "polydist"), "info"]
    out = subprocess.run(cmd, env=clean_env, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    rank_variable = "OMPI_COMM_WORLD_RANK" if mpi_flavor() == "openmpi" else "PMI_RANK"
    assert out.stdout.count(mpi_flavor()) == 2 and out.stdout.count(f"({rank_variable})") == 2
