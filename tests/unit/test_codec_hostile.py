"""Hostile payloads: exact sizes, bounded nesting, ValueError for every corruption (issue: codec and frames fuzzed)."""

import dataclasses
import subprocess
import sys
import textwrap

import msgpack
import numpy as np
import pytest
import torch

import _codec_classes  # noqa: F401 - allows the classes the hand-made payloads below name
from polydist import codec

R = "_codec_classes.Record"  # allowed by tests/unit/_codec_classes.py, imported by the fuzz tests too


def _ext(code, fields):
    return msgpack.packb(msgpack.ExtType(code, msgpack.packb(fields, use_bin_type=True)), use_bin_type=True)


def _refused(data, *words):
    with pytest.raises(ValueError) as info:
        codec.decode(data)
    for word in words:
        assert word in str(info.value), str(info.value)
    return str(info.value)


@pytest.mark.parametrize("shape", [[32768, 32768], [16384, 16384, 2]])
def test_memory_bomb_tensor_is_refused_naming_both_sizes(shape):
    data = _ext(7, ["float32", shape, b""])
    assert len(data) < 32
    _refused(data, str(shape), "carries 0 bytes")


@pytest.mark.parametrize(
    "fields, words",
    [
        (["float32", [2], b"\0" * 7], ["8 bytes", "carries 7"]),
        (["float32", [2], b"\0" * 9], ["carries 9"]),
        (["float32", [-1], b"\0" * 4], ["non-negative"]),
        (["float32", [2.0], b"\0" * 8], ["non-negative ints"]),
        (["float32", [1] * 65, b"\0" * 4], ["at most 64"]),
        (["onnx", [1], b"\0"], ["unknown torch dtype"]),  # a torch attribute that is a lazily imported module
        (["float32", "2", b"\0" * 8], ["shape"]),
        (["float32", [2], None], ["bytes"]),
        (["float32", [2]], ["3 fields"]),
    ],
)
def test_tensor_extension_must_be_exact(fields, words):
    _refused(_ext(7, fields), *words)


def test_empty_tensor_needs_no_data():
    t = codec.decode(_ext(7, ["float32", [0, 3], b""]))
    assert t.shape == (0, 3) and t.dtype == torch.float32


@pytest.mark.parametrize(
    "code, fields, words",
    [
        (8, ["<f8", [1000, 1000], b""], ["8000000 bytes", "carries 0"]),
        (8, ["|O", [1], b"\0" * 8], []),  # object arrays are refused
        (8, ["(1000000,)f8", [1], b""], []),  # sub-array dtypes are refused
        (8, [{"names": ["a"]}, [1], b""], ["dtype"]),
        (8, [",f4", [1], b"\0" * 4], ["dtype"]),  # found by make fuzz: NumPy's parser raised SyntaxError
        (9, ["f4,f4", b"\0" * 8], ["dtype"]),
        (9, ["<f4", b""], ["carries 0"]),  # used to raise IndexError
        (9, ["<f4", b"\0" * 5], ["carries 5"]),
        (4, ["1", 2.0], ["two floats"]),
        (6, ["PurePosixPath", 3], ["two strings"]),
    ],
)
def test_other_extensions_are_checked(code, fields, words):
    _refused(_ext(code, fields), *words)


def test_old_style_nested_tuple_extensions_do_not_crash():
    """The issue's crash: 300 tuple extensions, each re-entering msgpack. Checked in a subprocess: a crash is a signal."""
    code = textwrap.dedent(
        """
        import msgpack
        from polydist import codec
        data = msgpack.packb(1)
        for _ in range(300):
            data = msgpack.packb(msgpack.ExtType(1, data))
        try:
            codec.decode(data)
        except ValueError as e:
            print("ValueError", e)
        data = msgpack.packb(1)
        for _ in range(400):  # frozensets, the other reported crash
            data = msgpack.packb(msgpack.ExtType(3, data))
        try:
            codec.decode(data)
        except ValueError as e:
            print("ValueError", e)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [line.split()[0] for line in out.stdout.splitlines()] == ["ValueError"] * 2, out.stdout


def _tuples(n):
    x = 1
    for _ in range(n):
        x = (x,)
    return x


def _lists(n):
    x = 1
    for _ in range(n):
        x = [x]
    return x


def _depth(x, kind):
    """Nesting depth of ``x`` made by _lists/_tuples, without recursion (== and repr recurse past 1000 levels)."""
    n = 0
    while isinstance(x, kind):
        assert len(x) == 1
        x, n = x[0], n + 1
    assert x == 1
    return n


def test_depth_limit_is_the_same_on_both_sides():
    assert codec.MAX_DEPTH == 1024
    assert _depth(codec.decode(codec.encode(_lists(codec.MAX_DEPTH))), list) == codec.MAX_DEPTH
    half = codec.MAX_DEPTH // 2  # a tuple counts two levels
    assert _depth(codec.decode(codec.encode(_tuples(half))), tuple) == half
    for too_deep in (_lists(codec.MAX_DEPTH + 1), _tuples(codec.MAX_DEPTH // 2 + 1)):
        with pytest.raises(ValueError, match="nested deeper than 1024"):
            codec.encode(too_deep)
    _refused(b"\x91" * (codec.MAX_DEPTH + 1) + b"\xc0")  # a hand-made payload one level deeper


def test_tuple_set_frozenset_travel_in_band():
    value = {"t": (1, (2, 3)), "s": {1, 2}, "f": frozenset({(1, 2)}), (1, 2): "key"}
    out = codec.decode(codec.encode(value))
    assert out == value and type(out["t"]) is tuple and type(out["s"]) is set and type(out["f"]) is frozenset


@pytest.mark.parametrize(
    "data",
    [
        msgpack.packb({msgpack.ExtType(1, b"x"): [1]}),  # a marker with content
        msgpack.packb({msgpack.ExtType(2, b""): 5}),  # a set marker without a list
        msgpack.packb({msgpack.ExtType(2, b""): [[1]]}),  # an unhashable set item
        msgpack.packb({msgpack.ExtType(3, b""): [{}]}),
        msgpack.packb([1, 2]) + b"\x00",  # trailing bytes
        msgpack.packb([1, 2])[:-1],  # truncated
        b"",
        msgpack.packb(msgpack.ExtType(99, b"")),
    ],
)
def test_malformed_containers_raise_value_error(data):
    _refused(data, "malformed payload")


def test_a_peer_marker_key_among_others_is_a_plain_dict():
    data = msgpack.packb({msgpack.ExtType(1, b""): [1], "other": 2})
    out = codec.decode(data)
    assert isinstance(out, dict) and len(out) == 2


def test_pickle_still_refused_with_its_own_message():
    data = codec.encode(np.float16, allow_pickle=True)  # a type, only picklable
    with pytest.raises(ValueError, match="allow_pickle=True"):
        codec.decode(data)
    assert codec.decode(data, allow_pickle=True) is np.float16


def test_decoded_sizes_never_exceed_the_payload():
    for value in [torch.zeros(1000), np.zeros((10, 10)), [torch.ones(3)] * 4]:
        data = codec.encode(value)
        out = codec.decode(data)
        items = out if isinstance(out, list) else [out]
        assert sum(x.nbytes for x in items) <= len(data)


# ------------------------------------------------------------ classes: names and fields the receiver has not allowed


def _record(name, fields):
    return msgpack.packb({msgpack.ExtType(41, name.encode()): fields}, use_bin_type=True)


@pytest.mark.parametrize(
    "data, words",
    [
        (_record("os.system", {"command": "true"}), ["'os.system'", "has not allowed", "polydist.codec.allow(system)"]),
        (_record("builtins.eval", {}), ["'builtins.eval'", "has not allowed"]),
        (_ext(40, ["subprocess.Popen", "x"]), ["'subprocess.Popen'", "has not allowed"]),
        (_record(R, {"a": 1.0, "__class__": 2}), ["field(s) ['__class__']", "does not have"]),
        (_record(R, {"a": 1.0, "c": 5}), ["field(s) ['c']", "does not have"]),  # init=False: never set from the wire
        (_record(R, {"b": 1.0}), ["required field(s) a"]),
        (_record(R, [1.0]), ["map of its fields"]),
        (_record("_codec_classes.Row", {"x": 1, "z": 2}), ["'z'"]),
        (_ext(40, ["_codec_classes.Mode", "BLUE"]), ["'BLUE'"]),
        (_ext(40, ["_codec_classes.Mode", 1]), ["not by name"]),
        (_ext(40, [R, "a"]), ["a dataclass, as an enum member"]),
    ],
)
def test_receiver_refuses_classes_and_fields_it_has_not_allowed(data, words):
    _refused(data, *words)


def test_constructor_errors_become_value_errors():
    @dataclasses.dataclass
    class Positive:
        n: int

        def __post_init__(self):
            if self.n < 0:
                raise AssertionError("negative")

    name = f"{__name__}.{Positive.__qualname__}"
    codec.allow(Positive)
    try:
        _refused(_record(name, {"n": -1}), "raised AssertionError: negative")
        assert codec.decode(_record(name, {"n": 1})) == Positive(1)
    finally:
        codec.disallow(Positive)
    _refused(_record(name, {"n": 1}), "has not allowed")  # once disallowed


# ------------------------------------------------------------ the standard types' fields


@pytest.mark.parametrize(
    "code, fields, words",
    [
        (11, [2020, 13, 1, 0, 0, 0, 0, 0, None], ["month"]),
        (11, [2020, 1, 1, 0, 0, 0, 0, 0, [1, 0, 0, None]], ["timedelta(hours=24)"]),  # a 24 h offset
        (11, [2020, 1, 1, 0, 0, 0, 0, 0, "../../etc/passwd"], ["a key like"]),
        (11, [2020, 1, 1, 0, 0, 0, 0, 0, "Nowhere/Atlantis"], ["tz database"]),
        (11, [2020, 1, 1, 0, 0, 0, 0, 0], ["9 fields"]),
        (12, ["2020", 1, 1], ["ints"]),
        (14, [10**9, 0, 0], ["OverflowError"]),  # timedelta overflow
        (14, [2**64 - 1, 0, 0], ["OverflowError"]),
        (15, ["1E+99999999999999999999"], ["out of range"]),  # a Decimal exponent past libmpdec's
        (15, [" 1"], ["str(Decimal)"]),
        (15, ["1_000"], ["str(Decimal)"]),
        (16, [1, 0], ["positive denominator"]),
        (17, [b"\0" * 15], ["16 bytes"]),
        (18, [[-1, 2**63]], ["int64"]),
        (19, ["Tensor"], ["unknown torch dtype"]),
        (20, ["nosuchdevice:0"], ["does not know"]),
        (20, ["cuda:0; import os"], ["'type' or 'type:index'"]),
        (21, [0, 10, 0], ["must not be zero"]),
        (21, [0, 10], ["3 fields"]),
    ],
)
def test_standard_type_fields_are_checked(code, fields, words):
    _refused(_ext(code, fields), "malformed payload", *words)


def test_huge_fraction_is_refused_before_its_gcd():
    big = msgpack.ExtType(5, (2**70000).to_bytes(8751, "little", signed=True))
    _refused(msgpack.packb(msgpack.ExtType(16, msgpack.packb([big, 3]))), "at most 65536 bits")


@pytest.mark.parametrize(
    "data, words",
    [
        (msgpack.packb({msgpack.ExtType(30, b"x"): {}}), ["must be empty"]),
        (msgpack.packb({msgpack.ExtType(31, b""): [1]}), ["map of its items"]),
        (msgpack.packb({msgpack.ExtType(32, b"os.system"): {}}), ["factory 'os.system'"]),
    ],
)
def test_container_markers_are_checked(data, words):
    _refused(data, *words)
    assert codec.decode(msgpack.packb({msgpack.ExtType(32, b"list"): {1: 2}})) == {1: 2}  # a valid defaultdict
