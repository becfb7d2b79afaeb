"""A timed-out operation named, whoever found it: the error that says which ranks did not arrive, the grace
ranks wait for each other's word, and the hooks run with a named failure before it is raised or ends the rank.

Shared by the pipeline's timeout naming (:mod:`polydist.collectives.timeouts`,
for a resolved group) and by what watches torch's calls on polydist's own
groups, below the pipeline: the Python groups' watchdog
(:mod:`polydist.backends.watchdog`) and debug mode's leaving check
(:mod:`polydist.backends.leaving`). So it needs no group and imports nothing
above :mod:`polydist.errors`, like the flight recorder (:mod:`polydist.collectives.recorder`),
the other module of this folder the backends use.
"""

from __future__ import annotations

from typing import Optional

from ..errors import CollectiveTimeoutError

__all__ = ["on_timeout", "grace", "describe"]

# Called with the named error before it is raised (or ends the rank): the flight recorder's dump
# (polydist.trace.dump.timed_out), connected by polydist._wiring, since trace/
# builds on collectives/ and cannot be imported here.
on_timeout: list = []

_SHOWN = 16  # ranks listed in full in a message; longer lists are abridged


def _show(ranks: list) -> str:
    if len(ranks) <= _SHOWN:
        return str(ranks)
    return f"[{', '.join(map(str, ranks[:_SHOWN]))}, ...] ({len(ranks)} ranks)"


def grace(timeout_s: Optional[float]) -> float:
    """How long a rank that timed out waits for the other ranks' word (seconds)."""
    return min(max(1.0, 0.2 * timeout_s), 5.0) if timeout_s else 2.0


def describe(
    name: str, seq: int, ranks: tuple, rank: int, timeout_s: Optional[float], seen: Optional[set], rooted: bool,
    *, what: str = "", unknown: str = "", after: str = "",
) -> CollectiveTimeoutError:
    """The :class:`CollectiveTimeoutError` of call ``name`` #``seq`` on group ``ranks`` (global ranks) on ``rank``.

    ``seen``: the ranks known to have entered the call (None: unknown, for
    the reason ``unknown``); the others did not arrive. ``what``: the call's
    arguments, shown after its number; ``after``: a sentence appended.
    """
    head = f"{name} #{seq}{what} on group {_show(list(ranks))} timed out"
    head += f" after {timeout_s:g} s" if timeout_s else ""
    head += f" on rank {rank}"
    fields = dict(collective=name, seq=seq, group=ranks, rank=rank, timeout_s=timeout_s)
    if seen is None:
        text = f"{head}; could not learn which ranks arrived ({unknown})"
        return CollectiveTimeoutError(text + after, waiting=None, missing=None, **fields)
    waiting = sorted(seen)
    missing = [r for r in ranks if r not in seen]
    if not missing:
        text = (
            f"{head}: every rank of the group was waiting in it (a lost connection, or ranks that disagree "
            "on the calls: POLYDIST_DEBUG=1 compares them)"
        )
    else:
        absent = "did not arrive or had already done their part" if rooted else "did not arrive"
        text = f"{head}: ranks {_show(missing)} {absent}; ranks {_show(waiting)} were waiting"
    return CollectiveTimeoutError(text + after, waiting=waiting, missing=missing, **fields)
