"""Pure functions: reduce-op names and launcher detection (no processes)."""

import pytest
import torch
import torch.distributed as dist

from polydist import environment, ops


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


def test_detect_serial():
    info = environment.detect({})
    assert info.launcher == "serial" and info.rank == 0 and info.world_size == 1 and not info.is_distributed


def test_detect_torchrun():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
           "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"}
    info = environment.detect(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("torchrun", 3, 4, 1, 2)
    assert (info.node_rank, info.nnodes, info.master_addr, info.master_port) == (1, 2, "10.1.2.3", 29500)
    assert environment.detect({**env, "POLYDIST_LAUNCHER": "run"}).launcher == "polydist"


@pytest.mark.parametrize(
    "env, match",
    [({"RANK": "0"}, "WORLD_SIZE"), ({"WORLD_SIZE": "2"}, "RANK"), ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2"),
     ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x'"),
     ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=3")],
)
def test_detect_conflicts_name_the_variables(env, match):
    with pytest.raises(ValueError, match=match):
        environment.detect(env)
