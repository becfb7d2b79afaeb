"""A tensor or value as one *piece*: a fixed 64-byte header, then its body, in the same buffer as the data.

The data-moving collectives (all_gather, gather, scatter, all_to_all) move
each rank's item as a piece, so its dtype and shape travel *with* its bytes
instead of in a metadata round before them::

    [0:4)    magic b"PDX1"
    [4]      kind: 1 tensor, 2 value (codec bytes), 3 failure (the sender could not send its item)
    [5]      tensor: dtype code (:data:`DTYPES`); failure: 1 TypeError, 2 ValueError
    [6]      tensor: number of dims (at most codec.MAX_DIMS)
    [7]      flags: bit 0 = the sender has a remainder for someone (all_to_all);
             bit 1 = the sender's bodies of this call all have this length
    [8:16)   int64 body length in bytes
    [16:24)  int64 aux: scatter's slot width for the next call; all_to_all:
             the sender's longest body in this call
    [24:32)  int64 aux2: scatter's remainder width in this call (headers
             first: the longest body)
    [32:64)  int64 dims 0-3; a tensor with more dims starts its body with
             the rest (8 bytes each, padded to 16)

Body: a tensor's elements (after the extra dims), a value's codec bytes, or
a failure's message. In a slot the body starts 16-byte aligned, so a
received tensor is a view into the receive buffer for every dtype (a body
that lands unaligned, e.g. after a value on MPI, is copied).

Where the bytes go is a *slot* of an agreed width per message. Ranks cannot
know each other's sizes in advance, so the width is *predicted*
(:class:`Predictor`) from the history of earlier calls — history that every
rank taking part saw identically, so every rank predicts the same width
without communicating. A body longer than its slot sends the rest in a
second round that every rank learns about from the headers; a shorter one
is padded. So a training loop that repeats its shapes pays one round, and a
shape change costs one more, never a corruption.

Headers come from other ranks: :func:`read` checks every field before
anything is sized by it and raises ``ValueError`` naming the sender.
"""

from __future__ import annotations

import math
import struct
from itertools import accumulate
from typing import Any, Optional, Union

import numpy as np
import torch

from .. import codec
from .frames import check_declared

__all__ = [
    "HEADER", "DTYPES", "TENSOR", "VALUE", "FAILURE", "Piece", "Header", "read", "extra_dims", "shape_of", "Predictor", "align",
]

HEADER = 64
TENSOR, VALUE, FAILURE = 1, 2, 3
OVERFLOW, EVEN = 1, 2  # header flags
_MAGIC = b"PDX1"
_FIXED = struct.Struct("<4sBBBBqqq4q")  # magic, kind, code, ndim, flags, body length, aux, aux2, dims[0:4]
_INLINE_DIMS = 4

# Wire codes of dtypes: append only, never reorder (ranks may run different torch versions).
DTYPES = (
    "float32", "float64", "float16", "bfloat16", "uint8", "int8", "int16", "int32", "int64", "bool",
    "complex32", "complex64", "complex128", "uint16", "uint32", "uint64",
    "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
    "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16",
    "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7", "int1", "int2", "int3", "int4", "int5", "int6", "int7",
)  # fmt: skip
_CODE = {getattr(torch, n): i + 1 for i, n in enumerate(DTYPES) if hasattr(torch, n)}
_DTYPE = {code: dtype for dtype, code in _CODE.items()}
_ERROR_TYPES = {1: TypeError, 2: ValueError}


def align(n: int) -> int:
    """``n`` rounded up to a multiple of 16 (slot widths and body offsets keep every dtype aligned)."""
    return (n + 15) & ~15


class Piece:
    """This rank's item as a piece: ``header`` (64 bytes) and ``body`` (a contiguous tensor of any dtype, or bytes).

    Build with :meth:`tensor`, :meth:`value` or :meth:`failure`.
    """

    __slots__ = ("kind", "code", "shape", "body", "length", "flags", "aux", "aux2", "error")

    def __init__(self, kind: int, code: int, shape: tuple, body: Union[torch.Tensor, bytes]) -> None:
        self.kind, self.code, self.shape, self.body = kind, code, shape, body
        self.length = body.nbytes if isinstance(body, torch.Tensor) else len(body)
        self.flags = self.aux = self.aux2 = 0
        self.error: Optional[Exception] = None  # a failure: the local error, re-raised on this rank

    @classmethod
    def tensor(cls, x: torch.Tensor, device: torch.device) -> "Piece":
        """``x``'s elements as a body on ``device`` (a view when ``x`` is contiguous and there already)."""
        code = _CODE.get(x.dtype)
        if code is None:
            return cls.failure(_unsupported(x.dtype))
        data = x.detach()
        data = data if data.device == device else data.to(device)
        data = data if data.is_contiguous() else data.contiguous()
        shape = tuple(x.shape)
        if len(shape) > _INLINE_DIMS:
            data = torch.cat([torch.frombuffer(bytearray(extra_dims(shape)), dtype=torch.uint8).to(device), flat_bytes(data)])
        return cls(TENSOR, code, shape, data)

    @classmethod
    def described(cls, x: torch.Tensor) -> "Piece":
        """A TENSOR piece whose body holds only ``x``'s dims past four (its elements travel in a call of their
        own): its header and body are byte for byte those of :meth:`tensor`'s up to where the elements would
        start. A dtype with no wire code: a failure piece, as :meth:`tensor`."""
        code = _CODE.get(x.dtype)
        if code is None:
            return cls.failure(_unsupported(x.dtype))
        piece = cls(TENSOR, code, tuple(x.shape), extra_dims(x.shape))
        piece.length += x.nbytes  # the header declares the whole body, as the tensor's own piece does
        return piece

    @classmethod
    def value(cls, payload: bytes) -> "Piece":
        return cls(VALUE, 0, (), payload)

    @classmethod
    def failure(cls, error: Exception) -> "Piece":
        """A local error that must reach the other ranks instead of the item (the item is never sent)."""
        piece = cls(FAILURE, 1 if isinstance(error, TypeError) else 2, (), str(error).encode("utf-8", "replace")[:2048])
        piece.error = error
        return piece

    def header(self) -> bytes:
        dims = list(self.shape[:_INLINE_DIMS]) + [0] * (_INLINE_DIMS - min(len(self.shape), _INLINE_DIMS))
        return _FIXED.pack(_MAGIC, self.kind, self.code, len(self.shape), self.flags, self.length, self.aux, self.aux2, *dims)

    def _bytes(self) -> torch.Tensor:
        if isinstance(self.body, torch.Tensor):
            return flat_bytes(self.body)
        return torch.frombuffer(bytearray(self.body), dtype=torch.uint8)

    def write(self, slot: torch.Tensor, width: int) -> None:
        """Fill ``slot`` (uint8, on the body's device) with the header and the first ``width`` bytes of the body."""
        slot[:HEADER].copy_(torch.frombuffer(bytearray(self.header()), dtype=torch.uint8))
        n = min(width, self.length)
        if n:
            slot[HEADER : HEADER + n].copy_(self._bytes()[:n])

    def write_rest(self, slot: torch.Tensor, start: int) -> None:
        """Fill ``slot`` from 0 with the body's bytes past ``start`` (a remainder round; nothing when none)."""
        if self.length > start:
            slot[: self.length - start].copy_(self._bytes()[start:])


def _unsupported(dtype: torch.dtype) -> TypeError:
    return TypeError(f"a tensor of dtype {dtype} cannot travel (supported: {', '.join(DTYPES)})")


def extra_dims(shape: tuple) -> bytes:
    """The dims of ``shape`` past the header's four, as a TENSOR body starts with them (int64 each, padded to
    16 bytes so the elements after them stay aligned); empty for at most four dims."""
    n = len(shape) - _INLINE_DIMS
    return np.asarray(shape[_INLINE_DIMS:], dtype="<i8").tobytes().ljust(align(8 * n), b"\0") if n > 0 else b""


def shape_of(h: "Header", prefix: bytes, length: int, what: str) -> list:
    """The whole shape of TENSOR header ``h``, whose body of ``length`` bytes starts with ``prefix`` (at least
    its extra dims, :func:`extra_dims`), checked: at most ``codec.MAX_DIMS`` non-negative dims whose elements
    are exactly the rest of the body. Raises ``ValueError`` naming the sender otherwise."""
    if h.ndim <= _INLINE_DIMS:
        return h.dims
    extra, n = align(8 * (h.ndim - _INLINE_DIMS)), 8 * (h.ndim - _INLINE_DIMS)
    try:
        if length < extra or len(prefix) < n:
            raise ValueError(f"a body too short for {h.ndim} dims")
        shape = codec.check_shape([*h.dims, *np.frombuffer(prefix[:n], dtype="<i8").tolist()])
        if length - extra != math.prod(shape) * h.dtype.itemsize:
            raise ValueError(f"body length does not match shape {shape}")
    except ValueError as exc:
        raise ValueError(f"{what}: rank {h.rank} sent a malformed header: {exc}") from None
    return shape


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's elements as a flat uint8 view."""
    return t.reshape(-1).view(torch.uint8)


class Header:
    """A received header, checked (see :func:`read`)."""

    __slots__ = ("kind", "code", "ndim", "flags", "length", "aux", "aux2", "dims", "dtype", "rank")

    def error(self, body: bytes, what: str) -> Exception:
        """The exception a failure piece announces (same type on every rank; the message names the sender)."""
        text = body.decode("utf-8", "replace")
        return _ERROR_TYPES[self.code](f"{what}: rank {self.rank} failed before sending: {text}")


def read(row: Union[np.ndarray, bytes], rank: int, what: str) -> Header:
    """The header global rank ``rank`` sent, checked before anything is sized by it.

    Raises:
        ValueError: naming ``rank``: a wrong magic, unknown kind, dtype or
            failure code, more dims than ``codec.MAX_DIMS``, negative dims, a
            body length that is not the tensor's, or one beyond this
            machine's memory.
    """
    raw = row.tobytes() if isinstance(row, np.ndarray) else bytes(row)
    magic, kind, code, ndim, flags, length, aux, aux2, *dims = _FIXED.unpack_from(raw)
    h = Header()
    h.kind, h.code, h.ndim, h.flags, h.length, h.aux, h.aux2, h.dims, h.rank = kind, code, ndim, flags, length, aux, aux2, dims, rank
    h.dtype = None
    try:
        if magic != _MAGIC:
            raise ValueError(f"not a piece header (magic {magic!r})")
        check_declared(length, rank, what)
        for n in (aux, aux2):
            check_declared(n, rank, what)
        if kind == TENSOR:
            h.dtype = _DTYPE.get(code)
            if h.dtype is None:
                raise ValueError(f"unknown dtype code {code}")
            if ndim > codec.MAX_DIMS:
                raise ValueError(f"{ndim} dims (at most {codec.MAX_DIMS})")
            if any(d < 0 for d in dims):
                raise ValueError(f"negative dims {dims}")
            if ndim <= _INLINE_DIMS:
                h.dims = dims[:ndim]
                expected = math.prod(h.dims) * h.dtype.itemsize
                if length != expected:
                    raise ValueError(f"a body of {length} bytes for shape {h.dims} of {h.dtype}")
        elif kind == FAILURE:
            if code not in _ERROR_TYPES:
                raise ValueError(f"unknown failure code {code}")
        elif kind != VALUE:
            raise ValueError(f"unknown kind {kind}")
    except ValueError as exc:
        raise ValueError(f"{what}: rank {rank} sent a malformed header: {exc}") from None
    return h


def tensor_of(h: Header, body: torch.Tensor, what: str) -> torch.Tensor:
    """The tensor a TENSOR piece's ``body`` (exactly ``h.length`` uint8 bytes, 16-byte aligned) holds: a view."""
    shape = h.dims
    if h.ndim > _INLINE_DIMS:
        extra = align(8 * (h.ndim - _INLINE_DIMS))
        shape = shape_of(h, body[:extra].cpu().numpy().tobytes(), body.numel(), what)
        body = body[extra:]
    if body.data_ptr() % h.dtype.itemsize:  # after a body of another dtype or a value: realign
        body = body.clone()
    return body.view(h.dtype).view(shape)


def item_of(h: Header, body: torch.Tensor, what: str, value_device: torch.device, allow_pickle: Optional[bool]) -> Any:
    """What a received piece holds: a tensor (view), a decoded value; a failure raises its exception."""
    if h.kind == TENSOR:
        return tensor_of(h, body, what)
    data = body.cpu().numpy().tobytes()
    if h.kind == FAILURE:
        raise h.error(data, what)
    from .frames import decode_from  # the codec's checks, naming the sender

    return decode_from(data, h.rank, what, value_device, allow_pickle)


def raise_failures(headers: list, bodies: list, what: str, mine: Optional[Piece] = None) -> None:
    """Raise when a sender announced a failure: ``mine``'s own error on the rank that failed, else the first
    announced (the same exception type on every rank that received it)."""
    if mine is not None and mine.error is not None:
        raise mine.error
    for h, body in zip(headers, bodies):
        if h.kind == FAILURE:
            raise h.error(body.cpu().numpy().tobytes(), what)


class Predictor:
    """Predicts the next slot width from the widths before it, identically on every rank that saw them.

    What came after the last two widths the previous time they occurred,
    else after the last one, else the largest of the last four: a loop that
    repeats its sizes, or alternates calls of different sizes (predictions,
    then labels), is predicted exactly after one pass, and sizes that wander
    (the last batch of an epoch, variable-length sequences) mostly fit
    without a second round. The tables are bounded: cleared past 64 entries
    (at the same call on every rank, so ranks stay in agreement).
    """

    __slots__ = ("recent", "after1", "after2")
    FIRST = 256  # no history yet: small items still ride in the first round

    def __init__(self) -> None:
        self.recent: list[int] = []  # the last four widths, oldest first
        self.after1: dict = {}
        self.after2: dict = {}

    def predict(self) -> int:
        recent = self.recent
        if not recent:
            return self.FIRST
        width = self.after2.get(tuple(recent[-2:])) if len(recent) > 1 else None
        if width is None:
            width = self.after1.get(recent[-1])
        return max(recent) if width is None else width

    def record(self, width: int) -> None:
        width = align(width)
        recent = self.recent
        if recent:
            self.after1[recent[-1]] = width
            if len(recent) > 1:
                self.after2[tuple(recent[-2:])] = width
            if len(self.after2) > 64 or len(self.after1) > 64:
                self.after1.clear()
                self.after2.clear()
        recent.append(width)
        if len(recent) > 4:
            del recent[0]


class Plan:
    """The checked headers of one exchange, in group-rank order, and where their bodies lie back to back.

    Built by :func:`plan_of` and cached by the headers' bytes: a training loop
    sends the same headers call after call, and checking them costs more
    than moving a small tensor. ``memo`` holds what callers derive from the
    headers (a result's dtype and shape), for the same reason.
    """

    __slots__ = ("headers", "lengths", "offsets", "total", "failed", "even", "memo")

    def __init__(self, headers: list) -> None:
        self.headers = headers
        self.lengths = [h.length for h in headers]
        *self.offsets, self.total = accumulate(self.lengths, initial=0)
        self.failed = any(h.kind == FAILURE for h in headers)
        # every body has one length, and every sender says all its bodies have it: MPI's fixed-size
        # collectives (faster than the v-ones in mpich at large sizes) can move them
        self.even = len(set(self.lengths)) == 1 and all(h.flags & EVEN for h in headers)
        self.memo: dict = {}


_PLANS: dict = {}


def plan_of(raw: bytes, ranks: tuple, what: str) -> Plan:
    """The :class:`Plan` of ``len(ranks)`` headers back to back in ``raw`` (sent by global ``ranks``), checked by
    :func:`read` the first time these bytes are seen. Raises its ``ValueError`` naming the sender."""
    key = (raw, ranks)
    plan = _PLANS.get(key)
    if plan is None:
        plan = Plan([read(raw[i * HEADER : (i + 1) * HEADER], r, what) for i, r in enumerate(ranks)])
        if len(_PLANS) >= 256:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan
