import importlib.util
import os
import pathlib
import sys

import pytest
from hypothesis import HealthCheck, settings

from _world import World, WorldPool, horovodrun, mpi_flavor, mpiexec

# The codec fuzz tests' budgets (tests/unit/test_codec_fuzz.py): make test runs "default", make fuzz "long".
settings.register_profile("default", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=50000, deadline=None, suppress_health_check=list(HealthCheck))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ignite's own test files: run by tests/third_party/test_ignite_suite.py in their own pytest, not collected here.
collect_ignore = ["third_party/ignite"]

# Under Open MPI (make test-openmpi) as root, as in CI's containers: Open MPI refuses to start unless both are
# set, also for the tests that launch from this process's environment (polydist bench --backend mpi).
if mpi_flavor() == "openmpi" and os.geteuid() == 0:
    os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


@pytest.fixture(scope="session")
def world_pool():
    pool = WorldPool()
    yield pool
    pool.close()


def _mpi_missing() -> str:
    """Why the mpi worlds cannot run here ("" when they can)."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py mpich)"
    if not mpiexec():
        return "no mpiexec beside this Python (pip install mpich)"
    return ""


def _horovod_missing() -> str:
    if importlib.util.find_spec("horovod") is None or not horovodrun():
        return "Horovod is not installed (make horovod)"
    return ""


# The backends the world tests run on: gloo and MPI (the mpi4py backend under mpiexec) in make test;
# make test-horovod runs them on horovod (ranks started by horovodrun --gloo) with POLYDIST_TEST_BACKENDS=horovod.
BACKEND_KINDS = os.environ.get("POLYDIST_TEST_BACKENDS", "gloo,mpi").split(",")


@pytest.fixture(scope="session", params=BACKEND_KINDS)
def backend_kind(request) -> str:
    """The backend of the worlds a test takes (``BACKEND_KINDS``)."""
    missing = {"mpi": _mpi_missing, "horovod": _horovod_missing}.get(request.param, str)()
    if missing:
        pytest.skip(missing)
    return request.param


# The system tests: whole programs under a launcher and peers' own suites, run by make test-system (CI runs it after
# make test), which keeps make test, the suite of the library and its launch paths, within ~15 minutes on 2 cores.
# Marked here by file, as each of these files holds only such tests.
SYSTEM_FILES = frozenset(
    "tests/" + path
    for path in (
        "backends/mpi4py/test_mpi_runtimes.py",  # the MPI smoke tests under Open MPI and Intel MPI (each its own mpiexec)
        "docs/test_tutorials.py",  # every tutorial's program, run as the page says
        "launch/test_idist_launch_forms.py",  # ignite's launcher tests in each launch form
        "launch/test_multinode.py",  # two nodes emulated on one host
        "launch/test_restarts.py",  # --max-restarts and torchrun restarts
        "bench/test_soak.py",  # the soak job
        "trace/test_scenarios.py",  # fault scenarios read by polydist trace
        "training/test_checkpoint.py",  # checkpoint, SIGKILL and resume jobs
        "training/test_examples.py",  # the examples as a user runs them
        "training/test_main_job.py",  # the main job on each backend
        "third_party/test_accelerate_mpi.py",  # peers' code and suites, unmodified
        "third_party/test_fabric_mpi.py",
        "third_party/test_ignite_engine.py",
        "third_party/test_ignite_suite.py",
        "third_party/test_torch_suite.py",
    )
)


def pytest_collection_modifyitems(config, items):
    """Mark the tests of :data:`SYSTEM_FILES` ``system``. On horovod worlds, skip the tests marked as needing
    point-to-point, which Horovod lacks (polydist raises NotImplementedError there), or subgroups that only their
    members create (Horovod's process sets need every rank); outside make test-heavy, skip the tests marked heavy,
    and outside make hang-table those marked hang_table."""
    heavy = os.environ.get("POLYDIST_TEST_HEAVY") == "1"
    table = os.environ.get("POLYDIST_TEST_HANG_TABLE") == "1"
    root = pathlib.Path(str(config.rootpath))
    for item in items:
        if pathlib.Path(str(item.path)).relative_to(root).as_posix() in SYSTEM_FILES:
            item.add_marker(pytest.mark.system)
        if item.get_closest_marker("heavy") and not heavy:
            item.add_marker(pytest.mark.skip(reason="heavy: make test-heavy runs it"))
        if item.get_closest_marker("hang_table") and not table:
            item.add_marker(pytest.mark.skip(reason="hang_table: make hang-table runs it"))
        kind = getattr(item, "callspec", None) and item.callspec.params.get("backend_kind")
        if kind != "horovod":
            continue
        if item.get_closest_marker("p2p"):
            item.add_marker(pytest.mark.skip(reason="the horovod backend has no point-to-point (NotImplementedError)"))
        elif item.get_closest_marker("subgroups") and "groups" not in item.get_closest_marker("subgroups").kwargs:
            item.add_marker(pytest.mark.skip(reason="calls new_group on a group's members only; on horovod every rank calls it"))


def _new_groups(groups: list) -> None:
    import polydist as pd

    for ranks in groups:
        pd.new_group(ranks)


@pytest.fixture(autouse=True)
def _horovod_groups_on_every_rank(request):
    """The every-rank form on horovod worlds: before a test marked ``subgroups(groups=[...])``, every rank calls
    ``new_group`` for each of its groups, which the test then makes or uses on their members only (Horovod adds a
    process set with the whole job; elsewhere the test runs as written)."""
    marker = request.node.get_closest_marker("subgroups")
    callspec = getattr(request.node, "callspec", None)
    if marker is None or "groups" not in marker.kwargs or callspec is None:
        return
    if callspec.params.get("backend_kind") != "horovod" or not marker.kwargs["groups"]:
        return
    world = next(request.getfixturevalue(name) for name in ("world4", "world3", "world2") if name in request.fixturenames)
    world.run(_new_groups, marker.kwargs["groups"])


def _world(pool: WorldPool, size: int, kind: str) -> World:
    return pool.get(size, kind if kind in ("mpi", "horovod") else "polydist")


@pytest.fixture
def world2(world_pool, backend_kind) -> World:
    return _world(world_pool, 2, backend_kind)


@pytest.fixture
def world3(world_pool, backend_kind) -> World:
    return _world(world_pool, 3, backend_kind)


@pytest.fixture
def world4(world_pool, backend_kind) -> World:
    return _world(world_pool, 4, backend_kind)


@pytest.fixture
def mpi_world3(world_pool) -> World:
    """Three ranks under mpiexec on the mpi4py backend (for tests of the backend itself)."""
    if _mpi_missing():
        pytest.skip(_mpi_missing())
    return world_pool.get(3, "mpi")


@pytest.fixture
def torch_world2(world_pool) -> World:
    """Two ranks whose group the *user* created with torch.distributed.init_process_group."""
    return world_pool.get(2, how="torch")


@pytest.fixture(scope="session")
def cli_env():
    """Environment for launching subprocesses: the venv's polydist, no inherited launcher variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env
