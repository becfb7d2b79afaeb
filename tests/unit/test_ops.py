"""Pure functions: reduce-op names and their dtypes (launcher detection: tests/launch/test_environment.py)."""

import pytest
import torch
import torch.distributed as dist

from polydist import ops
from polydist.backends import registry


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


# ------------------------------------------------------------ what each backend reduces (issue 29)

# Every (backend, op, dtype) a backend refuses although the op is defined on the dtype: gloo's "Invalid
# scalar type" (measured on torch 2.13), NCCL's missing bitwise ops and int16/unsigned types, torch's
# missing CPU min/max of wide unsigned ints under horovod's gathered reduction, float8 on the CPU groups.
REFUSED = [
    ("gloo", "SUM", torch.uint16), ("gloo", "MAX", torch.int16), ("gloo", "MIN", torch.uint32),
    ("gloo", "PRODUCT", torch.uint64), ("gloo", "AND", torch.int16), ("gloo", "SUM", torch.float8_e4m3fn),
    ("nccl", "AND", torch.int32), ("nccl", "XOR", torch.bool), ("nccl", "SUM", torch.int16),
    ("nccl", "MAX", torch.uint16),
    ("mpi4py", "SUM", torch.float8_e5m2), ("mpi4py", "SUM", torch.complex32),
    ("horovod", "MAX", torch.uint16), ("horovod", "MIN", torch.uint64), ("horovod", "SUM", torch.float8_e4m3fn),
]


@pytest.mark.parametrize("backend, op, dtype", REFUSED)
def test_backend_refusal_names_dtype_op_and_backend(backend, op, dtype):
    with pytest.raises(TypeError) as info:
        ops.check_backend(registry.get(backend).reductions, op, dtype)
    message = str(info.value)
    assert str(dtype) in message and op in message and f"the {backend} backend" in message


ACCEPTED = [
    ("gloo", "SUM", torch.int32), ("gloo", "MAX", torch.bfloat16), ("gloo", "XOR", torch.bool),
    ("gloo", "SUM", torch.complex64), ("nccl", "MAX", torch.float16), ("nccl", "SUM", torch.float8_e4m3fn),
    ("mpi4py", "MAX", torch.int16), ("mpi4py", "XOR", torch.uint64), ("horovod", "SUM", torch.uint16),
    ("horovod", "MAX", torch.int16), ("some_registered_backend", "SUM", torch.uint16),
]


@pytest.mark.parametrize("backend, op, dtype", ACCEPTED)
def test_backend_accepts(backend, op, dtype):
    ops.check_backend(registry.get(backend).reductions, op, dtype)


def test_a_table_checks_its_own_pairs_and_remembers_what_it_accepted():
    table = ops.Reductions("toy", frozenset({torch.float32}), refused={"MAX": frozenset({torch.float32})})
    ops.check_backend(table, "SUM", torch.float32)
    assert ("SUM", torch.float32) in table.accepted
    with pytest.raises(TypeError, match="toy backend cannot reduce dtype torch.float32 with op MAX"):
        ops.check_backend(table, "MAX", torch.float32)
    with pytest.raises(TypeError, match="it reduces float32"):
        ops.check_backend(table, "SUM", torch.int8)
    assert table.accepted == {("SUM", torch.float32)}  # a refusal is never remembered as accepted
    ops.check_backend(None, "MAX", torch.uint64)  # no table: nothing second-guessed


def test_there_is_one_table_per_backend_the_registry_entrys():
    assert not hasattr(ops, "_BY_BACKEND") and not hasattr(ops, "declare")
    assert registry.get("gloo").reductions.backend == "gloo"
