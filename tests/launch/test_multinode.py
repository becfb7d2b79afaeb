"""Multi-node jobs for real: two hosts (network namespaces joined by a veth pair) on this machine.

Issue 5: ``polydist run --nnodes 2 --node-rank R --master-addr A --master-port P`` and
``Parallel(nnodes=2, node_rank=R, master_addr=A, master_port=P)`` meet through
PyTorch's static rendezvous at node 0's address, two gloo processes per host.

What gloo needs on each host (found here): it binds to the address its host
name resolves to. This machine's name resolves to 127.0.0.1 (as on many real
hosts: Debian's /etc/hosts maps it to 127.0.1.1), which the other host cannot
reach, and the job fails with "Gloo connectFullMesh failed ... Connection
refused, remote=[127.0.0.1]:...". So either ``GLOO_SOCKET_IFNAME`` names the
interface to use (test_polydist_run_main_job_on_two_hosts), or each host name
resolves to an address the other hosts reach (test_parallel_on_two_hosts).

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2; skipped otherwise.
"""

import contextlib
import importlib.util
import io
import json
import os
import re
import shutil
import sys
import textwrap

import pytest
import torch

from _netns import Together, two_hosts
from conftest import ROOT

EXAMPLE = os.path.join(ROOT, "examples", "train_digits.py")
POLYDIST = os.path.join(os.path.dirname(sys.executable), "polydist")
EPOCHS = 3
JOB_TIMEOUT_S = 150
# Any port: each namespace is a fresh network stack where nothing else listens.
PORT_RUN, PORT_PARALLEL, PORT_FAILING = 29500, 29501, 29502


@pytest.fixture(scope="module")
def net():
    with two_hosts("pd", 0) as two:
        yield two


def _env(base, **extra):
    """``base`` without interface choices inherited from the caller, plus ``extra``."""
    env = {k: v for k, v in base.items() if k not in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")}
    env.update(extra)
    return env


def _report(done) -> str:
    return "\n".join(result.describe(f"node {i}") for i, result in enumerate(done))


def _check_all(done):
    assert all(result.returncode == 0 for result in done), _report(done)


# ------------------------------------------------------------ polydist run: the main job on 2 hosts x 2 processes


def _accuracy(stdout: str) -> float:
    match = re.search(r"final test accuracy: (0\.\d{4})", stdout)
    assert match, stdout
    return float(match.group(1))


def _max_difference(path_a, path_b) -> float:
    a, b = (torch.load(p, weights_only=True)["model"] for p in (path_a, path_b))
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _serial_run(path) -> str:
    """The main job serially in this process (no start-up cost); its stdout. Same model on any world size
    up to rounding (tests/training/test_main_job.py, tests/training/test_checkpoint.py)."""
    spec = importlib.util.spec_from_file_location("train_digits_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert module.main(["--epochs", str(EPOCHS), "--checkpoint", path]) == 0
    return out.getvalue()


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_polydist_run_main_job_on_two_hosts(net, cli_env, tmp_path):
    """`polydist run --nnodes 2` on each host, GLOO_SOCKET_IFNAME naming its veth end: world size 4, the
    parameters identical on all ranks, and the model of a serial run (up to rounding)."""
    node0 = net.hosts[0]
    multi, serial = str(tmp_path / "multinode.pt"), str(tmp_path / "serial.pt")
    commands = [
        net.command(host, [
            POLYDIST, "run", "--nnodes", "2", "--node-rank", str(r), "--master-addr", node0.addr,
            "--master-port", str(PORT_RUN), "--nproc-per-node", "2",
            EXAMPLE, "--epochs", str(EPOCHS), "--checkpoint", multi,  # saved by rank 0, on host 0
        ])
        for r, host in enumerate(net.hosts)
    ]
    envs = [_env(cli_env, GLOO_SOCKET_IFNAME=host.ifname) for host in net.hosts]
    with Together(commands, envs) as job:
        serial_out = _serial_run(serial)  # meanwhile
        done = job.wait(JOB_TIMEOUT_S, net)
    _check_all(done)
    out0, out1 = done[0].stdout, done[1].stdout
    assert "[rank0]: world size 4, backend gloo" in out0, out0
    assert "[rank0]: parameters identical on all 4 ranks" in out0, out0
    assert "final test accuracy" not in out1  # ranks 2 and 3 live on node 1 and print nothing
    accuracy, reference = _accuracy(out0), _accuracy(serial_out)
    assert "world size 1" in serial_out
    assert accuracy >= 0.9
    assert abs(accuracy - reference) <= 0.01, (accuracy, reference)
    # Same global batch and sample order on any world size: only the rounding of the sums differs.
    difference = _max_difference(multi, serial)
    print(f"2 hosts x 2 ranks: accuracy {accuracy}; serial: {reference}; max parameter difference {difference:.2g}")
    assert difference < 1e-5


# ------------------------------------------------------------ Parallel(nnodes=2, node_rank=R, ...) on each host

PARALLEL_SCRIPT = textwrap.dedent(
    """
    import json
    import os
    import sys

    import polydist as pdist


    def whoami(local_rank, marker):
        me = {
            "rank": pdist.get_rank(), "local_rank": local_rank, "world_size": pdist.get_world_size(),
            "node_rank": pdist.get_node_rank(), "nnodes": pdist.get_nnodes(),
            "nproc_per_node": pdist.get_nproc_per_node(), "backend": pdist.backend(),
            "hostname": pdist.hostname(), "netns": os.readlink("/proc/self/ns/net"), "marker": marker,
        }
        return pdist.all_gather(me)  # one dict per rank, in rank order, on every rank


    if __name__ == "__main__":
        node_rank, addr, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
        with pdist.Parallel(backend="gloo", nproc_per_node=2, nnodes=2, node_rank=node_rank,
                            master_addr=addr, master_port=port) as parallel:
            results = parallel.run(whoami, f"node {node_rank}")
        print("RESULTS " + json.dumps(results), flush=True)
    """
)


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_parallel_on_two_hosts(net, cli_env, tmp_path):
    """Parallel(nnodes=2, ...) on each host, each with a host name of its own that resolves to its veth
    address (no GLOO_SOCKET_IFNAME): every rank sees the same 4 ranks, 2 per host, in their namespaces."""
    if shutil.which("unshare") is None:
        pytest.skip("`unshare` (util-linux) is not installed: cannot give each host a host name of its own")
    script = tmp_path / "parallel_two_hosts.py"
    script.write_text(PARALLEL_SCRIPT)
    node0 = net.hosts[0]
    commands = [
        net.command(host, [sys.executable, str(script), str(r), node0.addr, str(PORT_PARALLEL)], own_hostname=True)
        for r, host in enumerate(net.hosts)
    ]
    with Together(commands, [_env(cli_env)] * 2) as job:
        done = job.wait(JOB_TIMEOUT_S, net)
    _check_all(done)

    views = []  # what each rank of each host gathered
    for result in done:
        line = next((x for x in result.stdout.splitlines() if x.startswith("RESULTS ")), None)
        assert line is not None, result.stdout
        per_local_rank = json.loads(line[len("RESULTS "):])
        assert len(per_local_rank) == 2, per_local_rank  # Parallel.run returns this node's results
        views += per_local_rank
    gathered = views[0]
    assert all(view == gathered for view in views), views  # all_gather: the same list on all 4 ranks
    assert [d["rank"] for d in gathered] == [0, 1, 2, 3]
    for d in gathered:
        node = net.hosts[d["rank"] // 2]
        expected = {"world_size": 4, "nnodes": 2, "nproc_per_node": 2, "backend": "gloo",
                    "node_rank": d["rank"] // 2, "local_rank": d["rank"] % 2, "marker": f"node {d['rank'] // 2}",
                    "hostname": node.hostname, "netns": node.netns_id}
        assert {k: d[k] for k in expected} == expected, d
    print("\n".join(json.dumps(d) for d in gathered))
    assert len({net.hosts[0].netns_id, net.hosts[1].netns_id, os.readlink("/proc/self/ns/net")}) == 3


# ------------------------------------------------------------ a rank that fails on one host ends the job on both

FAILING_SCRIPT = textwrap.dedent(
    """
    import polydist as pdist

    pdist.initialize()
    if pdist.get_rank() == 3:  # local rank 1 of node 1
        raise KeyError("rank three is broken")
    pdist.barrier()  # the others wait here until the failure reaches them
    print("unreachable")
    """
)


@pytest.fixture(scope="module")
def failed_job(net, cli_env, tmp_path_factory):
    """(node 0, node 1) results of a 2 x 2 `polydist run` job whose rank 3 (on node 1) raises."""
    script = tmp_path_factory.mktemp("failing") / "fail_rank3.py"
    script.write_text(FAILING_SCRIPT)
    commands = [
        net.command(host, [
            POLYDIST, "run", "--nnodes", "2", "--node-rank", str(r), "--master-addr", net.hosts[0].addr,
            "--master-port", str(PORT_FAILING), "--nproc-per-node", "2", str(script),
        ])
        for r, host in enumerate(net.hosts)
    ]
    envs = [_env(cli_env, GLOO_SOCKET_IFNAME=host.ifname) for host in net.hosts]
    with Together(commands, envs) as job:
        return job.wait(JOB_TIMEOUT_S, net)


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_failure_on_one_host_ends_the_job_on_both(failed_job):
    node0, node1 = failed_job
    assert (node0.returncode, node1.returncode) == (1, 1), _report(failed_job)
    assert "unreachable" not in node0.stdout + node1.stdout
    # The node of the failed rank names it, with its traceback.
    assert re.search(r"^rank 3 \(local rank 1\b", node1.stderr, re.MULTILINE), node1.stderr
    assert "KeyError: 'rank three is broken'" in node1.stderr, node1.stderr


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_failure_on_another_host_is_not_blamed_on_a_local_rank(failed_job):
    node0, _ = failed_job
    report = node0.stderr[node0.stderr.find("polydist run: job failed"):]
    assert "polydist run: job failed" in report, node0.stderr
    # Ranks 0 and 1 died of "Connection closed by peer [node 1's address]" (or were stopped): consequences,
    # yet the headline reads "rank 0 (local rank 0, pid ...) failed first, with exit code 1".
    headline = report.splitlines()[1]
    assert not re.match(r"rank [01]\b", headline), report
