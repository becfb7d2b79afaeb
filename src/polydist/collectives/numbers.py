"""Reductions of Python numbers: exact, identical on every rank.

Numbers are reduced in Python on every rank, in rank order, after one
gather of their encodings (:mod:`~polydist.collectives.frames`): ints stay
exact ints of any size, floats are float64, and every rank gets the same
bits — unlike idist, which reduces numbers as float32 tensors.
"""

from __future__ import annotations

import functools
import numbers
import operator
import reprlib
from typing import Any

import numpy as np

from .. import codec
from ..groups import Resolved
from .frames import all_gather_bytes, decode_all, gather_bytes

__all__ = ["check_number", "reduce_numbers", "all_reduce_value", "reduce_value"]

_BITWISE = {"AND": operator.and_, "OR": operator.or_, "XOR": operator.xor}
_FOLD = {"SUM": operator.add, "PRODUCT": operator.mul, "MIN": min, "MAX": max, **_BITWISE}


def check_number(x: Any, op: str) -> Any:
    """Validate a Python number for reduce op ``op``; return it as a Python scalar.

    NumPy scalars become their Python equivalents (``.item()``).

    Raises:
        TypeError: ``x`` is not a bool/int/float/complex (naming its type), or
            ``op`` is undefined on it (AND/OR/XOR on float or complex,
            MIN/MAX/PRODUCT on complex).
    """
    if isinstance(x, np.generic) and isinstance(x, (np.number, np.bool_)):
        x = x.item()
    if not isinstance(x, numbers.Number) or not isinstance(x, (bool, int, float, complex)):
        raise TypeError(  # ignite.distributed's wording first
            f"Unhandled input type {type(x).__name__}: reductions take a tensor, a list of tensors, "
            f"or a Python number (bool, int, float, complex), got {type(x).__name__}: {reprlib.repr(x)}"
        )
    if op in _BITWISE and not isinstance(x, int):  # bool is an int
        raise TypeError(f"reduce op {op} is defined on bool and int values only, got {type(x).__name__} {x!r}")
    if op in ("MIN", "MAX", "PRODUCT") and isinstance(x, complex):
        raise TypeError(f"reduce op {op} is not defined on complex value {x!r}")
    return x


def reduce_numbers(values: list, op: str) -> Any:
    """Fold ``values`` (already checked) with ``op``, left to right, in Python."""
    if op == "AVG":
        return functools.reduce(operator.add, values) / len(values)
    return functools.reduce(_FOLD[op], values)


def _decode_numbers(rows: list[bytes], op: str, res: Resolved, what: str) -> Any:
    return reduce_numbers([check_number(v, op) for v in decode_all(rows, res, what)], op)


def all_reduce_value(x: Any, op: str, res: Resolved) -> Any:
    """Reduce a checked Python number across the group exactly (see module docstring)."""
    return _decode_numbers(all_gather_bytes(codec.encode(x), res, "all_reduce"), op, res, "all_reduce")


def reduce_value(x: Any, op: str, dst: int, res: Resolved) -> Any:
    """Like :func:`all_reduce_value`, with the result on ``dst`` only; other ranks get ``x`` back."""
    rows = gather_bytes(codec.encode(x), dst, res, "reduce")
    return x if rows is None else _decode_numbers(rows, op, res, "reduce")
