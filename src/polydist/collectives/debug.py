"""Debug mode: ranks compare a fingerprint of each collective before running it.

With ``POLYDIST_DEBUG=1`` in the environment or ``set_debug(True)`` (on every
rank; :mod:`polydist.settings`), each collective first all-gathers, over its own group, a fingerprint:
the group's sequence number (the one timeouts use), the collective's name and what every rank must
agree on (op, root, dtype, shape, ...). When the fingerprints differ, every
rank raises :class:`~polydist.CollectiveMismatchError` naming what each rank
called — instead of a hang or silent corruption. The check costs one extra
slot-sized all-gather per collective, so it is off by default.

Point-to-point calls in debug mode send a small header before a tensor so the
receiver can compare it with the tensor it expects.

A rank that skips one call of a loop whose calls all look alike (equal
shapes, same op) cannot be seen at that call: its next call carries the same
fingerprint as the others' skipped one. It is seen at the first call that
differs — at the latest when the rank leaves (``finalize()``, called by
``spawn``/``Parallel`` after the function, or interpreter exit): the leaving
rank tells the others on the group's store
(:mod:`polydist.backends.leaving`, which also covers the operations torch
runs for DDP, FSDP2 or the program itself). A rank waiting in the
fingerprint exchange of the leaver's next call has the leaver join it, as a
fingerprinted ``finalize`` call of the world: every rank raises the mismatch
there (the skipping rank from ``finalize()``; at interpreter exit it prints
it and exits with status 1).
"""

from __future__ import annotations

import os
import reprlib
import sys
from typing import Any, Callable, Optional

from .. import codec, live_world
from ..live_world import world
from ..errors import CollectiveMismatchError
from ..groups import Resolved, resolve
from ..settings import is_debug, set_debug
from .frames import all_gather_bytes, decode_all

__all__ = ["set_debug", "is_debug", "check", "check_leaving", "describe_tensor", "reset"]

# The world whose sequence numbers are known to be out of step (a mismatch was raised here), or
# whose leaving was already checked: finalize() does not compare again there (it would wait for
# ranks that are not coming, or compare twice when finalize is retried at exit).
_settled: object = None

# Filled in polydist._wiring by polydist.backends.leaving (backends/ uses this folder's recorder, so it is not
# imported here): announce(rank, world, calls, how) tells the others this rank leaves and returns None, "join" or a
# verdict (text, calls); entering(ranks, number) before a fingerprint exchange returns a verdict to raise (a rank of
# the group left) or None; leaving_exchange() after it.
announce: Optional[Callable[..., Any]] = None
entering: Optional[Callable[[Any, int], Optional[tuple]]] = None
leaving_exchange: Optional[Callable[[], None]] = None


def reset() -> None:
    """Number every group's collectives from 1 again (call it on every rank at the same point).

    The sequence numbers that fingerprints compare stay out of step after a
    rank skipped a collective; a program that recovers from the
    :class:`~polydist.CollectiveMismatchError` can put them back in step.
    """
    global _settled
    state = world()
    _settled = None
    for res in state.resolved.values() if state is not None else ():
        if res is not None:
            res.seq = 0


def describe_tensor(dtype, shape) -> str:
    """``float32[4, 2]`` — how fingerprints show a tensor."""
    return f"{codec.dtype_name(dtype)}[{', '.join(str(d) for d in shape)}]"


def check(res: Resolved, name: str, agree: tuple, call: str) -> None:
    """Compare this call with the other members' calls; raise on any difference.

    Args:
        res: the group the collective runs on; ``res.seq`` numbers the call.
        name: the collective ("all_reduce").
        agree: what every rank must pass identically (op, root, dtype, shape...).
        call: how to show this rank's call in the error, e.g.
            ``"all_reduce(float32[4], op=SUM)"``.

    Raises:
        CollectiveMismatchError: on every member, when any sequence number,
            name or ``agree`` differs; ``calls`` maps global rank → call.
    """
    mine = codec.encode([res.seq, name, list(agree), call])
    what = f"{name} (debug fingerprint)"
    gone = entering(res.ranks, res.seq) if entering is not None and name != "finalize" else None
    if gone is not None:
        raise CollectiveMismatchError(gone[0], gone[1])
    try:
        rows = decode_all(all_gather_bytes(mine, res, what), res, what)
    finally:
        if leaving_exchange is not None:
            leaving_exchange()
    for rank, row in zip(res.ranks, rows):
        if not (isinstance(row, list) and len(row) == 4 and type(row[0]) is int and isinstance(row[1], str)):
            raise ValueError(f"{what}: rank {rank} sent a malformed fingerprint: {reprlib.repr(row)}")
    keys = [(s, n, repr(a)) for s, n, a, _ in rows]
    if len(set(keys)) == 1:
        return
    global _settled
    _settled = world()
    calls = {rank: f"call #{s}: {c}" for rank, (s, _, _, c) in zip(res.ranks, rows)}
    listing = "; ".join(f"rank {rank}: {text}" for rank, text in calls.items())
    leaving = [rank for rank, (_, n, _, _) in zip(res.ranks, rows) if n == "finalize"]
    if leaving and len(leaving) < len(rows):
        listing += (f" (ranks {leaving} are leaving while the others still call collectives: they made fewer "
                    "calls, e.g. skipped one of a loop)")
    raise CollectiveMismatchError(f"ranks of group {list(res.ranks)} called different collectives: {listing}", calls)


def check_leaving(at_exit: bool = False) -> None:
    """Debug mode: tell the other ranks this one leaves; raise if they wait in a call it never made.

    Run by ``finalize()`` while the group lives, and at interpreter exit
    (wired in :mod:`polydist._wiring`); see the module docstring. At exit the
    mismatch is printed and the process ends with status 1.

    Raises:
        CollectiveMismatchError: a rank waits in a call this one never made.
    """
    global _settled
    state = world()
    if state is None or state.size == 1 or state is _settled or not is_debug():
        return
    _settled = state
    res = resolve(state, None)
    at_exit = at_exit or live_world.exiting
    how = "exit" if at_exit else "finalize()"
    calls = {"-".join(map(str, r.ranks)): r.seq for r in state.resolved.values() if r is not None}
    verdict = announce(state.rank, list(res.ranks), calls, how) if announce is not None else "join"
    try:
        if verdict == "join":
            res.seq += 1
            check(res, "finalize", (), "finalize()")
        elif verdict is not None:
            raise CollectiveMismatchError(verdict[0], verdict[1])
    except CollectiveMismatchError as exc:
        if not at_exit:
            raise
        sys.stderr.write(f"polydist: debug: CollectiveMismatchError: {exc}\n")  # an exit handler's error is lost
        sys.stderr.flush()
        os._exit(1)
