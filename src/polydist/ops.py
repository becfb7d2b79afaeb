"""Reduce-op names → ``torch.distributed.ReduceOp``, and which dtypes each op accepts."""

from __future__ import annotations

from typing import Union

import torch
import torch.distributed as dist

__all__ = ["OpLike", "resolve_op", "to_reduce_op", "check_op_dtype", "op_for"]

OpLike = Union[str, "dist.ReduceOp", "dist.ReduceOp.RedOpType"]

_NAMES = {
    "SUM": dist.ReduceOp.SUM,
    "PRODUCT": dist.ReduceOp.PRODUCT,
    "PROD": dist.ReduceOp.PRODUCT,
    "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX,
    "AVG": dist.ReduceOp.AVG,
    "MEAN": dist.ReduceOp.AVG,
    "AND": dist.ReduceOp.BAND,
    "BAND": dist.ReduceOp.BAND,
    "OR": dist.ReduceOp.BOR,
    "BOR": dist.ReduceOp.BOR,
    "XOR": dist.ReduceOp.BXOR,
    "BXOR": dist.ReduceOp.BXOR,
}
# Canonical names, as the design reference spells them.
_CANONICAL = {
    dist.ReduceOp.SUM: "SUM",
    dist.ReduceOp.PRODUCT: "PRODUCT",
    dist.ReduceOp.MIN: "MIN",
    dist.ReduceOp.MAX: "MAX",
    dist.ReduceOp.AVG: "AVG",
    dist.ReduceOp.BAND: "AND",
    dist.ReduceOp.BOR: "OR",
    dist.ReduceOp.BXOR: "XOR",
}


# Every collective resolves its op: remember the spellings seen (a handful) and the
# (op, dtype) pairs already accepted, so the hot path is one dict lookup each.
_SEEN: dict[str, str] = {}
_ACCEPTED: set[tuple[str, torch.dtype]] = set()
_CHECKED: dict[tuple, str] = {}  # (op as passed, dtype) -> canonical name, already checked


def resolve_op(op: OpLike) -> str:
    """Return the canonical op name ("SUM", ..., "XOR") for ``op``.

    ``op`` is a name in any case ("sum", "Max", "and") or a
    ``torch.distributed.ReduceOp``. Raises ``ValueError`` naming ``op`` when it
    is neither a known name nor a supported ReduceOp.
    """
    if isinstance(op, str):
        known = _SEEN.get(op)
        if known is not None:
            return known
        try:
            _SEEN[op] = _CANONICAL[_NAMES[op.upper()]]
            return _SEEN[op]
        except KeyError:
            raise ValueError(  # ignite.distributed's wording first
                f"Unsupported reduction operation: {op!r}; expected one of "
                "'SUM', 'PRODUCT', 'MIN', 'MAX', 'AVG', 'AND', 'OR', 'XOR' (any case)"
            ) from None
    red_type = getattr(op, "op", op)  # a ReduceOp instance wraps its RedOpType
    for known, name in _CANONICAL.items():
        if red_type == known:
            return name
    raise ValueError(f"unsupported reduce op {op!r}")


def op_for(op: OpLike, dtype: torch.dtype) -> str:
    """:func:`resolve_op` and :func:`check_op_dtype` in one: the canonical name of ``op`` on ``dtype``.

    Raises what they raise. Every tensor reduction calls it, so the answer
    for an (op, dtype) pair seen before is one dict lookup.
    """
    try:
        return _CHECKED[op, dtype]
    except (KeyError, TypeError):  # not seen yet, or an op object that cannot be a key
        name = resolve_op(op)
        check_op_dtype(name, dtype)
        try:
            _CHECKED[op, dtype] = name
        except TypeError:
            pass
        return name


def to_reduce_op(name: str) -> dist.ReduceOp:
    """The ``torch.distributed.ReduceOp`` for a canonical op name."""
    return _NAMES[name]


def check_op_dtype(name: str, dtype: torch.dtype) -> None:
    """Raise ``TypeError`` when reduce op ``name`` is undefined on ``dtype``.

    AND/OR/XOR need bool or integer tensors; MIN/MAX/PRODUCT are undefined on
    complex tensors; AVG needs a floating-point or complex dtype (an integer
    average cannot be written back in place).
    """
    if (name, dtype) in _ACCEPTED:
        return
    floating = dtype.is_floating_point
    complex_ = dtype.is_complex
    if name in ("AND", "OR", "XOR") and (floating or complex_):
        raise TypeError(f"reduce op {name} is defined on bool and integer tensors only, got dtype {dtype}")
    if name in ("MIN", "MAX", "PRODUCT") and complex_:
        raise TypeError(f"reduce op {name} is not defined on complex dtype {dtype}")
    if name == "AVG" and not (floating or complex_):
        raise TypeError(
            f"reduce op AVG needs a floating-point tensor to hold the result in place, got dtype {dtype}; "
            "use op='SUM' and divide, or convert the tensor to a floating dtype"
        )
    _ACCEPTED.add((name, dtype))
