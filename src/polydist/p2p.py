"""Point-to-point: send, recv, isend, irecv — of tensors and of Python values.

A tensor travels as ``torch.distributed.send`` sends it: one message, received
into a tensor of the same shape and dtype that the receiver passes. A value
travels as a *frame*: a 2 KiB slot (see :mod:`polydist.values`) marked with
a magic number, followed by a body only when the encoded value exceeds 2032
bytes; ``recv(None, src)`` returns it. A receiver that expects a value but
gets something else raises instead of misreading it. In debug mode a tensor
is preceded by a header slot with its dtype and shape, so a receiver whose
tensor does not match raises :class:`~polydist.CollectiveMismatchError` (after
draining the message, so the pair stays usable).

Source: ``torch.distributed.send/recv/isend/irecv`` (seeds 001, 004); ``src``
and ``dst`` are global ranks, ``tag`` matches sends to receives.
"""

from __future__ import annotations

import reprlib
from typing import Any, Optional

import torch
import torch.distributed as dist

from . import codec, debug, values
from ._common import active_group, contiguous
from .context import device
from .errors import CollectiveMismatchError
from .groups import GroupLike, Resolved
from .work import Work

__all__ = ["send", "recv", "isend", "irecv"]

_VALUE_MAGIC = 0x70645631  # "pdV1": a value frame
_TENSOR_MAGIC = 0x70645431  # "pdT1": a debug-mode tensor header


def _peer(peer: int, name: str, group: GroupLike, tag: int) -> Resolved:
    res = active_group(group, collective=False)
    if res is None:
        raise ValueError(f"{name}={peer}: point-to-point needs a process group; a serial run has no peer")
    res.check_root(peer, name)
    if peer == res.rank:
        raise ValueError(f"{name}={peer} is this process's own rank; a rank cannot send to or receive from itself")
    if isinstance(tag, bool) or not isinstance(tag, int) or tag < 0:
        raise ValueError(f"tag must be a non-negative int, got {tag!r}")
    return res


def _bytes_tensor(data: bytearray, res: Resolved) -> torch.Tensor:
    """``data`` as a uint8 tensor on the device the backend sends from."""
    return torch.frombuffer(data, dtype=torch.uint8).to(values.comm_device(res))


def _empty(nbytes: int, res: Resolved) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=values.comm_device(res))


# ---------------------------------------------------------------- sending


def _post_send(x: Any, dst: int, res: Resolved, tag: int, allow_pickle: Optional[bool]) -> list:
    """Post every message of ``x`` to ``dst`` (non-blocking); return the works and keep buffers alive in them."""
    if isinstance(x, torch.Tensor):
        works = []
        if debug.is_debug():
            header = codec.encode([codec.dtype_name(x.dtype), list(x.shape)])
            works.append(dist.isend(_bytes_tensor(values.make_slot(header, _TENSOR_MAGIC), res), dst, res.pg, tag))
        return [*works, dist.isend(contiguous(x), dst, res.pg, tag)]
    payload = values.encode(x, allow_pickle)
    slot = _bytes_tensor(values.make_slot(payload, _VALUE_MAGIC), res)
    works = [dist.isend(slot, dst, res.pg, tag)]
    if isinstance(payload, values.Failure):
        for w in works:
            w.wait()
        raise payload.error  # the receiver got the failure instead of the value, and raises too
    if len(payload) > values.inline_size(values.PAIR_SLOT):
        body = _bytes_tensor(bytearray(payload), res)
        works.append(dist.isend(body, dst, res.pg, tag))
    return works


def send(x: Any, dst: int, group: GroupLike = None, tag: int = 0, *, allow_pickle: Optional[bool] = None) -> None:
    """Send ``x`` to global rank ``dst`` and return once it is sent.

    Args:
        x: a tensor (any shape, dtype and device the backend supports; the
            receiver passes a tensor of the same shape and dtype to
            :func:`recv`), or any value the codec takes (the receiver calls
            ``recv(None, src)``).
        dst: global rank of the receiver, in ``group``, not this rank.
        group: None (world), a ProcessGroup, or a list of global ranks.
        tag: non-negative int matching this send to a ``recv`` with the same tag.
        allow_pickle: pickle values the safe codec does not support (and
            accept pickled values) for this call; None follows
            :func:`~polydist.set_allow_pickle`. Unpickling can run code.

    Raises:
        ValueError: ``dst`` not in the group, equal to this rank, or a bad
            ``tag``; a serial run (no peer).
        TypeError: a value the codec cannot encode — the receiver is told and
            raises too, so it does not wait forever.

    Source: ``torch.distributed.send``.
    """
    res = _peer(dst, "dst", group, tag)
    for w in _post_send(x, dst, res, tag, allow_pickle):
        w.wait()


def isend(x: Any, dst: int, group: GroupLike = None, tag: int = 0, *, allow_pickle: Optional[bool] = None) -> Work:
    """Start sending ``x`` to ``dst``; return a :class:`~polydist.Work` (``wait()`` returns None).

    Do not modify ``x`` before ``wait()``. Arguments and errors as :func:`send`.
    Source: ``torch.distributed.isend``.
    """
    res = _peer(dst, "dst", group, tag)
    return Work(_post_send(x, dst, res, tag, allow_pickle))


# ---------------------------------------------------------------- receiving


def _check_receiver(x: Any) -> None:
    if x is not None and not isinstance(x, torch.Tensor):
        raise TypeError(f"recv takes a tensor to fill, or None to receive a value; got {type(x).__name__}: {reprlib.repr(x)}")


def _frame_error(src: int, res: Resolved, expected: str, got: str) -> CollectiveMismatchError:
    return CollectiveMismatchError(
        f"rank {src} sent {got} but rank {res.rank} expected {expected}; a tensor sent with send(tensor) must be "
        "received into a tensor of the same shape and dtype, a value with recv(None, src)",
        {src: f"send({got}, dst={res.rank})", res.rank: f"recv({expected}, src={src})"},
    )


def _read_value(slot: torch.Tensor, src: int, res: Resolved, tag: int, allow_pickle: Optional[bool]) -> Any:
    """Finish receiving a value frame whose slot has arrived."""
    length, magic, body = values.read_slot(slot.cpu().numpy())
    if magic == _TENSOR_MAGIC:
        dtype_name, shape = codec.decode(body)
        _drain_tensor(dtype_name, shape, src, res, tag)
        raise _frame_error(src, res, "a value", f"a tensor {dtype_name}{list(shape)}")
    if magic != _VALUE_MAGIC:
        raise _frame_error(src, res, "a value", "data that is not a polydist value frame (a raw tensor?)")
    if length < 0:
        kind = TypeError if length == -1 else ValueError
        raise kind(f"recv: rank {src} failed before sending: {body.decode('utf-8', 'replace')}")
    if length > values.inline_size(values.PAIR_SLOT):
        data = _empty(length, res)
        dist.recv(data, src, res.pg, tag)
        body = data.cpu().numpy().tobytes()
    return codec.decode(body, device=device(), allow_pickle=allow_pickle)


def _drain_tensor(dtype_name: str, shape: list, src: int, res: Resolved, tag: int) -> None:
    dist.recv(torch.empty(shape, dtype=codec.torch_dtype(dtype_name), device=values.comm_device(res)), src, res.pg, tag)


def _check_header(slot: torch.Tensor, x: torch.Tensor, src: int, res: Resolved, tag: int) -> None:
    """Debug mode: compare the sender's tensor header with ``x``; drain and raise on a mismatch."""
    length, magic, body = values.read_slot(slot.cpu().numpy())
    mine = debug.describe_tensor(x.dtype, x.shape)
    if magic == _VALUE_MAGIC:
        if length > values.inline_size(values.PAIR_SLOT):
            dist.recv(_empty(length, res), src, res.pg, tag)
        raise _frame_error(src, res, f"a tensor {mine}", "a value")
    dtype_name, shape = codec.decode(body)
    if dtype_name != codec.dtype_name(x.dtype) or list(shape) != list(x.shape):
        _drain_tensor(dtype_name, shape, src, res, tag)
        theirs = debug.describe_tensor(codec.torch_dtype(dtype_name), shape)
        raise _frame_error(src, res, f"a tensor {mine}", f"a tensor {theirs}")


def _copy_back(buf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if buf is not x:
        x.copy_(buf)
    return x


def recv(
    x: Optional[torch.Tensor], src: int, group: GroupLike = None, tag: int = 0, *, allow_pickle: Optional[bool] = None
) -> Any:
    """Receive from global rank ``src``.

    Args:
        x: a tensor of the shape and dtype the sender sends (filled **in
            place**), or None to receive a Python value.
        src: global rank of the sender, in ``group``, not this rank.
        group: None (world), a ProcessGroup, or a list of global ranks.
        tag: must match the sender's tag.
        allow_pickle: pickle values the safe codec does not support (and
            accept pickled values) for this call; None follows
            :func:`~polydist.set_allow_pickle`. Unpickling can run code.

    Returns:
        ``x`` (filled) for a tensor; the decoded value for None (tensors
        inside on this rank's ``device()``). Unlike ``torch.distributed.recv``,
        which returns the sender's rank.

    Raises:
        ValueError: ``src`` not in the group, equal to this rank, a bad tag;
            a serial run.
        TypeError: ``x`` neither a tensor nor None; the sender's value could
            not be encoded.
        CollectiveMismatchError: a value was expected and something else
            arrived; in debug mode also a tensor of another shape or dtype.

    Source: ``torch.distributed.recv``.
    """
    _check_receiver(x)
    res = _peer(src, "src", group, tag)
    if x is None:
        slot = _empty(values.PAIR_SLOT, res)
        dist.recv(slot, src, res.pg, tag)
        return _read_value(slot, src, res, tag, allow_pickle)
    if debug.is_debug():
        slot = _empty(values.PAIR_SLOT, res)
        dist.recv(slot, src, res.pg, tag)
        _check_header(slot, x, src, res, tag)
    buf = contiguous(x)
    dist.recv(buf, src, res.pg, tag)
    return _copy_back(buf, x)


def irecv(
    x: Optional[torch.Tensor], src: int, group: GroupLike = None, tag: int = 0, *, allow_pickle: Optional[bool] = None
) -> Work:
    """Start receiving from ``src``; return a :class:`~polydist.Work` whose ``wait()`` returns what :func:`recv` returns.

    Do not read ``x`` before ``wait()``. For a value (``x`` None), or in
    debug mode, the first slot is received in the background and the rest
    inside ``wait()``. Arguments and errors as :func:`recv`.
    Source: ``torch.distributed.irecv``.
    """
    _check_receiver(x)
    res = _peer(src, "src", group, tag)
    if x is None or debug.is_debug():
        slot = _empty(values.PAIR_SLOT, res)
        work = dist.irecv(slot, src, res.pg, tag)
        if x is None:
            return Work([work], lambda: _read_value(slot, src, res, tag, allow_pickle))

        def finish_tensor() -> torch.Tensor:
            _check_header(slot, x, src, res, tag)
            buf = contiguous(x)
            dist.recv(buf, src, res.pg, tag)
            return _copy_back(buf, x)

        return Work([work], finish_tensor)
    buf = contiguous(x)
    return Work([dist.irecv(buf, src, res.pg, tag)], lambda: _copy_back(buf, x))
