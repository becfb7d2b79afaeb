"""The world a launcher announces is the world you get (polydist/launch/announced.py, the MPI backend's mpi_job and join check).

The stand-in's ``is_mpi_available()`` follows the launcher; a group of another
size or rank than the launcher announced raises ``WorldMismatchError`` at
``initialize()``, at adoption, and in the stand-in's own group creation,
before MPI starts. Unit tests on simulated environments, one process that
walks through several environments, and one real torchrun job (the issue's
Accelerate script among them).
"""

import json
import subprocess
import sys
import textwrap

import pytest

from launch.test_environment import HOROVOD, HYDRA, KUBEFLOW, OPENMPI, TORCHRUN, clean_env, srun  # noqa: F401
from polydist import WorldMismatchError
from polydist.backends import registry
from polydist.backends.mpi4py.job import mpi_job
from polydist.launch.announced import check_group
from polydist.launch.environment import detect

check_mpi_can_join = registry.get("mpi4py").lifecycle.check_join  # the MPI lifecycle's check before joining

SERIAL_TORCHRUN = {**TORCHRUN, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                   "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1"}


@pytest.fixture
def mpi_not_started(monkeypatch):
    """As in a process that has not imported mpi4py.MPI (pytest itself may have)."""
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)


@pytest.mark.parametrize("env, expected", [
    ({}, False),  # python script.py
    (HYDRA, True), (OPENMPI, True),
    (srun(1, 1, 0, PMI_RANK="1", PMI_SIZE="4"), True),  # srun --mpi=pmi2 started the MPI ranks itself
    (TORCHRUN, False), (srun(1, 1, 0), False), (KUBEFLOW, False), (HOROVOD, False),
    ({**HYDRA, "PMI_RANK": "0", "PMI_SIZE": "1", **TORCHRUN}, False),  # torchrun under mpiexec: its workers are not MPI's ranks
])
def test_mpi_job_is_decided_by_the_launcher(env, expected, mpi_not_started):
    assert mpi_job(detect(env)) is expected


def test_mpi_job_when_the_program_started_mpi(monkeypatch):
    class Started:
        Is_initialized, Is_finalized = staticmethod(lambda: True), staticmethod(lambda: False)

    monkeypatch.setitem(sys.modules, "mpi4py.MPI", Started)
    assert mpi_job(detect({})) and mpi_job(detect(TORCHRUN))


@pytest.mark.parametrize("env, backend, group, words", [
    (TORCHRUN, "gloo", (3, 1), "torchrun announced WORLD_SIZE=4, RANK=3, but the gloo group has 1 process (this one "
                               "is its rank 3): make the group with the launcher's rank and world size"),
    (TORCHRUN, "gloo", (1, 4), "torchrun announced WORLD_SIZE=4, RANK=3, but this process is rank 1 of the gloo group"),
    (TORCHRUN, "mpi", (0, 1), "torchrun announced WORLD_SIZE=4, RANK=3, but the mpi group has 1 process (this one is "
                              "its rank 0): the MPI backend needs an MPI launcher such as mpiexec (mpiexec -n 4 python "
                              "SCRIPT, or polydist run --backend mpi); use gloo (nccl on GPUs) under torchrun"),
    (srun(1, 1, 0), "horovod", (0, 1), "srun announced SLURM_NTASKS=4, SLURM_PROCID=1, but the horovod group has 1 "
                                       "process (this one is its rank 0): Horovod sees only the ranks horovodrun started"),
    (HYDRA, "gloo", (0, 2), "MPICH's mpiexec announced PMI_SIZE=4, PMI_RANK=1, but the gloo group has 2 processes"),
    (OPENMPI, "mpi4py", (5, 4), "Open MPI's mpirun announced OMPI_COMM_WORLD_SIZE=8, OMPI_COMM_WORLD_RANK=5, but the "
                                "mpi4py group has 4 processes"),
    (KUBEFLOW, "gloo", (0, 1), "the Kubeflow PyTorchJob announced WORLD_SIZE=3, RANK=1, but the gloo group has 1"),
])
def test_a_group_other_than_the_announced_world_is_named(env, backend, group, words):
    info = detect(env)
    with pytest.raises(WorldMismatchError) as caught:
        check_group(info, backend, *group)
    assert str(caught.value).startswith(words), str(caught.value)
    assert (caught.value.launcher, caught.value.announced, caught.value.group, caught.value.backend) == (
        info.launcher, (info.rank, info.world_size), group, backend)


@pytest.mark.parametrize("env", [{}, SERIAL_TORCHRUN, srun(0, 0, 0, ntasks=1, per_node="1", nnodes=1)])
def test_an_announced_world_of_one_is_never_checked(env):
    """``python script.py``, ``torchrun --nproc-per-node 1``, ``srun -n 1``: the program may make a world of its own."""
    check_group(detect(env), "gloo", 2, 4)
    check_mpi_can_join(detect(env), "mpi")


def test_the_announced_world_passes():
    check_group(detect(TORCHRUN), "gloo", 3, 4)
    check_group(detect(HYDRA), "mpi", 1, 4)


@pytest.mark.parametrize("env", [TORCHRUN, srun(1, 1, 0), KUBEFLOW])
def test_mpi_under_another_launcher_is_refused_before_it_starts(env, mpi_not_started):
    with pytest.raises(WorldMismatchError, match="would have 1 process .MPI sees no MPI launcher"):
        check_mpi_can_join(detect(env), "mpi")


def test_mpi_under_an_unnamed_launcher_is_checked_once_made(mpi_not_started):
    """RANK/WORLD_SIZE alone may come from an MPI polydist does not know: MPI starts, then its world is compared."""
    check_mpi_can_join(detect({"RANK": "1", "WORLD_SIZE": "2"}), "mpi")
    check_mpi_can_join(detect(HYDRA), "mpi")


def test_initialize_leaves_no_group_of_another_world(monkeypatch):
    """A backend that takes rank and size from elsewhere (here: a stand-in for create) and disagrees: no group left."""
    import torch.distributed as dist

    from polydist import context, default_group

    if dist.is_initialized():
        pytest.skip("this pytest process already has a default group")
    monkeypatch.setattr(context, "detect", lambda: detect(TORCHRUN))
    monkeypatch.setattr(default_group, "create", lambda kwargs, info: dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1))
    with pytest.raises(WorldMismatchError, match=r"^torchrun announced WORLD_SIZE=4, RANK=3, but the gloo group has 1 "):
        context.initialize("gloo")
    assert not dist.is_initialized() and context.world() is None


# One process, environments set one after the other: the stand-in reads the launcher at each call.
WALK = """
import json, os, sys
import polydist, torch.distributed as dist
launchers = {"serial": {}, "mpiexec": %r, "torchrun": %r, "srun": %r}
seen = {}
for name, env in launchers.items():
    os.environ.update(env)
    seen[name] = dist.is_mpi_available()
    for key in env:
        del os.environ[key]
os.environ.update(launchers["torchrun"])
for how, make in (("torch", lambda: dist.init_process_group("mpi")), ("polydist", lambda: polydist.initialize("mpi"))):
    try:
        make()
        seen[how] = "made rank %%d of %%d" %% (dist.get_rank(), dist.get_world_size())
    except polydist.WorldMismatchError as exc:
        seen[how] = str(exc)
seen["mpi started"] = "mpi4py.MPI" in sys.modules
for key in launchers["torchrun"]:
    del os.environ[key]
dist.init_process_group("mpi")  # python script.py with backend "mpi": MPI's world of one, a serial run
seen["serial mpi"] = [dist.get_rank(), dist.get_world_size(), dist.get_backend(), polydist.all_reduce(5)]
seen["started"] = dist.is_mpi_available()  # the program started MPI
dist.destroy_process_group()
print(json.dumps(seen))
""" % (HYDRA, TORCHRUN, srun(1, 1, 0))


@pytest.mark.timeout(90)
def test_the_stand_in_claims_mpi_only_inside_an_mpi_job(clean_env):
    pytest.importorskip("mpi4py")
    out = subprocess.run([sys.executable, "-c", WALK], env=clean_env, capture_output=True, text=True, timeout=80)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert {k: seen[k] for k in ("serial", "mpiexec", "torchrun", "srun")} == {
        "serial": False, "mpiexec": True, "torchrun": False, "srun": False}
    for how in ("torch", "polydist"):
        assert seen[how].startswith("torchrun announced WORLD_SIZE=4, RANK=3, but an mpi group here would have 1 "
                                    "process"), seen[how]
    assert seen["mpi started"] is False  # refused before MPI_Init
    assert seen["serial mpi"] == [0, 1, "mpi", 5] and seen["started"] is True


# The script (Accelerate picks MPI when is_mpi_available(); under torchrun it must pick gloo),
# then MPI and a world of one the program made itself, each refused.
UNDER_TORCHRUN = """
import json, os, sys
import polydist, torch, torch.distributed as dist
from accelerate import Accelerator

def attempt(call):
    try:
        return "returned %r" % (call(),)
    except polydist.WorldMismatchError as exc:
        return str(exc)

acc = Accelerator(cpu=True)
seen = {"accelerate": [str(acc.distributed_type), acc.state.backend, acc.process_index, acc.num_processes],
        "torch": [dist.get_rank(), dist.get_world_size(), dist.get_backend()],
        "gathered": acc.gather(torch.tensor([acc.process_index + 1])).tolist(),
        "polydist": [polydist.get_rank(), polydist.get_world_size(), polydist.all_reduce(polydist.get_rank() + 1)]}
acc.end_training()
seen["torch mpi"] = attempt(lambda: dist.init_process_group("mpi"))
seen["polydist mpi"] = attempt(lambda: polydist.initialize("mpi"))
seen["left"] = [dist.is_initialized(), "mpi4py.MPI" in sys.modules]
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # each worker a world of its own
seen["adopt"] = attempt(polydist.get_world_size)
seen["finalize"] = attempt(polydist.finalize)
dist.destroy_process_group()
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as f:
    json.dump(seen, f)
"""


@pytest.mark.timeout(150)
def test_under_torchrun_accelerate_gets_the_world_and_mpi_or_a_world_of_one_is_refused(clean_env, tmp_path):
    pytest.importorskip("accelerate")
    pytest.importorskip("mpi4py")
    (tmp_path / "script.py").write_text(textwrap.dedent(UNDER_TORCHRUN))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(tmp_path / "script.py"), str(tmp_path)]
    out = subprocess.run(cmd, env=clean_env, capture_output=True, text=True, timeout=140)
    assert out.returncode == 0, out.stderr[-4000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"{rank}.json").read_text())
        assert seen["accelerate"] == ["DistributedType.MULTI_CPU", "gloo", rank, 2]
        assert seen["torch"] == [rank, 2, "gloo"] and seen["gathered"] == [1, 2]
        assert seen["polydist"] == [rank, 2, 3]
        for how in ("torch mpi", "polydist mpi"):
            assert seen[how].startswith(f"torchrun announced WORLD_SIZE=2, RANK={rank}, but an mpi group here would "
                                        "have 1 process"), seen[how]
            assert seen[how].endswith("use gloo (nccl on GPUs) under torchrun")
        assert seen["left"] == [False, False]
        assert seen["adopt"].startswith(f"torchrun announced WORLD_SIZE=2, RANK={rank}, but the gloo group has 1 "
                                        "process (this one is its rank 0)"), seen["adopt"]
        assert seen["finalize"] == "returned None"  # a group polydist did not adopt is not its to destroy


def test_spawn_refuses_mpi_before_starting_processes():
    """spawn's processes are the elastic agent's, which MPI cannot see: refused up front, not a world of one each."""
    import polydist

    pytest.importorskip("mpi4py")
    with pytest.raises(ValueError, match="spawn with backend 'mpi': MPI sees only the ranks an MPI launcher starts"):
        polydist.spawn("mpi", print, nproc_per_node=2)
