"""Errors instead of hangs: argument validation, failures announced to every rank, debug mode, pickle opt-in.

Each ``_xxx`` function runs on every rank of a shared world (see _world.py)
and returns what the test then checks in the parent. Functions that change a
process-wide setting (debug mode, pickle) restore it in a ``finally`` so the
shared worlds stay clean for the next test.
"""

import pickle

import msgpack
import numpy as np
import pytest
import torch

import polydist as pd
from polydist import codec
from polydist.collectives import debug

pytestmark = pytest.mark.timeout(120)


class Point:
    """A user class the safe codec does not know (module level, so pickle can find it)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return type(other) is Point and (self.x, self.y) == (other.x, other.y)

    def __repr__(self):
        return f"Point({self.x}, {self.y})"


class _Exploit:
    """Unpickling this writes a file: proof that code ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def error_of(call):
    """``(exception type, message)`` raised by ``call()``, or None."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the tests check the exact type
        return type(exc), str(exc)
    return None


# ------------------------------------------------------------ validation before communication


def _validation_cases(r, n):
    t = torch.ones(4)
    i64 = torch.ones(4, dtype=torch.int64)
    # name -> (call, expected type, fragments of the message that name the bad value)
    return {
        "unknown_op": (lambda: pd.all_reduce(t, op="median"), ValueError, ["'median'"]),
        "unknown_op_number": (lambda: pd.all_reduce(3, op="mean_of"), ValueError, ["'mean_of'"]),
        "unknown_op_list": (lambda: pd.all_reduce([t, t], op="sumx"), ValueError, ["'sumx'"]),
        "unknown_op_reduce": (lambda: pd.reduce(t, op="bogus"), ValueError, ["'bogus'"]),
        "unknown_op_reduce_scatter": (lambda: pd.reduce_scatter(t, op="nope"), ValueError, ["'nope'"]),
        "reduce_dst_range": (lambda: pd.reduce(t, dst=n), ValueError, [f"dst={n}"]),
        "reduce_dst_negative": (lambda: pd.reduce(t, dst=-1), ValueError, ["dst=-1"]),
        "reduce_number_dst_range": (lambda: pd.reduce(5, dst=7), ValueError, ["dst=7"]),
        "gather_dst_range": (lambda: pd.gather(t, dst=n + 3), ValueError, [f"dst={n + 3}"]),
        "gather_value_dst_range": (lambda: pd.gather("v", dst=n), ValueError, [f"dst={n}"]),
        "scatter_src_range": (lambda: pd.scatter([t] * n, src=n), ValueError, [f"src={n}"]),
        "broadcast_src_range": (lambda: pd.broadcast(t, src=9), ValueError, ["src=9"]),
        "broadcast_value_src_range": (lambda: pd.broadcast("x", src=-2), ValueError, ["src=-2"]),
        "reduce_dst_float": (lambda: pd.reduce(t, dst=0.0), TypeError, ["0.0"]),
        "gather_dst_str": (lambda: pd.gather(t, dst="0"), TypeError, ["'0'"]),
        "scatter_src_none": (lambda: pd.scatter([t] * n, src=None), TypeError, ["None"]),
        "broadcast_src_bool": (lambda: pd.broadcast(t, src=True), TypeError, ["True"]),
        "and_float": (lambda: pd.all_reduce(t, op="AND"), TypeError, ["AND", "float32"]),
        "or_float64_reduce": (lambda: pd.reduce(torch.ones(2, dtype=torch.float64), op="or"), TypeError, ["float64"]),
        "xor_bf16_reduce_scatter": (lambda: pd.reduce_scatter(torch.ones(4, dtype=torch.bfloat16), op="XOR"),
                                    TypeError, ["bfloat16"]),
        "and_float_number": (lambda: pd.all_reduce(1.5, op="and"), TypeError, ["1.5"]),
        "and_list_with_float": (lambda: pd.all_reduce([i64, t], op="AND"), TypeError, ["float32"]),
        "avg_int": (lambda: pd.all_reduce(i64, op="AVG"), TypeError, ["AVG", "int64"]),
        "avg_int_reduce": (lambda: pd.reduce(torch.ones(2, dtype=torch.int32), op="avg"), TypeError, ["int32"]),
        "avg_uint8_reduce_scatter": (lambda: pd.reduce_scatter(torch.ones(4, dtype=torch.uint8), op="AVG"),
                                     TypeError, ["uint8"]),
        "avg_bool": (lambda: pd.all_reduce(torch.ones(2, dtype=torch.bool), op="AVG"), TypeError, ["bool"]),
        "max_complex": (lambda: pd.all_reduce(torch.ones(2, dtype=torch.complex64), op="MAX"), TypeError,
                        ["complex64"]),
        "min_complex_number": (lambda: pd.all_reduce(1j, op="MIN"), TypeError, ["1j"]),
        "all_reduce_str": (lambda: pd.all_reduce("text"), TypeError, ["str"]),
        "reduce_none": (lambda: pd.reduce(None), TypeError, ["NoneType"]),
        "reduce_scatter_list": (lambda: pd.reduce_scatter([t]), TypeError, ["list"]),
        "reduce_scatter_0dim": (lambda: pd.reduce_scatter(torch.tensor(1.0)), ValueError, ["0-dim"]),
        "group_type": (lambda: pd.all_reduce(t, group="world"), pd.InvalidGroupError, ["str"]),
        "group_rank_range": (lambda: pd.all_gather(t, group=[0, 9]), ValueError, ["9"]),
        "group_rank_type": (lambda: pd.all_reduce(t, group=[0, "1"]), pd.InvalidGroupError, ["'1'"]),
        "group_duplicates": (lambda: pd.broadcast(t, group=[0, 0]), ValueError, ["[0, 0]"]),
        # A rank outside the group is no error but a no-op (torch.distributed's rule): tests/core/test_world_state.py.
    }


VALIDATION_NAMES = list(_validation_cases(0, 2))


def _validation():
    r, n = pd.get_rank(), pd.get_world_size()
    out = {}
    for k, (name, (call, _, _)) in enumerate(_validation_cases(r, n).items()):
        error = error_of(call)
        # the group still works after each rejected call
        after = pd.all_reduce(torch.tensor([float(k)])).item()
        out[name] = (error, after, k)
    return out


def test_validation_errors_exact_types_then_group_usable(world2):
    expected = _validation_cases(0, 2)
    for r, out in enumerate(world2.run(_validation)):
        for name in VALIDATION_NAMES:
            _, kind, fragments = _validation_cases(r, 2)[name]
            error, after, k = out[name]
            assert error is not None, (r, name, "no error")
            assert error[0] is kind, (r, name, error)
            for fragment in fragments:
                assert fragment in error[1], (r, name, fragment, error[1])
            assert after == 2.0 * k, (r, name)
    assert set(expected) == set(VALIDATION_NAMES)


def _subgroup_roots():
    r = pd.get_rank()
    group = [0, 2] if r in (0, 2) else [1, 3]
    t = torch.ones(2)
    out = {
        # src/dst are GLOBAL ranks: the group rank (0 or 1) of a member is not accepted unless it is a member
        "reduce_group_rank": error_of(lambda: pd.reduce(t, dst=3 if r in (0, 2) else 0, group=group)),
        "broadcast_other_group": error_of(lambda: pd.broadcast(t, src=1 if r in (0, 2) else 2, group=group)),
        "gather_other_group": error_of(lambda: pd.gather(t, dst=3 if r in (0, 2) else 2, group=group)),
        "scatter_other_group": error_of(lambda: pd.scatter([t, t], src=1 if r in (0, 2) else 0, group=group)),
    }
    out["after"] = pd.all_reduce(torch.tensor([float(r)]), group=group).item()
    return out


@pytest.mark.subgroups(groups=[[0, 2], [1, 3]])
def test_roots_outside_subgroup(world4):
    for r, out in enumerate(world4.run(_subgroup_roots)):
        group = "[0, 2]" if r in (0, 2) else "[1, 3]"
        for name in ("reduce_group_rank", "broadcast_other_group", "gather_other_group", "scatter_other_group"):
            assert out[name][0] is ValueError and group in out[name][1], (r, name, out[name])
        assert out["after"] == (2.0 if r in (0, 2) else 4.0)


# ------------------------------------------------------------ failures every rank learns of


def _every_rank_cases(r):
    big = "ü" * 2000  # > 2 KiB: the others would need a second round
    xs3 = [torch.ones(1)] * 3
    return {
        # wrong list lengths -> ValueError
        "scatter_long": (lambda: pd.scatter([torch.ones(1)] * 4 if r == 0 else None, src=0), ValueError, ["got 4"]),
        "scatter_short_values": (lambda: pd.scatter(["a"] if r == 1 else None, src=1), ValueError, ["got 1"]),
        "scatter_not_list": (lambda: pd.scatter(torch.ones(3) if r == 2 else None, src=2), TypeError, ["Tensor"]),
        "all_to_all_long": (lambda: pd.all_to_all(xs3 + [torch.ones(1)]), ValueError, ["got 4"]),
        "all_to_all_one_rank_short": (lambda: pd.all_to_all(["a", "b"] if r == 1 else ["a", "b", "c"]),
                                      ValueError, ["got 2"]),
        "all_to_all_one_rank_not_list": (lambda: pd.all_to_all("abc" if r == 2 else xs3), TypeError, ["str"]),
        # unencodable values -> TypeError
        "all_gather_object": (lambda: pd.all_gather(object() if r == 1 else big), TypeError, ["builtins.object"]),
        "all_gather_nested": (lambda: pd.all_gather({"k": [(1, Point(r, r))]} if r == 0 else r), TypeError,
                              ["Point"]),
        "all_gather_numpy_object": (lambda: pd.all_gather(np.array([None, 1], dtype=object) if r == 2 else r),
                                    TypeError, ["object"]),
        "broadcast_object": (lambda: pd.broadcast({"x": object()} if r == 0 else None, src=0), TypeError,
                             ["builtins.object"]),
        "broadcast_lambda_src1": (lambda: pd.broadcast([lambda: 1] if r == 1 else None, src=1), TypeError,
                                  ["function"]),
        "gather_object_off_dst": (lambda: pd.gather(object() if r == 2 else big, dst=0), TypeError,
                                  ["builtins.object"]),
        "scatter_object": (lambda: pd.scatter(["a", object(), big] if r == 0 else None, src=0), TypeError,
                           ["builtins.object"]),
        "scatter_point": (lambda: pd.scatter([Point(0, 0), 1, 2] if r == 1 else None, src=1), TypeError, ["Point"]),
        "all_to_all_object": (lambda: pd.all_to_all([big, object(), torch.ones(2)] if r == 0 else [big, 1, 2]),
                              TypeError, ["builtins.object"]),
    }


EVERY_RANK_NAMES = list(_every_rank_cases(0))


def _every_rank():
    r = pd.get_rank()
    out = {}
    for k, (name, (call, _, _)) in enumerate(_every_rank_cases(r).items()):
        error = error_of(call)
        after = pd.all_gather(k)  # the group still works
        out[name] = (error, after, k)
    return out


def test_failures_raise_on_every_rank_then_group_usable(world3):
    cases = _every_rank_cases(0)
    for r, out in enumerate(world3.run(_every_rank)):
        for name in EVERY_RANK_NAMES:
            _, kind, fragments = cases[name]
            error, after, k = out[name]
            assert error is not None, (r, name, "no error on this rank")
            assert error[0] is kind, (r, name, error)
            for fragment in fragments:
                assert fragment in error[1], (r, name, fragment, error[1])
            assert after == [k, k, k], (r, name)


# ------------------------------------------------------------ debug mode


def _case_shapes(r):
    pd.all_reduce(torch.ones(r + 1))


def _case_dtypes(r):
    pd.all_reduce(torch.ones(2, dtype=torch.float64 if r == 1 else torch.float32))


def _case_ops(r):
    pd.all_reduce(torch.ones(2), op=["SUM", "MAX", "MIN"][r])


def _case_collectives(r):
    if r == 0:
        pd.all_reduce(torch.ones(2))
    else:
        pd.broadcast(torch.ones(2), src=0)


def _case_broadcast_src(r):
    pd.broadcast(torch.ones(2), src=min(r, 1))


def _case_reduce_dst(r):
    pd.reduce(torch.ones(2), dst=r)


def _case_gather_dst(r):
    pd.gather(torch.ones(2), dst=2 - r)


def _case_skipped(r):
    # rank 1 skips the all_reduce and goes on to the barrier
    if r != 1:
        pd.all_reduce(torch.ones(2))
    pd.barrier()


def _case_sequence(r):
    pd.all_reduce(torch.ones(2))  # call #1 everywhere: matches
    if r == 1:
        debug.reset()  # rank 1's count falls behind, as if it had missed a call
    pd.all_reduce(torch.ones(2))  # identical call, different sequence numbers


def _case_tensor_vs_value(r):
    pd.all_gather(torch.ones(2) if r == 0 else 5)


def _case_reduce_scatter_shapes(r):
    pd.reduce_scatter(torch.ones(3 + r))


def _case_safe_mode(r):
    pd.broadcast(torch.ones(2), src=0, safe_mode=(r == 0))


def _case_number_vs_tensor(r):
    pd.all_reduce(1 if r == 2 else torch.ones(1))


DEBUG_CASES = {
    "shapes": (_case_shapes, ["float32[1]", "float32[2]", "float32[3]"]),
    "dtypes": (_case_dtypes, ["float32[2]", "float64[2]", "float32[2]"]),
    "ops": (_case_ops, ["op=SUM", "op=MAX", "op=MIN"]),
    "collectives": (_case_collectives, ["all_reduce(", "broadcast(", "broadcast("]),
    "broadcast_src": (_case_broadcast_src, ["src=0", "src=1", "src=1"]),
    "reduce_dst": (_case_reduce_dst, ["dst=0", "dst=1", "dst=2"]),
    "gather_dst": (_case_gather_dst, ["dst=2", "dst=1", "dst=0"]),
    "skipped": (_case_skipped, ["all_reduce(", "barrier(", "all_reduce("]),
    "sequence": (_case_sequence, ["#2", "#1", "#2"]),
    "tensor_vs_value": (_case_tensor_vs_value, ["float32[2]", "int", "int"]),
    "reduce_scatter_shapes": (_case_reduce_scatter_shapes, ["float32[3]", "float32[4]", "float32[5]"]),
    "safe_mode": (_case_safe_mode, ["safe_mode", "float32[2]", "float32[2]"]),
    "number_vs_tensor": (_case_number_vs_tensor, ["float32[1]", "float32[1]", "number"]),
}


def _debug_mismatch(name):
    r = pd.get_rank()
    pd.set_debug(True)
    try:
        try:
            DEBUG_CASES[name][0](r)
            error = None
        except pd.CollectiveMismatchError as exc:
            error = (type(exc), str(exc), dict(exc.calls))
        except Exception as exc:  # noqa: BLE001 - reported to the test
            error = (type(exc), str(exc), None)
        if name == "sequence":
            debug.reset()  # bring the counts back in step on every rank
        # still in debug mode: a matching call afterwards passes the check and is correct
        after = pd.all_reduce(torch.tensor([float(r)])).item()
        return error, after
    finally:
        pd.set_debug(False)
        debug.reset()


@pytest.mark.parametrize("name", list(DEBUG_CASES))
def test_debug_mismatch_raises_on_every_rank_naming_each_call(world3, name):
    fragments = DEBUG_CASES[name][1]
    for r, (error, after) in enumerate(world3.run(_debug_mismatch, name)):
        assert error is not None, (r, "no error: the mismatch went unnoticed")
        kind, message, calls = error
        assert kind is pd.CollectiveMismatchError, (r, kind, message)
        assert sorted(calls) == [0, 1, 2], calls
        for rank, fragment in enumerate(fragments):
            assert fragment in calls[rank], (rank, fragment, calls[rank])
            assert f"rank {rank}" in message
        assert after == 3.0


def _debug_subgroup_mismatch():
    r = pd.get_rank()
    pd.set_debug(True)
    try:
        group = [0, 2] if r in (0, 2) else [1, 3]
        try:
            pd.all_reduce(torch.ones(1 + (r == 2)), group=group)  # only group [0, 2] disagrees
            error = None
        except pd.CollectiveMismatchError as exc:
            error = (str(exc), dict(exc.calls))
        return error, pd.all_reduce(torch.ones(1), group=group).item()
    finally:
        pd.set_debug(False)
        debug.reset()


@pytest.mark.subgroups(groups=[[0, 2], [1, 3]])
def test_debug_mismatch_in_a_subgroup_names_global_ranks(world4):
    results = world4.run(_debug_subgroup_mismatch)
    for r in (0, 2):
        (message, calls), after = results[r]
        assert sorted(calls) == [0, 2] and "float32[1]" in calls[0] and "float32[2]" in calls[2]
        assert "[0, 2]" in message and after == 2.0
    for r in (1, 3):
        assert results[r] == (None, 2.0)


def _debug_p2p():
    r = pd.get_rank()
    pd.set_debug(True)
    try:
        if r == 0:
            pd.send(torch.ones(3), 1)  # the receiver expects float32[2]
            pd.send(torch.ones(2, dtype=torch.float64), 1)  # ... float32[2]
            pd.send("a value", 1)  # the receiver passes a tensor
            pd.send("a long value " * 40, 1)  # the same, with a body
            pd.send(torch.ones(2), 1)  # the receiver expects a value
            pd.isend(torch.ones(5), 1).wait()  # irecv of float32[4]
            pd.send(torch.arange(2.0), 1)  # matching
            pd.send({"v": 1}, 1)  # matching
            return None
        errors = [
            error_of(lambda: pd.recv(torch.zeros(2), 0)),
            error_of(lambda: pd.recv(torch.zeros(2), 0)),
            error_of(lambda: pd.recv(torch.zeros(2), 0)),
            error_of(lambda: pd.recv(torch.zeros(2), 0)),
            error_of(lambda: pd.recv(None, 0)),
            error_of(lambda: pd.irecv(torch.zeros(4), 0).wait()),
        ]
        ok = pd.recv(torch.zeros(2), 0).tolist()
        return errors, ok, pd.recv(None, 0)
    finally:
        pd.set_debug(False)
        debug.reset()


def _debug_p2p_calls():
    r = pd.get_rank()
    pd.set_debug(True)
    try:
        if r == 0:
            pd.send(torch.ones(3), 1)
            return pd.recv(None, 1)
        try:
            pd.recv(torch.zeros(2), 0)
            calls = None
        except pd.CollectiveMismatchError as exc:
            calls = dict(exc.calls)
        pd.send("after", 0)
        return calls
    finally:
        pd.set_debug(False)
        debug.reset()


@pytest.mark.p2p
def test_debug_p2p_receiver_mismatch(world2):
    sender, receiver = world2.run(_debug_p2p)
    assert sender is None  # the sender does not raise
    errors, ok, value = receiver
    kinds = [e[0] if e else None for e in errors]
    assert kinds == [pd.CollectiveMismatchError] * 6, errors
    assert "float32[3]" in errors[0][1] and "float32[2]" in errors[0][1]
    assert "float64[2]" in errors[1][1] and "float32[2]" in errors[1][1]
    assert "value" in errors[2][1] and "value" in errors[3][1]
    assert "float32[2]" in errors[4][1] and "recv(None, src)" in errors[4][1]
    assert "float32[5]" in errors[5][1] and "float32[4]" in errors[5][1]
    assert ok == [0.0, 1.0] and value == {"v": 1}  # the pair is still in step


@pytest.mark.p2p
def test_debug_p2p_calls_name_both_ranks(world2):
    after, calls = world2.run(_debug_p2p_calls)
    assert after == "after"
    assert calls is not None and 0 in calls and "float32[3]" in calls[0], calls
    assert 1 in calls and "float32[2]" in calls[1], calls  # the receiver's own call too


def _debug_matching_calls():
    r = pd.get_rank()
    pd.set_debug(True)
    try:
        out = {}
        t = torch.tensor([r + 1.0])
        out["all_reduce"] = pd.all_reduce(t).tolist()
        out["all_reduce_list"] = [x.tolist() for x in pd.all_reduce([torch.ones(2) * r, torch.tensor([r])])]
        out["all_reduce_number"] = pd.all_reduce(r + 1, op="max")
        out["reduce"] = pd.reduce(torch.tensor([r + 1.0]), dst=1).tolist()
        out["reduce_number"] = pd.reduce(r, dst=2)
        out["broadcast"] = pd.broadcast(torch.full((2,), float(r)), src=2).tolist()
        out["broadcast_safe"] = pd.broadcast(torch.arange(3) if r == 0 else None, src=0, safe_mode=True).tolist()
        out["broadcast_value"] = pd.broadcast("é" * 3000 if r == 1 else None, src=1) == "é" * 3000
        out["all_gather"] = pd.all_gather(torch.arange(r + 1)).tolist()
        out["all_gather_value"] = pd.all_gather({"r": r})
        g = pd.gather(torch.tensor([r]), dst=0)
        out["gather"] = None if g is None else g.tolist()
        out["scatter"] = pd.scatter([torch.ones(i + 1) for i in range(3)] if r == 2 else None, src=2).tolist()
        out["reduce_scatter"] = pd.reduce_scatter(torch.arange(6.0) * (r + 1)).tolist()
        out["all_to_all"] = [x.tolist() for x in pd.all_to_all([torch.tensor([10 * r + i]) for i in range(3)])]
        out["barrier"] = pd.barrier()
        h = pd.all_reduce(torch.tensor([1.0]), async_op=True)
        out["async"] = h.wait().tolist()
        if r in (0, 2):
            out["subgroup"] = pd.all_reduce(torch.tensor([float(r)]), group=[0, 2]).tolist()
        if r == 0:
            pd.send(torch.ones(2), 1)
            pd.send("hello", 1)
            pd.isend(torch.arange(3), 1).wait()
        elif r == 1:
            out["recv"] = pd.recv(torch.zeros(2), 0).tolist()
            out["recv_value"] = pd.recv(None, 0)
            out["irecv"] = pd.irecv(torch.zeros(3, dtype=torch.int64), 0).wait().tolist()
        out["final"] = pd.all_gather(r)
        return out
    finally:
        pd.set_debug(False)
        debug.reset()


@pytest.mark.subgroups
def test_debug_mode_matching_calls_give_correct_results(world3):
    for r, out in enumerate(world3.run(_debug_matching_calls)):
        assert out["all_reduce"] == [6.0]
        assert out["all_reduce_list"] == [[3.0, 3.0], [3]]
        assert out["all_reduce_number"] == 3
        assert out["reduce"] == ([6.0] if r == 1 else [r + 1.0])
        assert out["reduce_number"] == (3 if r == 2 else r)
        assert out["broadcast"] == [2.0, 2.0]
        assert out["broadcast_safe"] == [0, 1, 2]
        assert out["broadcast_value"] is True
        assert out["all_gather"] == [0, 0, 1, 0, 1, 2]
        assert out["all_gather_value"] == [{"r": 0}, {"r": 1}, {"r": 2}]
        assert out["gather"] == ([0, 1, 2] if r == 0 else None)
        assert out["scatter"] == [1.0] * (r + 1)
        assert out["reduce_scatter"] == torch.tensor_split(torch.arange(6.0) * 6, 3)[r].tolist()
        assert out["all_to_all"] == [[10 * j + r] for j in range(3)]
        assert out["barrier"] is None and out["async"] == [3.0]
        if r in (0, 2):
            assert out["subgroup"] == [2.0]
        if r == 1:
            assert out["recv"] == [1.0, 1.0] and out["recv_value"] == "hello" and out["irecv"] == [0, 1, 2]
        assert out["final"] == [0, 1, 2]


def test_debug_mode_follows_environment_and_set_debug():
    # set_debug wins over POLYDIST_DEBUG; restored afterwards (this is the parent, serial process)
    before = pd.is_debug()
    try:
        pd.set_debug(True)
        assert pd.is_debug() is True
        pd.set_debug(False)
        assert pd.is_debug() is False
        assert pd.all_reduce(torch.ones(2)).tolist() == [1.0, 1.0]  # serial: the input
    finally:
        pd.set_debug(before)


# ------------------------------------------------------------ pickle opt-in


def _pickle_process_wide():
    r = pd.get_rank()
    before = codec.pickle_allowed()
    out = {}
    out["all_gather_refused"] = error_of(lambda: pd.all_gather(Point(r, 0)))
    out["broadcast_refused"] = error_of(lambda: pd.broadcast(Point(1, 2) if r == 0 else None, src=0))
    out["usable"] = pd.all_gather(r)
    pd.set_allow_pickle(True)
    try:
        out["all_gather"] = pd.all_gather(Point(r, 0))
        out["broadcast"] = pd.broadcast({"p": (Point(1, 2),)} if r == 0 else None, src=0)
        out["broadcast_big"] = pd.broadcast([Point(i, "x" * 10) for i in range(30)] if r == 1 else None, src=1)
        out["gather"] = pd.gather(Point(r, 3), dst=1)
        out["scatter"] = pd.scatter([Point(i, 4) for i in range(2)] if r == 0 else None, src=0)
        out["all_to_all"] = pd.all_to_all([Point(r, i) for i in range(2)])
        if r == 0:
            pd.send(Point(5, 6), 1)
        else:
            out["recv"] = pd.recv(None, 0)
    finally:
        pd.set_allow_pickle(before)
    out["refused_again"] = error_of(lambda: pd.all_gather(Point(r, 0)))
    return out


@pytest.mark.p2p
def test_pickle_process_wide_opt_in(world2):
    for r, out in enumerate(world2.run(_pickle_process_wide)):
        for name in ("all_gather_refused", "broadcast_refused", "refused_again"):
            assert out[name][0] is TypeError and "Point" in out[name][1], (name, out[name])
        assert out["usable"] == [0, 1]
        assert out["all_gather"] == [Point(0, 0), Point(1, 0)]
        assert out["broadcast"] == {"p": (Point(1, 2),)}
        assert out["broadcast_big"] == [Point(i, "x" * 10) for i in range(30)]
        assert out["gather"] == ([Point(0, 3), Point(1, 3)] if r == 1 else None)
        assert out["scatter"] == Point(r, 4)
        assert out["all_to_all"] == [Point(0, r), Point(1, r)]
        if r == 1:
            assert out["recv"] == Point(5, 6)


def _pickle_per_call():
    r = pd.get_rank()
    out = {}
    out["all_gather"] = pd.all_gather(Point(r, 1), allow_pickle=True)
    out["broadcast"] = pd.broadcast(Point(2, 3) if r == 1 else None, src=1, allow_pickle=True)
    out["gather"] = pd.gather([Point(r, 2)], dst=0, allow_pickle=True)
    out["scatter"] = pd.scatter([Point(i, 4) for i in range(2)] if r == 0 else None, src=0, allow_pickle=True)
    out["all_to_all"] = pd.all_to_all([Point(r, i) for i in range(2)], allow_pickle=True)
    out["still_refused"] = error_of(lambda: pd.all_gather(Point(r, 0)))  # the flag does not stick
    if r == 0:
        pd.send(Point(7, 8), 1, allow_pickle=True)
    else:
        out["recv"] = pd.recv(None, 0, allow_pickle=True)
    return out


@pytest.mark.p2p
def test_pickle_per_call_opt_in(world2):
    for r, out in enumerate(world2.run(_pickle_per_call)):
        assert out["all_gather"] == [Point(0, 1), Point(1, 1)]
        assert out["broadcast"] == Point(2, 3)
        assert out["gather"] == ([[Point(0, 2)], [Point(1, 2)]] if r == 0 else None)
        assert out["scatter"] == Point(r, 4)
        assert out["all_to_all"] == [Point(0, r), Point(1, r)]
        assert out["still_refused"][0] is TypeError and "Point" in out["still_refused"][1]
        if r == 1:
            assert out["recv"] == Point(7, 8)


# ------------------------------------------------------------ the codec's pickle opt-in, directly


def test_codec_refuses_unknown_types_without_opt_in():
    before = codec.pickle_allowed()
    try:
        pd.set_allow_pickle(False)
        for value in (Point(1, 2), {"a": [Point(1, 2)]}, (1, {Point(0, 0).__class__: 1})):
            with pytest.raises(TypeError, match="Point|type"):
                codec.encode(value)
        with pytest.raises(TypeError, match="Point"):
            codec.encode([1, Point(1, 2)], allow_pickle=False)
    finally:
        pd.set_allow_pickle(before)


def test_codec_per_call_allow_pickle_round_trip():
    value = {"p": Point(1, "ü"), "t": (Point(2, 3), torch.arange(3)), "plain": [1, 2.5]}
    data = codec.encode(value, allow_pickle=True)
    out = codec.decode(data, allow_pickle=True)
    assert out["p"] == Point(1, "ü") and out["t"][0] == Point(2, 3) and type(out["t"]) is tuple
    assert out["t"][1].tolist() == [0, 1, 2] and out["plain"] == [1, 2.5]
    # values the safe codec knows are not pickled even with the opt-in: decodable without it
    assert codec.decode(codec.encode([1, "a", (2,)], allow_pickle=True)) == [1, "a", (2,)]


def test_codec_decode_of_pickled_payload_needs_opt_in_and_runs_no_code(tmp_path):
    before = codec.pickle_allowed()
    marker = tmp_path / "ran"
    try:
        pd.set_allow_pickle(False)
        data = codec.encode({"x": Point(1, 2)}, allow_pickle=True)
        with pytest.raises(ValueError, match="allow_pickle"):
            codec.decode(data)
        exploit = codec.encode([_Exploit(str(marker))], allow_pickle=True)
        with pytest.raises(ValueError, match="pickle"):
            codec.decode(exploit)
        assert not marker.exists()  # no code ran
        # a hand-made pickle extension payload is refused the same way
        raw = msgpack.packb(msgpack.ExtType(10, pickle.dumps(_Exploit(str(marker)))))
        with pytest.raises(ValueError):
            codec.decode(raw)
        assert not marker.exists()
    finally:
        pd.set_allow_pickle(before)


def test_codec_process_wide_setting_and_per_call_override():
    before = codec.pickle_allowed()
    try:
        pd.set_allow_pickle(True)
        assert codec.pickle_allowed() is True
        data = codec.encode(Point(3, 4))  # follows the process-wide setting
        assert codec.decode(data) == Point(3, 4)
        with pytest.raises(TypeError, match="Point"):
            codec.encode(Point(3, 4), allow_pickle=False)  # the per-call flag wins
        with pytest.raises(ValueError, match="pickle"):
            codec.decode(data, allow_pickle=False)
        pd.set_allow_pickle(False)
        assert codec.pickle_allowed() is False and codec.pickle_allowed(True) is True
        assert codec.decode(data, allow_pickle=True) == Point(3, 4)
        with pytest.raises(ValueError, match="pickle"):
            codec.decode(data)
    finally:
        pd.set_allow_pickle(before)


def test_serial_value_collectives_apply_the_same_pickle_rule():
    # serial run (this parent process): the value still goes through the codec
    before = codec.pickle_allowed()
    try:
        pd.set_allow_pickle(False)
        with pytest.raises(TypeError, match="Point"):
            pd.all_gather(Point(1, 1))
        with pytest.raises(TypeError, match="Point"):
            pd.broadcast(Point(1, 1), src=0)
        pd.set_allow_pickle(True)
        assert pd.all_gather(Point(1, 1)) == [Point(1, 1)]
        assert pd.broadcast(Point(2, 2), src=0) == Point(2, 2)
    finally:
        pd.set_allow_pickle(before)


# ------------------------------------------------------------ a skipped call of a loop of equal calls (issue 29)

_SKIPPING_LOOP = '''
import sys, torch, polydist as pd

def loop(local_rank=None):
    r = pd.get_rank()
    try:
        for step in range(4):
            if r == 1 and step == 2:
                continue  # rank 1 skips one all_reduce; every call has the same shape
            pd.all_reduce(torch.full((2,), float(step)))
    except pd.CollectiveMismatchError as exc:
        print(f"rank {r} raised CollectiveMismatchError: {exc}", flush=True)

if __name__ == "__main__" and sys.argv[1] == "spawn":
    pd.spawn("gloo", loop, nproc_per_node=2)  # finalize() after loop: rank 1's error comes from there
elif __name__ == "__main__":
    pd.initialize("mpi")
    loop()
    try:
        pd.finalize()
    except pd.CollectiveMismatchError as exc:
        print(f"rank {pd.get_rank()} raised CollectiveMismatchError: {exc}", flush=True)
'''


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_debug_a_skipped_call_of_equal_calls_raises_on_every_rank(backend, cli_env, tmp_path):
    import subprocess
    import sys

    from _world import mpi_job_env, mpiexec
    from conftest import _mpi_missing

    script = tmp_path / "loop.py"
    script.write_text(_SKIPPING_LOOP)
    env = dict(cli_env, POLYDIST_DEBUG="1", PYTHONUNBUFFERED="1")
    if backend == "mpi":
        if _mpi_missing():
            pytest.skip(_mpi_missing())
        command = [mpiexec(), "-n", "2", sys.executable, str(script), "mpi"]
        env = mpi_job_env(env)
    else:
        command = [sys.executable, str(script), "spawn"]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=90)
    text = out.stdout + out.stderr
    mismatch = "rank 0: call #4: all_reduce(float32[2], op=SUM); rank 1: call #4: finalize()"
    assert f"rank 0 raised CollectiveMismatchError: ranks of group [0, 1] called different collectives: {mismatch}" in text
    if backend == "mpi":
        assert f"rank 1 raised CollectiveMismatchError: ranks of group [0, 1] called different collectives: {mismatch}" in text
    else:  # raised by spawn's finalize() after the function: the launcher's report names rank 1, either with
        # its own traceback, or with rank 0's error when rank 0 (waiting in finalize's exchange that rank 1, gone,
        # never joined) was ended first by the debug watcher (backends/leaving.py)
        assert out.returncode != 0
        if "--- traceback of rank 1 ---" in text:
            assert (f"CollectiveMismatchError: ranks of group [0, 1] called different collectives: {mismatch}"
                    in text.split("--- traceback of rank 1 ---")[1])  # fmt: skip
        else:
            report = text.split("--- traceback of rank 0 ---")[1]
            assert "CollectiveMismatchError: all_gather #" in report and "rank 1 never called it — it left" in report
