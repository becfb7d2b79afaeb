"""broadcast and barrier: tensors in place, Python values of any type and size.

Semantics of ``torch.distributed.broadcast``/``barrier`` (PyTorch docs,
"Collective functions") and of idist's ``broadcast(safe_mode=...)`` for
values, without idist's float32 rounding and ASCII-only strings. Every call
takes the one path of :mod:`~polydist.collectives.pipeline`; ``src`` is a
global rank, also with a subgroup.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from .. import codec
from ..context import device
from ..groups import GroupLike, Resolved
from . import frames, tensor_header
from .debug import describe_tensor
from .pipeline import Collective, check_layout, contiguous, done, finish

__all__ = ["broadcast", "barrier"]

_TENSOR_FRAME, _VALUE_FRAME = b"T", b"V"


def broadcast(
    tensor: Any,
    src: int = 0,
    group: GroupLike = None,
    *,
    safe_mode: bool = False,
    async_op: bool = False,
    allow_pickle: Optional[bool] = None,
) -> Any:
    """Send ``src``'s ``tensor`` to every rank of the group.

    Args:
        tensor: on ``src``: a tensor, or any value the codec takes (number, str,
            bytes, ``pathlib.Path``, list/tuple/dict/set, nested, tensors
            inside). Elsewhere: when ``src`` sends a tensor without
            ``safe_mode``, a tensor of the same shape and dtype (filled in
            place); when ``src`` sends a value, or with ``safe_mode=True``,
            anything, e.g. None (ignored). A tensor on ``src`` meeting a
            non-tensor elsewhere without ``safe_mode`` is a mismatch between
            ranks (debug mode reports it).
        src: global rank of the source.
        group: None (world), a ProcessGroup, or a list of global ranks.
        safe_mode: src first sends the tensor's shape and dtype, so other
            ranks may pass None or a tensor of another shape (a new tensor is
            then returned, on the backend's device).
        async_op: return a :class:`~polydist.Work` whose ``wait()`` returns
            the result (the size/value frame is exchanged before returning).
        allow_pickle: pickle values the safe codec does not support (and
            accept pickled values) for this call; None follows
            :func:`~polydist.set_allow_pickle`. Unpickling can run code.

    Returns:
        A tensor broadcast is done **in place** where the receiving tensor
        matches and that tensor is returned; otherwise a new tensor. A value:
        on ``src``, the value itself (as idist); elsewhere decoded — ints
        exact at any size, floats float64, strings exact (UTF-8), tuples stay
        tuples, tensors inside on this rank's ``device()``.

    Dtypes by backend: any dtype on gloo and ``mpi4py`` (CPU tensors): a dtype
    gloo cannot carry (int16, uint16/32/64, float8, complex) travels as its
    bytes; nccl CUDA tensors.

    Examples:
        On 2 ranks (``import polydist as pdist``)::

            t = torch.full((2,), pdist.get_rank())           # rank 0: [0, 0]; rank 1: [1, 1]
            pdist.broadcast(t, src=0)                        # every rank: tensor([0, 0]), in place
            pdist.broadcast({"lr": 0.1} if pdist.get_rank() == 0 else None, src=0)   # every rank: {'lr': 0.1}
            pdist.broadcast(torch.ones(3) if pdist.get_rank() == 0 else None, src=0, safe_mode=True)
            # every rank: tensor([1., 1., 1.])

    Raises:
        ValueError: ``src`` not in the group.
        TypeError: a sparse tensor (naming its layout), on this rank before
            any communication; a value the codec cannot encode — on every rank, since src
            announces the failure instead of the value.
        ValueError: a value the codec refuses otherwise (nested past its
            depth limit, text UTF-8 cannot encode such as a lone surrogate)
            — on every rank, naming src and the reason; src raises the
            codec's own error (``UnicodeEncodeError`` for text).

    Source: ``torch.distributed.broadcast``; idist ``broadcast`` (safe_mode),
    without its float32 rounding of numbers and its ASCII-only strings.
    """
    check_layout(tensor, "broadcast")
    return _BROADCAST.run(group, src, async_op, tensor, src, safe_mode, allow_pickle)


def _broadcast_serial(tensor: Any, src: int, safe_mode: bool, allow_pickle: Optional[bool]) -> Any:
    if isinstance(tensor, torch.Tensor):
        return tensor
    return codec.decode(codec.encode(tensor, allow_pickle), allow_pickle=allow_pickle)  # as a real broadcast would


def _broadcast_fingerprint(tensor: Any, src: int, safe_mode: bool, allow_pickle: Optional[bool]) -> tuple:
    if isinstance(tensor, torch.Tensor) and not safe_mode:
        shown = describe_tensor(tensor.dtype, tensor.shape)
        return (src, "tensor", codec.dtype_name(tensor.dtype), list(tensor.shape)), f"broadcast({shown}, src={src})"
    return (src, "framed"), f"broadcast({'safe_mode' if safe_mode else type(tensor).__name__}, src={src})"


def _broadcast_body(
    res: Resolved, tensor: Any, src: int, safe_mode: bool, allow_pickle: Optional[bool], async_op: bool
) -> Any:
    if isinstance(tensor, torch.Tensor) and not safe_mode:
        buf = contiguous(tensor)
        work = dist.broadcast(_bytes_of(buf), src, group=res.pg, async_op=async_op)
        return finish(lambda: _copy_back(buf, tensor), [work], async_op)
    return _framed_broadcast(tensor, src, res, async_op, allow_pickle)


_BROADCAST = Collective("broadcast", _broadcast_body, _broadcast_serial, _broadcast_fingerprint, root="src")


# Dtypes every backend (gloo included) carries natively; others travel as their bytes.
_NATIVE = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
                     torch.int32, torch.int64, torch.bool})  # fmt: skip


def _bytes_of(buf: torch.Tensor) -> torch.Tensor:
    """``buf`` itself, or for a dtype gloo cannot carry (int16, uint32, complex, ...) its memory as uint8."""
    return buf if buf.dtype in _NATIVE else buf.reshape(-1).view(torch.uint8)


def _copy_back(buf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if buf is not x:
        x.copy_(buf)
    return x


def _framed_broadcast(x: Any, src: int, res: Resolved, async_op: bool, allow_pickle: Optional[bool]) -> Any:
    """Broadcast with a leading frame saying what follows: a tensor's header (:mod:`.tensor_header`), or a value."""
    is_src = res.rank == src
    frame = None
    if is_src:
        if isinstance(x, torch.Tensor):
            try:
                frame = _TENSOR_FRAME + tensor_header.encode(x)
            except TypeError as exc:  # a dtype with no wire code: every rank raises, none waits for the elements
                frame = frames.Failure(exc)
        else:
            frame = frames.encode(x, allow_pickle)
            if isinstance(frame, bytes):
                frame = _VALUE_FRAME + frame
    got = frames.broadcast_bytes(frame, src, res)
    if got[:1] == _VALUE_FRAME:
        return done(x if is_src else frames.decode_from(got[1:], src, "broadcast", device(), allow_pickle), async_op)
    if got[:1] != _TENSOR_FRAME:
        raise ValueError(f"broadcast: rank {src} sent a frame that is neither a value nor a tensor header")
    dtype, shape = tensor_header.decode(got[1:], src, "broadcast")
    if is_src or (isinstance(x, torch.Tensor) and x.dtype == dtype and list(x.shape) == shape):
        target = x
    else:
        target = torch.empty(shape, dtype=dtype, device=res.device)
    buf = contiguous(target)
    work = dist.broadcast(_bytes_of(buf), src, group=res.pg, async_op=async_op)
    return finish(lambda: _copy_back(buf, target), [work], async_op)


# ---------------------------------------------------------------- barrier


def barrier(group: GroupLike = None, *, async_op: bool = False) -> Any:
    """Block until every rank of the group has entered the barrier (no-op when serial).

    With ``async_op=True``, return a :class:`~polydist.Work` instead of
    blocking (its ``wait()`` returns None). Backends: any — gloo, nccl,
    ``mpi4py`` (it takes no tensor, so no dtype rules).

    Examples:
        On 2 ranks (``import polydist as pdist``)::

            if pdist.get_rank() == 0:
                prepare_data()                      # rank 1 waits in the barrier meanwhile
            pdist.barrier()                         # every rank: None, once both have entered
            pdist.barrier(async_op=True).wait()     # every rank: None

    Raises ``ValueError``/``TypeError`` for a bad ``group``.
    Source: ``torch.distributed.barrier``.
    """
    return _BARRIER.run(group, None, async_op)


def _barrier_body(res: Resolved, async_op: bool) -> Any:
    return finish(lambda: None, [dist.barrier(group=res.pg, async_op=async_op)], async_op)


_BARRIER = Collective("barrier", _barrier_body, lambda: None, lambda: ((), "barrier()"))
