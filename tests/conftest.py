import os
import sys

import pytest

from _world import World, WorldPool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def world_pool():
    pool = WorldPool()
    yield pool
    pool.close()


@pytest.fixture
def world2(world_pool) -> World:
    return world_pool.get(2)


@pytest.fixture
def world3(world_pool) -> World:
    return world_pool.get(3)


@pytest.fixture
def world4(world_pool) -> World:
    return world_pool.get(4)


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
