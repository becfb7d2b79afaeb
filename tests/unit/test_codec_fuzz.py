"""Property tests of the codec (Hypothesis): exact round trips, and every mutation of a valid payload either
decodes or raises ValueError, in a child process with a memory limit and a timeout.

Budget: the ``default`` profile runs in ``make test``; ``make fuzz`` runs the
``long`` profile (``--hypothesis-profile=long``); both are registered in
``tests/conftest.py``, where Hypothesis's plugin finds them at start-up.
"""

import os
import pathlib
import select
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

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
leaves = (
    hashables
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
    | st.sets(hashables, max_size=3),
    max_leaves=12,
)


def _same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and a.device == b.device and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    return a == b


@given(values)
def test_every_encodable_value_round_trips_exactly(value):
    assert _same(codec.decode(codec.encode(value)), value)


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
