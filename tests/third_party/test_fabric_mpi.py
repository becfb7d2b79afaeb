"""Lightning Fabric's DDP strategy on polydist's MPI backend under ``mpiexec``, trained to the same result as on gloo.

How Fabric gets the backend (lightning 2.6.6, ``lightning/fabric/``):
``DDPStrategy(process_group_backend=NAME)`` keeps the name
(strategies/ddp.py:76) and ``_setup_distributed`` passes it unchanged
(ddp.py:224-229, ``_get_process_group_backend`` falls back to
``Backend.default_device_backend_map`` only when it is None) to
``utilities/distributed.py:_init_dist_connection``, which sets MASTER_ADDR and
MASTER_PORT from the cluster environment and calls
``torch.distributed.init_process_group(NAME, rank=..., world_size=..., timeout=...)``
(distributed.py:280-283). Fabric never checks the name: any backend that
torch.distributed knows is accepted, so ``import polydist`` is the whole way
in, with ``process_group_backend="mpi4py"`` or ``"mpi"`` (polydist gives a
stock wheel torch's "mpi" backend). Under ``mpiexec`` Fabric picks its
``MPIEnvironment`` (connector.py:381-391: mpi4py importable and COMM_WORLD size
> 1), which takes rank and world size from COMM_WORLD and rank 0's host name
and a free port for the store, and launches nothing itself.

One job per backend, ``mpiexec -n 2 python _fabric_train.py BACKEND OUT``
(see _mpi_train.py): 4 epochs of SGD with momentum on 512 digits, 32 per rank
and step, data order fixed (Fabric's DistributedSampler, no shuffling).
"gloo" is the reference: stock Fabric without polydist.
"""

import pytest

from _mpi_train import Jobs, assert_same_training, check_job, job_env
from conftest import _mpi_missing

pytest.importorskip("lightning.fabric", reason="lightning is not installed (pip install lightning==2.6.6)")
pytestmark = pytest.mark.skipif(bool(_mpi_missing()), reason=_mpi_missing() or "-")


@pytest.fixture(scope="module")
def jobs(cli_env, tmp_path_factory) -> Jobs:
    return Jobs("_fabric_train.py", tmp_path_factory.mktemp("fabric"), lambda backend: job_env(cli_env))


@pytest.mark.timeout(200)  # this job and, run alone, the gloo reference; each job gives up after 90 s
@pytest.mark.parametrize("backend", ["gloo", "mpi4py", "mpi"])
def test_fabric_ddp_under_mpiexec(backend, jobs):
    reports = jobs(backend)
    # torch.distributed's default group is the named backend, through polydist's ProcessGroup for both MPI names
    check_job(reports, backend)
    for rep in reports:
        assert rep["client"] == {
            "cluster_environment": "MPIEnvironment",  # Fabric found the mpiexec job itself
            "strategy": "DDPStrategy",
            "process_group_backend": backend,
            "fabric_world_size": 2,
            "fabric_rank": rep["rank"],
        }
    assert_same_training(reports, jobs("gloo"))


NO_STORE = (
    "torch's 'mpi' default group has only a placeholder Store (distributed_c10d.py:1875, as on a PyTorch built "
    "with MPI), so Fabric's new_group(backend='gloo') fails in ProcessGroupGloo's constructor"
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "backend", ["gloo", "mpi4py", pytest.param("mpi", marks=pytest.mark.xfail(strict=True, reason=NO_STORE))]
)
def test_fabric_rank_zero_first(backend, jobs):
    """``fabric.rank_zero_first()`` (fabric.py:726) barriers on a new gloo group (utilities/distributed.py:423).

    Tried after training in each job above. With "mpi4py" the group was
    created through env:// and the store is there; "mpi" has none.
    """
    for rep in jobs(backend):
        assert rep["probes"]["rank_zero_first"] == "ok"
