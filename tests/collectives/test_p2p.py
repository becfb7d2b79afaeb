"""Point-to-point: send, recv, isend, irecv of tensors and values, tags, errors.

Each ``_xxx`` function runs on every rank of a shared world (see _world.py)
and returns what the test then checks in the parent.
"""

import pathlib
import warnings

import pytest
import torch

import polydist as pd
from polydist import context

pytestmark = [pytest.mark.timeout(120), pytest.mark.p2p]

SMALL = {"text": "héllo wörld ✓", "n": 2**100, "t": (1, 2.5)}
BIG = {"text": "日本語テキスト" * 200, "blob": bytes(range(256)) * 12, "t": torch.arange(100, dtype=torch.float64)}


def _plain(x):
    if isinstance(x, torch.Tensor):
        return ("tensor", str(x.dtype), tuple(x.shape), x.tolist())
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


# ------------------------------------------------------------ tensors and values


def _send_recv():
    r = pd.get_rank()
    out = {}
    if r == 0:
        out["send_returns"] = pd.send(torch.arange(6.0).reshape(2, 3), dst=1)
        pd.send(SMALL, 1)
        pd.send(BIG, 1)
        pd.send(pathlib.Path("/a/b"), 1)
        pd.send(torch.tensor([1 + 2j, 3j], dtype=torch.complex64), 1)
        pd.send(torch.tensor([True, False]), 1)
        x = torch.zeros(4, dtype=torch.int64)
        out["recv_tensor"] = (pd.recv(x, src=1) is x, x.tolist())
        out["recv_value"] = pd.recv(None, 1)
        out["recv_big"] = _plain(pd.recv(None, 1))
    else:
        t = torch.zeros(2, 3)
        out["tensor"] = (pd.recv(t, src=0) is t, t.tolist())
        out["small"] = pd.recv(None, 0)
        out["big"] = _plain(pd.recv(None, src=0))
        out["path"] = pd.recv(None, 0)
        c = torch.zeros(2, dtype=torch.complex64)
        pd.recv(c, 0)
        out["complex"] = c.tolist()
        b = torch.zeros(2, dtype=torch.bool)
        pd.recv(b, 0)
        out["bool"] = b.tolist()
        pd.send(torch.tensor([5, 6, 7, 2**40]), 0)
        pd.send([None, ("tuple",), {1, 2}], 0)
        pd.send({"t": torch.ones(2, 2), "s": "x" * 5000}, 0)
    return out


def test_send_recv_tensors_and_values(world2):
    first, second = world2.run(_send_recv)
    assert first["send_returns"] is None
    assert second["tensor"] == (True, [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    assert second["small"] == SMALL and type(second["small"]["t"]) is tuple
    assert second["big"] == _plain(BIG)
    assert second["path"] == pathlib.Path("/a/b")
    assert second["complex"] == [1 + 2j, 3j]
    assert second["bool"] == [True, False]
    assert first["recv_tensor"] == (True, [5, 6, 7, 2**40])
    assert first["recv_value"] == [None, ("tuple",), {1, 2}]
    assert first["recv_big"] == {"t": ("tensor", "torch.float32", (2, 2), [[1.0, 1.0], [1.0, 1.0]]), "s": "x" * 5000}


def _isend_irecv():
    r = pd.get_rank()
    out = {}
    if r == 0:
        handles = [pd.isend(torch.full((5,), 7.0), 1), pd.isend(SMALL, 1), pd.isend(BIG, 1)]
        out["types"] = [type(h).__name__ for h in handles]
        out["waits"] = [h.wait() for h in handles]
        out["completed"] = [h.is_completed() for h in handles]
        y = torch.zeros(3, dtype=torch.float64)
        hy = pd.irecv(y, 1)
        hv = pd.irecv(None, 1)
        out["irecv_tensor"] = (hy.wait() is y, y.tolist(), hy.is_completed())
        out["irecv_value"] = hv.wait()
    else:
        x = torch.zeros(5)
        hx = pd.irecv(x, 0)
        hs = pd.irecv(None, 0)
        hb = pd.irecv(None, 0)
        out["tensor"] = (hx.wait() is x, x.tolist())
        out["small"] = hs.wait()
        out["big"] = _plain(hb.wait())
        out["again"] = hs.wait() == SMALL  # a second wait returns the same result
        pd.send(torch.tensor([0.5, 1.5, 2.5], dtype=torch.float64), 0)
        h = pd.isend(("from", 1), 0)
        h.wait()
    return out


def test_isend_irecv_handles(world2):
    first, second = world2.run(_isend_irecv)
    assert first["types"] == ["Work"] * 3
    assert first["waits"] == [None, None, None]
    assert first["completed"] == [True, True, True]
    assert second["tensor"] == (True, [7.0] * 5)
    assert second["small"] == SMALL and second["big"] == _plain(BIG) and second["again"]
    assert first["irecv_tensor"] == (True, [0.5, 1.5, 2.5], True)
    assert first["irecv_value"] == ("from", 1)


def _tags():
    r = pd.get_rank()
    if r == 0:
        hs = [pd.isend("tag one", 1, tag=1), pd.isend("x" * 4000 + "tag two", 1, tag=2),
              pd.isend(torch.tensor([3.0]), 1, tag=3), pd.isend(torch.tensor([4.0]), 1, tag=4)]
        for h in hs:
            h.wait()
        return None
    # received in another order than sent: tags pick the message
    four = pd.recv(torch.zeros(1), 0, tag=4).tolist()
    two = pd.recv(None, 0, tag=2)
    three = pd.recv(torch.zeros(1), 0, tag=3).tolist()
    one = pd.recv(None, 0, tag=1)
    return one, two[-7:], len(two), three, four


def test_tags_match_sends_to_receives(world2):
    assert world2.run(_tags)[1] == ("tag one", "tag two", 4007, [3.0], [4.0])


def _non_contiguous_receive():
    r = pd.get_rank()
    if r == 0:
        pd.send(torch.arange(6.0).reshape(2, 3), 1)
        pd.send(torch.arange(6.0).reshape(2, 3) * 10, 1)
        src = torch.arange(12.0).reshape(3, 4).t()  # a non-contiguous send
        pd.send(src, 1)
        return None
    base = torch.zeros(3, 2)
    pd.recv(base.t(), 0)  # non-contiguous view: written back into base
    base2 = torch.zeros(3, 2)
    pd.irecv(base2.t(), 0).wait()
    got = torch.zeros(4, 3)
    pd.recv(got, 0)
    return base.tolist(), base2.tolist(), got.tolist()


def test_non_contiguous_receive_and_send(world2):
    base, base2, got = world2.run(_non_contiguous_receive)[1]
    assert base == torch.arange(6.0).reshape(2, 3).t().tolist()
    assert base2 == (torch.arange(6.0).reshape(2, 3) * 10).t().tolist()
    assert got == torch.arange(12.0).reshape(3, 4).t().tolist()


def _ring():
    r, n = pd.get_rank(), pd.get_world_size()
    right, left = (r + 1) % n, (r - 1) % n
    send = torch.full((1024 * 1024,), float(r + 1))  # 4 MiB of float32
    send[0] = -r
    recv = torch.empty_like(send)
    handle = pd.isend(send, right)  # every rank sends first: must not deadlock
    pd.recv(recv, left)
    handle.wait()
    h2 = pd.isend({"from": r, "pad": "p" * 3000}, right, tag=7)
    value = pd.recv(None, left, tag=7)
    h2.wait()
    h3 = pd.irecv(torch.zeros(3), left)
    pd.send(torch.full((3,), float(r)), right)
    third = h3.wait().tolist()
    return recv[0].item(), recv[1:].unique().tolist(), recv.numel(), value["from"], third


def test_ring_exchange_4mib_three_ranks(world3):
    for r, (head, rest, numel, value_from, third) in enumerate(world3.run(_ring)):
        left = (r - 1) % 3
        assert head == -left and rest == [float(left + 1)] and numel == 1024 * 1024
        assert value_from == left and third == [float(left)] * 3


def _p2p_subgroup():
    r = pd.get_rank()
    if r == 1:
        return None
    if r == 0:
        pd.send(torch.tensor([42]), dst=2, group=[0, 2])  # dst is a GLOBAL rank
        return pd.recv(None, src=2, group=[0, 2])
    got = pd.recv(torch.zeros(1, dtype=torch.int64), src=0, group=[0, 2]).tolist()
    pd.send("back from 2", dst=0, group=pd.new_group([0, 2]))
    return got


def test_p2p_on_subgroup_uses_global_ranks(world3):
    assert world3.run(_p2p_subgroup) == ["back from 2", None, [42]]


# ------------------------------------------------------------ errors


def _error_of(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test checks the type
        return type(exc), str(exc)
    return None


def _bad_arguments():
    r = pd.get_rank()
    other = 1 - r
    t = torch.ones(2)
    errors = {
        "send_self": _error_of(lambda: pd.send(t, dst=r)),
        "recv_self": _error_of(lambda: pd.recv(t, src=r)),
        "isend_self": _error_of(lambda: pd.isend(t, r)),
        "irecv_self": _error_of(lambda: pd.irecv(None, r)),
        "send_out": _error_of(lambda: pd.send(t, dst=5)),
        "recv_out": _error_of(lambda: pd.recv(None, src=-1)),
        "send_float_dst": _error_of(lambda: pd.send(t, dst=1.0)),
        "send_negative_tag": _error_of(lambda: pd.send(t, other, tag=-1)),
        "recv_negative_tag": _error_of(lambda: pd.recv(t, other, tag=-3)),
        "isend_negative_tag": _error_of(lambda: pd.isend("v", other, tag=-2)),
        "recv_list": _error_of(lambda: pd.recv([1, 2], other)),
        "irecv_list": _error_of(lambda: pd.irecv([0.0], other)),
        "recv_string": _error_of(lambda: pd.recv("buffer", other)),
    }
    # the pair still works after all of these
    if r == 0:
        pd.send("still fine", 1)
        after = pd.recv(torch.zeros(1), 1).tolist()
    else:
        after = pd.recv(None, 0)
        pd.send(torch.tensor([9.0]), 0)
    return errors, after


def test_bad_arguments_raise_before_communication(world2):
    for r, (errors, after) in enumerate(world2.run(_bad_arguments)):
        for name in ("send_self", "isend_self"):
            assert errors[name][0] is ValueError and f"dst={r}" in errors[name][1], (name, errors[name])
        for name in ("recv_self", "irecv_self"):
            assert errors[name][0] is ValueError and f"src={r}" in errors[name][1], (name, errors[name])
        assert errors["send_out"][0] is ValueError and "dst=5" in errors["send_out"][1]
        assert errors["recv_out"][0] is ValueError and "src=-1" in errors["recv_out"][1]
        assert errors["send_float_dst"][0] is TypeError and "1.0" in errors["send_float_dst"][1]
        assert errors["send_negative_tag"][0] is ValueError and "-1" in errors["send_negative_tag"][1]
        assert errors["recv_negative_tag"][0] is ValueError and "-3" in errors["recv_negative_tag"][1]
        assert errors["isend_negative_tag"][0] is ValueError and "-2" in errors["isend_negative_tag"][1]
        assert errors["recv_list"][0] is TypeError and "list" in errors["recv_list"][1]
        assert errors["irecv_list"][0] is TypeError and "list" in errors["irecv_list"][1]
        assert errors["recv_string"][0] is TypeError and "str" in errors["recv_string"][1]
        assert after == ("still fine" if r == 1 else [9.0])


def _peer_outside_group():
    # only the members 0 and 2 create [0, 2] (the group _p2p_subgroup uses too)
    r = pd.get_rank()
    if r == 1:  # not a member: a no-op, as torch.distributed's send, so no rank waits for anything
        context.world().warned.clear()  # warned once per group and world; this shared world may have seen it
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            not_member = _error_of(lambda: pd.send(torch.ones(1), dst=0, group=[0, 2]))
            sent = pd.send(torch.ones(1), dst=0, group=[0, 2])
        return (not_member, sent, [str(w.message) for w in caught]), None
    outside = _error_of(lambda: pd.send(torch.ones(1), dst=1, group=[0, 2]))
    outside_recv = _error_of(lambda: pd.recv(None, src=1, group=[0, 2]))
    if r == 0:
        pd.send(1, 2, group=[0, 2])
        after = None
    else:
        after = pd.recv(None, 0, group=[0, 2])
    return (outside, outside_recv), after


def test_peer_outside_group(world3):
    results = world3.run(_peer_outside_group)
    for r in (0, 2):
        (outside, outside_recv), after = results[r]
        assert outside[0] is ValueError and "dst=1" in outside[1] and "[0, 2]" in outside[1]
        assert outside_recv[0] is ValueError and "src=1" in outside_recv[1]
    assert results[2][1] == 1
    (not_member, sent, warned), _ = results[1]
    assert not_member is None and sent is None
    assert len(warned) == 1 and "send on global rank 1, which is not a member of group [0, 2]" in warned[0]


def test_serial_run_has_no_peer():
    # this (parent) process has no process group and no launcher: a serial run
    assert not pd.is_initialized() and pd.get_world_size() == 1
    for call in (lambda: pd.send(torch.ones(1), dst=1), lambda: pd.recv(None, src=1),
                 lambda: pd.isend("v", 1), lambda: pd.irecv(torch.ones(1), 1)):
        with pytest.raises(ValueError, match="serial"):
            call()


def _value_expected_raw_tensor_arrives():
    r = pd.get_rank()
    if r == 0:
        pd.send(torch.arange(64, dtype=torch.float32), 1)  # a raw tensor, exactly one slot in size
        pd.send("next", 1)
        return None
    error = _error_of(lambda: pd.recv(None, 0))
    return error, pd.recv(None, 0)


def test_receiver_expecting_value_gets_raw_tensor(world2):
    error, after = world2.run(_value_expected_raw_tensor_arrives)[1]
    assert error[0] is pd.CollectiveMismatchError, error
    assert "rank 0" in error[1] and "recv(None, src)" in error[1]
    assert after == "next"  # the pair is still in step


def _unencodable_value():
    r = pd.get_rank()
    if r == 0:
        errors = [_error_of(lambda: pd.send({"ok": 1, "bad": object()}, 1)),
                  _error_of(lambda: pd.isend([lambda: 0], 1))]
        pd.send("after", 1)
        return errors
    errors = [_error_of(lambda: pd.recv(None, 0)), _error_of(lambda: pd.irecv(None, 0).wait())]
    return errors, pd.recv(None, 0)


def test_unencodable_value_type_error_on_sender_and_receiver(world2):
    sender, (receiver, after) = world2.run(_unencodable_value)
    assert sender[0][0] is TypeError and "builtins.object" in sender[0][1]
    assert sender[1][0] is TypeError and "function" in sender[1][1]
    assert receiver[0][0] is TypeError and "rank 0" in receiver[0][1] and "builtins.object" in receiver[0][1]
    assert receiver[1][0] is TypeError and "function" in receiver[1][1]
    assert after == "after"
