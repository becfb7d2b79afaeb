"""The codec's standard types, torch's small types and allowed classes: exact round trips and refusals (issue 51)."""

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

from _values import exact
from polydist import codec


@codec.allow
@dataclasses.dataclass
class Metrics:
    loss: float
    accuracy: float = 0.0
    per_class: typing.Any = None
    seen: int = dataclasses.field(default=0, init=False)  # not an init field: not sent, the constructor sets it


class Point(typing.NamedTuple):
    x: int
    y: typing.Any = ()


Pair = collections.namedtuple("Pair", "first second")


class Color(enum.Enum):
    RED = (255, 0, 0)
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Perm(enum.Flag):
    R = 4
    W = 2


codec.allow(Point, Pair, Color, Level, Perm)

IST = dt.timezone(dt.timedelta(hours=5, minutes=30), "IST")

ROWS = [
    Metrics(0.25, 0.9, {"cat": torch.tensor([1.0, 2.0])}),
    Point(1, (2, Point(3))),
    Pair([1, 2], {"k": Pair(None, b"x")}),
    Color.RED,
    Color.GREEN,
    Level.HIGH,
    Perm.R | Perm.W,
    Perm.W,
    dt.datetime(2026, 11, 29, 9, 45, 1, 123456, tzinfo=IST),
    dt.datetime(2026, 11, 1, 1, 30, fold=1, tzinfo=zoneinfo.ZoneInfo("America/New_York")),
    dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
    dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=-3))),
    dt.datetime(1, 1, 1),
    dt.date(2024, 2, 29),
    dt.time(23, 59, 59, 999999, tzinfo=IST),
    dt.timedelta(days=-999999999),
    dt.timedelta(microseconds=1),
    decimal.Decimal("3.14159265358979323846264338327950288419716939937510"),
    decimal.Decimal("-0.000"),
    decimal.Decimal("1.2300E+999999999999999998"),
    decimal.Decimal("-Infinity"),
    decimal.Decimal("sNaN42"),
    fractions.Fraction(2**100, 3**50),
    fractions.Fraction(-1, 7),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    torch.Size([2, 0, 3]),
    torch.Size([]),
    torch.bfloat16,
    torch.complex128,
    torch.device("cuda", 1),
    torch.device("cpu"),
    range(0),
    range(2**70, -5, -3),
    collections.OrderedDict([("b", 1), ("a", (2, 3))]),
    collections.Counter("mississippi"),
    collections.defaultdict(list, {1: [2], "x": []}),
    collections.defaultdict(None, {}),
    {"nested": [Metrics(1.0), {Level.LOW: collections.OrderedDict(x=dt.date(2020, 1, 1))}], (1, Color.RED): range(3)},
]


@pytest.mark.parametrize("value", ROWS, ids=lambda v: type(v).__name__)
def test_every_row_round_trips_as_itself(value):
    assert exact(codec.decode(codec.encode(value)), value)


def test_enum_members_are_the_members_themselves():
    assert codec.decode(codec.encode(Color.RED)) is Color.RED
    assert codec.decode(codec.encode([Level.LOW]))[0] is Level.LOW
    assert codec.decode(codec.encode(torch.float16)) is torch.float16


def test_dataclass_is_rebuilt_through_its_constructor():
    seen = []

    @dataclasses.dataclass
    class Checked:
        n: int

        def __post_init__(self):
            seen.append(self.n)

    codec.allow(Checked)
    try:
        data = codec.encode(Checked(3))
        assert seen == [3]
        assert codec.decode(data) == Checked(3)
        assert seen == [3, 3, 3]  # decoding called the constructor (and so did the Checked(3) compared with)
    finally:
        codec.disallow(Checked)


# ------------------------------------------------------------ the sender's refusals


@dataclasses.dataclass
class NotAllowedMetrics:
    loss: float


class NotAllowedTuple(typing.NamedTuple):
    a: int


class NotAllowedEnum(enum.Enum):
    A = 1


@pytest.mark.parametrize(
    "value, name, kind",
    [(NotAllowedMetrics(1.0), "NotAllowedMetrics", "dataclass"), ([NotAllowedTuple(1)], "NotAllowedTuple", "named tuple"),
     ({"k": NotAllowedEnum.A}, "NotAllowedEnum", "enum")],
)
def test_a_class_not_allowed_is_refused_naming_the_line_that_allows_it(value, name, kind):
    with pytest.raises(TypeError) as info:
        codec.encode(value)
    message = str(info.value)
    assert f"{__name__}.{name}, a {kind}" in message and f"polydist.codec.allow({name})" in message


@pytest.mark.parametrize(
    "value, words",
    [
        (lambda: torch.ones(3).to_sparse(), ["sparse_coo", "to_dense"]),
        (lambda: torch.eye(3).to_sparse_csr(), ["sparse_csr", "crow_indices"]),
        (lambda: {"g": torch.eye(2).to_sparse_csr()}, ["sparse_csr"]),
        (collections.defaultdict(lambda: 0), ["default_factory", "callable"]),
        (dt.datetime(2020, 1, 1, tzinfo=type("Odd", (dt.tzinfo,), {"utcoffset": lambda s, d: dt.timedelta(0)})()), ["Odd"]),
        (type("Sub", (dict,), {})(), ["Sub"]),
    ],
)
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_other_refusals_name_the_value(value, words):
    with pytest.raises(TypeError) as info:
        codec.encode(value() if callable(value) and not isinstance(value, type) else value)
    for word in words:
        assert word in str(info.value)


def test_huge_fraction_is_refused():
    with pytest.raises(ValueError, match="65537-bit"):
        codec.encode(fractions.Fraction(2**65536 + 1, 3))


def test_allow_takes_only_classes_it_can_rebuild():
    with pytest.raises(TypeError, match="dataclasses, named tuples and enums"):
        codec.allow(dict)
    with pytest.raises(TypeError, match="dataclasses, named tuples and enums"):
        codec.allow(Metrics(1.0))  # an instance, not a class

    @dataclasses.dataclass
    class Metrics2:
        a: int

    Metrics2.__qualname__ = "Metrics"  # another class under Metrics's wire name
    with pytest.raises(ValueError, match="already allowed"):
        codec.allow(Metrics2)
    assert Metrics in codec.allowed() and Metrics2 not in codec.allowed()
    assert codec.allow(Metrics) is Metrics  # again: a no-op


def test_records_count_two_levels_like_tuples():
    x = 1
    for _ in range(codec.MAX_DEPTH // 2):
        x = Pair(x, None)
    out = codec.decode(codec.encode(x))
    for _ in range(codec.MAX_DEPTH // 2):  # without recursion: == and repr recurse past 1000 levels
        assert type(out) is Pair and out.second is None
        out = out.first
    assert out == 1
    with pytest.raises(ValueError, match="nested deeper than 1024"):
        codec.encode(Pair(x, None))
