"""What the jobs of tests/cluster check, and the switch that keeps them out of make test.

No conftest.py here on purpose: the suite's modules import ``conftest`` by name (tests/conftest.py), and a second
conftest module would take its place in ``sys.modules`` for the folders collected after this one.
"""

import json
import os
import re

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# A cluster and its jobs take minutes: make test-slurm sets POLYDIST_TEST_SLURM=1, make test skips them.
only_in_make_target = pytest.mark.skipif(os.environ.get("POLYDIST_TEST_SLURM") != "1",
                                         reason="real clusters: make test-slurm runs it")


def final_accuracy(text: str) -> float:
    """The accuracy ``examples/train_digits.py`` prints at its end (``final test accuracy: 0.xxxx``)."""
    return float(re.search(r"final test accuracy: (0\.\d{4})", text).group(1))


def documented_accuracy() -> float:
    """The main job's accuracy as the README shows it; a job on any world size gives it up to rounding."""
    with open(os.path.join(ROOT, "README.md")) as f:
        return final_accuracy(f.read())


# How far a world's accuracy may be from the README's (the same model on any world size, up to rounding)
ACCURACY_TOLERANCE = 0.01


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


def drop_link_mid_job(argv, env, cwd, ready, net, lost, wait_s, kill_inside=True):
    """Run ``argv``; once ``ready`` exists (the job's ranks are in their collective loop), take host ``lost``'s
    veth end down and wait up to ``wait_s`` for the job to end. Returns ``(named, ended, returncode, stderr)``:
    the (seconds after the drop, line) of each stderr line naming a CollectiveTimeoutError, the seconds until
    the job ended, its exit code and whole stderr. The link is back up afterwards; with ``kill_inside`` every
    process left in the namespaces (the lost host's ranks) is killed first."""
    import subprocess
    import threading
    import time

    lines = []  # (monotonic time, line) of the job's stderr, read as it comes
    job = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in job.stderr))
    reader.start()
    host = net.hosts[lost]
    try:
        while not ready.exists():
            assert job.poll() is None, "".join(line for _, line in lines)
            time.sleep(0.2)
        subprocess.run(["ip", "-n", host.netns, "link", "set", host.ifname, "down"], check=True, timeout=20)
        dropped = time.monotonic()
        job.wait(timeout=wait_s)
        ended = time.monotonic() - dropped
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
            job.wait(timeout=10)
        if kill_inside:
            net.kill_inside()
        subprocess.run(["ip", "-n", host.netns, "link", "set", host.ifname, "up"], timeout=20, check=False)
        reader.join(timeout=10)
    named = [(t - dropped, line.strip()) for t, line in lines if "CollectiveTimeoutError" in line]
    return named, ended, job.returncode, "".join(line for _, line in lines)
