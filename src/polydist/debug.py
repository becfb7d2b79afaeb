"""Debug mode: ranks compare a fingerprint of each collective before running it.

With ``POLYDIST_DEBUG=1`` in the environment or ``set_debug(True)`` (on every
rank), each collective first all-gathers, over its own group, a fingerprint:
a per-group sequence number, the collective's name and what every rank must
agree on (op, root, dtype, shape, ...). When the fingerprints differ, every
rank raises :class:`~polydist.CollectiveMismatchError` naming what each rank
called — instead of a hang or silent corruption. The check costs one extra
slot-sized all-gather per collective, so it is off by default.

Point-to-point calls in debug mode send a small header before a tensor so the
receiver can compare it with the tensor it expects.
"""

from __future__ import annotations

import os
from typing import Optional

from . import codec
from .errors import CollectiveMismatchError
from .groups import Resolved
from .values import all_gather_bytes

__all__ = ["set_debug", "is_debug", "check", "reset", "describe_tensor"]

_debug: Optional[bool] = None  # None: follow POLYDIST_DEBUG
_sequence: dict[tuple[int, ...], int] = {}


def set_debug(enabled: bool) -> None:
    """Turn debug mode on or off for this process (do it on every rank, at the same point)."""
    global _debug
    _debug = bool(enabled)


def is_debug() -> bool:
    """Whether debug mode is on: ``set_debug``, else ``POLYDIST_DEBUG`` = 1/true/yes/on (read once)."""
    global _debug
    if _debug is None:  # every collective asks: read the environment only the first time
        _debug = os.environ.get("POLYDIST_DEBUG", "0").lower() in ("1", "true", "yes", "on")
    return _debug


def reset() -> None:
    """Forget the sequence numbers (a new world starts counting from 1)."""
    _sequence.clear()


def describe_tensor(dtype, shape) -> str:
    """``float32[4, 2]`` — how fingerprints show a tensor."""
    return f"{codec.dtype_name(dtype)}[{', '.join(str(d) for d in shape)}]"


def check(res: Resolved, name: str, agree: tuple, call: str) -> None:
    """Compare this call with the other members' calls; raise on any difference.

    Args:
        res: the group the collective runs on.
        name: the collective ("all_reduce").
        agree: what every rank must pass identically (op, root, dtype, shape...).
        call: how to show this rank's call in the error, e.g.
            ``"all_reduce(float32[4], op=SUM)"``.

    Raises:
        CollectiveMismatchError: on every member, when any sequence number,
            name or ``agree`` differs; ``calls`` maps global rank → call.
    """


    seq = _sequence.get(res.ranks, 0) + 1
    _sequence[res.ranks] = seq
    mine = codec.encode([seq, name, list(agree), call])
    rows = [codec.decode(b) for b in all_gather_bytes(mine, res, f"{name} (debug fingerprint)")]
    keys = [(s, n, repr(a)) for s, n, a, _ in rows]
    if len(set(keys)) == 1:
        return
    calls = {rank: f"call #{s}: {c}" for rank, (s, _, _, c) in zip(res.ranks, rows)}
    listing = "; ".join(f"rank {rank}: {text}" for rank, text in calls.items())
    raise CollectiveMismatchError(f"ranks of group {list(res.ranks)} called different collectives: {listing}", calls)
