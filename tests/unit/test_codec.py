"""The safe codec: exact round trips, refusal of unsupported types, no code on decode."""

import pathlib
import pickle

import msgpack
import numpy as np
import pytest
import torch

from polydist import codec

VALUES = [
    None,
    True,
    0,
    -1,
    2**53 + 1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    2**200 + 7,
    -(2**130),
    1.5,
    float("inf"),
    1 / 3,
    3 + 4j,
    "",
    "ascii",
    "héllo wörld — 日本語 🎉",
    b"\x00\xff bytes",
    [1, [2, [3]]],
    (1, "two", (3.0,)),
    {"a": 1, 2: "b", (1, 2): [3]},
    {1, 2, 3},
    frozenset({"x"}),
    pathlib.Path("/tmp/some/file.txt"),
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_round_trip_exact(value):
    out = codec.decode(codec.encode(value))
    assert out == value and type(out) is type(value)


def test_bytearray_arrives_as_bytes():
    assert codec.decode(codec.encode(bytearray(b"ba"))) == b"ba"


def test_float_is_float64_exact():
    x = 0.1 + 0.2
    assert codec.decode(codec.encode(x)) == x
    assert codec.decode(codec.encode(float(16777217))) == 16777217.0


def test_tuple_stays_tuple_nested():
    out = codec.decode(codec.encode({"k": [(1, (2,))]}))
    assert isinstance(out["k"][0], tuple) and isinstance(out["k"][0][1], tuple)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.bool, torch.complex64])
def test_tensor_dtype_shape_kept(dtype):
    t = (torch.arange(24).reshape(2, 3, 4) % 5).to(dtype)
    out = codec.decode(codec.encode(t))
    assert out.dtype == dtype and out.shape == t.shape and torch.equal(out, t)


def test_tensor_non_contiguous_empty_and_scalar():
    t = torch.arange(12.0).reshape(3, 4).t()
    assert torch.equal(codec.decode(codec.encode(t)), t)
    e = torch.empty(0, 5)
    assert codec.decode(codec.encode(e)).shape == (0, 5)
    s = torch.tensor(7)
    out = codec.decode(codec.encode(s))
    assert out.shape == () and out.item() == 7


def test_tensor_moves_to_decoder_device():
    out = codec.decode(codec.encode([torch.ones(2)]), device=torch.device("meta"))
    assert out[0].device.type == "meta"


def test_numpy_array_and_scalar():
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    out = codec.decode(codec.encode(a))
    assert out.dtype == np.int16 and np.array_equal(out, a)
    s = np.float32(1.25)
    out = codec.decode(codec.encode(s))
    assert out == s and out.dtype == np.float32


class Custom:
    pass


@pytest.mark.parametrize(
    "value, name",
    [(Custom(), "Custom"), ([1, {"x": Custom()}], "Custom"), (object(), "object"), (np.array([object()]), "object")],
)
def test_unsupported_type_raises_type_error_naming_it(value, name):
    with pytest.raises(TypeError, match=name):
        codec.encode(value)


def test_decode_never_unpickles():
    payload = pickle.dumps(Custom())
    with pytest.raises(Exception) as info:
        codec.decode(payload)
    assert not isinstance(info.value, TypeError) or "Custom" not in str(info.value)


def test_decode_rejects_unknown_extension_and_dtype():
    with pytest.raises(ValueError, match="extension type code 99"):
        codec.decode(msgpack.packb(msgpack.ExtType(99, b"")))
    bad = msgpack.ExtType(7, msgpack.packb(["Tensor", [1], b"\x00"], use_bin_type=True))
    with pytest.raises(ValueError, match="unknown torch dtype 'Tensor'"):
        codec.decode(msgpack.packb(bad))
