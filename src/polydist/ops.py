"""Reduce-op names → ``torch.distributed.ReduceOp``, which dtypes each op accepts, and what each backend reduces.

Two tables: :func:`check_op_dtype` says where an op is defined at all (AND on
floats is not), on any backend; :class:`Reductions` declares, once per
backend, the dtypes and (op, dtype) pairs that backend can reduce, so a
combination it would fail inside (gloo's ``Invalid scalar type`` for uint16)
is a ``TypeError`` naming dtype, op and backend before anything is sent
(:func:`check_backend`, called by the pipeline once the group is known).
Each backend's table is a trait of its entry in
:mod:`polydist.backends.registry` and is read from there: there is no second,
name-keyed copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

import torch
import torch.distributed as dist

__all__ = ["OpLike", "SPELLINGS", "resolve_op", "to_reduce_op", "check_op_dtype", "op_for", "Reductions", "mark_suspects", "check_backend"]

OpLike = Union[str, "dist.ReduceOp", "dist.ReduceOp.RedOpType"]

# Every spelling of each op, canonical name first: idist's names (SUM, PRODUCT, MIN, MAX, AND, OR, and XOR by
# analogy) and AVG; then torch.distributed.ReduceOp's member names (BAND, BOR, BXOR: op="BAND" ports
# ReduceOp.BAND as written), NumPy's and MPI's PROD, and the "mean" of Lightning Fabric's and Accelerate's
# reduce_op/reduction, and the AVERAGE of idist on Horovod (hvd.Average). Any case.
SPELLINGS = {
    "SUM": ("SUM",),
    "PRODUCT": ("PRODUCT", "PROD"),
    "MIN": ("MIN",),
    "MAX": ("MAX",),
    "AVG": ("AVG", "MEAN", "AVERAGE"),
    "AND": ("AND", "BAND"),
    "OR": ("OR", "BOR"),
    "XOR": ("XOR", "BXOR"),
}
_REDUCE_OPS = {
    "SUM": dist.ReduceOp.SUM,
    "PRODUCT": dist.ReduceOp.PRODUCT,
    "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX,
    "AVG": dist.ReduceOp.AVG,
    "AND": dist.ReduceOp.BAND,
    "OR": dist.ReduceOp.BOR,
    "XOR": dist.ReduceOp.BXOR,
}
_NAMES = {spelling: _REDUCE_OPS[name] for name, spellings in SPELLINGS.items() for spelling in spellings}
# Canonical names, as the design reference spells them.
_CANONICAL = {op: name for name, op in _REDUCE_OPS.items()}
_EXPECTED = ", ".join(repr(s[0]) + (f" (or {', '.join(map(repr, s[1:]))})" if s[1:] else "") for s in SPELLINGS.values())


# Every collective resolves its op: remember the spellings seen (a handful) and the
# (op, dtype) pairs already accepted, so the hot path is one dict lookup each.
_SEEN: dict[str, str] = {}
_ACCEPTED: set[tuple[str, torch.dtype]] = set()
_CHECKED: dict[tuple, str] = {}  # (op as passed, dtype) -> canonical name, already checked


def resolve_op(op: OpLike) -> str:
    """Return the canonical op name ("SUM", ..., "XOR") for ``op``.

    ``op`` is a ``torch.distributed.ReduceOp`` or a name in any case ("sum",
    "Max", "band"): SUM, PRODUCT (or PROD), MIN, MAX, AVG (or MEAN, AVERAGE),
    AND (or BAND), OR (or BOR), XOR (or BXOR); see :data:`SPELLINGS`. Raises
    ``ValueError`` naming ``op`` and every accepted name when it is neither a
    known name nor a supported ReduceOp.
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
                f"Unsupported reduction operation: {op!r}; expected one of {_EXPECTED} (any case), "
                "or a torch.distributed.ReduceOp"
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


# ---------------------------------------------------------------- what each backend reduces


@dataclass(frozen=True)
class Reductions:
    """What one backend can reduce: a trait of its registry entry (``reductions``), checked by :func:`check_backend`.

    Attributes:
        backend: the backend's name, as ``torch.distributed.get_backend`` gives it.
        dtypes: the dtypes it reduces under every op :func:`check_op_dtype` allows.
        refused: ``{op name: dtypes}`` refused under that op although in ``dtypes``.
        source: where the table comes from (the backend's sources, docs, a measurement).
    """

    backend: str
    dtypes: frozenset
    refused: dict = field(default_factory=dict)
    source: str = ""
    accepted: set = field(default_factory=set, compare=False, repr=False)  # (op, dtype) pairs already checked

    def why_not(self, name: str, dtype: torch.dtype) -> Optional[str]:
        """None when the backend reduces ``dtype`` under op ``name``; else the reason, for a ``TypeError``."""
        if dtype not in self.dtypes:
            listed = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.dtypes))
            return f"the {self.backend} backend cannot reduce dtype {dtype} (op {name}); it reduces {listed}"
        if dtype in self.refused.get(name, ()):
            return f"the {self.backend} backend cannot reduce dtype {dtype} with op {name}"
        return None


_ALL_DTYPES = tuple(d for d in vars(torch).values() if isinstance(d, torch.dtype))
# (op, dtype) pairs that some declared backend refuses: only these need the group's backend checked, so
# the hot path (float32 SUM, say) pays one set lookup (see collectives/reduce.py's all_reduce).
SUSPECT: set[tuple[str, torch.dtype]] = set()


def mark_suspects(table: Reductions) -> Reductions:
    """Add the (op, dtype) pairs ``table`` refuses to :data:`SUSPECT`; returns ``table``.

    Called by :func:`polydist.backends.declaration.declare` for every entry with a table.
    """
    SUSPECT.update((name, d) for name in _CANONICAL.values() for d in _ALL_DTYPES if table.why_not(name, d))
    return table


def check_backend(table: Optional[Reductions], name: str, dtype: torch.dtype) -> None:
    """Raise ``TypeError`` naming dtype, op and backend when the backend of ``table`` cannot reduce ``dtype``
    under op ``name``.

    ``table`` is the group's registry entry's ``reductions``; None (a backend without a declared table) is
    not second-guessed: its own errors stand.
    """
    if table is None or (name, dtype) in table.accepted:
        return
    why = table.why_not(name, dtype)
    if why is not None:
        raise TypeError(f"{why}; convert the tensor to a dtype it reduces, e.g. int32, int64 or float32")
    table.accepted.add((name, dtype))
