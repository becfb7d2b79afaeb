"""Python values (numbers, strings, objects) over uint8 tensors.

Values are encoded by :mod:`polydist.codec` and travel as bytes. Every
transfer first moves one fixed-size *slot* per message (2 KiB in groups of up
to 16 ranks, shrinking to 256 B in large groups, see :func:`slot_size`)::

    [0:8)   int64 length of the payload; negative: the sender failed to encode
            (-1 TypeError, -2 ValueError) and the inline part holds the message
    [8:16)  int64 auxiliary field (largest payload of the exchange, or a magic)
    [16:)   the payload itself when it fits

so a small value (up to 2032 bytes encoded: a 1 KiB string, a dict of
metrics) costs one collective round — latency, not bandwidth, dominates at
these sizes — and a larger one costs a second round sized to the largest
payload. Because a rank that cannot encode its value
still sends a slot (flagged), every rank learns of the failure in the same
round and raises the same exception type: nobody hangs, the group stays
usable, and the value itself is never sent.

Numbers are reduced in Python on every rank, in rank order, after one
gather: ints stay exact ints of any size, floats are float64, and every rank
gets the same bits.
"""

from __future__ import annotations

import functools
import numbers
import operator
import reprlib
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch
import torch.distributed as dist

from . import codec
from ._compat import all_gather_single
from .context import device
from .groups import Resolved

__all__ = [
    "PAIR_SLOT",
    "slot_size",
    "inline_size",
    "Failure",
    "Payload",
    "encode",
    "make_slot",
    "read_slot",
    "comm_device",
    "all_gather_bytes",
    "gather_bytes",
    "broadcast_bytes",
    "scatter_bytes",
    "all_to_all_bytes",
    "check_number",
    "reduce_numbers",
    "all_reduce_value",
    "reduce_value",
    "decode_all",
]

_HEADER = 16


def slot_size(group_size: int) -> int:
    """Bytes per slot in a group of ``group_size`` ranks: 2 KiB, down to 256 B so a round moves <= 32 KiB per rank."""
    return max(256, min(2048, 32768 // group_size))


def inline_size(slot: int) -> int:
    """Largest payload a slot of ``slot`` bytes carries inline."""
    return slot - _HEADER


PAIR_SLOT = slot_size(2)  # point-to-point frames
_ERROR_CODES = {TypeError: -1, ValueError: -2}
_ERROR_TYPES = {code: kind for kind, code in _ERROR_CODES.items()}


class Failure:
    """A local TypeError/ValueError that must reach the other ranks instead of the payload."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.code = _ERROR_CODES[ValueError if isinstance(error, ValueError) else TypeError]


Payload = Union[bytes, Failure]


def encode(x: Any, allow_pickle: Optional[bool] = None) -> Payload:
    """``codec.encode(x)``, or a :class:`Failure` carrying the codec's TypeError."""
    try:
        return codec.encode(x, allow_pickle=allow_pickle)
    except TypeError as e:
        return Failure(e)


def make_slot(payload: Optional[Payload], aux: int = 0, size: int = PAIR_SLOT) -> bytearray:
    """The ``size``-byte slot announcing ``payload`` (None: an empty slot)."""
    slot = bytearray(size)
    slot[8:16] = aux.to_bytes(8, "little", signed=True)
    if isinstance(payload, Failure):
        message = str(payload.error).encode("utf-8", "replace")[: inline_size(size)]
        slot[:8] = payload.code.to_bytes(8, "little", signed=True)
        slot[_HEADER : _HEADER + len(message)] = message
    elif payload is not None:
        slot[:8] = len(payload).to_bytes(8, "little", signed=True)
        if len(payload) <= inline_size(size):
            slot[_HEADER : _HEADER + len(payload)] = payload
    return slot


def read_slot(slot: np.ndarray) -> tuple[int, int, bytes]:
    """``(length, aux, inline bytes)`` of a received slot; for a failure, the message bytes."""
    length = int.from_bytes(slot[:8].tobytes(), "little", signed=True)
    aux = int.from_bytes(slot[8:16].tobytes(), "little", signed=True)
    if length < 0:
        return length, aux, slot[_HEADER:].tobytes().rstrip(b"\0")
    return length, aux, slot[_HEADER : _HEADER + min(length, inline_size(len(slot)))].tobytes()


def _raise_failures(read: Sequence[tuple[int, int, bytes]], ranks: Sequence[int], what: str, mine: Any) -> None:
    """Raise on every rank when any slot is flagged; the failing rank re-raises its own error."""
    failed = [(r, length, body) for r, (length, _, body) in zip(ranks, read) if length < 0]
    if not failed:
        return
    if isinstance(mine, Failure):
        raise mine.error
    rank, code, body = failed[0]
    raise _ERROR_TYPES[code](f"{what}: rank {rank} failed before sending: {body.decode('utf-8', 'replace')}")


def comm_device(res: Resolved) -> torch.device:
    """Device that byte buffers must live on for this group's backend."""
    if str(dist.get_backend(res.pg)) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _tensor(data: Union[bytes, bytearray], size: int, dev: torch.device) -> torch.Tensor:
    """``data`` zero-padded to ``size`` bytes, as a uint8 tensor on ``dev``."""
    buf = bytearray(size)
    buf[: len(data)] = data
    if not size:
        return torch.empty(0, dtype=torch.uint8, device=dev)
    return torch.frombuffer(buf, dtype=torch.uint8).to(dev)


def _rows(t: torch.Tensor, n: int) -> np.ndarray:
    return t.cpu().numpy().reshape(n, -1)


def _inline(read: Sequence[tuple[int, int, bytes]]) -> list[bytes]:
    return [body for _, _, body in read]


def _all_gather_slots(payload: Payload, res: Resolved, what: str) -> tuple[list, int, torch.device]:
    """First round of all_gather/gather: every member's slot; raises on every rank if any member failed.

    Returns the read slots, the width of the second round (0 when every
    payload fitted inline) and the device of the byte buffers.
    """
    dev, size = comm_device(res), slot_size(res.size)
    out = torch.empty(res.size * size, dtype=torch.uint8, device=dev)
    all_gather_single(out, _tensor(make_slot(payload, size=size), size, dev), group=res.pg)
    read = [read_slot(s) for s in _rows(out, res.size)]
    _raise_failures(read, res.ranks, what, payload)
    width = max(length for length, _, _ in read)
    return read, (0 if width <= inline_size(size) else width), dev


def all_gather_bytes(payload: Payload, res: Resolved, what: str = "all_gather") -> list[bytes]:
    """Every group member's ``payload``, in group-rank order (one round if all fit in a slot)."""
    read, width, dev = _all_gather_slots(payload, res, what)
    if not width:
        return _inline(read)
    out = torch.empty(res.size * width, dtype=torch.uint8, device=dev)
    all_gather_single(out, _tensor(payload, width, dev), group=res.pg)
    rows = _rows(out, res.size)
    return [rows[i, :length].tobytes() for i, (length, _, _) in enumerate(read)]


def gather_bytes(payload: Payload, dst: int, res: Resolved, what: str = "gather") -> Optional[list[bytes]]:
    """Every member's ``payload`` on global rank ``dst`` (group-rank order); None elsewhere.

    The slots are all-gathered so that every rank knows whether a second,
    padded ``gather`` round is needed and can raise on a failure.
    """
    read, width, dev = _all_gather_slots(payload, res, what)
    here = res.rank == dst
    if not width:
        return _inline(read) if here else None
    big = torch.empty(res.size * width, dtype=torch.uint8, device=dev) if here else None
    dist.gather(_tensor(payload, width, dev), list(big.chunk(res.size)) if here else None, dst=dst, group=res.pg)
    if not here:
        return None
    rows = _rows(big, res.size)
    return [rows[i, :length].tobytes() for i, (length, _, _) in enumerate(read)]


def broadcast_bytes(payload: Optional[Payload], src: int, res: Resolved, what: str = "broadcast") -> bytes:
    """``payload`` of global rank ``src`` on every member (pass None elsewhere)."""
    dev, size = comm_device(res), slot_size(res.size)
    slot = _tensor(make_slot(payload, size=size), size, dev)
    dist.broadcast(slot, src, group=res.pg)
    read = read_slot(slot.cpu().numpy())
    _raise_failures([read], [src], what, payload)
    length, _, body = read
    if length <= inline_size(size):
        return body
    data = _tensor(payload if isinstance(payload, bytes) else b"", length, dev)
    dist.broadcast(data, src, group=res.pg)
    return data.cpu().numpy().tobytes()


def scatter_bytes(payloads: Union[Sequence[bytes], Failure, None], src: int, res: Resolved, what: str) -> bytes:
    """Item ``i`` of ``src``'s ``payloads`` (one per group rank) on group rank ``i``."""
    dev, size = comm_device(res), slot_size(res.size)
    here = res.rank == src
    slots = None
    if here:
        if isinstance(payloads, Failure):
            slots = [_tensor(make_slot(payloads, size=size), size, dev) for _ in range(res.size)]
        else:
            width = max(len(p) for p in payloads)
            slots = [_tensor(make_slot(p, aux=width, size=size), size, dev) for p in payloads]
    slot = torch.empty(size, dtype=torch.uint8, device=dev)
    dist.scatter(slot, slots, src=src, group=res.pg)
    read = read_slot(slot.cpu().numpy())
    _raise_failures([read], [src], what, payloads)
    length, width, body = read
    if width <= inline_size(size):
        return body
    data = torch.empty(width, dtype=torch.uint8, device=dev)
    items = [_tensor(p, width, dev) for p in payloads] if here else None
    dist.scatter(data, items, src=src, group=res.pg)
    return data[:length].cpu().numpy().tobytes()


def all_to_all_bytes(payloads: Union[Sequence[bytes], Failure], res: Resolved, what: str) -> list[bytes]:
    """``payloads[i]`` of every rank lands on group rank ``i``; returns what this rank received.

    Each slot carries the sender's largest outgoing payload, so every rank
    learns whether the second round (``all_to_all_single`` with split sizes,
    only for payloads that do not fit in a slot) is needed.
    """
    dev, size, n = comm_device(res), slot_size(res.size), res.size
    inline = inline_size(size)
    if isinstance(payloads, Failure):
        slots = bytes(make_slot(payloads, size=size)) * n
    else:
        largest = max(len(p) for p in payloads)
        slots = b"".join(bytes(make_slot(p, aux=largest, size=size)) for p in payloads)
    out = torch.empty(n * size, dtype=torch.uint8, device=dev)
    dist.all_to_all_single(out, _tensor(slots, n * size, dev), group=res.pg)
    read = [read_slot(s) for s in _rows(out, n)]
    _raise_failures(read, res.ranks, what, payloads)
    if max(aux for _, aux, _ in read) <= inline:
        return _inline(read)
    send_sizes = [len(p) if len(p) > inline else 0 for p in payloads]
    recv_sizes = [length if length > inline else 0 for length, _, _ in read]
    big = b"".join(p for p, size in zip(payloads, send_sizes) if size)
    data = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=dev)
    dist.all_to_all_single(
        data, _tensor(big, len(big), dev), recv_sizes, send_sizes, group=res.pg
    )
    flat, offset, received = data.cpu().numpy(), 0, []
    for (_, _, body), size in zip(read, recv_sizes):
        received.append(flat[offset : offset + size].tobytes() if size else body)
        offset += size
    return received


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
            "reductions take a tensor, a list of tensors, or a Python number (bool, int, float, complex), "
            f"got {type(x).__name__}: {reprlib.repr(x)}"
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


def _decode_numbers(rows: list[bytes], op: str) -> Any:
    return reduce_numbers([check_number(codec.decode(b), op) for b in rows], op)


def all_reduce_value(x: Any, op: str, res: Resolved) -> Any:
    """Reduce a checked Python number across the group exactly (see module docstring)."""
    return _decode_numbers(all_gather_bytes(codec.encode(x), res, "all_reduce"), op)


def reduce_value(x: Any, op: str, dst: int, res: Resolved) -> Any:
    """Like :func:`all_reduce_value`, with the result on ``dst`` only; other ranks get ``x`` back."""
    rows = gather_bytes(codec.encode(x), dst, res, "reduce")
    return x if rows is None else _decode_numbers(rows, op)


def decode_all(rows: list[bytes], allow_pickle: Optional[bool] = None) -> list:
    """Decode received payloads, tensors onto this rank's ``device()``."""
    here = device()
    return [codec.decode(b, device=here, allow_pickle=allow_pickle) for b in rows]
