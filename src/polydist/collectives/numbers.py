"""Reductions of Python values: numbers, and structures of numbers and tensors, exact and identical on every rank.

Values are reduced in Python on every rank, in rank order, after one
gather of their encodings (:mod:`~polydist.collectives.frames`): ints stay
exact ints of any size, floats are float64, and every rank gets the same
bits — unlike idist, which reduces numbers as float32 tensors.

A *structure* — a dict (``OrderedDict``, ``Counter``, ``defaultdict`` too), a
list, a tuple, a named tuple or an allowed dataclass, nested, whose leaves are
numbers and tensors — is reduced leaf by leaf in that same one gather (what
Lightning's ``log_dict`` and ignite's metrics do by hand, one collective per
key). Since every rank then holds every rank's value, ranks whose structures
differ (other keys, types, lengths, tensor shapes) all raise the same
:class:`~polydist.errors.CollectiveMismatchError` naming the ranks and the
key: none hangs. A value that is not such a structure is refused before its
bytes are sent, in-band, so the other ranks raise too.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import operator
import reprlib
from typing import Any, Callable, Optional

import numpy as np
import torch

from .. import codec
from ..errors import CollectiveMismatchError
from ..groups import Resolved
from ..ops import check_op_dtype
from .frames import Failure, Payload, all_gather_bytes, decode_all, encode, gather_bytes

__all__ = ["check_number", "check_value", "is_structure", "reduce_numbers", "reduce_values", "all_reduce_value", "reduce_value"]

_BITWISE = {"AND": operator.and_, "OR": operator.or_, "XOR": operator.xor}
_FOLD = {"SUM": operator.add, "PRODUCT": operator.mul, "MIN": min, "MAX": max, **_BITWISE}
_TENSOR_FOLD = {
    "SUM": torch.add, "AVG": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum, "MAX": torch.maximum,
    "AND": torch.bitwise_and, "OR": torch.bitwise_or, "XOR": torch.bitwise_xor,
}


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
            f"a Python number (bool, int, float, complex), or a dict, list, tuple, named tuple or dataclass of "
            f"numbers and tensors, got {type(x).__name__}: {reprlib.repr(x)}"
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


# ---------------------------------------------------------------- structures


def is_structure(x: Any) -> bool:
    """Whether ``x`` is a container :func:`all_reduce_value` reduces leaf by leaf (not checked inside)."""
    return isinstance(x, (dict, list, tuple)) or (dataclasses.is_dataclass(x) and not isinstance(x, type))


def _children(x: Any) -> Optional[list]:
    """``[(key, child)]`` of a structure, None for a leaf."""
    if isinstance(x, dict):
        return list(x.items())
    if isinstance(x, (list, tuple)):
        return list(enumerate(x))
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [(f.name, getattr(x, f.name)) for f in dataclasses.fields(x) if f.init]
    return None


def _rebuild(like: Any, values: list) -> Any:
    """A structure of ``like``'s type and keys holding ``values``."""
    if isinstance(like, dict):
        out = like.copy()  # keeps the type, and a defaultdict's factory
        for k, v in zip(like, values):
            out[k] = v
        return out
    if isinstance(like, tuple) and hasattr(type(like), "_fields"):  # a named tuple
        return type(like)(*values)
    if isinstance(like, (list, tuple)):  # torch.Size too
        return type(like)(values)
    return dataclasses.replace(like, **{f.name: v for f, v in zip((f for f in dataclasses.fields(like) if f.init), values)})


def _at(path: str, key: Any) -> str:
    return f"{path}[{key!r}]" if path else f"[{key!r}]"


def check_value(x: Any, op: str, path: str = "") -> Any:
    """``x`` checked for reduce op ``op``: a number (as :func:`check_number`), a dense tensor the op is defined
    on, or a structure of them (:func:`is_structure`); numbers come back as Python scalars.

    Raises ``TypeError`` naming the key path (``['loss']``) and the type of the first bad leaf.
    """
    kids = _children(x)
    if kids is not None:
        return _rebuild(x, [check_value(v, op, _at(path, k)) for k, v in kids])
    try:
        if isinstance(x, torch.Tensor):
            codec.check_dense(x, "all_reduce")
            if op != "AVG":  # AVG of an integer tensor inside a value is a new float tensor, like an int's AVG
                check_op_dtype(op, x.dtype)
            elif x.dtype == torch.bool:
                raise TypeError("reduce op AVG is not defined on bool tensors")
            return x
        return check_number(x, op)
    except TypeError as exc:
        if not path:
            raise
        raise TypeError(f"at {path}: {exc}") from None


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor {codec.dtype_name(x.dtype)}{list(x.shape)}"
    kids = _children(x)
    if kids is not None:
        return f"{type(x).__name__} with keys {[k for k, _ in kids]}" if isinstance(x, dict) else f"{type(x).__name__} of {len(kids)}"
    return type(x).__name__


def _mismatch(values: list, ranks: list, path: str, what: str, name: str) -> CollectiveMismatchError:
    calls = {r: _describe(v) for r, v in zip(ranks, values)}
    shown = "; ".join(f"rank {r}: {d}" for r, d in calls.items())
    where = f"at {path}" if path else "at the top level"
    return CollectiveMismatchError(f"{name}: ranks passed values that differ in {what} {where}: {shown}", calls)


def _leaf_kind(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return ("tensor", x.dtype, tuple(x.shape))
    return "number" if isinstance(x, (bool, int, float, complex)) else type(x)


def reduce_values(values: list, op: str, ranks: list, name: str = "all_reduce", path: str = "") -> Any:
    """Fold ``values`` (one per rank, checked) with ``op`` leaf by leaf, in rank order.

    Raises ``CollectiveMismatchError`` naming the ranks and the key path where
    their structures (types, keys, lengths, tensor dtypes and shapes) differ.
    """
    first = values[0]
    kids = _children(first)
    if kids is None:
        kinds = {_leaf_kind(v) for v in values}
        if len(kinds) > 1:
            raise _mismatch(values, ranks, path, "type, dtype or shape", name)
        if not isinstance(first, torch.Tensor):
            return reduce_numbers(values, op)
        total = functools.reduce(_TENSOR_FOLD[op], values)
        return total / len(values) if op == "AVG" else total
    if any(type(v) is not type(first) for v in values):
        raise _mismatch(values, ranks, path, "type", name)
    if isinstance(first, dict):  # the same keys, in any order
        if any(v.keys() != first.keys() for v in values):
            raise _mismatch(values, ranks, path, "keys", name)
        leaves = [[v[k] for v in values] for k in first]
    else:  # a dataclass's fields are its type's; a list's or tuple's items by position
        keyed = [_children(v) for v in values]
        if any(len(other) != len(kids) for other in keyed):
            raise _mismatch(values, ranks, path, "length", name)
        leaves = [[other[i][1] for other in keyed] for i in range(len(kids))]
    out = [reduce_values(column, op, ranks, name, _at(path, key)) for (key, _), column in zip(kids, leaves)]
    return _rebuild(first, out)


def _checked(x: Any, op: str) -> Payload:
    """The encoding of ``x`` after :func:`check_value`, or a failure the other ranks learn of."""
    try:
        x = check_value(x, op)
    except (TypeError, RecursionError) as exc:
        return Failure(exc)
    return encode(x)


def _fold(rows: list[bytes], op: str, res: Resolved, what: str) -> Any:
    values = decode_all(rows, res, what)
    try:  # each sender checked its own value; this guards against one that did not
        return reduce_values([check_value(v, op) for v in values], op, list(res.ranks), what)
    except RecursionError:
        raise ValueError(f"{what}: a rank sent a value nested too deep to reduce") from None


def all_reduce_value(x: Any, op: str, res: Resolved) -> Any:
    """Reduce a Python number or structure across the group exactly (see module docstring)."""
    return _fold(all_gather_bytes(_checked(x, op), res, "all_reduce"), op, res, "all_reduce")


def reduce_value(x: Any, op: str, dst: int, res: Resolved) -> Any:
    """Like :func:`all_reduce_value`, with the result on ``dst`` only; other ranks get ``x`` back."""
    rows = gather_bytes(_checked(x, op), dst, res, "reduce")
    return x if rows is None else _fold(rows, op, res, "reduce")
