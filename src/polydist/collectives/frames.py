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
payload. A slot carries no tensor metadata: a tensor's dtype and
shape travel only in :mod:`~polydist.collectives.pieces`' header (inside a
value frame for broadcast's safe mode and point-to-point,
:mod:`~polydist.collectives.tensor_header`). The slot keeps its own 16-byte
header, not pieces' 64 bytes, because a value needs only a length: packing
and checking pieces' header instead measured 3-6 us more per slot (timeit,
a 20-byte dict, on a loaded 2-core machine) on every Python-value
collective, and would cut what a slot carries inline from 2032 to 1984 bytes. Because a rank that cannot encode its value
still sends a slot (flagged), every rank learns of the failure in the same
round and raises the same exception type: nobody hangs, the group stays
usable, and the value itself is never sent.

A slot comes from another rank, so it is checked before anything is sized by
it (:func:`read_slot`): an unknown failure code, or a declared length larger
than this machine's physical memory, raises ``ValueError`` naming the
sending rank instead of an allocation; received payloads are decoded by
:func:`decode_from`, which names the sender of a malformed one.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch
import torch.distributed as dist

from .. import codec
from .._torch import all_gather_single
from ..context import device
from ..groups import Resolved

__all__ = [
    "PAIR_SLOT",
    "slot_size",
    "inline_size",
    "Failure",
    "Payload",
    "REFUSALS",
    "encode",
    "make_slot",
    "read_slot",
    "slot_aux",
    "decode_from",
    "raise_failures",
    "all_gather_bytes",
    "gather_bytes",
    "broadcast_bytes",
    "scatter_bytes",
    "all_to_all_bytes",
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
    """A local refusal that must reach the other ranks instead of the payload (announced as TypeError or ValueError)."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.code = _ERROR_CODES[TypeError if isinstance(error, TypeError) else ValueError]


Payload = Union[bytes, Failure]


# Every way the encoder refuses a value: a type it does not take (TypeError), nesting past its depth
# limit or a size msgpack cannot frame (ValueError), text that is not UTF-8 encodable such as a lone
# surrogate (UnicodeEncodeError, a ValueError), an int or float out of range (OverflowError), or a
# structure deep enough to exhaust Python's stack (RecursionError). Each reaches the other ranks in-band.
REFUSALS = (TypeError, ValueError, OverflowError, RecursionError)


def encode(x: Any, allow_pickle: Optional[bool] = None) -> Payload:
    """``codec.encode(x)``, or a :class:`Failure` carrying whatever the codec refused it with (:data:`REFUSALS`)."""
    try:
        return codec.encode(x, allow_pickle=allow_pickle)
    except REFUSALS as e:
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


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no bound beyond int64
        return 2**63 - 1


MAX_DECLARED = _physical_memory()  # no honest payload is larger than this machine's memory


def check_declared(n: int, rank: int, what: str) -> int:
    """``n``, a byte count another rank declared, or ``ValueError`` when nothing honest could be that large."""
    if not 0 <= n <= MAX_DECLARED:
        raise ValueError(
            f"{what}: rank {rank} declared a payload of {n} bytes, beyond this machine's memory "
            f"({MAX_DECLARED} bytes): a corrupt or hostile frame"
        )
    return n


def slot_aux(slot: np.ndarray) -> int:
    """The auxiliary field of a slot, unchecked (point-to-point reads its magic before trusting the rest)."""
    return int.from_bytes(slot[8:16].tobytes(), "little", signed=True)


def read_slot(slot: np.ndarray, rank: int, what: str) -> tuple[int, int, bytes]:
    """``(length, aux, inline bytes)`` of a slot received from global rank ``rank``; for a failure, the message bytes.

    Raises ``ValueError`` naming ``rank`` for a length that is neither a
    failure code nor a size this machine could hold.
    """
    length = int.from_bytes(slot[:8].tobytes(), "little", signed=True)
    aux = slot_aux(slot)
    if length in _ERROR_TYPES:
        return length, aux, slot[_HEADER:].tobytes().rstrip(b"\0")
    check_declared(length, rank, what)
    return length, aux, slot[_HEADER : _HEADER + min(length, inline_size(len(slot)))].tobytes()


def decode_from(data: bytes, rank: int, what: str, device: Optional[torch.device] = None, allow_pickle: Optional[bool] = None) -> Any:
    """``codec.decode(data)`` of a payload from global rank ``rank``; ``ValueError`` naming it when malformed."""
    try:
        return codec.decode(data, device=device, allow_pickle=allow_pickle)
    except ValueError as exc:
        raise ValueError(f"{what}: the payload from rank {rank} cannot be decoded: {exc}") from None


def raise_failures(read: Sequence[tuple[int, int, bytes]], ranks: Sequence[int], what: str, mine: Any) -> None:
    """Raise on every rank when any slot is flagged; the failing rank re-raises its own error."""
    failed = [(r, length, body) for r, (length, _, body) in zip(ranks, read) if length < 0]
    if not failed:
        return
    if isinstance(mine, Failure):
        raise mine.error
    rank, code, body = failed[0]
    raise _ERROR_TYPES[code](f"{what}: rank {rank} failed before sending: {body.decode('utf-8', 'replace')}")


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
    dev, size = res.device, slot_size(res.size)
    out = torch.empty(res.size * size, dtype=torch.uint8, device=dev)
    all_gather_single(out, _tensor(make_slot(payload, size=size), size, dev), group=res.pg)
    read = [read_slot(s, r, what) for s, r in zip(_rows(out, res.size), res.ranks)]
    raise_failures(read, res.ranks, what, payload)
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
    dev, size = res.device, slot_size(res.size)
    slot = _tensor(make_slot(payload, size=size), size, dev)
    dist.broadcast(slot, src, group=res.pg)
    read = read_slot(slot.cpu().numpy(), src, what)
    raise_failures([read], [src], what, payload)
    length, _, body = read
    if length <= inline_size(size):
        return body
    data = _tensor(payload if isinstance(payload, bytes) else b"", length, dev)
    dist.broadcast(data, src, group=res.pg)
    return data.cpu().numpy().tobytes()


def scatter_bytes(payloads: Union[Sequence[bytes], Failure, None], src: int, res: Resolved, what: str) -> bytes:
    """Item ``i`` of ``src``'s ``payloads`` (one per group rank) on group rank ``i``."""
    dev, size = res.device, slot_size(res.size)
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
    read = read_slot(slot.cpu().numpy(), src, what)
    raise_failures([read], [src], what, payloads)
    length, width, body = read
    if length > check_declared(width, src, what):
        raise ValueError(f"{what}: rank {src} declared a payload of {length} bytes in a round of {width}")
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
    dev, size, n = res.device, slot_size(res.size), res.size
    inline = inline_size(size)
    if isinstance(payloads, Failure):
        slots = bytes(make_slot(payloads, size=size)) * n
    else:
        largest = max(len(p) for p in payloads)
        slots = b"".join(bytes(make_slot(p, aux=largest, size=size)) for p in payloads)
    out = torch.empty(n * size, dtype=torch.uint8, device=dev)
    dist.all_to_all_single(out, _tensor(slots, n * size, dev), group=res.pg)
    read = [read_slot(s, r, what) for s, r in zip(_rows(out, n), res.ranks)]
    raise_failures(read, res.ranks, what, payloads)
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


def decode_all(rows: list[bytes], res: Resolved, what: str, allow_pickle: Optional[bool] = None) -> list:
    """Decode the payloads received from the group's members (group-rank order), tensors onto ``device()``."""
    here = device()
    return [decode_from(b, r, what, here, allow_pickle) for b, r in zip(rows, res.ranks)]
