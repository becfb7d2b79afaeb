"""mpi4py on demand, and what the MPI process group is built from (internal).

MPI datatypes and ops for torch dtypes and reduce ops, and tensors as MPI
buffers by address (the work handles live in :mod:`~polydist.backends.work`,
the lanes that run them in :mod:`~polydist.backends.lane`). ``mpi4py.MPI`` is
imported on the first call of :func:`mpi` only, because importing it
initializes MPI.
"""

from __future__ import annotations

import atexit
import itertools
import importlib.util
from typing import Any, Optional, Sequence

import torch

from ...ops import check_op_dtype, resolve_op
from ..lane import stop_threads

BACKEND_NAME = "mpi4py"

MPI: Any = None  # the mpi4py.MPI module, once imported
REDUCE_TYPES: dict = {}  # torch dtype -> MPI datatype for reductions
_OPS: dict = {}  # canonical op name -> MPI.Op (numeric dtypes)
_BOOL_OPS: dict = {}  # canonical op name -> MPI.Op (bool: logical ops)
PLANS: dict = {}  # (dtype, op name or RedOpType value) -> (MPI datatype, MPI.Op, divide for AVG, op name), learnt


def available() -> bool:
    """True when mpi4py is installed (checked without importing it, so without starting MPI)."""
    return importlib.util.find_spec("mpi4py") is not None


def mpi() -> Any:
    """The ``mpi4py.MPI`` module, imported (and MPI initialized) on first call."""
    global MPI
    if MPI is None:
        from mpi4py import MPI as module

        REDUCE_TYPES.update(
            {
                torch.float32: module.FLOAT,
                torch.float64: module.DOUBLE,
                torch.int8: module.INT8_T,
                torch.uint8: module.UINT8_T,
                torch.int16: module.INT16_T,
                torch.uint16: module.UINT16_T,
                torch.int32: module.INT32_T,
                torch.uint32: module.UINT32_T,
                torch.int64: module.INT64_T,
                torch.uint64: module.UINT64_T,
                torch.bool: module.C_BOOL,
                torch.complex64: module.C_FLOAT_COMPLEX,
                torch.complex128: module.C_DOUBLE_COMPLEX,
            }
        )
        _OPS.update(
            SUM=module.SUM, AVG=module.SUM, PRODUCT=module.PROD, MIN=module.MIN, MAX=module.MAX, AND=module.BAND, OR=module.BOR, XOR=module.BXOR
        )
        # MPI allows only logical ops on C_BOOL; these match torch's bool results.
        _BOOL_OPS.update(
            SUM=module.LOR, MAX=module.LOR, OR=module.LOR, PRODUCT=module.LAND, MIN=module.LAND, AND=module.LAND, XOR=module.LXOR
        )
        atexit.register(stop_threads)  # after mpi4py's import, so it runs before MPI_Finalize
        MPI = module
    return MPI


# ---------------------------------------------------------------- buffers


def raw(t: torch.Tensor) -> list:
    """``t``'s memory as an MPI byte buffer (``t`` must be contiguous and on the CPU)."""
    return [MPI.buffer.fromaddress(t.data_ptr(), t.nbytes), MPI.BYTE]


def typed(t: torch.Tensor) -> list:
    """``t``'s memory as a typed MPI buffer, for reductions."""
    return [MPI.buffer.fromaddress(t.data_ptr(), t.nbytes), REDUCE_TYPES[t.dtype]]


_BUFFERS: dict = {}  # (address, bytes, torch dtype) -> buffer spec; see cached_buffer


def cached_buffer(t: torch.Tensor, datatype: Any) -> list:
    """``[buffer, datatype]`` for contiguous CPU ``t``, reused across calls on the same memory.

    Making the buffer object costs about as much as a small MPI call, and
    training loops reduce the same tensors again and again. A cached spec is
    used only for a tensor at the very same address and size, so the memory
    it names belongs to that tensor. Bounded: cleared past 256 entries.
    """
    key = (t.data_ptr(), t.nbytes, t.dtype)
    spec = _BUFFERS.get(key)
    if spec is None:
        if len(_BUFFERS) >= 256:
            _BUFFERS.clear()
        spec = _BUFFERS[key] = [MPI.buffer.fromaddress(key[0], key[1]), datatype]
    return spec


def reduce_setup(t: torch.Tensor, op: Any) -> tuple[str, Any, Optional[torch.dtype]]:
    """(op name, MPI op, wide dtype or None) for reducing ``t``; errors name the bad op or dtype."""
    name = resolve_op(op)
    check_op_dtype(name, t.dtype)  # the one op x dtype table, polydist's collectives use it too
    if t.dtype == torch.bool:
        return name, _BOOL_OPS[name], None
    if t.dtype in (torch.float16, torch.bfloat16):
        return name, _OPS[name], torch.float32
    if t.dtype not in REDUCE_TYPES:
        raise TypeError(f"the {BACKEND_NAME} backend cannot reduce dtype {t.dtype}")
    return name, _OPS[name], None


def address(t: torch.Tensor) -> Any:
    """``t``'s memory as an MPI buffer (``t`` contiguous, on the CPU)."""
    return MPI.buffer.fromaddress(t.data_ptr(), t.nbytes)


def offsets_of(counts: Sequence[int]) -> list[int]:
    """Displacements of ``counts`` laid back to back."""
    return list(itertools.accumulate(counts, initial=0))[:-1]


def counted(t: torch.Tensor, counts: list[int]) -> list:
    return [address(t), (counts, offsets_of(counts)), MPI.BYTE]


