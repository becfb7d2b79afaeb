"""The one path every collective and point-to-point call takes.

Each public call first checks and normalises its own arguments — what needs
no group: the op, dtypes, types, list lengths — so a serial run rejects the
same bad input as a distributed one, and then hands them to its
:class:`Collective`, which declares what the call is (its name, its root
argument, what ranks must agree on, its serial result, its body). The
collective runs the shared steps, always in this order:

1. **world**: the live world's state; without a process group, the serial
   result (a launched job without a group raises
   :class:`~polydist.NotInitializedError` instead);
2. **resolve** ``group`` (:func:`polydist.groups.resolve`) in that world;
3. **non-member**: a rank outside ``group`` gets its input back unchanged, a
   no-op warned once per group, as in torch.distributed;
4. **root check**: ``src``/``dst`` must be a member (and not this rank, for
   point-to-point); then the call's own **group check**, for what depends on
   the group's backend (the dtypes it reduces, :func:`polydist.ops.check_backend`);
5. **sequence number**: the group's count of collectives, one counter per
   group that debug mode and timeouts share;
6. **flight recorder** (:mod:`~polydist.collectives.recorder`): the call
   is recorded as started, and as completed or failed when it ends; while
   its body runs the record is the recorder's ``outer`` one, which a
   process group that records its own operations (polydist's Python groups,
   whoever calls them) adopts, so the call is recorded once;
7. **debug fingerprint** (:mod:`~polydist.collectives.debug`), when on;
8. **timeout naming** (:mod:`~polydist.collectives.timeouts`) around
9. **the body**: the backend call(s) — and around the ``wait()`` of the
   :class:`Work` it returns with ``async_op=True``. A backend-specific fast
   path (the mpi4py group's blocking all-reduce) lives inside a body, after
   every step above. A failure takes one path, here and in ``wait()``
   (:func:`polydist.collectives.timeouts.failed`): a timeout is named, the
   record marked failed, the flight recorder's dump written.

Point-to-point calls take steps 1–4, 6 and 9: they are not collectives of
the group, so they are not numbered (debug mode checks them with a header of
their own).
"""

from __future__ import annotations

import reprlib
import warnings
from typing import Any, Callable, Optional

import torch

from .. import codec, settings
from ..context import require_group
from ..groups import GroupLike, resolve
from . import debug, recorder, timeouts
from .work import Work

__all__ = ["Collective", "finish", "done", "check_tensor", "check_layout", "check_list", "contiguous"]


class Collective:
    """What a collective is, declared once; its ``run`` runs the steps of the module docstring.

    Args:
        name: the public name ("all_reduce"), used in messages.
        body: ``body(res, *args, async_op)`` → result (or a :class:`Work`
            when ``async_op``): the communication itself, on the resolved group.
        serial: ``serial(*args)`` → the result of a run without a process
            group; None: the call needs a peer, so a serial run raises
            ``ValueError``.
        fingerprint: ``fingerprint(*args)`` → ``(agree, shown)``: what every
            rank must pass identically and how to show this rank's call in a
            mismatch; None: not a collective of the group (point-to-point),
            so it is neither numbered nor fingerprinted.
        root: name of the root argument ("src"/"dst"), or None.
        peer: the root is a peer that must not be this rank (point-to-point).
        echo: a non-member gets the call's input (the first of ``args``)
            back; False: None, as torch.distributed's ``send`` returns.
        op_at: index in ``args`` of the reduction op, recorded by the flight
            recorder; None: the call has no op.
        check: ``check(res, *args)``: raises for arguments the resolved
            group's backend cannot take, before anything is sent; None: none.
    """

    __slots__ = ("name", "body", "serial", "fingerprint", "root", "peer", "echo", "op_at", "check")

    def __init__(
        self,
        name: str,
        body: Callable[..., Any],
        serial: Optional[Callable[..., Any]],
        fingerprint: Optional[Callable[..., tuple]],
        root: Optional[str] = None,
        peer: bool = False,
        echo: bool = True,
        op_at: Optional[int] = None,
        check: Optional[Callable[..., None]] = None,
    ) -> None:
        self.name, self.body, self.serial, self.fingerprint = name, body, serial, fingerprint
        self.root, self.peer, self.echo, self.op_at, self.check = root, peer, echo, op_at, check

    def run(self, group: GroupLike, root: Any, async_op: bool, *args: Any) -> Any:
        """Run the call's steps, in order (see the module docstring), on ``group`` (None: the world).

        A method, so that a reader and a static walk follow the tensor from the public function to the
        transport; the spec's fields are read once into locals (a small MPI all_reduce takes a few
        microseconds).
        """
        name, body, fingerprint, root_name, echo = self.name, self.body, self.fingerprint, self.root, self.echo
        rooted = root_name is not None  # some ranks may finish their part without waiting for the others
        rec = recorder.RECORDER
        state = require_group()
        if state is None:
            return done(self._serial(args, root), async_op)
        res = state.world_group if group is None else None
        if res is None:
            res = resolve(state, group)
            if res is None:
                _warn_not_member(state, group, name)
                return done(args[0] if args and echo else None, async_op)
        if rooted:
            res.check_root(root, root_name)
            if self.peer and root == res.rank:
                raise ValueError(
                    f"{root_name}={root} is this process's own rank; a rank cannot send to or receive from itself"
                )
        check, op_at = self.check, self.op_at
        if check is not None:
            check(res, *args)
        op = args[op_at] if op_at is not None else None
        if fingerprint is None:
            if not rec.on:
                return body(res, *args, async_op)
            record = rec.start(res, name, None, op, root, args[0], async_op)
            outer, rec.outer = rec.outer, record  # the group's own record of this call is this one
            try:
                result = body(res, *args, async_op)
            except BaseException as exc:
                rec.fail(record, exc)
                raise
            finally:
                rec.outer = outer
            return _recorded(rec, record, result, async_op)
        res.seq += 1
        record = rec.start(res, name, res.seq, op, root, args[0] if args else (), async_op) if rec.on else None
        outer, rec.outer = rec.outer, record
        try:
            debug_on = settings.DEBUG_SWITCH.value
            if debug_on is None:
                debug_on = settings.is_debug()  # reads $POLYDIST_DEBUG, once
            if debug_on:
                agree, shown = fingerprint(*args)
                debug.check(res, name, agree, shown)
            result = body(res, *args, async_op)
        except BaseException as exc:
            rec.outer = outer
            named = timeouts.failed(
                exc, lambda e: timeouts.explain(e, res, name, rooted), (rec, record) if record is not None else None
            )
            if named is None:
                raise
            raise named from exc
        rec.outer = outer
        if async_op:  # the wait may time out too: name the missing ranks there as well
            seq = res.seq
            result.explain = lambda exc: timeouts.explain(exc, res, name, rooted, seq)
        if record is not None:
            if not async_op:  # the common case, inline
                rec.end(record)
                return result
            return _recorded(rec, record, result, async_op)
        return result


    def _serial(self, args: tuple, root: Any) -> Any:
        if self.serial is None:
            raise ValueError(f"{self.root}={root!r}: point-to-point needs a process group; a serial run has no peer")
        if self.root is not None:
            if isinstance(root, bool) or not isinstance(root, int):
                raise TypeError(f"{self.root} must be an int global rank, got {root!r}")
            if root != 0:
                raise ValueError(f"{self.root}={root} is not a rank of a serial (world size 1) run")
        return self.serial(*args)


def _recorded(rec: recorder.Recorder, record: list, result: Any, async_op: bool) -> Any:
    """``result``, with ``record`` marked completed now, or when the :class:`Work` it is has been waited."""
    if async_op and isinstance(result, Work) and not result.finished():
        result.record = (rec, record)
    else:
        rec.end(record)
    return result


def _warn_not_member(state: Any, group: GroupLike, name: str) -> None:
    key = tuple(sorted(group)) if isinstance(group, (list, tuple, range)) else group
    if key in state.warned:
        return
    state.warned.add(key)
    shown = list(key) if isinstance(key, tuple) else "NON_GROUP_MEMBER" if isinstance(key, int) else "a process group"
    warnings.warn(
        f"{name} on global rank {state.rank}, which is not a member of group {shown}: the call does nothing "
        "and returns its input (torch.distributed's rule; warned once per group)",
        RuntimeWarning,
        stacklevel=4,
    )


# ---------------------------------------------------------------- helpers shared by the bodies


def finish(result_fn: Callable[[], Any], works: list, async_op: bool) -> Any:
    """Return ``result_fn()`` now, or a :class:`Work` that waits ``works`` and then calls it."""
    if async_op:
        return Work(works, result_fn)
    for w in works:
        if w is not None:
            w.wait()
    return result_fn()


def done(result: Any, async_op: bool) -> Any:
    return Work.done(result) if async_op else result


def contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_contiguous() else x.contiguous()


def check_tensor(x: Any, name: str) -> torch.Tensor:
    """``x`` when it is a dense tensor; ``TypeError`` naming what it is otherwise."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} takes a tensor, got {type(x).__name__}: {reprlib.repr(x)}")
    return codec.check_dense(x, name)


def check_layout(x: Any, name: str) -> None:
    """``TypeError`` naming the layout when ``x`` is a sparse (non-strided) tensor, before any communication."""
    if isinstance(x, torch.Tensor):
        codec.check_dense(x, name)


def check_list(xs: Any, size: int, name: str, what: str) -> list:
    """``xs`` as a list of exactly ``size`` items; ``ValueError``/``TypeError`` naming the bad value."""
    if not isinstance(xs, (list, tuple)):
        raise TypeError(f"{name} takes a list with one item per rank of the group ({what}), got {type(xs).__name__}")
    if len(xs) != size:
        raise ValueError(f"{name} needs a list of {size} items, one per rank of the group ({what}), got {len(xs)}")
    return list(xs)
