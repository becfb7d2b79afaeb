"""Accelerate's multi-CPU path under ``mpiexec`` on polydist's MPI backend, trained to the same result as on gloo.

How Accelerate picks a backend (accelerate 1.15.0, ``accelerate/``):

- Multi-CPU is chosen when ``cpu=True`` (``Accelerator(cpu=True)`` or
  ``ACCELERATE_USE_CPU=1``, state.py:915) and ``LOCAL_RANK`` is set or one of
  ``PMI_SIZE``/``OMPI_COMM_WORLD_SIZE``/``MV2_COMM_WORLD_SIZE``/``WORLD_SIZE``
  is > 1 (state.py:800-806). Plain ``mpiexec`` sets no ``LOCAL_RANK``, so
  without ``cpu=True`` a CPU-only job runs as N separate serial processes.
- Its backend is then ``"mpi"`` when the user asked for None or "mpi" and
  ``torch.distributed.is_mpi_available()``, else ``"gloo"`` (state.py:810-813);
  a user's ``backend`` (``InitProcessGroupKwargs(backend=...)``, or
  ``PartialState(backend=...)``) that differs from that choice raises
  ``ValueError: Your assigned backend ... is not available, please use ...``
  (state.py:195-197). Rank and world size come from ``RANK``/``PMI_RANK``/
  ``OMPI_COMM_WORLD_RANK``... (utils/environment.py:263-280), and Accelerate
  calls ``torch.distributed.init_process_group(backend, rank=, world_size=, ...)``
  only if no default group exists yet (state.py:284-285).

So the two supported ways in, with no change to Accelerate:

- ``"mpi"`` by name: ``import polydist`` gives a stock wheel torch's "mpi"
  backend (inside an MPI job ``is_mpi_available()`` becomes True; under
  torchrun it stays False, tests/launch/test_announced_world.py), and
  ``Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend="mpi")])``
  takes it; it is even Accelerate's default then.
- ``"mpi4py"`` is refused by name (test below). Create the default group first,
  ``torch.distributed.init_process_group("mpi4py", init_method="mpi://")``, then
  ``Accelerator(cpu=True)``, which adopts it. Accelerate's ``state.backend``
  still says "mpi" (its own rule, not the group's name); nothing in the
  multi-CPU path depends on it beyond ``gather``'s choice of
  ``all_gather_into_tensor`` over ``all_gather`` (utils/operations.py:338),
  both of which polydist's group serves.

Caveat for multi-node jobs: with a backend other than "mpi", Accelerate
demands ``MASTER_ADDR`` when local and global world sizes differ, even for a
group that already exists (state.py:255-263); set it to anything, or use "mpi".

One job per backend, ``mpiexec -n 2 python _accelerate_train.py BACKEND OUT``
(see _mpi_train.py): 4 epochs of SGD with momentum on 512 digits, 32 per rank
and step, data order fixed (Accelerate's batch-sampler sharding, no shuffling).
"gloo" is the reference: stock Accelerate without polydist.
"""

import subprocess
import sys
import textwrap

import pytest

from _mpi_train import Jobs, assert_same_training, check_job, free_port, job_env
from conftest import _mpi_missing

pytest.importorskip("accelerate", reason="accelerate is not installed (pip install accelerate==1.15.0)")
pytestmark = pytest.mark.skipif(bool(_mpi_missing()), reason=_mpi_missing() or "-")


@pytest.fixture(scope="module")
def jobs(cli_env, tmp_path_factory) -> Jobs:
    def env_for(backend):
        if backend == "gloo":  # Accelerate's own group uses env://: it sets MASTER_PORT (29500), never MASTER_ADDR
            return job_env(cli_env, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
        return job_env(cli_env)

    return Jobs("_accelerate_train.py", tmp_path_factory.mktemp("accelerate"), env_for)


@pytest.mark.timeout(200)  # this job and, run alone, the gloo reference; each job gives up after 90 s
@pytest.mark.parametrize("backend", ["gloo", "mpi4py", "mpi"])
def test_accelerate_multi_cpu_under_mpiexec(backend, jobs):
    reports = jobs(backend)
    check_job(reports, backend)
    for rep in reports:
        assert rep["client"] == {
            "distributed_type": "DistributedType.MULTI_CPU",
            "num_processes": 2,
            "process_index": rep["rank"],
            # Accelerate's label: "mpi" whenever torch has an "mpi" backend, also for the mpi4py group it adopted
            "state_backend": "gloo" if backend == "gloo" else "mpi",
            "gathered": [0, 1],  # accelerator.gather through the group
            "is_ddp": True,
        }
    assert_same_training(reports, jobs("gloo"))


REFUSED = """
import polydist, torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
try:
    Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend="mpi4py")])
    print("accepted")
except ValueError as exc:
    print("refused:", exc, "| initialized:", dist.is_initialized())
"""


@pytest.mark.timeout(60)
def test_accelerate_refuses_mpi4py_by_name(cli_env):
    """Accelerate's multi-CPU path knows only "mpi" and "gloo": the reason "mpi4py" goes in as a ready group.

    Decided from the environment alone, before any communication: one process
    with the variables MPICH's mpiexec sets for rank 0 of 2 shows it.
    """
    env = job_env(cli_env, PMI_SIZE="2", PMI_RANK="0")
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(REFUSED)], env=env, capture_output=True, text=True,
                         timeout=50)
    assert out.returncode == 0, out.stderr[-3000:]
    refusal = "Your assigned backend mpi4py is not available, please use gloo"  # state.py:197
    assert out.stdout.strip() == f"refused: {refusal} | initialized: False"
