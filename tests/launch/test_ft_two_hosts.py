"""``polydist run --fault-tolerant`` on two hosts (network namespaces joined by a veth pair, tests/_netns.py).

One launcher per host (``--nnodes 2 --node-rank R --master-addr A --master-port P``): node 0 serves torchft's
lighthouse and the job's store, each node starts and replaces its own replica groups, and the launchers
exchange their fault logs, so that both report every fault and node 0 says how the whole job ended. The
replica groups meet only through the veth link: their managers, the state a replacement receives and the
gradients' gloo group all listen on the host's own address (no GLOO_SOCKET_IFNAME here: polydist binds
torchft's gloo device itself).

* a host's **link dropped** for a few seconds: the other host's replica group discards at most the step
  in flight and goes on; the cut-off one is never restarted, takes the live state when the link is back,
  and every replica group ends with the same state;
* a rank **killed** inside a replica group of two ranks (HSDP across hosts): its replica group is
  replaced on its host and rejoins with the live state from the other host.

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2; skipped otherwise.
"""

import os
import re
import sys

import pytest

from _netns import Together, two_hosts

pytest.importorskip("torchft", reason="torchft is not installed: pip install 'polydist[ft]'")

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ft_job.py")
POLYDIST = os.path.join(os.path.dirname(sys.executable), "polydist")
STEPS = 300
PORT = 29610  # any: each namespace is a fresh network stack
JOB_TIMEOUT_S = 150

pytestmark = [pytest.mark.ft, pytest.mark.timeout(JOB_TIMEOUT_S + 60)]


@pytest.fixture(scope="module")
def net():
    with two_hosts("ft", 7) as two:
        yield two


def _run(net, cli_env, fault: str, nproc: int, *flags: str):
    """The job on both hosts, ``nproc`` ranks each; FT_LINK names each host's end of the link."""
    node0 = net.hosts[0]
    commands = [net.command(host, [
        POLYDIST, "run", "--fault-tolerant", "--nnodes", "2", "--node-rank", str(r), "--master-addr", node0.addr,
        "--master-port", str(PORT), "--nproc-per-node", str(nproc), "--timeout", "3", *flags, JOB, str(STEPS)])
        for r, host in enumerate(net.hosts)]  # fmt: skip
    env = {k: v for k, v in cli_env.items() if k not in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")}
    envs = [dict(env, FT_FAULT=fault, FT_LINK=host.ifname, FT_DROP_S="4") for host in net.hosts]
    with Together(commands, envs) as job:
        return job.wait(JOB_TIMEOUT_S, net)


def _report(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("polydist: fault-tolerant:")]


def _starts(stdout: str) -> list:
    return [(int(r), int(i)) for r, i in re.findall(r"start: replica (\d+) incarnation (\d+)", stdout)]


def _check_ended_identical(done, lines_of_node0: list):
    for node, result in enumerate(done):
        assert result.returncode == 0, result.describe(f"node {node}")
    whole = "\n".join(result.describe(f"node {node}") for node, result in enumerate(done))  # all of it when it fails
    final = lines_of_node0[-1]
    assert re.search(rf"replica groups 0, 1 finished at step {STEPS} with identical model and optimizer state", final), \
        whole  # fmt: skip
    faults = [line for line in lines_of_node0 if "discarded" in line and "finished at step" not in line]
    assert len(faults) == 1 and re.search(r"(no step|1 step) discarded", faults[0]), whole


@pytest.mark.system
def test_a_host_whose_link_drops_is_left_out_then_takes_the_live_state_and_finishes(net, cli_env):
    done = _run(net, cli_env, "drop:1:60", 1)
    report = _report(done[0].stderr)
    _check_ended_identical(done, report)
    assert "replica group 1 did not take part in step 60" in report[0], report
    assert re.search(r"replica group 1 is back at step \d+, [\d.]+ s after it was left out: it received the live "
                     r"state", "\n".join(report)), report  # fmt: skip
    assert _starts(done[0].stdout) == [(0, 0)] and _starts(done[1].stdout) == [(1, 0)], [d.stdout for d in done]
    assert _report(done[1].stderr)[:2] == report[:2]  # node 1 read node 0's log: the same story, told there too


def test_a_rank_killed_in_a_replica_group_of_two_is_replaced_on_its_host_and_rejoins(net, cli_env):
    done = _run(net, cli_env, "kill:1:60", 2, "--replica-group-size", "2")
    report = _report(done[0].stderr)
    _check_ended_identical(done, report)
    assert "rank 2 (replica group 1) lost (killed by SIGKILL) at step 60" in report[0], report
    assert re.search(r"replica group 1 rejoined at step \d+: its replacement received the live state", report[1]), report
    assert sorted(set(_starts(done[0].stdout))) == [(0, 0)], done[0].stdout  # the survivors never restarted
    assert sorted(set(_starts(done[1].stdout))) == [(1, 0), (1, 1)], done[1].stdout
