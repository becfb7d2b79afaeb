"""Property tests of the codec (Hypothesis): exact round trips, and every mutation of a valid payload either
decodes or raises ValueError, in a child process with a memory limit and a timeout.

Budget: the ``default`` profile runs in ``make test``; ``make fuzz`` runs the
``long`` profile (``--hypothesis-profile=long``); both are registered in
``tests/conftest.py``, where Hypothesis's plugin finds them at start-up.
"""

import collections
import datetime as dt
import os
import pathlib
import select
import subprocess
import sys
import zoneinfo

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from _codec_classes import Bits, Mode, Record, Row
from _values import exact
from polydist import codec


CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_decode_child.py")
ANSWER_TIMEOUT_S = 20.0
STARTUP_TIMEOUT_S = 300.0

_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int64, torch.uint8,
           torch.bool, torch.complex64, torch.int16, torch.uint16]
_NP_DTYPES = ["<f4", "<f8", "<i2", "|u1", "|b1", "<c16", "<M8[ns]", "<U3", "|S2"]


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(_DTYPES))
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    return torch.randint(0, 2, shape).to(dtype) if draw(st.booleans()) else torch.zeros(shape, dtype=dtype)


@st.composite
def arrays(draw):
    dtype = np.dtype(draw(st.sampled_from(_NP_DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    return np.zeros(shape, dtype=dtype)


hashables = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
_ZONES = st.sampled_from([None, dt.timezone.utc, dt.timezone(dt.timedelta(hours=-9, seconds=1), "X"),
                          zoneinfo.ZoneInfo("Europe/Paris")])
standard = (
    st.datetimes(timezones=_ZONES, allow_imaginary=False)
    | st.dates()
    | st.times(timezones=_ZONES)
    | st.timedeltas()
    | st.decimals(allow_nan=True)
    | st.fractions()
    | st.uuids()
    | st.lists(st.integers(0, 2**40), max_size=4).map(torch.Size)
    | st.sampled_from([torch.float32, torch.bfloat16, torch.device("cpu"), torch.device("cuda", 3), Mode.TRAIN,
                       Mode.EVAL, Bits.A, Bits.A | Bits.B])
    | st.builds(range, st.integers(), st.integers(), st.integers().filter(bool))
)
leaves = (
    hashables
    | standard
    | st.complex_numbers(allow_nan=False)
    | st.builds(pathlib.PurePosixPath, st.text(alphabet="abc/", max_size=6)).map(lambda p: pathlib.Path(p))
    | tensors()
    | arrays()
    | st.sampled_from([np.float32(1.5), np.int64(-3), np.bool_(True)])
)
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4)
    | st.tuples(inner, inner)
    | st.dictionaries(hashables, inner, max_size=3)
    | st.sets(hashables, max_size=3)
    | st.dictionaries(hashables, inner, max_size=3).map(collections.OrderedDict)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=3).map(collections.Counter)
    | st.dictionaries(hashables, inner, max_size=3).map(lambda d: collections.defaultdict(list, d))
    | st.builds(Record, inner, inner)
    | st.builds(Row, inner, inner),
    max_leaves=12,
)


@given(values)
def test_every_encodable_value_round_trips_exactly(value):
    assert exact(codec.decode(codec.encode(value)), value)


# ------------------------------------------------------------ mutations, decoded in a child


class Child:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        # importing torch can take longer than an answer may (a loaded machine, make test-xla's torch_xla):
        # the answers' timeout starts once the child is ready
        ready, _, _ = select.select([self.proc.stdout], [], [], STARTUP_TIMEOUT_S)
        line = self.proc.stdout.readline().decode().strip() if ready else ""
        if line != "ready":
            self.proc.kill()
            raise AssertionError(f"the decoder did not start within {STARTUP_TIMEOUT_S} s (said {line!r})")

    def decode(self, data: bytes) -> str:
        self.proc.stdin.write(len(data).to_bytes(4, "little") + data)
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], ANSWER_TIMEOUT_S)
        if not ready:
            self.proc.kill()
            raise AssertionError(f"decoding hung (> {ANSWER_TIMEOUT_S} s) on {data[:64]!r}...")
        line = self.proc.stdout.readline().decode().strip()
        if not line:
            code = self.proc.wait()
            raise AssertionError(f"the decoder died (exit code {code}) on {data[:64]!r}...")
        return line

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def child():
    c = Child()
    yield c
    c.close()


@st.composite
def mutated(draw):
    data = bytearray(codec.encode(draw(values)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "big"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[i] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del data[i:]
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[i : i + draw(st.integers(1, 8))]
        else:  # a length, count or shape field turned huge: 0xcf is msgpack's uint64
            data[i:i] = b"\xcf" + draw(st.sampled_from([2**31, 2**32 + 1, 2**62, 2**64 - 1])).to_bytes(8, "big")
    return bytes(data)


@given(mutated())
def test_every_mutation_decodes_or_raises_value_error(child, data):
    answer = child.decode(data)
    if answer.startswith("ok"):
        assert int(answer.split()[1]) <= len(data), f"decoded {answer} from {len(data)} bytes"
    else:
        assert answer == "ValueError", answer


@given(st.binary(max_size=256))
def test_random_bytes_decode_or_raise_value_error(child, data):
    answer = child.decode(data)
    assert answer.startswith("ok") or answer == "ValueError", answer


# ------------------------------------------------------------ hostile extensions of the standard and allowed types

_TAGS = list(range(11, 22)) + [30, 31, 32, 40, 41]  # polydist.codec.stdtypes' codes, the enum and the record


def _field():
    return (
        st.none() | st.booleans() | st.integers() | st.integers(-(2**80), 2**80) | st.floats() | st.text(max_size=6)
        | st.binary(max_size=17)
        | st.sampled_from(["1E+999999999999999999", "9E-999999999999999999", "1E+99999999999999999999", "NaN",
                           "-Infinity", "Europe/Paris", "../x", "cuda:1", "float32", "_codec_classes.Record",
                           "_codec_classes.Mode", "TRAIN", "os.system", "builtins.eval"])
        | st.lists(st.integers(-(2**64), 2**64), max_size=4)
    )


def _bigints(x):
    return msgpack.ExtType(5, x.to_bytes((x.bit_length() + 8) // 8, "little", signed=True))


@st.composite
def hostile_extensions(draw):
    """One extension of a new tag with fields of the wrong kind or count, a wrong tag, names not allowed, huge Decimal
    exponents and timedelta days, inside records nested deep."""
    code = draw(st.sampled_from(_TAGS))
    fields = draw(st.lists(_field(), max_size=10))
    if draw(st.booleans()):  # a valid value's own fields, under its tag or another one
        valid = codec.encode(draw(standard))
        obj = msgpack.unpackb(valid, ext_hook=lambda c, d: msgpack.ExtType(c, d), strict_map_key=False)
        if isinstance(obj, msgpack.ExtType):
            code = draw(st.sampled_from([obj.code, *_TAGS]))
            fields = msgpack.unpackb(obj.data, ext_hook=lambda c, d: msgpack.ExtType(c, d))
            if isinstance(fields, list) and fields and draw(st.booleans()):
                fields = fields[: draw(st.integers(0, len(fields)))] + draw(st.lists(_field(), max_size=2))
    if code in (14, 12, 21) and draw(st.booleans()):  # timedelta, date, range: huge numbers
        fields = [draw(st.sampled_from([10**9, -(10**9), 2**63 - 1, _bigints(2**200)])), 0, 0]
    if code in (30, 31, 32, 41):  # a marker: its header, and the map or list it holds
        header = draw(st.sampled_from([b"", b"list", b"_codec_classes.Record", b"_codec_classes.Row", b"os.system",
                                       b"_codec_classes.Mode", b"\xff"]))
        items = draw(st.dictionaries(st.text(alphabet="abxy", max_size=2), _field(), max_size=3) | st.lists(_field()))
        value = {msgpack.ExtType(code, header): items}
    else:
        value = msgpack.ExtType(code, msgpack.packb(fields, use_bin_type=True, default=_bigints))
    # inside records nested deep, written as bytes: msgpack's packer stops at its depth limit, a hostile peer need not
    record = b"\x81" + msgpack.packb(msgpack.ExtType(41, b"_codec_classes.Record")) + b"\x81\xa1a"
    return record * draw(st.sampled_from([0, 1, 3, 600])) + msgpack.packb(value, use_bin_type=True, default=_bigints)


@given(hostile_extensions())
def test_hostile_extensions_decode_or_raise_value_error(child, data):
    answer = child.decode(data)
    assert answer.startswith("ok") or answer == "ValueError", answer
