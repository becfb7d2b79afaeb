"""gather, scatter, all_to_all, all_gather and broadcast(safe_mode): any shapes, any dtypes, any values.

Each ``_xxx`` function runs on every rank of a shared world (see _world.py)
and returns what the test then checks in the parent.
"""

import math
import pathlib

import numpy as np
import pytest
import torch

import polydist as pd

pytestmark = pytest.mark.timeout(120)


def same(a, b):
    """Deep equality that also requires the same types (tuple stays tuple), dtypes and shapes."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def values_of(rank):
    """Python values of every supported kind; some depend on ``rank``, some exceed a 2 KiB slot encoded."""
    return [
        None,
        True,
        f"rank {rank}: naïve café — Ελληνικά — 漢字 — 🎉",
        "",
        b"\x00\xff\x10 bytes" + bytes([rank]),
        pathlib.Path(f"/data/rank{rank}/file.txt"),
        2**100 + rank,
        -(2**100) - rank,
        2**63 - 1,
        0.1 + 0.2 * rank,
        1e-300,
        float("inf"),
        16777217.0,
        3 + 4j * rank,
        (1, ("nested", (rank,)), [2.5]),
        {"a": [1, {"b": (2, 3)}], 7: "seven", (1, 2): {"set": {rank, 10}}},
        {1, 2, rank + 3},
        frozenset({"x", "y"}),
        {"t": torch.arange(6, dtype=torch.int16).reshape(2, 3) + rank, "a": np.arange(4, dtype=np.float32) * rank},
        [torch.tensor(1.5 * rank, dtype=torch.float64), np.int64(rank), np.float32(0.25)],
        "ü" * (150 + rank),  # 300+ UTF-8 bytes: still one round
        "ü" * (1500 + rank),  # 3000+ UTF-8 bytes: a second round
        {"big": list(range(1000 + rank)), "blob": bytes(range(256)) * 12},
        [torch.full((300,), rank, dtype=torch.bfloat16)],
    ]


# ------------------------------------------------------------ all_gather of tensors of different shapes


def _all_gather_shapes():
    r = pd.get_rank()
    out = {}
    out["rows"] = pd.all_gather(torch.arange((r + 1) * 3).reshape(r + 1, 3))
    out["empty_rows"] = pd.all_gather(torch.ones(0 if r == 1 else 2, 2) * r)
    out["scalars"] = pd.all_gather(torch.tensor(float(r)))
    out["list_any_shapes"] = pd.all_gather(torch.arange(r + 1).reshape([1] * r + [r + 1]), concat=False)
    out["list_even"] = pd.all_gather(torch.full((2, 2), r), concat=False)
    out["nc"] = pd.all_gather((torch.arange(6.0).reshape(2, 3) + r).t())
    return out


def test_all_gather_different_shapes_concat_and_list(world3):
    for out in world3.run(_all_gather_shapes):
        assert same(out["rows"], torch.cat([torch.arange((r + 1) * 3).reshape(r + 1, 3) for r in range(3)]))
        assert same(out["empty_rows"], torch.tensor([[0.0, 0.0], [0.0, 0.0], [2.0, 2.0], [2.0, 2.0]]))
        assert same(out["scalars"], torch.tensor([0.0, 1.0, 2.0]))
        assert [tuple(t.shape) for t in out["list_any_shapes"]] == [(1,), (1, 2), (1, 1, 3)]
        assert [t.reshape(-1).tolist() for t in out["list_any_shapes"]] == [[0], [0, 1], [0, 1, 2]]
        assert same(out["list_even"], [torch.full((2, 2), r) for r in range(3)])
        assert same(out["nc"], torch.cat([(torch.arange(6.0).reshape(2, 3) + r).t() for r in range(3)]))


# ------------------------------------------------------------ gather


def _gather_shapes():
    r = pd.get_rank()
    out = {}
    out["rows"] = pd.gather(torch.full((r + 1, 2), r, dtype=torch.int32), dst=1)
    out["list"] = pd.gather(torch.ones(r + 2, r + 1), dst=2, concat=False)
    out["even_list"] = pd.gather(torch.tensor([r, -r]), dst=0, concat=False)
    out["scalar"] = pd.gather(torch.tensor(r), dst=0)
    return out


def test_gather_different_shapes(world3):
    for r, out in enumerate(world3.run(_gather_shapes)):
        if r == 1:
            want = torch.cat([torch.full((i + 1, 2), i, dtype=torch.int32) for i in range(3)])
            assert same(out["rows"], want)
        else:
            assert out["rows"] is None
        if r == 2:
            assert same(out["list"], [torch.ones(i + 2, i + 1) for i in range(3)])
        else:
            assert out["list"] is None
        if r == 0:
            assert same(out["even_list"], [torch.tensor([i, -i]) for i in range(3)])
            assert same(out["scalar"], torch.tensor([0, 1, 2]))
        else:
            assert out["even_list"] is None and out["scalar"] is None


def _incompatible(name):
    r = pd.get_rank()
    calls = {
        "all_gather_trailing": lambda: pd.all_gather(torch.ones(2, r + 1)),
        "all_gather_ndim": lambda: pd.all_gather(torch.ones([2] * (r + 1))),
        "all_gather_dtype": lambda: pd.all_gather(torch.ones(2, dtype=torch.float64 if r == 1 else torch.float32)),
        "all_gather_dtype_list": lambda: pd.all_gather(torch.ones(2, dtype=torch.int8 if r == 2 else torch.int16),
                                                       concat=False),
        "gather_trailing": lambda: pd.gather(torch.ones(3, 2 + r), dst=2),
        "gather_dtype": lambda: pd.gather(torch.ones(1, dtype=torch.bool if r == 0 else torch.uint8), dst=0),
    }
    try:
        calls[name]()
        error = None
    except Exception as exc:  # noqa: BLE001 - the test checks the type
        error = (type(exc), str(exc))
    return error, pd.all_gather(r)  # the group still works


@pytest.mark.parametrize(
    "name, fragments",
    [
        ("all_gather_trailing", ["rank 0: (2, 1), rank 1: (2, 2), rank 2: (2, 3)", "concat=False"]),
        ("all_gather_ndim", ["rank 0: (2,), rank 1: (2, 2), rank 2: (2, 2, 2)"]),
        ("all_gather_dtype", ["rank 0: float32, rank 1: float64, rank 2: float32"]),
        ("all_gather_dtype_list", ["rank 0: int16, rank 1: int16, rank 2: int8"]),
        ("gather_trailing", ["rank 0: (3, 2), rank 1: (3, 3), rank 2: (3, 4)"]),
        ("gather_dtype", ["rank 0: bool, rank 1: uint8, rank 2: uint8"]),
    ],
)
def test_incompatible_shapes_or_dtypes_value_error_on_every_rank(world3, name, fragments):
    """all_gather raises on every rank; gather on dst, the only rank that learns the others' pieces (the senders
    return None as usual, and the group stays usable)."""
    dst = {"gather_trailing": 2, "gather_dtype": 0}.get(name)
    for r, (error, after) in enumerate(world3.run(_incompatible, name)):
        if dst is not None and r != dst:
            assert error is None and after == [0, 1, 2], error
            continue
        assert error is not None and error[0] is ValueError, error
        for fragment in fragments:
            assert fragment in error[1], (fragment, error[1])
        assert after == [0, 1, 2]


# ------------------------------------------------------------ scatter


def _scatter_shapes():
    r = pd.get_rank()
    out = {}
    xs = [torch.arange(i * 2, dtype=torch.float64).reshape(i, 2) for i in range(3)] if r == 2 else None
    out["rows"] = pd.scatter(xs, src=2)
    ys = (torch.ones(2, 3), torch.zeros(4), torch.full((1, 1, 1), 7.0)) if r == 0 else None  # a tuple works too
    out["shapes"] = pd.scatter(ys, src=0)
    zs = [torch.tensor(float(i)) for i in range(3)] if r == 1 else None
    out["scalars"] = pd.scatter(zs, src=1)
    own = [torch.ones(1), torch.ones(2), torch.ones(3)]
    got = pd.scatter(own if r == 0 else None, src=0)
    out["src_gets_its_item"] = (got.tolist(), got.shape)
    nc = [(torch.arange(6.0).reshape(2, 3) * i).t() for i in range(3)] if r == 1 else None
    out["nc"] = pd.scatter(nc, src=1)
    return out


def test_scatter_different_shapes(world3):
    for r, out in enumerate(world3.run(_scatter_shapes)):
        assert same(out["rows"], torch.arange(r * 2, dtype=torch.float64).reshape(r, 2))
        assert same(out["shapes"], [torch.ones(2, 3), torch.zeros(4), torch.full((1, 1, 1), 7.0)][r])
        assert same(out["scalars"], torch.tensor(float(r)))
        assert out["src_gets_its_item"] == ([1.0] * (r + 1), (r + 1,))
        assert same(out["nc"], (torch.arange(6.0).reshape(2, 3) * r).t().contiguous())


# ------------------------------------------------------------ all_to_all


def _all_to_all_shapes():
    r = pd.get_rank()
    out = {}
    xs = [torch.full((r + 1, i + 1), 10 * r + i, dtype=torch.int64) for i in range(3)]
    out["shapes"] = pd.all_to_all(xs)
    dtypes = [torch.float64, torch.int8, torch.bool]
    ys = [torch.ones(i + 2, dtype=dtypes[(r + i) % 3]) for i in range(3)]
    out["dtypes"] = pd.all_to_all(ys)
    zs = [torch.empty(0, 3) if i == r else torch.tensor(float(r)) for i in range(3)]
    out["empty_and_scalar"] = pd.all_to_all(tuple(zs))
    nc = [(torch.arange(6.0).reshape(2, 3) + r).t() for _ in range(3)]
    out["nc"] = pd.all_to_all(nc)
    return out


def test_all_to_all_different_shapes_and_dtypes(world3):
    dtypes = [torch.float64, torch.int8, torch.bool]
    for r, out in enumerate(world3.run(_all_to_all_shapes)):
        assert same(out["shapes"], [torch.full((j + 1, r + 1), 10 * j + r, dtype=torch.int64) for j in range(3)])
        assert same(out["dtypes"], [torch.ones(r + 2, dtype=dtypes[(j + r) % 3]) for j in range(3)])
        want = [torch.empty(0, 3) if j == r else torch.tensor(float(j)) for j in range(3)]
        assert [tuple(t.shape) for t in out["empty_and_scalar"]] == [tuple(t.shape) for t in want]
        assert same([t for t in out["empty_and_scalar"] if t.numel()], [t for t in want if t.numel()])
        assert same(out["nc"], [(torch.arange(6.0).reshape(2, 3) + j).t().contiguous() for j in range(3)])


# ------------------------------------------------------------ broadcast(safe_mode)


def _broadcast_safe():
    r = pd.get_rank()
    out = {}
    src_t = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    others = [None, torch.zeros(5), torch.zeros(3, 4, dtype=torch.float32)][r]
    out["int32"] = pd.broadcast(src_t if r == 0 else others, src=0, safe_mode=True)
    keep = torch.zeros(2, 2, dtype=torch.float64)
    got = pd.broadcast(torch.eye(2, dtype=torch.float64) if r == 2 else keep, src=2, safe_mode=True)
    out["in_place"] = (got.tolist(), got is keep or r == 2, keep.tolist())
    out["scalar"] = pd.broadcast(torch.tensor(2.5) if r == 1 else "anything", src=1, safe_mode=True)
    out["empty"] = pd.broadcast(torch.empty(0, 7) if r == 0 else None, src=0, safe_mode=True)
    out["value"] = pd.broadcast({"k": (1, 2)} if r == 1 else torch.ones(3), src=1, safe_mode=True)
    return out


def test_broadcast_safe_mode_any_shape_on_receivers(world3):
    for r, out in enumerate(world3.run(_broadcast_safe)):
        assert same(out["int32"], torch.arange(12, dtype=torch.int32).reshape(3, 4))
        got, in_place, keep = out["in_place"]
        assert got == [[1.0, 0.0], [0.0, 1.0]] and in_place
        assert keep == ([[0.0, 0.0], [0.0, 0.0]] if r == 2 else got)
        assert same(out["scalar"], torch.tensor(2.5))
        assert out["empty"].shape == (0, 7) and out["empty"].dtype == torch.float32
        assert same(out["value"], {"k": (1, 2)})


# ------------------------------------------------------------ dtypes


# int16/uint16/uint32 have no gloo transport of their own: polydist moves bytes.
DTYPES = ["bool", "complex64", "complex128", "int8", "uint8", "int16", "uint16", "uint32", "float64", "bfloat16",
          "float16", "int32"]
BIG = 3000  # elements added to every tensor so that it cannot ride in the metadata slot


def _sample(dtype_name, rank, n):
    dtype = getattr(torch, dtype_name)
    base = torch.arange(n) + 3 * rank
    if dtype == torch.bool:
        return (base % 2 == 0)
    if dtype.is_complex:
        return (base + 1j * (base - 1)).to(dtype)
    return base.to(dtype)


def _dtypes(dtype_name, extra):
    r = pd.get_rank()
    out = {}
    out["all_gather"] = pd.all_gather(_sample(dtype_name, r, r + 2 + extra))
    out["all_gather_even"] = pd.all_gather(_sample(dtype_name, r, 2 + extra))
    out["all_gather_list"] = pd.all_gather(_sample(dtype_name, r, 2 * r + 1 + extra).reshape(-1, 1), concat=False)
    out["gather"] = pd.gather(_sample(dtype_name, r, r + 1 + extra), dst=1)
    xs = [_sample(dtype_name, 10 + i, i + 1 + extra) for i in range(3)] if r == 0 else None
    out["scatter"] = pd.scatter(xs, src=0)
    out["all_to_all"] = pd.all_to_all([_sample(dtype_name, 10 * r + i, i + 2 + extra) for i in range(3)])
    out["broadcast"] = pd.broadcast(_sample(dtype_name, 7, 5 + extra) if r == 2 else None, src=2, safe_mode=True)
    receiver = _sample(dtype_name, 7, 5 + extra) if r == 2 else torch.zeros(5 + extra, dtype=getattr(torch, dtype_name))
    out["broadcast_in_place"] = pd.broadcast(receiver, src=2)
    out["in_object"] = pd.all_gather({"t": _sample(dtype_name, r, 3 + extra)})
    return out


@pytest.mark.parametrize("extra", [0, BIG], ids=["inline", "data-round"])
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_dtypes_through_every_shape_collective(world3, dtype_name, extra):
    for r, out in enumerate(world3.run(_dtypes, dtype_name, extra)):
        assert same(out["all_gather"], torch.cat([_sample(dtype_name, i, i + 2 + extra) for i in range(3)])), dtype_name
        assert same(out["all_gather_even"], torch.cat([_sample(dtype_name, i, 2 + extra) for i in range(3)]))
        want = [_sample(dtype_name, i, 2 * i + 1 + extra).reshape(-1, 1) for i in range(3)]
        assert same(out["all_gather_list"], want)
        if r == 1:
            assert same(out["gather"], torch.cat([_sample(dtype_name, i, i + 1 + extra) for i in range(3)]))
        else:
            assert out["gather"] is None
        assert same(out["scatter"], _sample(dtype_name, 10 + r, r + 1 + extra))
        assert same(out["all_to_all"], [_sample(dtype_name, 10 * j + r, r + 2 + extra) for j in range(3)])
        assert same(out["broadcast"], _sample(dtype_name, 7, 5 + extra))
        assert same(out["broadcast_in_place"], _sample(dtype_name, 7, 5 + extra))
        assert same(out["in_object"], [{"t": _sample(dtype_name, i, 3 + extra)} for i in range(3)])


# ------------------------------------------------------------ Python values in every collective


def _values_everywhere():
    r = pd.get_rank()
    n = pd.get_world_size()
    mine = values_of(r)
    out = {}
    out["all_gather"] = [pd.all_gather(v) for v in mine]
    out["all_gather_whole"] = pd.all_gather(mine)
    out["broadcast"] = [pd.broadcast(v if r == 1 else None, src=1) for v in values_of(1)]
    out["gather"] = [pd.gather(v, dst=2) for v in mine]
    out["scatter"] = [pd.scatter([values_of(i)[k] for i in range(n)] if r == 0 else None, src=0)
                      for k in range(len(mine))]
    out["all_to_all"] = [pd.all_to_all([(r, i, v) for i in range(n)]) for v in mine]
    out["all_to_all_whole"] = pd.all_to_all([values_of(10 * r + i) for i in range(n)])
    return out


def test_values_in_every_collective(world3):
    count = len(values_of(0))
    for r, out in enumerate(world3.run(_values_everywhere)):
        for k in range(count):
            expect_all = [values_of(i)[k] for i in range(3)]
            assert same(out["all_gather"][k], expect_all), (k, out["all_gather"][k])
            assert same(out["broadcast"][k], values_of(1)[k]), (k, out["broadcast"][k])
            assert same(out["gather"][k], expect_all if r == 2 else None), k
            assert same(out["scatter"][k], values_of(r)[k]), (k, out["scatter"][k])
            assert same(out["all_to_all"][k], [(j, r, values_of(j)[k]) for j in range(3)]), k
        assert same(out["all_gather_whole"], [values_of(i) for i in range(3)])
        assert same(out["all_to_all_whole"], [values_of(10 * j + r) for j in range(3)])


def _float_bits():
    r = pd.get_rank()
    nan = pd.all_gather(float("nan"))
    tiny = pd.broadcast(5e-324, src=0)
    third = pd.scatter([1 / 3, 2 / 3] if r == 1 else None, src=1)
    return [math.isnan(x) for x in nan], tiny, third, type(third)


def test_floats_travel_as_exact_float64(world2):
    for r, (nan, tiny, third, kind) in enumerate(world2.run(_float_bits)):
        assert nan == [True, True] and tiny == 5e-324
        assert third == [1 / 3, 2 / 3][r] and kind is float


def _tensor_values_on_own_device():
    r = pd.get_rank()
    got = pd.all_gather({"w": torch.ones(2) * r})
    return [(v["w"].device.type, v["w"].tolist()) for v in got], pd.device().type


def test_tensors_inside_values_arrive_on_own_device(world2):
    for got, dev in world2.run(_tensor_values_on_own_device):
        assert got == [(dev, [0.0, 0.0]), (dev, [1.0, 1.0])]


# ------------------------------------------------------------ mixed lists of tensors and values


def _mixed_lists():
    r = pd.get_rank()
    out = {}
    xs = [torch.arange(4) * 10 + i if i % 2 == 0 else {"i": i, "s": "é" * 200} for i in range(3)]
    out["all_to_all"] = pd.all_to_all([x if not isinstance(x, dict) else {**x, "from": r} for x in xs])
    out["all_to_all_flip"] = pd.all_to_all([f"text {r}" if (i + r) % 2 else torch.ones(i + 1, r + 1) for i in range(3)])
    ys = [torch.tensor([1.0, 2.0]), "two", {"three": torch.arange(3, dtype=torch.int8)}] if r == 2 else None
    out["scatter_mixed"] = pd.scatter(ys, src=2)
    zs = [torch.ones(1, dtype=torch.float32), torch.ones(2, dtype=torch.float64), torch.ones(3, dtype=torch.int8)]
    out["scatter_mixed_dtypes"] = pd.scatter(zs if r == 0 else None, src=0)
    out["scatter_big"] = pd.scatter([b"x" * (300 * (i + 1)) for i in range(3)] if r == 1 else None, src=1)
    return out


def test_mixed_tensor_and_value_lists(world3):
    for r, out in enumerate(world3.run(_mixed_lists)):
        got = out["all_to_all"]
        for j in range(3):
            if r % 2 == 0:
                assert same(got[j], torch.arange(4) * 10 + r)
            else:
                assert same(got[j], {"i": r, "s": "é" * 200, "from": j})
        for j, item in enumerate(out["all_to_all_flip"]):
            if (r + j) % 2:
                assert same(item, f"text {j}")
            else:
                assert same(item, torch.ones(r + 1, j + 1))
        want = [torch.tensor([1.0, 2.0]), "two", {"three": torch.arange(3, dtype=torch.int8)}][r]
        assert same(out["scatter_mixed"], want)
        assert same(out["scatter_mixed_dtypes"],
                    [torch.ones(1, dtype=torch.float32), torch.ones(2, dtype=torch.float64),
                     torch.ones(3, dtype=torch.int8)][r])
        assert out["scatter_big"] == b"x" * (300 * (r + 1))
