"""The Slurm cluster (``_cluster.py``) for the tests in this folder, which ``make test-slurm`` runs
(POLYDIST_TEST_SLURM=1, Slurm and munge installed by the target); ``make test`` skips them."""

import json
import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _cluster import SlurmCluster, missing  # noqa: E402
from _netns import Unavailable  # noqa: E402

ENABLED = os.environ.get("POLYDIST_TEST_SLURM") == "1"


def pytest_collection_modifyitems(config, items):
    """Outside make test-slurm, skip this folder's tests (a cluster and its jobs take minutes)."""
    if ENABLED:
        return
    for item in items:
        if str(item.fspath).startswith(HERE + os.sep):
            item.add_marker(pytest.mark.skip(reason="a real Slurm cluster: make test-slurm runs it"))


@pytest.fixture(scope="session")
def slurm():
    reason = missing()
    if reason:
        pytest.skip(f"no Slurm cluster here: {reason}")
    pid = os.getpid()
    cluster = SlurmCluster(tag=f"slm{pid % 100000}", octet=(pid + 203) % 250 + 1)
    try:
        cluster.start()
        yield cluster
    except Unavailable as exc:
        pytest.fail(str(exc))
    finally:
        cluster.close()


def whoami(stdout: str) -> list[dict]:
    """The WHOAMI records of a job's output (``_whoami.py``), in rank order."""
    # raw_decode: mpiexec's output forwarding may put two ranks' lines on one line
    decoder = json.JSONDecoder()
    records = [decoder.raw_decode(stdout, m.end())[0] for m in re.finditer(r"WHOAMI ", stdout)]
    return sorted(records, key=lambda r: r["rank"])


def check_world(records: list[dict], nodes: list[str], per_node: int, backend: str = "gloo") -> None:
    """Every rank of a ``len(nodes)`` x ``per_node`` job, placed by Slurm's block distribution, found its
    place and took part in correct collectives with every other node."""
    world = len(nodes) * per_node
    assert [r["rank"] for r in records] == list(range(world)), records
    for r in records:
        rank = r["rank"]
        where = (rank, r)
        assert r["world_size"] == world, where
        assert (r["node_rank"], r["local_rank"]) == divmod(rank, per_node), where
        assert r["local_rank_arg"] == r["local_rank"], where
        assert (r["nnodes"], r["nproc_per_node"]) == (len(nodes), per_node), where
        assert r["hostname"] == r["uname"] == nodes[rank // per_node], where
        assert r["backend"] == backend, where
        assert r["all_reduce"] == world * (world + 1) / 2, where
        assert [p["hostname"] for p in r["peers"]] == [nodes[q // per_node] for q in range(world)], where
        assert r["shapes"] == [[q + 1, 3] for q in range(world)] and r["shaped_ok"], where
    assert len({r["netns"] for r in records}) == len(nodes)  # really one network stack per node
