"""Point-to-point: send, recv, isend, irecv — of tensors and of Python values.

A tensor travels as ``torch.distributed.send`` sends it: one message, received
into a tensor of the same shape and dtype that the receiver passes. A value
travels as a *frame*: a 2 KiB slot (see :mod:`polydist.collectives.frames`) marked with
a magic number, followed by a body only when the encoded value exceeds 2032
bytes; ``recv(None, src)`` returns it. A receiver that expects a value but
gets something else raises instead of misreading it. In debug mode a tensor
is preceded by a frame holding its header (:mod:`~polydist.collectives.tensor_header`:
pieces' header of its dtype and shape), so a receiver whose
tensor does not match raises :class:`~polydist.CollectiveMismatchError` (after
draining the message, so the pair stays usable).

Source: ``torch.distributed.send/recv/isend/irecv`` (PyTorch docs, "Point-to-point communication"); ``src``
and ``dst`` are global ranks, ``tag`` matches sends to receives.
"""

from __future__ import annotations

import reprlib
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ..settings import is_debug
from . import frames, tensor_header
from .debug import describe_tensor
from .pipeline import Collective, check_layout, contiguous
from ..context import device
from ..errors import CollectiveMismatchError
from ..groups import GroupLike, Resolved
from .work import Work

__all__ = ["send", "recv", "isend", "irecv"]

_VALUE_MAGIC = 0x70645631  # "pdV1": a value frame
_TENSOR_MAGIC = 0x70645431  # "pdT1": a debug-mode tensor header


def _check_tag(tag: Any) -> int:
    if isinstance(tag, bool) or not isinstance(tag, int) or tag < 0:
        raise ValueError(f"tag must be a non-negative int, got {tag!r}")
    return tag


def _peer_calls(name: str) -> Callable[..., None]:
    """The group check of ``name``: its backend must have point-to-point (its registry entry's ``point_to_point``)."""

    def check(res: Resolved, *args: Any) -> None:
        if not res.entry.point_to_point:
            raise NotImplementedError(
                f"{name}: the {res.backend} backend has no point-to-point operations; use a collective "
                "(broadcast, scatter, all_to_all) or a backend that has them"
            )

    return check


def _bytes_tensor(data: bytearray, res: Resolved) -> torch.Tensor:
    """``data`` as a uint8 tensor on the device the backend sends from."""
    return torch.frombuffer(data, dtype=torch.uint8).to(res.device)


def _on_comm_device(x: torch.Tensor, res: Resolved) -> torch.Tensor:
    """``x`` contiguous on the device the backend sends from: gloo's send of CUDA memory crashes the
    process (PyTorch docs, "Backends": no GPU point-to-point on gloo), so such a tensor goes via the CPU."""
    if x.device == res.device:
        return contiguous(x)
    return x.to(res.device, memory_format=torch.contiguous_format)


def _receive_buffer(x: torch.Tensor, res: Resolved) -> torch.Tensor:
    """``x`` itself when the backend can write into it; else a buffer on the backend's device, copied back."""
    if x.device == res.device:
        return contiguous(x)
    return torch.empty(x.shape, dtype=x.dtype, device=res.device)


def _empty(nbytes: int, res: Resolved) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=res.device)


# ---------------------------------------------------------------- sending


def _post_send(x: Any, dst: int, res: Resolved, tag: int, allow_pickle: Optional[bool]) -> list:
    """Post every message of ``x`` to ``dst`` (non-blocking); return the works and keep buffers alive in them."""
    if isinstance(x, torch.Tensor):
        works = []
        if is_debug():
            try:
                header: frames.Payload = tensor_header.encode(x)
            except TypeError as exc:  # a dtype with no wire code: the receiver is told instead of waiting
                header = frames.Failure(exc)
            works.append(dist.isend(_bytes_tensor(frames.make_slot(header, _TENSOR_MAGIC), res), dst, res.pg, tag))
            if isinstance(header, frames.Failure):
                works[0].wait()
                raise header.error
        return [*works, dist.isend(_on_comm_device(x, res), dst, res.pg, tag)]
    payload = frames.encode(x, allow_pickle)
    slot = _bytes_tensor(frames.make_slot(payload, _VALUE_MAGIC), res)
    works = [dist.isend(slot, dst, res.pg, tag)]
    if isinstance(payload, frames.Failure):
        for w in works:
            w.wait()
        raise payload.error  # the receiver got the failure instead of the value, and raises too
    if len(payload) > frames.inline_size(frames.PAIR_SLOT):
        body = _bytes_tensor(bytearray(payload), res)
        works.append(dist.isend(body, dst, res.pg, tag))
    return works


def send(tensor: Any, dst: int, group: GroupLike = None, tag: int = 0, *, allow_pickle: Optional[bool] = None) -> None:
    """Send ``tensor`` to global rank ``dst`` and return once it is sent.

    Args:
        tensor: a tensor (any shape and dtype; the receiver passes a tensor
            of the same shape and dtype to :func:`recv`; on a device the
            backend cannot send from, e.g. CUDA on gloo, it travels through a
            copy on the backend's device), or any value the codec takes (the
            receiver calls ``recv(None, src)``).
        dst: global rank of the receiver, in ``group``, not this rank.
        group: None (world), a ProcessGroup, or a list of global ranks.
        tag: non-negative int matching this send to a ``recv`` with the same tag.
        allow_pickle: pickle values the safe codec does not support (and
            accept pickled values) for this call; None follows
            :func:`~polydist.set_allow_pickle`. Unpickling can run code.

    Dtypes by backend: any dtype on gloo and ``mpi4py`` (CPU tensors; a
    tensor travels as its bytes); nccl CUDA tensors.

    Examples:
        On 2 ranks (``import polydist as pdist``)::

            if pdist.get_rank() == 0:
                pdist.send(torch.tensor([1.0, 2.0]), dst=1)   # rank 0: None, once sent
                pdist.send({"step": 3}, dst=1)               # a value: rank 1 calls recv(None, 0)
            else:
                t, v = pdist.recv(torch.empty(2), src=0), pdist.recv(None, src=0)   # tensor([1., 2.]), {'step': 3}

    Raises:
        ValueError: ``dst`` not in the group, equal to this rank, or a bad
            ``tag``; a serial run (no peer).
        TypeError: a sparse tensor (naming its layout), on this rank before
            any communication; a value the codec cannot encode — the receiver is told and
            raises too, so it does not wait forever.
        ValueError: a value the codec refuses otherwise (depth, text UTF-8
            cannot encode): the receiver raises ``ValueError`` naming this
            rank and the reason.
        NotImplementedError: the group's backend has no point-to-point
            (horovod), before anything is sent.

    Source: ``torch.distributed.send``.
    """
    check_layout(tensor, "send")
    _SEND.run(group, dst, False, tensor, dst, _check_tag(tag), allow_pickle)


def isend(tensor: Any, dst: int, group: GroupLike = None, tag: int = 0, *, allow_pickle: Optional[bool] = None) -> Work:
    """Start sending ``tensor`` to ``dst``; return a :class:`~polydist.Work` (``wait()`` returns None).

    Do not modify ``tensor`` before ``wait()``. Arguments, errors and dtypes by
    backend as :func:`send` (any dtype on gloo and ``mpi4py``; nccl CUDA tensors).

    Examples:
        On 2 ranks (``import polydist as pdist``)::

            if pdist.get_rank() == 0:
                w = pdist.isend(torch.tensor([1.0, 2.0]), dst=1)   # rank 0: a Work, at once
            else:
                w = pdist.irecv(torch.empty(2), src=0)             # rank 1: a Work, at once
            w.wait()                                               # rank 0: None; rank 1: tensor([1., 2.])

    Returns:
        A :class:`~polydist.Work` at once; its ``wait()`` returns None once
        ``tensor`` (or the encoded value) has been handed to the backend.

    Raises:
        ValueError: ``dst`` not in the group, equal to this rank, or a bad
            ``tag``; a serial run — at the call, before anything is sent.
        TypeError: a sparse tensor (naming its layout), on this rank before
            any communication; a value the codec cannot encode (``ValueError`` when
            refused for its depth or text) — at the call; the receiver is
            told and raises too.
        CollectiveTimeoutError: from ``wait()``, when the receiver does not
            take it within the collective timeout.

    Source: ``torch.distributed.isend``.
    """
    check_layout(tensor, "isend")
    return _SEND.run(group, dst, True, tensor, dst, _check_tag(tag), allow_pickle)


def _send_body(res: Resolved, x: Any, dst: int, tag: int, allow_pickle: Optional[bool], async_op: bool) -> Any:
    works = _post_send(x, dst, res, tag, allow_pickle)
    if async_op:
        return Work(works)
    for w in works:
        w.wait()
    return None


_SEND = Collective("send", _send_body, None, None, root="dst", peer=True, echo=False, check=_peer_calls("send"))


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
    raw = slot.cpu().numpy()
    if frames.slot_aux(raw) not in (_TENSOR_MAGIC, _VALUE_MAGIC):
        raise _frame_error(src, res, "a value", "data that is not a polydist value frame (a raw tensor?)")
    length, magic, body = frames.read_slot(raw, src, "recv")
    frames.raise_failures([(length, magic, body)], [src], "recv", None)
    if magic == _TENSOR_MAGIC:
        dtype, shape = tensor_header.decode(body, src, "recv")
        _drain_tensor(dtype, shape, src, res, tag)
        raise _frame_error(src, res, "a value", f"a tensor {describe_tensor(dtype, shape)}")
    if length > frames.inline_size(frames.PAIR_SLOT):
        data = _empty(length, res)
        dist.recv(data, src, res.pg, tag)
        body = data.cpu().numpy().tobytes()
    return frames.decode_from(body, src, "recv", device(), allow_pickle)


def _drain_tensor(dtype: torch.dtype, shape: list, src: int, res: Resolved, tag: int) -> None:
    dist.recv(torch.empty(shape, dtype=dtype, device=res.device), src, res.pg, tag)


def _check_header(slot: torch.Tensor, x: torch.Tensor, src: int, res: Resolved, tag: int) -> None:
    """Debug mode: compare the sender's tensor header with ``x``; drain and raise on a mismatch."""
    length, magic, body = frames.read_slot(slot.cpu().numpy(), src, "recv")
    mine = describe_tensor(x.dtype, x.shape)
    if magic == _VALUE_MAGIC:
        if length > frames.inline_size(frames.PAIR_SLOT):
            dist.recv(_empty(length, res), src, res.pg, tag)
        raise _frame_error(src, res, f"a tensor {mine}", "a value")
    frames.raise_failures([(length, magic, body)], [src], "recv", None)  # the sender's dtype has no header
    dtype, shape = tensor_header.decode(body, src, "recv")
    if dtype != x.dtype or list(shape) != list(x.shape):
        _drain_tensor(dtype, shape, src, res, tag)
        raise _frame_error(src, res, f"a tensor {mine}", f"a tensor {describe_tensor(dtype, shape)}")


def _copy_back(buf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if buf is not x:
        x.copy_(buf)
    return x


def recv(
    tensor: Optional[torch.Tensor], src: int, group: GroupLike = None, tag: int = 0, *, allow_pickle: Optional[bool] = None
) -> Any:
    """Receive from global rank ``src``.

    Args:
        tensor: a tensor of the shape and dtype the sender sends (filled **in
            place**), or None to receive a Python value.
        src: global rank of the sender, in ``group``, not this rank.
        group: None (world), a ProcessGroup, or a list of global ranks.
        tag: must match the sender's tag.
        allow_pickle: pickle values the safe codec does not support (and
            accept pickled values) for this call; None follows
            :func:`~polydist.set_allow_pickle`. Unpickling can run code.

    Returns:
        ``tensor`` (filled) for a tensor; the decoded value for None (tensors
        inside on this rank's ``device()``). Unlike ``torch.distributed.recv``,
        which returns the sender's rank.

    Dtypes by backend: as for :func:`send` (any dtype on gloo and ``mpi4py``;
    nccl CUDA tensors).

    Examples:
        On 2 ranks (``import polydist as pdist``)::

            if pdist.get_rank() == 0:
                pdist.send(torch.tensor([1.0, 2.0]), dst=1); pdist.send("done", dst=1)
            else:
                pdist.recv(torch.empty(2), src=0)   # rank 1: tensor([1., 2.]), filled in place
                pdist.recv(None, src=0)             # rank 1: 'done'

    Raises:
        ValueError: ``src`` not in the group, equal to this rank, a bad tag;
            a serial run.
        TypeError: a sparse tensor (naming its layout), on this rank before
            any communication; ``tensor`` neither a tensor nor None; the sender's value could
            not be encoded (``ValueError`` when refused for its depth or text).
        CollectiveMismatchError: a value was expected and something else
            arrived; in debug mode also a tensor of another shape or dtype.
        NotImplementedError: the group's backend has no point-to-point
            (horovod), before anything is received.

    Source: ``torch.distributed.recv``.
    """
    _check_receiver(tensor)
    check_layout(tensor, "recv")
    return _RECV.run(group, src, False, tensor, src, _check_tag(tag), allow_pickle)


def _recv_body(res: Resolved, x: Any, src: int, tag: int, allow_pickle: Optional[bool], async_op: bool) -> Any:
    if async_op:
        return _irecv_body(res, x, src, tag, allow_pickle)
    if x is None:
        slot = _empty(frames.PAIR_SLOT, res)
        dist.recv(slot, src, res.pg, tag)
        return _read_value(slot, src, res, tag, allow_pickle)
    if is_debug():
        slot = _empty(frames.PAIR_SLOT, res)
        dist.recv(slot, src, res.pg, tag)
        _check_header(slot, x, src, res, tag)
    buf = _receive_buffer(x, res)
    dist.recv(buf, src, res.pg, tag)
    return _copy_back(buf, x)


def irecv(
    tensor: Optional[torch.Tensor], src: int, group: GroupLike = None, tag: int = 0, *, allow_pickle: Optional[bool] = None
) -> Work:
    """Start receiving from ``src``; return a :class:`~polydist.Work` whose ``wait()`` returns what :func:`recv` returns.

    Do not read ``tensor`` before ``wait()``. For a value (``tensor`` None), or in
    debug mode, the first slot is received in the background and the rest
    inside ``wait()``. Arguments, errors and dtypes by backend as :func:`recv`
    (any dtype on gloo and ``mpi4py``; nccl CUDA tensors).

    Examples:
        On 2 ranks (``import polydist as pdist``)::

            if pdist.get_rank() == 0:
                pdist.isend({"step": 3}, dst=1).wait()   # rank 0: None
            else:
                w = pdist.irecv(None, src=0)             # rank 1: a Work, at once
                w.wait()                                 # rank 1: {'step': 3}

    Returns:
        A :class:`~polydist.Work` at once; its ``wait()`` returns what
        :func:`recv` returns: ``tensor`` filled, or the decoded value.

    Raises:
        ValueError: ``src`` not in the group, equal to this rank, a bad tag;
            a serial run — at the call, before anything is received.
        TypeError: a sparse tensor (naming its layout), on this rank before
            any communication; ``tensor`` neither a tensor nor None — at the call; from
            ``wait()``, the sender's value could not be encoded
            (``ValueError`` when refused for its depth or text).
        CollectiveMismatchError: from ``wait()``, a value was expected and
            something else arrived; in debug mode also a tensor of another
            shape or dtype.
        CollectiveTimeoutError: from ``wait()``, when nothing arrives within
            the collective timeout.

    Source: ``torch.distributed.irecv``.
    """
    _check_receiver(tensor)
    check_layout(tensor, "irecv")
    return _RECV.run(group, src, True, tensor, src, _check_tag(tag), allow_pickle)


def _irecv_body(res: Resolved, x: Any, src: int, tag: int, allow_pickle: Optional[bool]) -> Work:
    if x is None or is_debug():
        slot = _empty(frames.PAIR_SLOT, res)
        work = dist.irecv(slot, src, res.pg, tag)
        if x is None:
            return Work([work], lambda: _read_value(slot, src, res, tag, allow_pickle))

        def finish_tensor() -> torch.Tensor:
            _check_header(slot, x, src, res, tag)
            buf = _receive_buffer(x, res)
            dist.recv(buf, src, res.pg, tag)
            return _copy_back(buf, x)

        return Work([work], finish_tensor)
    buf = _receive_buffer(x, res)
    return Work([dist.irecv(buf, src, res.pg, tag)], lambda: _copy_back(buf, x))


_RECV = Collective("recv", _recv_body, None, None, root="src", peer=True, check=_peer_calls("recv"))
