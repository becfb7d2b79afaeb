"""all_reduce, broadcast, all_gather and barrier on gloo with 2-4 ranks.

Each ``_xxx`` function runs on every rank of a shared world (see _world.py)
and returns what the test then checks in the parent.
"""

import pathlib
import warnings

import pytest

import torch
import torch.distributed as dist

import polydist as pd

pytestmark = pytest.mark.timeout(120)


# ------------------------------------------------------------ seed 000's printed outputs


def _seed000():
    rank = pd.get_rank()
    t = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank
    returned = pd.all_reduce(t, op="SUM")
    gathered = pd.all_gather(2.0 * rank)
    msg = pd.broadcast(f"hello from rank {rank}", src=0)
    return t.tolist(), returned is t, gathered, msg


def test_seed000_examples_3_ranks(world3):
    for t, same, gathered, msg in world3.run(_seed000):
        assert t == [9, 12] and same  # in place, and returned
        assert gathered == [0.0, 2.0, 4.0] and all(type(v) is float for v in gathered)
        assert msg == "hello from rank 0"


# ------------------------------------------------------------ all_reduce


def _all_reduce_ops():
    r = pd.get_rank()
    out = {}
    for op in ["sum", "PRODUCT", "Min", "max", "AVG"]:
        out[op] = pd.all_reduce(torch.tensor([r + 1.0, 2.0 * (r + 1)]), op=op).tolist()
    for op in ["and", "OR", "xor"]:
        out[op] = pd.all_reduce(torch.tensor([r + 1, 6]), op=op).tolist()
    out["bool_and"] = pd.all_reduce(torch.tensor([True, r == 0]), op="AND").tolist()
    out["reduceop"] = pd.all_reduce(torch.ones(1), op=dist.ReduceOp.MAX).tolist()
    return out


def test_all_reduce_ops_tensors(world4):
    for out in world4.run(_all_reduce_ops):
        assert out["sum"] == [10.0, 20.0]
        assert out["PRODUCT"] == [24.0, 384.0]
        assert out["Min"] == [1.0, 2.0] and out["max"] == [4.0, 8.0]
        assert out["AVG"] == [2.5, 5.0]
        assert out["and"] == [1 & 2 & 3 & 4, 6] and out["OR"] == [1 | 2 | 3 | 4, 6] and out["xor"] == [1 ^ 2 ^ 3 ^ 4, 0]
        assert out["bool_and"] == [True, False]
        assert out["reduceop"] == [1.0]


def _all_reduce_numbers():
    r = pd.get_rank()
    big = 2**53 + 1
    return {
        "int": pd.all_reduce(r + 1),
        "big": pd.all_reduce(big + r),
        "huge": pd.all_reduce(2**70 if r == 0 else 1),
        "float": pd.all_reduce(0.1 * (r + 1)),
        "avg_int": pd.all_reduce(r, op="avg"),
        "max": pd.all_reduce(float(r), op="MAX"),
        "bool_and": pd.all_reduce(r != 1, op="AND"),
        "bool_or": pd.all_reduce(r == 1, op="or"),
        "complex": pd.all_reduce(1j * r),
    }


def test_all_reduce_numbers_exact(world3):
    results = world3.run(_all_reduce_numbers)
    first = results[0]
    assert all(r == first for r in results)  # the same bits everywhere
    assert first["int"] == 6 and type(first["int"]) is int
    assert first["big"] == 3 * (2**53 + 1) + 3 and type(first["big"]) is int
    assert first["huge"] == 2**70 + 2
    assert first["float"] == pytest.approx(0.6) and type(first["float"]) is float
    assert first["avg_int"] == 1.0 and first["max"] == 2.0
    assert first["bool_and"] is False and first["bool_or"] is True
    assert first["complex"] == 3j


def _all_reduce_non_contiguous():
    r = pd.get_rank()
    base = torch.arange(6.0).reshape(2, 3) * (r + 1)
    view = base.t()  # non-contiguous view into base
    pd.all_reduce(view)
    return base.tolist()


def test_all_reduce_non_contiguous_written_back(world2):
    for base in world2.run(_all_reduce_non_contiguous):
        assert base == (torch.arange(6.0).reshape(2, 3) * 3).tolist()


def _bad_all_reduce_then_usable():
    errors = []
    for call in [
        lambda: pd.all_reduce(torch.ones(2), op="median"),
        lambda: pd.all_reduce(torch.ones(2), op="AND"),
        lambda: pd.all_reduce(torch.ones(2, dtype=torch.int64), op="AVG"),
        lambda: pd.all_reduce(1.5, op="xor"),
        lambda: pd.all_reduce("text"),
        lambda: pd.all_reduce(torch.ones(2), group=[0, 7]),
        lambda: pd.all_reduce(torch.ones(2), group="world"),
    ]:
        try:
            call()
        except (TypeError, ValueError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    # The group is still usable after the rejected calls.
    return errors, pd.all_reduce(torch.ones(1)).item()


def test_bad_arguments_raise_before_communication(world2):
    for errors, total in world2.run(_bad_all_reduce_then_usable):
        assert len(errors) == 7
        assert errors[0].startswith("ValueError") and "'median'" in errors[0]
        assert errors[1].startswith("TypeError") and "torch.float32" in errors[1]
        assert errors[2].startswith("TypeError") and "AVG" in errors[2]
        assert errors[3].startswith("TypeError") and "1.5" in errors[3]
        assert errors[4].startswith("TypeError") and "str" in errors[4]
        assert errors[5].startswith("ValueError") and "rank 7" in errors[5]
        assert errors[6].startswith("InvalidGroupError") and "str" in errors[6]  # a TypeError and a ValueError
        assert total == 2.0


# ------------------------------------------------------------ groups


def _groups():
    r = pd.get_rank()
    out = {}
    if r in (1, 3):
        t = torch.tensor([float(r)])
        out["list"] = pd.all_reduce(t, group=[3, 1]).item()
        out["again"] = pd.all_reduce(torch.tensor([1.0]), group=[1, 3]).item()
        out["same_group"] = pd.new_group([1, 3]) is pd.new_group([3, 1])
        out["bcast"] = pd.broadcast("from 3" if r == 3 else None, src=3, group=[1, 3])
        out["gather"] = pd.all_gather(r * 10, group=[1, 3])
        pd.barrier(group=[1, 3])
        try:
            pd.broadcast(torch.ones(1), src=0, group=[1, 3])
        except ValueError as exc:
            out["bad_src"] = str(exc)
    else:  # torch.distributed's rule: a non-member's call is a no-op that returns its input, warned once per group
        t = torch.ones(1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["not_member"] = (pd.all_reduce(t, group=[1, 3]) is t, t.item(), pd.all_reduce(5, group=[3, 1]))
        out["warned"] = [str(w.message) for w in caught]
    pg = dist.new_group([0, 1, 2, 3])
    out["pg"] = pd.all_reduce(r, group=pg)
    pd.barrier()
    return out


@pytest.mark.subgroups  # its members alone call new_group again, which Horovod's every-rank new_group forbids
def test_groups_as_rank_lists_and_process_groups(world4):
    results = world4.run(_groups)
    for r in (1, 3):
        out = results[r]
        assert out["list"] == 4.0 and out["again"] == 2.0 and out["same_group"]
        assert out["bcast"] == "from 3" and out["gather"] == [10, 30]
        assert "src=0 is not a rank of the group [1, 3]" in out["bad_src"]
    for r in (0, 2):
        assert results[r]["not_member"] == (True, 1.0, 5)
        assert len(results[r]["warned"]) == 1  # once per group, whatever order its ranks were listed in
        assert f"all_reduce on global rank {r}, which is not a member of group [1, 3]" in results[r]["warned"][0]
    assert all(out["pg"] == 6 for out in results)



def _counts_of_groups():
    """torch's count of groups on each rank after ranks 0 and 3 alone made the group of the rank list [0, 3]."""
    from torch.distributed import distributed_c10d as c10d

    if pd.get_rank() in (0, 3):
        pd.all_reduce(torch.ones(1), group=[0, 3])
    return pd.all_gather(c10d._world.group_count)


@pytest.mark.subgroups
def test_a_rank_list_group_leaves_torchs_count_of_groups_alike_on_every_rank(world4):
    """torch names a group every rank makes by its count of groups: were a members-only group counted on its members
    alone (torch 2.14 counts it), the next such group would get different names on the ranks, which then hang."""
    for counts in world4.run(_counts_of_groups):
        assert len(set(counts)) == 1, counts

# ------------------------------------------------------------ broadcast


def _broadcast_values():
    r = pd.get_rank()
    src_val = lambda v: v if r == 1 else None  # noqa: E731
    text = "naïve café — Ελληνικά — 漢字 — 🎉" * 20  # longer than one slot
    return {
        "int": pd.broadcast(src_val(2**53 + 1), src=1),
        "f32": pd.broadcast(src_val(16777217), src=1),
        "float": pd.broadcast(src_val(0.1), src=1),
        "text": pd.broadcast(src_val(text), src=1) == text,
        "bytes": pd.broadcast(src_val(b"\x00\x01"), src=1),
        "path": pd.broadcast(src_val(pathlib.Path("/data/x")), src=1),
        "obj": pd.broadcast(src_val({"a": (1, 2), "b": [None, True]}), src=1),
        "big": len(pd.broadcast(src_val("x" * 100_000), src=1)),
        "tensor_in_obj": pd.broadcast(src_val({"w": torch.arange(3)}), src=1)["w"].tolist(),
    }


def test_broadcast_values_exact(world3):
    for out in world3.run(_broadcast_values):
        assert out["int"] == 2**53 + 1 and type(out["int"]) is int
        assert out["f32"] == 16777217  # idist turns this into 16777216.0
        assert out["float"] == 0.1
        assert out["text"] is True
        assert out["bytes"] == b"\x00\x01"
        assert out["path"] == pathlib.Path("/data/x")
        assert out["obj"] == {"a": (1, 2), "b": [None, True]}
        assert out["big"] == 100_000
        assert out["tensor_in_obj"] == [0, 1, 2]


def _broadcast_tensors():
    r = pd.get_rank()
    t = torch.full((2, 3), float(r))
    same = pd.broadcast(t, src=2) is t
    safe_none = pd.broadcast(torch.arange(5) * 7 if r == 0 else None, src=0, safe_mode=True)
    other_shape = pd.broadcast(torch.ones(2, 2) if r == 0 else torch.zeros(7), src=0, safe_mode=True)
    keep = torch.zeros(3)
    in_place = pd.broadcast(torch.ones(3) if r == 0 else keep, src=0, safe_mode=True)
    nc = torch.zeros(3, 2).t()
    if r == 0:
        nc.copy_(torch.arange(6.0).reshape(2, 3))
    pd.broadcast(nc, src=0)
    return (t.tolist(), same, safe_none.tolist(), safe_none.dtype, other_shape.shape, in_place is keep or r == 0,
            keep.tolist() if r else None, nc.tolist())


def test_broadcast_tensors_and_safe_mode(world3):
    for r, out in enumerate(world3.run(_broadcast_tensors)):
        t, same, safe_none, dtype, other_shape, in_place, keep, nc = out
        assert t == [[2.0] * 3] * 2 and same
        assert safe_none == [0, 7, 14, 21, 28] and dtype == torch.int64
        assert other_shape == (2, 2)
        assert in_place and (r == 0 or keep == [1.0, 1.0, 1.0])
        assert nc == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def _broadcast_bad_src():
    msgs = []
    for src in (3, -1, "0"):
        try:
            pd.broadcast(torch.ones(1), src=src)
        except (ValueError, TypeError) as exc:
            msgs.append(str(exc))
    return msgs


def test_broadcast_bad_src(world2):
    for msgs in world2.run(_broadcast_bad_src):
        assert "src=3" in msgs[0] and "src=-1" in msgs[1] and "'0'" in msgs[2]


# ------------------------------------------------------------ all_gather


def _all_gather_tensors():
    r = pd.get_rank()
    even = pd.all_gather(torch.full((2, 2), r))
    scalar = pd.all_gather(torch.tensor(r * 1.5))
    uneven = pd.all_gather(torch.arange(r + 1))
    listed = pd.all_gather(torch.ones(r + 1, r + 2), concat=False)
    try:
        pd.all_gather(torch.ones(2, r + 1))
        trailing_error = None
    except ValueError as exc:
        trailing_error = str(exc)
    try:
        pd.all_gather(torch.ones(2, dtype=torch.float32 if r else torch.float64))
        dtype_error = None
    except ValueError as exc:
        dtype_error = str(exc)
    values = pd.all_gather({"rank": r, "name": f"ранг {r}"})
    return (even.tolist(), scalar.tolist(), uneven.tolist(), [tuple(t.shape) for t in listed], trailing_error,
            dtype_error, values)


def test_all_gather_shapes_and_values(world3):
    for out in world3.run(_all_gather_tensors):
        even, scalar, uneven, listed, trailing_error, dtype_error, values = out
        assert even == [[0, 0], [0, 0], [1, 1], [1, 1], [2, 2], [2, 2]]
        assert scalar == [0.0, 1.5, 3.0]
        assert uneven == [0, 0, 1, 0, 1, 2]
        assert listed == [(1, 2), (2, 3), (3, 4)]
        assert "rank 0: (2, 1), rank 1: (2, 2), rank 2: (2, 3)" in trailing_error
        assert "rank 0: float64, rank 1: float32, rank 2: float32" in dtype_error
        assert values == [{"rank": i, "name": f"ранг {i}"} for i in range(3)]


def _all_gather_seed_lists():
    return pd.all_gather(torch.tensor([pd.get_rank()])).tolist(), pd.all_gather([pd.get_rank()])


def test_all_gather_seed_lists_4_ranks(world4):
    for tensor, values in world4.run(_all_gather_seed_lists):
        assert tensor == [0, 1, 2, 3]
        assert values == [[0], [1], [2], [3]]


def _unsupported_value_raises():
    try:
        pd.all_gather(object())
    except TypeError as exc:
        return str(exc), pd.all_gather(1)


def test_unsupported_value_type_error_then_usable(world2):
    for msg, after in world2.run(_unsupported_value_raises):
        assert "builtins.object" in msg and after == [1, 1]


# ------------------------------------------------------------ barrier


def _barrier_orders_writes(path):
    r = pd.get_rank()
    if r == 0:
        pathlib.Path(path).write_text("written by rank 0")
    pd.barrier()
    return pathlib.Path(path).read_text()


def test_barrier(world3, tmp_path):
    assert world3.run(_barrier_orders_writes, str(tmp_path / "f")) == ["written by rank 0"] * 3
