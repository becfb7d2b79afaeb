"""reduce, reduce_scatter, coalesced all_reduce, async handles and subgroups (issue 3) on gloo.

Each ``_xxx`` function runs on every rank of a shared world (see _world.py)
and returns what the test then checks in the parent.
"""

import pytest
import torch
import torch.distributed as dist

import polydist as pd

pytestmark = pytest.mark.timeout(120)


# ------------------------------------------------------------ the seeds' printed outputs (4 ranks)


def _seed_outputs():
    r = pd.get_rank()
    ones = torch.ones(1)
    reduced = pd.reduce(ones, dst=0, op="SUM")
    t = torch.tensor([r + 1], dtype=torch.float32)
    all_reduced = pd.all_reduce(t)
    xs = [torch.tensor([float(i)]) for i in (1, 2, 3, 4)] if r == 0 else None
    scattered = pd.scatter(xs, src=0)
    scattered_values = pd.scatter([1, 2, 3, 4] if r == 0 else None, src=0)
    gathered = pd.gather(torch.tensor([r], dtype=torch.float32), dst=0)
    gathered_values = pd.gather([r], dst=0)
    all_gathered = pd.all_gather(torch.tensor([r], dtype=torch.float32))
    all_gathered_values = pd.all_gather([r])
    return {
        "reduce": (ones.tolist(), reduced is ones),
        "all_reduce": (t.tolist(), all_reduced is t),
        "scatter": scattered.tolist(),
        "scatter_values": scattered_values,
        "gather": None if gathered is None else gathered.tolist(),
        "gather_values": gathered_values,
        "all_gather": all_gathered.tolist(),
        "all_gather_values": all_gathered_values,
    }


def test_seed_outputs_4_ranks(world4):
    for r, out in enumerate(world4.run(_seed_outputs)):
        # seed 001: "only rank 0 will have four"; the others keep their ones (gloo would leave partial sums)
        assert out["reduce"] == ([4.0] if r == 0 else [1.0], True)
        assert out["all_reduce"] == ([10.0], True)
        assert out["scatter"] == [float(r + 1)]
        assert out["scatter_values"] == r + 1 and type(out["scatter_values"]) is int
        assert out["gather"] == ([0.0, 1.0, 2.0, 3.0] if r == 0 else None)
        assert out["gather_values"] == ([[0], [1], [2], [3]] if r == 0 else None)
        assert out["all_gather"] == [0.0, 1.0, 2.0, 3.0]
        assert out["all_gather_values"] == [[0], [1], [2], [3]]


# ------------------------------------------------------------ reduce


def _reduce_tensors():
    r = pd.get_rank()
    out = {}
    for dst in range(4):
        for op in ["sum", "PRODUCT", "Min", "MAX", "avg"]:
            x = torch.tensor([r + 1.0, -2.0 * (r + 1), 0.5 * r])
            before = x.clone()
            y = pd.reduce(x, dst=dst, op=op)
            out[(dst, op)] = (x.tolist(), y is x, torch.equal(x, before))
        for op in ["and", "OR", "Xor"]:
            x = torch.tensor([r + 1, 6, 2**40 + r], dtype=torch.int64)
            y = pd.reduce(x, dst=dst, op=op)
            out[(dst, op)] = (x.tolist(), y is x, x.dtype)
    b = torch.tensor([True, r == 0, r != 3])
    pd.reduce(b, dst=1, op="AND")
    out["bool_and"] = (b.tolist(), b.dtype)
    b = torch.tensor([False, r == 2])
    pd.reduce(b, dst=1, op="OR")
    out["bool_or"] = b.tolist()
    ro = torch.tensor([float(r)])
    pd.reduce(ro, dst=3, op=dist.ReduceOp.MAX)
    out["reduceop"] = ro.tolist()
    i8 = torch.tensor([r, -r], dtype=torch.int8)
    pd.reduce(i8, dst=2, op="SUM")
    out["int8"] = (i8.tolist(), i8.dtype)
    f64 = torch.tensor([0.1 * (r + 1)], dtype=torch.float64)
    pd.reduce(f64, dst=0, op="SUM")
    out["f64"] = f64.item()
    # a non-contiguous tensor on dst gets the result written back into its storage
    base = torch.arange(6.0).reshape(2, 3) * (r + 1)
    pd.reduce(base.t(), dst=2)
    out["non_contiguous"] = base.tolist()
    big = torch.full((1000, 100), float(r + 1))  # large enough that gloo splits the work
    pd.reduce(big, dst=1)
    out["big"] = (big.min().item(), big.max().item())
    return out


def test_reduce_tensors_every_op_every_dst(world4):
    ranks = range(4)
    inputs = [[r + 1.0, -2.0 * (r + 1), 0.5 * r] for r in ranks]
    expected = {
        "sum": [10.0, -20.0, 3.0],
        "PRODUCT": [24.0, 16.0 * 24.0, 0.0],
        "Min": [1.0, -8.0, 0.0],
        "MAX": [4.0, -2.0, 1.5],
        "avg": [2.5, -5.0, 0.75],
    }
    int_inputs = [[r + 1, 6, 2**40 + r] for r in ranks]
    int_expected = {
        "and": [1 & 2 & 3 & 4, 6, (2**40) & (2**40 + 1) & (2**40 + 2) & (2**40 + 3)],
        "OR": [1 | 2 | 3 | 4, 6, 2**40 + 3],
        "Xor": [1 ^ 2 ^ 3 ^ 4, 0, 0 ^ 1 ^ 2 ^ 3],
    }
    for r, out in enumerate(world4.run(_reduce_tensors)):
        for dst in range(4):
            for op, want in expected.items():
                value, same, untouched = out[(dst, op)]
                assert same, (dst, op)
                if r == dst:
                    assert value == pytest.approx(want), (r, dst, op)
                else:  # non-dst input UNTOUCHED, unlike gloo's native reduce
                    assert value == inputs[r] and untouched, (r, dst, op, value)
            for op, want in int_expected.items():
                value, same, dtype = out[(dst, op)]
                assert same and dtype == torch.int64
                assert value == (want if r == dst else int_inputs[r]), (r, dst, op)
        assert out["bool_and"] == ([True, False, False] if r == 1 else [True, r == 0, r != 3], torch.bool)
        assert out["bool_or"] == ([False, True] if r == 1 else [False, r == 2])
        assert out["reduceop"] == ([3.0] if r == 3 else [float(r)])
        assert out["int8"] == (([6, -6] if r == 2 else [r, -r]), torch.int8)
        if r == 0:
            assert out["f64"] == pytest.approx(1.0, abs=1e-14)  # float64 arithmetic, not float32
        else:
            assert out["f64"] == 0.1 * (r + 1)
        base = torch.arange(6.0).reshape(2, 3)
        assert out["non_contiguous"] == (base * 10 if r == 2 else base * (r + 1)).tolist()
        assert out["big"] == ((10.0, 10.0) if r == 1 else (float(r + 1), float(r + 1)))


def _reduce_numbers():
    r = pd.get_rank()
    return {
        "int": pd.reduce(r + 1, dst=1),
        "big": pd.reduce(2**100 + r, dst=2),
        "float": pd.reduce(0.5 * r, dst=0, op="MAX"),
        "avg": pd.reduce(r + 1, dst=3, op="AVG"),
        "bool": pd.reduce(r != 2, dst=0, op="AND"),
        "product": pd.reduce(r + 1, dst=0, op="product"),
        "min": pd.reduce(-r, dst=3, op="min"),
        "xor": pd.reduce(r + 1, dst=1, op="xor"),
        "complex": pd.reduce(1j * r, dst=2),
    }


def test_reduce_numbers_result_on_dst_input_elsewhere(world4):
    for r, out in enumerate(world4.run(_reduce_numbers)):
        assert out["int"] == (10 if r == 1 else r + 1) and type(out["int"]) is int
        assert out["big"] == (4 * 2**100 + 6 if r == 2 else 2**100 + r)
        assert out["float"] == (1.5 if r == 0 else 0.5 * r) and type(out["float"]) is float
        assert out["avg"] == (2.5 if r == 3 else r + 1)
        assert out["bool"] is (False if r == 0 else r != 2)
        assert out["product"] == (24 if r == 0 else r + 1)
        assert out["min"] == (-3 if r == 3 else -r)
        assert out["xor"] == (1 ^ 2 ^ 3 ^ 4 if r == 1 else r + 1)
        assert out["complex"] == (6j if r == 2 else 1j * r)


# ------------------------------------------------------------ reduce_scatter


def _reduce_scatter(rows, op, dtype_name):
    r = pd.get_rank()
    dtype = getattr(torch, dtype_name)
    x = (torch.arange(rows * 3).reshape(rows, 3) * (r + 1)).to(dtype)
    before = x.clone()
    y = pd.reduce_scatter(x, op=op)
    return y.tolist(), tuple(y.shape), y.dtype, torch.equal(x, before), y.data_ptr() != x.data_ptr() or rows == 0


@pytest.mark.parametrize(
    "rows, op, dtype_name",
    [(8, "SUM", "float32"), (10, "sum", "float32"), (2, "SUM", "int64"), (9, "AVG", "float64"),
     (7, "max", "int32"), (5, "min", "float32"), (6, "PRODUCT", "int64")],
)
def test_reduce_scatter_chunks_like_tensor_split(world4, rows, op, dtype_name):
    dtype = getattr(torch, dtype_name)
    inputs = [(torch.arange(rows * 3).reshape(rows, 3) * (r + 1)).to(dtype) for r in range(4)]
    stacked = torch.stack(inputs).to(torch.float64)
    total = {
        "SUM": stacked.sum(0), "AVG": stacked.mean(0), "MAX": stacked.max(0).values,
        "MIN": stacked.min(0).values, "PRODUCT": stacked.prod(0),
    }[op.upper()].to(dtype)
    chunks = torch.tensor_split(total, 4)
    for r, (value, shape, out_dtype, untouched, new) in enumerate(world4.run(_reduce_scatter, rows, op, dtype_name)):
        assert shape == tuple(chunks[r].shape), (r, shape)
        assert value == chunks[r].tolist(), (r, value)  # exact: every value here is representable
        assert out_dtype == dtype
        assert untouched and new  # input unmodified, result is a new tensor


def _reduce_scatter_more():
    r = pd.get_rank()
    nc = (torch.arange(12.0).reshape(3, 4) * (r + 1)).t()  # non-contiguous, rows = 4
    a = pd.reduce_scatter(nc).tolist()
    bools = pd.reduce_scatter(torch.tensor([True, r == 0, r != 1, True, False]), op="OR").tolist()
    three_d = pd.reduce_scatter(torch.ones(5, 2, 2) * r, op="sum")
    return a, bools, tuple(three_d.shape), three_d.sum().item()


def test_reduce_scatter_non_contiguous_bool_and_3d(world4):
    base = (torch.arange(12.0).reshape(3, 4) * 10).t()
    shapes = [(2, 2, 2), (1, 2, 2), (1, 2, 2), (1, 2, 2)]
    for r, (a, bools, shape, total) in enumerate(world4.run(_reduce_scatter_more)):
        assert a == torch.tensor_split(base, 4)[r].tolist()
        assert bools == torch.tensor_split(torch.tensor([True, True, True, True, False]), 4)[r].tolist()
        assert shape == shapes[r] and total == 6.0 * shape[0] * 4


# ------------------------------------------------------------ coalesced all_reduce of a list


def _all_reduce_list():
    r = pd.get_rank()
    base = torch.arange(6.0).reshape(2, 3) * (r + 1)
    members = [
        torch.full((2, 3), float(r + 1)),
        torch.tensor([r, 10 * r], dtype=torch.int64),
        base.t(),  # non-contiguous view: must be written back into base
        torch.tensor(0.5 * r, dtype=torch.float64),  # 0-dim
        torch.tensor([r + 1], dtype=torch.int8),
        torch.full((3,), float(r)),
    ]
    returned = pd.all_reduce(members)
    sums = [m.tolist() for m in members]
    dtypes = [m.dtype for m in members]
    grads = [torch.full((4,), float(r + 1)), torch.full((2, 2), 2.0 * (r + 1)), torch.arange(3.0).t()]
    avg_tuple = tuple(grads)
    pd.all_reduce(avg_tuple, op="AVG")
    maxed = [torch.tensor([r, -r]), torch.tensor([float(r)])]
    pd.all_reduce(maxed, op="max")
    return returned is members, sums, dtypes, base.tolist(), [g.tolist() for g in grads], [m.tolist() for m in maxed]


def test_all_reduce_list_coalesced_mixed_dtypes(world4):
    for same, sums, dtypes, base, grads, maxed in world4.run(_all_reduce_list):
        assert same
        assert sums[0] == [[10.0] * 3] * 2
        assert sums[1] == [6, 60]
        assert sums[2] == (torch.arange(6.0).reshape(2, 3) * 10).t().tolist()
        assert sums[3] == 3.0
        assert sums[4] == [10]
        assert sums[5] == [6.0] * 3
        assert dtypes == [torch.float32, torch.int64, torch.float32, torch.float64, torch.int8, torch.float32]
        assert base == (torch.arange(6.0).reshape(2, 3) * 10).tolist()
        assert grads == [[2.5] * 4, [[5.0, 5.0]] * 2, [0.0, 1.0, 2.0]]
        assert maxed == [[3, 0], [3.0]]


def _all_reduce_one_tensor_list():
    t = torch.full((3,), float(pd.get_rank() + 1))
    as_list, as_tuple = [t], (t.clone(),)
    out_list, out_tuple = pd.all_reduce(as_list), pd.all_reduce(as_tuple)
    return out_list is as_list, out_tuple is as_tuple, t.tolist(), as_tuple[0].tolist()


def test_all_reduce_returns_the_one_tensor_list_it_was_given(world3):
    """A list or tuple of one tensor comes back as itself, reduced in place (MPI's direct path returned the
    tensor: found by benchmarks/soak.py)."""
    for is_list, is_tuple, reduced, reduced_in_tuple in world3.run(_all_reduce_one_tensor_list):
        assert is_list and is_tuple and reduced == reduced_in_tuple == [6.0] * 3


# ------------------------------------------------------------ async_op=True


def _async_matches_sync():
    r = pd.get_rank()
    out = {}

    def check(name, start, sync):
        handle = start()
        assert isinstance(handle, pd.Work), (name, type(handle))
        got = handle.wait()
        out[name] = (_plain(got), _plain(sync()), handle.is_completed(), handle.wait() is got)

    check("all_reduce", lambda: pd.all_reduce(torch.tensor([r + 1.0]), async_op=True),
          lambda: pd.all_reduce(torch.tensor([r + 1.0])))
    check("all_reduce_avg", lambda: pd.all_reduce(torch.tensor([r + 1.0]), op="AVG", async_op=True),
          lambda: pd.all_reduce(torch.tensor([r + 1.0]), op="AVG"))
    check("all_reduce_list", lambda: pd.all_reduce([torch.ones(2) * r, torch.tensor([r])], async_op=True),
          lambda: pd.all_reduce([torch.ones(2) * r, torch.tensor([r])]))
    check("all_reduce_number", lambda: pd.all_reduce(r + 1, async_op=True), lambda: pd.all_reduce(r + 1))
    check("reduce", lambda: pd.reduce(torch.tensor([r + 1.0, 2.0]), dst=2, async_op=True),
          lambda: pd.reduce(torch.tensor([r + 1.0, 2.0]), dst=2))
    check("reduce_avg", lambda: pd.reduce(torch.tensor([r + 1.0]), dst=1, op="avg", async_op=True),
          lambda: pd.reduce(torch.tensor([r + 1.0]), dst=1, op="avg"))
    check("broadcast", lambda: pd.broadcast(torch.full((3,), float(r)), src=3, async_op=True),
          lambda: pd.broadcast(torch.full((3,), float(r)), src=3))
    check("broadcast_safe", lambda: pd.broadcast(torch.arange(r + 2), src=1, safe_mode=True, async_op=True),
          lambda: pd.broadcast(torch.arange(r + 2), src=1, safe_mode=True))
    check("broadcast_value", lambda: pd.broadcast({"r": r}, src=2, async_op=True),
          lambda: pd.broadcast({"r": r}, src=2))
    check("all_gather", lambda: pd.all_gather(torch.arange(r + 1), async_op=True),
          lambda: pd.all_gather(torch.arange(r + 1)))
    check("all_gather_list", lambda: pd.all_gather(torch.ones(r + 1, 2), concat=False, async_op=True),
          lambda: pd.all_gather(torch.ones(r + 1, 2), concat=False))
    check("all_gather_value", lambda: pd.all_gather(f"r{r}", async_op=True), lambda: pd.all_gather(f"r{r}"))
    check("gather", lambda: pd.gather(torch.arange(r + 1) * 2, dst=1, async_op=True),
          lambda: pd.gather(torch.arange(r + 1) * 2, dst=1))
    check("gather_value", lambda: pd.gather((r, "x"), dst=3, async_op=True), lambda: pd.gather((r, "x"), dst=3))
    xs = [torch.arange(i + 1, dtype=torch.float64) for i in range(4)] if r == 0 else None
    check("scatter", lambda: pd.scatter(xs, src=0, async_op=True), lambda: pd.scatter(xs, src=0))
    vs = [{"to": i} for i in range(4)] if r == 2 else None
    check("scatter_value", lambda: pd.scatter(vs, src=2, async_op=True), lambda: pd.scatter(vs, src=2))
    check("reduce_scatter", lambda: pd.reduce_scatter(torch.arange(10.0) * (r + 1), async_op=True),
          lambda: pd.reduce_scatter(torch.arange(10.0) * (r + 1)))
    ys = [torch.full((i + 1,), 10 * r + i) for i in range(4)]
    check("all_to_all", lambda: pd.all_to_all(ys, async_op=True), lambda: pd.all_to_all(ys))
    zs = [f"{r}->{i}" for i in range(4)]
    check("all_to_all_value", lambda: pd.all_to_all(zs, async_op=True), lambda: pd.all_to_all(zs))
    check("barrier", lambda: pd.barrier(async_op=True), lambda: pd.barrier())
    # several handles in flight at once, waited in reverse order
    a, b = torch.tensor([float(r)]), torch.tensor([r], dtype=torch.int64)
    h1 = pd.all_reduce(a, async_op=True)
    h2 = pd.all_reduce(b, op="max", async_op=True)
    out["in_flight"] = (h2.wait().tolist(), h1.wait().tolist(), h1.wait() is a)
    return out


def _plain(x):
    """Something the parent can compare with ==: tensors become (dtype, shape, values)."""
    if isinstance(x, torch.Tensor):
        return ("tensor", str(x.dtype), tuple(x.shape), x.tolist())
    if isinstance(x, list):
        return [_plain(i) for i in x]
    return x


def test_async_op_wait_returns_the_sync_result(world4):
    names = ["all_reduce", "all_reduce_avg", "all_reduce_list", "all_reduce_number", "reduce", "reduce_avg",
             "broadcast", "broadcast_safe", "broadcast_value", "all_gather", "all_gather_list", "all_gather_value",
             "gather", "gather_value", "scatter", "scatter_value", "reduce_scatter", "all_to_all",
             "all_to_all_value", "barrier"]
    for r, out in enumerate(world4.run(_async_matches_sync)):
        for name in names:
            got, sync, completed, stable = out[name]
            assert got == sync, (r, name, got, sync)
            assert completed and stable, (r, name)
        assert out["all_reduce"][0] == ("tensor", "torch.float32", (1,), [10.0])
        assert out["all_reduce_avg"][0][3] == [2.5]
        assert out["all_reduce_number"][0] == 10
        assert out["reduce"][0][3] == ([10.0, 8.0] if r == 2 else [r + 1.0, 2.0])
        assert out["broadcast"][0][3] == [3.0] * 3
        assert out["broadcast_safe"][0][3] == [0, 1, 2]
        assert out["broadcast_value"][0] == {"r": 2}
        assert out["all_gather"][0][3] == [0, 0, 1, 0, 1, 2, 0, 1, 2, 3]
        assert [t[2] for t in out["all_gather_list"][0]] == [(1, 2), (2, 2), (3, 2), (4, 2)]
        assert out["all_gather_value"][0] == ["r0", "r1", "r2", "r3"]
        assert out["gather"][0] == (("tensor", "torch.int64", (10,), [0, 0, 2, 0, 2, 4, 0, 2, 4, 6]) if r == 1 else None)
        assert out["gather_value"][0] == ([(i, "x") for i in range(4)] if r == 3 else None)
        assert out["scatter"][0] == ("tensor", "torch.float64", (r + 1,), [float(i) for i in range(r + 1)])
        assert out["scatter_value"][0] == {"to": r}
        assert out["reduce_scatter"][0][3] == torch.tensor_split(torch.arange(10.0) * 10, 4)[r].tolist()
        assert out["all_to_all"][0] == [("tensor", "torch.int64", (r + 1,), [10 * j + r] * (r + 1)) for j in range(4)]
        assert out["all_to_all_value"][0] == [f"{j}->{r}" for j in range(4)]
        assert out["barrier"][0] is None
        assert out["in_flight"] == ([3], [6.0], True)


def _async_is_completed_eventually():
    r = pd.get_rank()
    import time

    t = torch.full((256, 1024), float(r))
    h = pd.all_reduce(t, async_op=True)
    deadline = time.monotonic() + 30
    while not h.is_completed() and time.monotonic() < deadline:
        time.sleep(0.01)
    polled = h.is_completed()
    result = h.wait(timeout=30)
    return polled, result is t, t[0, :3].tolist(), repr(h)


def test_async_is_completed_polls_without_wait(world3):
    for polled, same, head, text in world3.run(_async_is_completed_eventually):
        assert polled and same and head == [3.0, 3.0, 3.0]
        assert "completed" in text


# ------------------------------------------------------------ subgroups: rank lists and new_group


def _subgroups(kind):
    r = pd.get_rank()
    mine = [1, 3] if r in (1, 3) else [0, 2]
    low, high = mine
    group = mine if kind == "list" else pd.new_group(list(reversed(mine)))
    me = mine.index(r)  # rank inside the group
    out = {}
    t = torch.tensor([float(r + 1)])
    pd.all_reduce(t, group=group)
    out["all_reduce"] = t.tolist()
    out["all_reduce_number"] = pd.all_reduce(r, group=group, op="max")
    t = torch.tensor([float(r + 1), 1.0])
    pd.reduce(t, dst=high, group=group)  # dst is a GLOBAL rank
    out["reduce"] = t.tolist()
    out["broadcast"] = pd.broadcast(torch.tensor([float(r)]), src=high, group=group).tolist()
    out["broadcast_value"] = pd.broadcast(f"from {r}", src=low, group=group)
    out["all_gather"] = pd.all_gather(torch.arange(r + 1), group=group).tolist()
    out["all_gather_value"] = pd.all_gather({"r": r}, group=group)
    g = pd.gather(torch.tensor([r, r]), dst=low, group=group)
    out["gather"] = None if g is None else g.tolist()
    xs = [torch.full((i + 1,), 100 * r + i) for i in range(2)] if r == high else None
    out["scatter"] = pd.scatter(xs, src=high, group=group).tolist()
    out["scatter_value"] = pd.scatter([f"{r}:{i}" for i in range(2)] if r == low else None, src=low, group=group)
    out["reduce_scatter"] = pd.reduce_scatter(torch.arange(3.0) * (r + 1), group=group).tolist()
    out["all_to_all"] = [y.tolist() for y in pd.all_to_all([torch.tensor([10 * r + i]) for i in range(2)], group=group)]
    out["all_to_all_value"] = pd.all_to_all([(r, i) for i in range(2)], group=group)
    pd.barrier(group=group)
    out["me"] = me
    out["world_after"] = pd.all_reduce(torch.tensor([1.0])).item()  # the world is still in step
    return out


@pytest.mark.parametrize("kind", ["list", "new_group"])
@pytest.mark.subgroups(groups=[[0, 2], [1, 3]])
def test_every_collective_on_subgroups_with_global_roots(world4, kind):
    for r, out in enumerate(world4.run(_subgroups, kind)):
        low, high = (1, 3) if r in (1, 3) else (0, 2)
        me = out["me"]
        assert out["all_reduce"] == [float(low + high + 2)]
        assert out["all_reduce_number"] == high
        assert out["reduce"] == ([low + high + 2.0, 2.0] if r == high else [r + 1.0, 1.0])
        assert out["broadcast"] == [float(high)]
        assert out["broadcast_value"] == f"from {low}"
        assert out["all_gather"] == list(range(low + 1)) + list(range(high + 1))
        assert out["all_gather_value"] == [{"r": low}, {"r": high}]
        assert out["gather"] == ([low, low, high, high] if r == low else None)
        assert out["scatter"] == [100 * high + me] * (me + 1)
        assert out["scatter_value"] == f"{low}:{me}"
        total = torch.arange(3.0) * (low + high + 2)
        assert out["reduce_scatter"] == torch.tensor_split(total, 2)[me].tolist()
        assert out["all_to_all"] == [[10 * low + me], [10 * high + me]]
        assert out["all_to_all_value"] == [(low, me), (high, me)]
        assert out["world_after"] == 4.0


def _overlapping_groups():
    r = pd.get_rank()
    out = {}
    if r in (0, 2):
        out["02"] = pd.all_reduce(torch.tensor([r + 1.0]), group=[0, 2]).item()
    if r in (0, 1):
        out["01"] = pd.all_reduce(torch.tensor([r + 1.0]), group=[1, 0]).item()
    if r in (1, 2):
        out["12"] = pd.all_reduce(torch.tensor([r + 1.0]), group=[1, 2]).item()
    # the whole world as a rank list in any order: group rank order is the sorted global ranks
    t = torch.tensor([float(r)])
    pd.reduce(t, dst=2, group=[2, 0, 1])
    out["reduce"] = t.tolist()
    out["reduce_scatter"] = pd.reduce_scatter(torch.arange(7) * (r + 1), group=[1, 2, 0]).tolist()
    out["all_to_all"] = pd.all_to_all([f"{r}->{i}" for i in range(3)], group=[2, 1, 0])
    out["cached"] = pd.new_group([0, 1, 2]) is pd.new_group([2, 0, 1])
    return out


@pytest.mark.subgroups(groups=[[0, 2], [0, 1], [1, 2]])
def test_overlapping_rank_list_groups_used_by_different_ranks(world3):
    # Each pair uses its own rank list; members create a list's group on first use, non-members never do.
    results = world3.run(_overlapping_groups, timeout=25)
    assert [results[r].get("02") for r in range(3)] == [4.0, None, 4.0]
    assert [results[r].get("01") for r in range(3)] == [3.0, 3.0, None]
    assert [results[r].get("12") for r in range(3)] == [None, 5.0, 5.0]
    total = torch.arange(7) * 6
    for r, out in enumerate(results):
        assert out["reduce"] == ([3.0] if r == 2 else [float(r)])
        assert out["reduce_scatter"] == torch.tensor_split(total, 3)[r].tolist()
        assert out["all_to_all"] == [f"{src}->{r}" for src in range(3)]
        assert out["cached"]  # one cached group per rank set, not a communicator per call


# ------------------------------------------------------------ dtypes the backend cannot reduce (issue 29)


_REFUSALS = {  # (call, dtypes of the tensors passed, op); a list of two: a coalesced all_reduce
    "gloo": [("all_reduce", [torch.uint16], "SUM"), ("reduce", [torch.uint16], "SUM"),
             ("reduce_scatter", [torch.uint16], "SUM"), ("all_reduce", [torch.int16], "MAX"),
             ("all_reduce", [torch.uint32], "MIN"), ("all_reduce", [torch.uint64], "PRODUCT"),
             ("reduce", [torch.int16], "XOR"), ("all_reduce", [torch.int32, torch.uint16], "SUM")],
    "mpi4py": [("all_reduce", [torch.float8_e4m3fn], "SUM"), ("reduce", [torch.float8_e5m2], "MAX"),
               ("reduce_scatter", [torch.float8_e4m3fn], "SUM")],
    "horovod": [("all_reduce", [torch.uint16], "MAX"), ("reduce", [torch.uint32], "MIN"),
                ("all_reduce", [torch.float8_e4m3fn], "SUM")],
}


def _backend_refusals():
    """Rank 0 alone makes each refused call; had it sent anything, the good all_reduce after it would break."""
    backend = str(dist.get_backend())  # gloo, mpi4py or horovod: the name the tables are declared under
    errors = []
    if pd.get_rank() == 0:
        for fn, dtypes, op in _REFUSALS[backend]:
            tensors = [torch.zeros(4, dtype=d) for d in dtypes]
            try:
                getattr(pd, fn)(tensors if len(tensors) > 1 else tensors[0], op=op)
                errors.append(None)
            except TypeError as exc:
                errors.append(str(exc))
    return backend, errors, pd.all_reduce(torch.tensor([pd.get_rank() + 1.0])).tolist()


def test_a_dtype_the_backend_cannot_reduce_is_a_type_error_before_communicating(world2):
    (backend, errors, after), (_, none, after1) = world2.run(_backend_refusals)
    assert none == [] and after == after1 == [3.0]
    calls = _REFUSALS[backend]
    assert len(errors) == len(calls)
    for (fn, dtypes, op), message in zip(calls, errors):
        assert message is not None, (fn, dtypes, op)
        assert str(dtypes[-1]) in message and op in message and f"the {backend} backend" in message
