"""What the launchers of a multi-node fault-tolerant job tell each other (launch/ft_nodes.py), over a real TCP
store in this process; no job is started."""

import json
from datetime import timedelta

import pytest
import torch.distributed as dist

from polydist.launch import ft_nodes


def ev(kind, replica, t, **fields):
    return {"kind": kind, "replica": replica, "t": float(t), **fields}


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _client(store):
    return lambda: dist.TCPStore("127.0.0.1", store.port, is_master=False, wait_for_workers=False,
                                 timeout=timedelta(seconds=2))  # fmt: skip


def test_each_node_reads_the_others_events_once_and_not_its_own(store):
    node0, node1 = ft_nodes.Nodes(0, 2, lambda: store), ft_nodes.Nodes(1, 2, _client(store))
    first, second = ev("started", 1, 1.0, incarnation=0), ev("failed", 1, 2.0, step=3, error="e", since=1.5)
    assert node1.exchange([first]) == []
    assert node0.exchange([ev("started", 0, 1.0, incarnation=0)]) == [first]
    assert node0.exchange([]) == []
    assert node1.exchange([second]) == [ev("started", 0, 1.0, incarnation=0)]
    assert node0.exchange([]) == [second]
    assert node1.exchange([]) == []


def test_another_nodes_lines_are_checked_like_the_fault_log(store):
    """Bytes from another node are hostile until checked: what is not an event is skipped, a line still being
    written waits, and a log past MAX_LOG_BYTES is no longer read."""
    node0 = ft_nodes.Nodes(0, 2, lambda: store)
    good = json.dumps(ev("failed", 1, 1.0, step=3, error="e", since=0.5)).encode()
    def append(data):  # as Nodes.exchange does
        store.append("polydist/ft/events/1", data)
        store.add("polydist/ft/events/1/appends", 1)

    append(b"not json\n" + json.dumps({"kind": "failed"}).encode() + b"\n" + good[:7])
    assert node0.exchange([]) == []
    append(good[7:] + b"\n")
    assert [e["step"] for e in node0.exchange([])] == [3]
    for _ in range(ft_nodes.MAX_LOG_BYTES // 2**20):
        append(b"x" * 2**20)
    assert node0.exchange([]) == [] and node0._too_long == {1}


def test_a_node_cut_off_keeps_its_events_and_sends_them_when_the_store_answers_again(store, monkeypatch):
    monkeypatch.setattr(ft_nodes, "_RETRY_S", 0.0)
    up = [False]

    def connect():
        if not up[0]:
            raise RuntimeError("Network is unreachable")
        return _client(store)()

    node0, node1 = ft_nodes.Nodes(0, 2, lambda: store), ft_nodes.Nodes(1, 2, connect)
    events = [ev("started", 1, 1.0, incarnation=0), ev("failed", 1, 2.0, step=3, error="e", since=1.5)]
    assert node1.exchange(events[:1]) == [] and node1.exchange(events[1:]) == []
    assert not node1.post_exits({1: 0}, set())
    assert node0.exchange([]) == [] and node0.missing() == [1]
    up[0] = True
    assert node1.post_exits({1: 0, 3: 143}, {3})
    assert node0.exchange([]) == events and node0.missing() == [] and node0.exits() == {1: 0, 3: "stopped"}


def test_exit_codes_that_are_not_exit_codes_are_dropped(store):
    node0 = ft_nodes.Nodes(0, 3, lambda: store)
    store.set("polydist/ft/exits/1", json.dumps({"2": 0, "3": True, "x": 1, "4": "1", "5": 143, "6": "stopped"}))
    store.set("polydist/ft/exits/2", b"\xff not json")
    assert node0.exits() == {2: 0, 5: 143, 6: "stopped"} and node0.missing() == []
