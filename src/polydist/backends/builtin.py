"""torch's own backends' registry entries: gloo, nccl, and the names torch knows that never run here.

Declared like any other backend's (:func:`polydist.backends.declaration.declare`),
when :mod:`polydist.backends.registry` is imported, so they come first in
declaration order. Also the dtype sets other backends' reduction tables
build on (:data:`MPI_DTYPES`, :data:`UNSIGNED_WIDE`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import ops
from .declaration import SLOTS, Backend, declare
from .lifecycle import Lifecycle

__all__ = ["GLOO", "NCCL", "MPI_DTYPES", "UNSIGNED_WIDE"]

_FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
_COMPLEX = {torch.complex64, torch.complex128}  # SUM/AVG only (ops.check_op_dtype), as pairs of reals
UNSIGNED_WIDE = frozenset({torch.uint16, torch.uint32, torch.uint64})
# The dtypes MPI reduces (backends/mpi4py/_mpi.py REDUCE_TYPES): every integer width, floats, C bool, complex.
MPI_DTYPES = frozenset(_FLOATS | _COMPLEX | UNSIGNED_WIDE | {torch.int8, torch.uint8, torch.int16, torch.int32,
                                                              torch.int64, torch.bool})

# What torch's backends do beyond the defaults: gloo offers its host's address; nccl needs CUDA.
class _Gloo(Lifecycle):
    offers_host_address = True
    fault_tolerance = "torchft"

    def available(self) -> bool:
        return dist.is_gloo_available()


class _Nccl(Lifecycle):
    fault_tolerance = "torchft"

    def available(self) -> bool:
        return dist.is_nccl_available() and torch.cuda.is_available()

    def versions(self) -> dict:
        return {"nccl": ".".join(map(str, torch.cuda.nccl.version()))}


class _Absent(Lifecycle):
    def available(self) -> bool:
        return False


# gloo: ProcessGroupGloo instantiates its reductions for float, double, half, bfloat16, int8, uint8,
# int32, int64 and bool only (GENERATE_ALL_TYPES); int16 and uint16/32/64 fail inside gloo with
# "Invalid scalar type" under every op (measured on torch 2.13: all_reduce, reduce, reduce_scatter).
GLOO = declare(Backend(
    "gloo", builtin=True, default_for="cpu", lifecycle=_Gloo(), mover=SLOTS, timeout_settable=True, torch_recorder=True,
    reductions=ops.Reductions(
        "gloo", frozenset(_FLOATS | _COMPLEX | {torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool}),
        source="torch's ProcessGroupGloo.cpp (GENERATE_ALL_TYPES); measured on torch 2.13",
    ),
))
# nccl: torch's ncclDataType map (int8, uint8, int32, int64, float16/32/64, bfloat16, bool as uint8, the
# float8 types) and NCCL's ops (sum, prod, max, min, avg: no bitwise ops, torch refuses BAND/BOR/BXOR).
_FLOAT8 = {torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}
_NCCL_DTYPES = frozenset(_FLOATS | _COMPLEX | _FLOAT8 | {torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool})
NCCL = declare(Backend(
    "nccl", builtin=True, lifecycle=_Nccl(), device="cuda", default_for="cuda", reduce_keeps_input=True,
    native_avg=True, mover=SLOTS, timeout_settable=True, torch_recorder=True,
    reductions=ops.Reductions(
        "nccl", _NCCL_DTYPES, refused={op: _NCCL_DTYPES for op in ("AND", "OR", "XOR")},
        source="torch's ProcessGroupNCCL (ncclDataType, ncclOp); NCCL's docs (ncclDataType_t, ncclRedOp_t)",
    ),
))
# torch's other built-in names: never listed as available here (ucc, xccl: not in the wheels polydist supports).
for _name in ("ucc", "xccl", "undefined", "fake"):
    declare(Backend(_name, builtin=True, lifecycle=_Absent(), listed=False))
