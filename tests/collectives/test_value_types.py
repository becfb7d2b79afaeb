"""Issue 51 on shared worlds (gloo and MPI): the standard types, torch's small types and allowed classes through every
value collective; a class not allowed, refused by the sender and by a receiver; structured all_reduce and reduce.

Each ``_xxx`` function runs on every rank of a shared world (see _world.py) and returns what the test then checks
in the parent. The classes are allowed at import, so on every rank (the ranks import this module to run them).
"""

import collections
import dataclasses
import datetime as dt
import decimal
import enum
import fractions
import typing
import uuid
import zoneinfo

import pytest
import torch

import polydist as pd
from _values import exact
from polydist import codec

pytestmark = pytest.mark.timeout(180)


@codec.allow
@dataclasses.dataclass
class Metrics:
    loss: float
    accuracy: float
    confusion: torch.Tensor
    epoch: int = 0


@codec.allow
class Span(typing.NamedTuple):
    start: int
    stop: int


Pair = codec.allow(collections.namedtuple("Pair", "key value"))


@codec.allow
class Phase(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


@codec.allow
class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def rows(rank):
    """One value of every row of the issue's table, each depending on ``rank``."""
    return [
        Metrics(0.5 / (rank + 1), 0.9, torch.eye(2) * rank, epoch=rank),
        Span(rank, rank + 10),
        Pair(f"k{rank}", [rank, {"nested": Span(0, rank)}]),
        Phase.EVAL if rank % 2 else Phase.TRAIN,
        Level.HIGH if rank else Level.LOW,
        dt.datetime(2026, 11, 29, 9, rank, 1, 500, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30), "IST")),
        dt.datetime(2026, 11, 1, 1, 30, rank, fold=1, tzinfo=zoneinfo.ZoneInfo("America/New_York")),
        dt.date(2024, 2, 29 - rank),
        dt.time(12, rank, tzinfo=dt.timezone.utc),
        dt.timedelta(days=-rank, microseconds=7),
        decimal.Decimal(f"1.{rank}0000000000000000000000000000001E-{400 + rank}"),
        fractions.Fraction(2**100 + rank, 3),
        uuid.UUID(int=rank * 2**64 + 12345),
        torch.Size([rank, 3]),
        [torch.float16, torch.bfloat16][rank % 2],
        torch.device("cuda", rank),
        collections.OrderedDict([("z", rank), ("a", Level.LOW)]),
        collections.defaultdict(list, {rank: [rank]}),
        collections.Counter({"x": rank + 1}),
        range(rank, 100, 7),
        {"mixed": (Phase.TRAIN, dt.date(2020, 1, 1 + rank)), Level.LOW: [Span(1, 2)] * (rank + 1)},
    ]


# ------------------------------------------------------------ every row, every value collective


def _rows_everywhere():
    r, n = pd.get_rank(), pd.get_world_size()
    mine = rows(r)
    out = {
        "all_gather": pd.all_gather(mine),
        "one_by_one": [pd.all_gather(v) for v in mine],
        "broadcast": pd.broadcast(mine if r == 1 else None, src=1),
        "broadcast_safe": pd.broadcast(mine if r == 0 else None, src=0, safe_mode=True),
        "gather": pd.gather(mine, dst=n - 1),
        "scatter": pd.scatter([rows(10 + i) for i in range(n)] if r == 0 else None, src=0),
        "all_to_all": pd.all_to_all([(r, i, rows(i)) for i in range(n)]),
    }
    if r < 2:  # point to point between ranks 0 and 1: blocking one way, non-blocking the other
        if r == 0:
            pd.send(mine, 1)
            out["recv"] = pd.irecv(None, 1).wait()
        else:
            out["recv"] = pd.recv(None, 0)
            pd.isend(mine, 0).wait()
    return out


@pytest.mark.p2p
def test_every_row_through_every_value_collective(world3):
    n = 3
    for r, out in enumerate(world3.run(_rows_everywhere)):
        everyone = [rows(i) for i in range(n)]
        assert exact(out["all_gather"], everyone)
        assert all(exact(out["one_by_one"][k], [row[k] for row in everyone]) for k in range(len(rows(0))))
        assert exact(out["broadcast"], rows(1)) and exact(out["broadcast_safe"], rows(0))
        assert exact(out["gather"], everyone if r == n - 1 else None)
        assert exact(out["scatter"], rows(10 + r))
        assert exact(out["all_to_all"], [(j, r, rows(r)) for j in range(n)])
        if r < 2:
            assert exact(out["recv"], rows(1 - r))
        assert out["all_gather"][1][3] is Phase.EVAL  # the member itself, rebuilt on the receiver


def test_rows_differ_from_rank_to_rank():
    """The rows above depend on the rank, so a rank that got its own value back would fail the test above."""
    assert all(not exact(a, b) for a, b in zip(rows(0), rows(1)))


# ------------------------------------------------------------ classes not allowed: the sender, then a receiver


@dataclasses.dataclass
class Secret:
    """Allowed on rank 0 only, at run time (``_one_side``)."""

    value: int


def _other_fields():
    @dataclasses.dataclass
    class Secret:  # the same wire name as the module's Secret, other fields: what a receiver built differently has
        value: int
        extra: int = 0

    Secret.__qualname__, Secret.__module__ = "Secret", __name__
    return Secret


def _one_side():
    r = pd.get_rank()
    out = {}
    try:  # no rank has allowed it: refused on every sender, and every rank raises
        pd.all_gather(Secret(r))
    except TypeError as exc:
        out["sender"] = str(exc)
    if r == 0:
        codec.allow(Secret)
    try:  # rank 0 may send it now; rank 1 has not allowed it
        out["gather"] = pd.all_gather(Secret(r) if r == 0 else "plain")
    except ValueError as exc:
        out["receiver"] = str(exc)
    fake = _other_fields()
    if r == 1:
        codec.allow(fake)
    try:  # rank 1 allowed a Secret with an extra field: the fields rank 0 sends are a subset, it decodes them
        got = pd.broadcast(Secret(5) if r == 0 else None, src=0)
        out["subset"] = (type(got) is fake, got.value, got.extra) if r == 1 else None
    except ValueError as exc:
        out["subset"] = str(exc)
    try:  # and rank 1 sends its extra field to rank 0, whose Secret lacks it
        got = pd.broadcast(fake(1, 2) if r == 1 else None, src=1)
        out["extra"] = (got.value, got.extra)  # rank 1: its own value back
    except ValueError as exc:
        out["extra"] = str(exc)
    codec.disallow(Secret, fake)
    out["after"] = pd.all_gather(r)  # the group still works
    return out


def test_a_class_not_allowed_is_refused_by_sender_and_receiver(world2):
    first, second = world2.run(_one_side)
    for out in (first, second):
        assert f"{__name__}.Secret, a dataclass" in out["sender"] and "polydist.codec.allow(Secret)" in out["sender"]
        assert out["after"] == [0, 1]
    assert "gather" not in second and "rank 0" in second["receiver"] and "has not allowed" in second["receiver"]
    assert f"'{__name__}.Secret'" in second["receiver"]
    assert second["subset"] == (True, 5, 0)
    assert "rank 1" in first["extra"] and "field(s) ['extra']" in first["extra"] and "does not have" in first["extra"]


# ------------------------------------------------------------ sparse tensors


def _sparse():
    r = pd.get_rank()
    coo, csr = torch.eye(2).to_sparse(), torch.eye(2).to_sparse_csr()
    out = {}
    for name, call in [("all_gather", lambda: pd.all_gather(coo)), ("broadcast", lambda: pd.broadcast(csr, src=0)),
                       ("all_reduce", lambda: pd.all_reduce(coo)), ("gather", lambda: pd.gather(csr)),
                       ("send", lambda: pd.send(coo, 1 - r))]:
        try:
            call()
        except TypeError as exc:
            out[name] = str(exc)
    try:  # inside a value and in a scatter list: refused in-band, every rank raises
        pd.all_gather({"grad": coo if r == 0 else torch.ones(1)})
    except TypeError as exc:
        out["in_value"] = str(exc)
    out["after"] = pd.all_gather(r)
    return out


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.p2p
def test_sparse_tensors_are_refused_before_communication_naming_the_layout(world2):
    for r, out in enumerate(world2.run(_sparse)):
        for name, layout in [("all_gather", "coo"), ("broadcast", "csr"), ("all_reduce", "coo"), ("gather", "csr"),
                             ("send", "coo")]:
            assert f"{name} takes dense (strided) tensors, got a torch.sparse_{layout} tensor" in out[name], out
        assert "sparse_coo" in out["in_value"] and (r == 0 or "rank 0" in out["in_value"])
        assert out["after"] == [0, 1]


# ------------------------------------------------------------ structured all_reduce and reduce


def _reduce_structures():
    r, n = pd.get_rank(), pd.get_world_size()
    from polydist.collectives import frames

    rounds = []
    real = frames.all_gather_single
    frames.all_gather_single = lambda *a, **k: (rounds.append(1), real(*a, **k))[1]
    try:
        small = pd.all_reduce({"loss": 0.25 * (r + 1), "n": r + 1, "ok": True, "t": torch.tensor([r, 1.0])})
    finally:
        frames.all_gather_single = real
    out = {"small": small, "rounds": len(rounds)}
    m = Metrics(loss=float(r), accuracy=0.5 + r / 10, confusion=torch.full((2, 2), r + 1, dtype=torch.int64), epoch=3)
    out["dataclass_avg"] = pd.all_reduce(m, op="AVG")
    out["dataclass_max"] = pd.all_reduce(m, op="max")
    out["namedtuple"] = pd.all_reduce(Span(r, 10 * r), op="SUM")
    out["nested"] = pd.all_reduce(collections.OrderedDict(a=[1, (2, torch.ones(3))], b={"c": 2**70 + r}))
    out["bools"] = pd.all_reduce({"any": r == 1, "all": True}, op="OR")
    out["reduce"] = pd.reduce({"loss": float(r), "span": Span(r, r)}, dst=1, op="SUM")
    out["key_order"] = pd.all_reduce({"a": r, "b": 1} if r % 2 else {"b": 1, "a": r})  # rank 0's order
    out["size"] = pd.all_reduce(torch.Size([r, 2]), op="MAX")
    mismatches = {
        "keys": {"loss": 1.0, **({"acc": 1.0} if r == 1 else {"top5": 1.0})},
        "type": Span(1, 2) if r == 0 else {"start": 1, "stop": 2},
        "length": [1.0] * (r + 1),
        "shape": {"t": torch.ones(r + 1)},
        "leaf": {"x": [1.0, "text" if r == 1 else 2.0]},
    }
    for name, value in mismatches.items():
        try:
            pd.all_reduce(value)
            out[name] = None
        except (pd.CollectiveMismatchError, TypeError) as exc:
            out[name] = (type(exc).__name__, str(exc))
    out["after"] = pd.all_reduce(r)
    return out


def test_structured_all_reduce_leaf_by_leaf_in_one_collective(world3):
    for r, out in enumerate(world3.run(_reduce_structures)):
        assert out["rounds"] == 1  # one all_gather of the encodings: the whole dict in one collective
        assert exact(out["small"], {"loss": 1.5, "n": 6, "ok": 3, "t": torch.tensor([3.0, 3.0])})
        avg = out["dataclass_avg"]
        assert type(avg) is Metrics and avg.loss == 1.0 and abs(avg.accuracy - 0.6) < 1e-12 and avg.epoch == 3.0
        assert exact(avg.confusion, torch.full((2, 2), 2.0))  # an int tensor's AVG is a float tensor, as an int's
        mx = out["dataclass_max"]
        assert mx.loss == 2.0 and exact(mx.confusion, torch.full((2, 2), 3)) and mx.epoch == 3
        assert exact(out["namedtuple"], Span(3, 30))
        assert exact(out["nested"], collections.OrderedDict(a=[3, (6, torch.full((3,), 3.0))], b={"c": 3 * 2**70 + 3}))
        assert out["bools"] == {"any": True, "all": True}
        assert list(out["key_order"].items()) == [("b", 3), ("a", 3)]
        assert exact(out["size"], torch.Size([2, 2]))
        if r == 1:
            assert exact(out["reduce"], {"loss": 3.0, "span": Span(3, 3)})
        else:
            assert exact(out["reduce"], {"loss": float(r), "span": Span(r, r)})
        kind, message = out["keys"]
        assert kind == "CollectiveMismatchError" and "keys at the top level" in message
        assert "rank 0: dict with keys ['loss', 'top5']" in message and "rank 1: dict with keys ['loss', 'acc']" in message
        kind, message = out["type"]
        assert kind == "CollectiveMismatchError" and "rank 0: Span of 2" in message and "rank 1: dict" in message
        assert "length" in out["length"][1] and "rank 2: list of 3" in out["length"][1]
        kind, message = out["shape"]
        assert kind == "CollectiveMismatchError" and "at ['t']" in message and "rank 2: tensor float32[3]" in message
        kind, message = out["leaf"]
        assert kind == "TypeError" and "['x'][1]" in message and "str" in message and (r == 1 or "rank 1" in message)
        assert out["after"] == 3  # the group still works


def test_serial_structured_reductions_check_as_distributed_ones():
    """No process group (this test process): the value comes back checked, refused as it would be with other ranks."""
    assert exact(pd.all_reduce({"loss": 1, "t": torch.ones(2, dtype=torch.int64)}, op="AVG"),
                 {"loss": 1.0, "t": torch.ones(2)})
    assert exact(pd.reduce(Span(1, 2), dst=0), Span(1, 2))
    with pytest.raises(TypeError, match="polydist.codec.allow\\(Secret\\)"):
        pd.all_reduce(Secret(1))
    with pytest.raises(TypeError, match="at \\['x'\\]\\[1\\]"):
        pd.all_reduce({"x": [1.0, "text"]})
    with pytest.raises(TypeError, match="sparse_coo"):
        pd.all_reduce(torch.eye(2).to_sparse())
