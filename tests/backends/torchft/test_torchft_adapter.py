"""polydist's adapter over torchft 0.2.0 (src/polydist/backends/torchft/), one process, no lighthouse needed:
each workaround of a torchft defect, the safe state transport, and the servers' addresses."""

import socket
import threading
import time
import urllib.request
from datetime import timedelta

import pytest
import torch

torchft = pytest.importorskip("torchft", reason="torchft is not installed: pip install 'polydist[ft]'")

from polydist import codec  # noqa: E402
from polydist.backends.torchft import engine, transport, wrappers  # noqa: E402
from _fakes import _Group, _Manager  # noqa: E402

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------- the comm hook (torchft 0.2.0's assert)


def _bucket(values):
    bucket = torch.tensor(values, dtype=torch.float32)

    class Bucket:
        def buffer(self):
            return bucket

    return Bucket(), bucket


def test_hook_averages_over_the_participants_without_blocking():
    group = _Group()
    manager = _Manager(group, participants=4)
    bucket, tensor = _bucket([4.0, 8.0])
    fut = wrappers.comm_hook(manager, bucket)
    assert not fut.done()  # the hook returned before the all-reduce completed: backward goes on meanwhile
    (sent,), work = group.works[0]
    sent.add_(torch.tensor([4.0, 8.0]))  # what the other replica groups added
    work.future.set_result([sent])
    assert fut.wait().tolist() == [2.0, 4.0] and manager.reported == []


def test_hook_survives_a_peer_lost_mid_all_reduce():
    """torchft 0.2.0's hook asserts here (`assert fut._fut`) and kills the survivor; polydist's completes the
    future with the bucket as it is and reports the error, so the step is not committed."""
    group = _Group()
    manager = _Manager(group)
    bucket, tensor = _bucket([1.0, 2.0])
    fut = wrappers.comm_hook(manager, bucket)
    group.works[0][1].future.set_exception(RuntimeError("Connection reset by peer"))
    assert fut.wait() is tensor and tensor.tolist() == [1.0, 2.0]
    assert [str(e) for e in manager.reported] == ["Connection reset by peer"]


def test_hook_after_a_failure_sends_nothing_and_a_group_that_cannot_start_reports():
    manager = _Manager(_Group(error_on_start=RuntimeError("no group")))
    bucket, tensor = _bucket([1.0])
    assert wrappers.comm_hook(manager, bucket).wait() is tensor
    assert [str(e) for e in manager.reported] == ["no group"]
    group = _Group()
    manager = _Manager(group)
    manager.report_error(RuntimeError("earlier bucket failed"))
    assert wrappers.comm_hook(manager, bucket).wait() is tensor and group.works == []


def test_a_replica_group_receiving_the_live_state_contributes_zeros():
    group = _Group()
    bucket, tensor = _bucket([5.0, 5.0])
    wrappers.comm_hook(_Manager(group, participating=False), bucket)
    assert group.works[0][0][0].tolist() == [0.0, 0.0]


def test_ddp_with_the_hook_trains_one_process_and_prints_no_unused_parameters_warning(capfd):
    """The real torchft DDP subclass: the hook registered (DDP checks its annotations), one backward through it."""
    group = _Group()
    manager = _Manager(group, participants=1)
    model = wrappers.FaultTolerantDDP(manager, torch.nn.Linear(3, 2))
    assert model._comm_hook is wrappers.comm_hook

    def complete():
        while not group.works:
            time.sleep(0.001)
        (sent,), work = group.works[0]
        work.future.set_result([sent])

    threading.Thread(target=complete, daemon=True).start()
    model(torch.ones(4, 3)).sum().backward()
    assert model.module.weight.grad is not None and manager.reported == []
    assert "find_unused_parameters=True" not in capfd.readouterr().err


# ---------------------------------------------------------------- the state transport (no pickle)


def _state(step=3):
    model = torch.nn.Linear(4, 2)
    return {"user": {"model": model.state_dict()}, "torchft": {"step": step, "batches_committed": 6}}


def test_state_round_trips_through_the_codec_on_loopback():
    received = []
    sender = transport.SafeTransport("127.0.0.1", timedelta(seconds=10))
    receiver = transport.SafeTransport("127.0.0.1", timedelta(seconds=10), on_received=lambda b, s: received.append(b))
    receiver.required = frozenset({"model"})
    try:
        state = _state()
        sender.send_checkpoint([1], 3, state, timedelta(seconds=5))
        got = receiver.recv_checkpoint(0, sender.metadata(), 3, timedelta(seconds=5))
        assert got["torchft"] == {"step": 3, "batches_committed": 6}
        for name, value in state["user"]["model"].items():
            assert torch.equal(got["user"]["model"][name], value)
        assert received and received[0] > 0
        assert sender.metadata().startswith("http://127.0.0.1:")
    finally:
        sender.shutdown()
        receiver.shutdown()


def test_state_is_served_to_its_token_and_step_only_and_never_pickled():
    sender = transport.SafeTransport("127.0.0.1", timedelta(seconds=1))
    try:
        sender.send_checkpoint([1], 7, _state(7), timedelta(seconds=1))
        base = sender.address()
        for path in ("/wrongtoken/7", f"/{sender._token}/8", f"/{sender._token}/x", "/", f"/{sender._token}"):
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(base + path, timeout=5)
            assert info.value.code == 404
        with urllib.request.urlopen(f"{sender.metadata()}/7", timeout=5) as response:
            payload = response.read()
        assert b"pickle" not in payload[:64] and codec.decode(payload)["torchft"]["step"] == 7
        sender.disallow_checkpoint()  # after the commit vote: nothing is served any more
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{sender.metadata()}/7", timeout=5)
    finally:
        sender.shutdown()


class _Hostile:
    """An HTTP server on loopback that answers every GET with ``body`` (and ``length``)."""

    def __init__(self, body: bytes, length=None):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.body, self.length = body, len(body) if length is None else length
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % self.length + self.body)
            conn.close()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/token"


@pytest.mark.parametrize(
    "body, length, words",
    [
        (__import__("pickle").dumps({"user": {}, "torchft": {"step": 1, "batches_committed": 1}}), None, "malformed"),
        (codec.encode({"user": {"model": {}}, "torchft": {"step": -1, "batches_committed": 0}}), None, "not a torchft state"),
        (codec.encode({"user": {"other": 1}, "torchft": {"step": 1, "batches_committed": 0}}), None, "lacks ['model']"),
        (codec.encode([1, 2, 3]), None, "not a torchft state"),
        (b"x" * 10, 10**12, "offered a state of 1000000000000 bytes"),
        (codec.encode({"user": {}})[:5], 100, "ended after"),
    ],
)
def test_hostile_state_is_an_error_naming_the_sender_never_code(body, length, words):
    server = _Hostile(body, length)
    receiver = transport.SafeTransport("127.0.0.1", timedelta(seconds=5), limit=1 << 20)
    receiver.required = frozenset({"model"})
    try:
        with pytest.raises(ValueError) as info:
            receiver.recv_checkpoint(2, server.url, 1, timedelta(seconds=5))
        assert words in str(info.value)
    finally:
        server.sock.close()
        receiver.shutdown()


def test_an_address_that_is_not_http_is_refused_before_any_connection():
    receiver = transport.SafeTransport("127.0.0.1", timedelta(seconds=1))
    try:
        with pytest.raises(ValueError, match="no state address"):
            receiver.recv_checkpoint(0, "file:///etc/passwd", 1, timedelta(seconds=1))
    finally:
        receiver.shutdown()


def test_plain_turns_ordered_dicts_into_dicts_keeping_order():
    from collections import OrderedDict

    value = OrderedDict([("b", OrderedDict(z=1)), ("a", [OrderedDict(y=2)])])
    out = transport.plain(value)
    assert type(out) is dict and list(out) == ["b", "a"] and type(out["b"]) is dict and type(out["a"][0]) is dict


# ---------------------------------------------------------------- the manager's servers (bound to one address)


def _listening_ports() -> dict:
    """{port: local address} of this process's listening TCP sockets (from /proc/net/tcp{,6})."""
    ports = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    address, port = fields[1].rsplit(":", 1)
                    ports[int(port, 16)] = address
    return ports


def test_lighthouse_and_manager_listen_on_loopback_only(monkeypatch):
    """torchft binds its manager server to every interface ("[::]:port"); polydist binds it to the job's host."""
    import torch.distributed as dist

    server, address = engine.serve_lighthouse("127.0.0.1", 1)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ship = transport.SafeTransport("127.0.0.1", timedelta(seconds=5))
    manager = engine.make_manager(
        replica=0, group_rank=0, group_size=1, store=("127.0.0.1", store.port), lighthouse=address,
        host="127.0.0.1", timeout=timedelta(seconds=5), min_replicas=1, transport=ship,
    )
    try:
        ports = _listening_ports()
        manager_port = int(manager._manager.address().rsplit(":", 1)[1])
        lighthouse_port = int(address.rsplit(":", 1)[1])
        loopback = ("0100007F", "0000000000000000FFFF00000100007F")
        assert manager._manager.address().startswith("http://127.0.0.1:")
        for port in (manager_port, lighthouse_port, ship._server.server_address[1]):
            assert ports.get(port) in loopback, (port, ports.get(port))
        assert manager._quorum_retries == engine.QUORUM_RETRIES > 0  # torchft's default 0: one lighthouse blip kills all
    finally:
        manager.shutdown(wait=False)
        server.shutdown()


def test_a_program_that_an_error_ended_logs_no_end_of_its_replica_group(monkeypatch):
    """At interpreter exit (the worker stops a program that returned before that) polydist.ft.stop only shuts the
    manager down: the digest of a replica group of several ranks is a collective its dead peers would not join,
    and a "finished" event would tell the launcher this replica group finished."""
    from polydist import ft, live_world

    class Session:
        ended = []

        def finish(self):
            self.ended.append("finish")

        manager = type("Manager", (), {"shutdown": lambda self, wait: Session.ended.append(("shutdown", wait))})()

    for exiting, ended in ((True, [("shutdown", False)]), (False, ["finish"])):
        Session.ended = []
        monkeypatch.setattr(live_world, "exiting", exiting)
        monkeypatch.setattr(ft, "_session", Session())
        monkeypatch.setattr(ft, "_stopped", False)
        ft.stop()
        assert Session.ended == ended
