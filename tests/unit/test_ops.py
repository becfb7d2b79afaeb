"""Pure functions: reduce-op names and their dtypes (launcher detection: tests/launch/test_environment.py)."""

import pytest
import torch
import torch.distributed as dist

from polydist import ops


@pytest.mark.parametrize(
    "name, canonical",
    [("sum", "SUM"), ("Sum", "SUM"), ("product", "PRODUCT"), ("min", "MIN"), ("MAX", "MAX"), ("avg", "AVG"),
     ("and", "AND"), ("Or", "OR"), ("xor", "XOR"), (dist.ReduceOp.SUM, "SUM"), (dist.ReduceOp.BAND, "AND")],
)
def test_op_names_any_case(name, canonical):
    assert ops.resolve_op(name) == canonical


@pytest.mark.parametrize("bad", ["summ", "", "MEDIAN"])
def test_unknown_op_names_value(bad):
    with pytest.raises(ValueError, match=repr(bad)):
        ops.resolve_op(bad)


@pytest.mark.parametrize(
    "op, dtype", [("AND", torch.float32), ("XOR", torch.bfloat16), ("OR", torch.complex64), ("MAX", torch.complex64), ("AVG", torch.int64)]
)
def test_op_undefined_on_dtype(op, dtype):
    with pytest.raises(TypeError, match=str(dtype)):
        ops.check_op_dtype(op, dtype)


@pytest.mark.parametrize("op, dtype", [("AND", torch.int32), ("AND", torch.bool), ("AVG", torch.float16), ("MIN", torch.int8)])
def test_op_defined_on_dtype(op, dtype):
    ops.check_op_dtype(op, dtype)
