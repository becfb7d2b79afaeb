"""Collectives on Python values (numbers, strings, objects) over uint8 tensors.

Values are encoded by :mod:`polydist.codec` and travel as bytes. Each transfer
sends a fixed 256-byte slot first — an 8-byte length and, when it fits, the
payload itself — so a small value costs one collective round; a larger one
costs a second round sized to the largest payload. Numbers are reduced in
Python on every rank, in rank order, after one all-gather: ints stay exact
ints of any size, floats are float64, and every rank gets the same bits.
"""

from __future__ import annotations

import functools
import numbers
import operator
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

from . import codec
from ._compat import all_gather_single
from .context import device
from .groups import Resolved

__all__ = [
    "comm_device",
    "all_gather_bytes",
    "broadcast_bytes",
    "check_number",
    "reduce_numbers",
    "all_gather_value",
    "broadcast_value",
    "all_reduce_value",
]

_SLOT = 256
_HEADER = 8  # little-endian int64 payload length
_INLINE = _SLOT - _HEADER


def comm_device(res: Resolved) -> torch.device:
    """Device that byte buffers must live on for this group's backend."""
    if str(dist.get_backend(res.pg)) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _to_tensor(data: bytes, size: int, device: torch.device) -> torch.Tensor:
    buf = bytearray(size)
    buf[: len(data)] = data
    return torch.frombuffer(buf, dtype=torch.uint8).to(device) if size else torch.empty(0, dtype=torch.uint8)


def _slot(payload: Optional[bytes]) -> bytearray:
    slot = bytearray(_SLOT)
    if payload is not None:
        slot[:_HEADER] = len(payload).to_bytes(_HEADER, "little")
        if len(payload) <= _INLINE:
            slot[_HEADER : _HEADER + len(payload)] = payload
    return slot


def _length(slot: np.ndarray) -> int:
    return int.from_bytes(slot[:_HEADER].tobytes(), "little")


def all_gather_bytes(payload: bytes, res: Resolved) -> list[bytes]:
    """Every group member's ``payload``, in group-rank order (one round if all are ≤ 248 B)."""
    dev = comm_device(res)
    out = torch.empty(res.size * _SLOT, dtype=torch.uint8, device=dev)
    all_gather_single(out, _to_tensor(bytes(_slot(payload)), _SLOT, dev), group=res.pg)
    slots = out.cpu().numpy().reshape(res.size, _SLOT)
    lengths = [_length(s) for s in slots]
    if max(lengths) <= _INLINE:
        return [slots[i, _HEADER : _HEADER + n].tobytes() for i, n in enumerate(lengths)]
    width = max(lengths)
    out = torch.empty(res.size * width, dtype=torch.uint8, device=dev)
    all_gather_single(out, _to_tensor(payload, width, dev), group=res.pg)
    rows = out.cpu().numpy().reshape(res.size, width)
    return [rows[i, :n].tobytes() for i, n in enumerate(lengths)]


def broadcast_bytes(payload: Optional[bytes], src: int, res: Resolved) -> bytes:
    """``payload`` of global rank ``src`` on every member (pass None elsewhere)."""
    dev = comm_device(res)
    slot = _to_tensor(bytes(_slot(payload)), _SLOT, dev)
    dist.broadcast(slot, src, group=res.pg)
    head = slot.cpu().numpy()
    n = _length(head)
    if n <= _INLINE:
        return head[_HEADER : _HEADER + n].tobytes()
    body = _to_tensor(payload if payload is not None else b"", n, dev)
    dist.broadcast(body, src, group=res.pg)
    return body.cpu().numpy().tobytes()


# ---------------------------------------------------------------- numbers

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
        raise TypeError(
            f"reductions take a tensor or a Python number (bool, int, float, complex), got {type(x).__name__}: {x!r}"
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


# ---------------------------------------------------------------- values


def all_gather_value(x: Any, res: Resolved) -> list:
    """Every member's value, as a list in group-rank order; tensors land on this rank's device."""
    payload = codec.encode(x)  # TypeError on an unsupported type, before any communication
    here = device()
    return [codec.decode(b, device=here) for b in all_gather_bytes(payload, res)]


def broadcast_value(x: Any, src: int, res: Resolved) -> Any:
    """The value of global rank ``src``; what other ranks pass is ignored."""
    payload = codec.encode(x) if res.rank == src else None
    return codec.decode(broadcast_bytes(payload, src, res), device=device())


def all_reduce_value(x: Any, op: str, res: Resolved) -> Any:
    """Reduce Python numbers across the group exactly (see module docstring)."""
    x = check_number(x, op)
    values = all_gather_value(x, res)
    return reduce_numbers([check_number(v, op) for v in values], op)
