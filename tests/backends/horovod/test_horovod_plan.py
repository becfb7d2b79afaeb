"""The horovod backend's reduction plan and its rank-order reduction, without Horovod (pure torch)."""

from __future__ import annotations

import functools
import operator

import pytest
import torch

from polydist.backends.horovod.process_group import _reduce_plan
from polydist.backends.tensors import reduce_rows as _reduce_rows

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]  # fmt: skip


def test_plan_sends_what_horovod_reduces_to_it_and_gathers_the_rest():
    assert _reduce_plan(torch.ones(2), "SUM") == ("SUM", "native")
    assert _reduce_plan(torch.ones(2, dtype=torch.int64), "max") == ("MAX", "native")
    assert _reduce_plan(torch.ones(2, dtype=torch.float16), "AVG") == ("AVG", "native")
    assert _reduce_plan(torch.ones(2, dtype=torch.bfloat16), "SUM") == ("SUM", "wide")
    assert _reduce_plan(torch.ones(2, dtype=torch.complex64), "AVG") == ("AVG", "real")
    assert _reduce_plan(torch.ones(2, dtype=torch.int8), "SUM") == ("SUM", "gathered")  # Horovod has no int8 reduction
    assert _reduce_plan(torch.ones(2, dtype=torch.int32), "XOR") == ("XOR", "gathered")  # nor bitwise ops
    assert _reduce_plan(torch.ones(2, dtype=torch.bool), "OR") == ("OR", "gathered")


def test_plan_rejects_bad_ops_and_devices_before_anything_is_sent():
    with pytest.raises(ValueError, match="'median'"):
        _reduce_plan(torch.ones(2), "median")
    with pytest.raises(TypeError, match="AND"):
        _reduce_plan(torch.ones(2), "AND")
    with pytest.raises(TypeError, match="AVG"):
        _reduce_plan(torch.ones(2, dtype=torch.int32), "AVG")
    with pytest.raises(ValueError, match="meta"):
        _reduce_plan(torch.ones(2, device="meta"), "SUM")


_PY_OPS = {"SUM": operator.add, "PRODUCT": operator.mul, "MIN": min, "MAX": max,
           "AND": operator.and_, "OR": operator.or_, "XOR": operator.xor}  # fmt: skip


def _wrap(value: int, dtype: torch.dtype) -> int:
    """``value`` as the integer dtype holds it (two's complement wrap-around), as gloo's integer sums do."""
    bits = torch.iinfo(dtype).bits
    value &= (1 << bits) - 1
    return value - (1 << bits) if torch.iinfo(dtype).min < 0 and value >= 1 << (bits - 1) else value


@pytest.mark.parametrize("name", sorted(_PY_OPS))
@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32])
def test_gathered_rows_reduce_like_python_in_rank_order(name, dtype):
    if dtype == torch.bool:
        rows = [[True, False, True, False], [True, True, False, False], [True, False, False, True]]
    else:
        rows = [[100, -3, 7, 0], [100, 5, -7, 1], [3, 2, 1, -1]] if torch.iinfo(dtype).min < 0 else [[200, 3, 7, 0], [100, 5, 9, 1], [3, 2, 1, 4]]
    got = _reduce_rows(torch.tensor(rows, dtype=dtype), name, dtype)
    assert got.dtype == dtype
    for column, value in enumerate(got.tolist()):
        expected = functools.reduce(_PY_OPS[name], [int(r[column]) for r in rows])
        expected = bool(expected) if dtype == torch.bool else _wrap(expected, dtype)
        assert value == expected, (name, dtype, column)
