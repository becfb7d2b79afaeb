"""Collective timeouts that say which ranks did not arrive.

A backend's own timeout error (gloo: "Timed out waiting 5000ms for recv
operation to complete") does not say who is missing. polydist numbers the
collectives each rank calls on each group (the group's sequence number, set
by :mod:`~polydist.collectives.pipeline`: no communication). When a collective times out, every rank that timed
out in it writes ``polydist/timeout/<group>/<seq>/<rank>`` into the default
group's store (the rendezvous store, which outlives a stuck collective), waits
a short grace for the other ranks that timed out in the same call, and raises
:class:`~polydist.CollectiveTimeoutError` naming the ranks whose keys are
missing. Only the error path communicates.

The timeout itself is the process group's (``initialize(timeout=...)``,
``spawn(timeout=...)``, ``polydist run --timeout``). MPI collectives have no
timeout of their own: polydist's Python groups (mpi4py, horovod, xla-tpu)
are watched by :mod:`polydist.backends.watchdog`, which names the call with
:func:`describe` and ends the job; on mpi4py a rank that raises ends the job
through ``MPI_Abort``, and a rank that dies is ended by ``mpiexec``.
"""

from __future__ import annotations

import re
import time
from typing import Callable, Optional

from .. import _torch
from ..errors import CollectiveTimeoutError, PolydistError
from ..groups import Resolved

__all__ = ["explain", "failed", "on_timeout", "describe", "grace"]

# Called with the named timeout before it is raised: the flight recorder's dump
# (polydist.trace.dump.timed_out), connected by polydist._wiring, since trace/
# builds on collectives/ and cannot be imported here.
on_timeout: list = []

_GLOO_WAIT = re.compile(r"Timed out waiting (\d+)ms")
_TIMEOUT_TEXT = re.compile(r"timed out|timeout", re.IGNORECASE)
_SHOWN = 16  # ranks listed in full in a message; longer lists are abridged


def explain(
    exc: RuntimeError, res: Resolved, name: str, rooted: bool, seq: Optional[int] = None
) -> Optional[CollectiveTimeoutError]:
    """The :class:`CollectiveTimeoutError` that names who did not arrive, when ``exc`` is a backend timeout.

    None for any other error (it passes unchanged): polydist's own, a store
    wait's, and errors whose text is not a timeout's. ``rooted``: some ranks
    of this collective may finish their part without waiting for the others
    (broadcast, reduce, gather, scatter), so a rank without a key may have
    arrived and left. ``seq``: the call's sequence number (default: the
    group's latest, right for a synchronous call; an asynchronous one is
    waited for later, when the group may have moved on).
    """
    if isinstance(exc, (PolydistError, *_torch.StoreError)) or not _TIMEOUT_TEXT.search(str(exc)):
        return None
    return _explain(name, rooted, exc, res, res.seq if seq is None else seq)


def failed(
    exc: BaseException, explain: Callable[[RuntimeError], Optional[Exception]], recorded: Optional[tuple]
) -> Optional[Exception]:
    """The one failure path of a collective and of the ``wait()`` of its :class:`~polydist.Work`.

    Names the timeout (``explain(exc)`` for a ``RuntimeError``), marks the
    flight recorder's ``recorded`` = ``(recorder, record)`` failed (with the
    named error when there is one), and for a named timeout runs
    :data:`on_timeout` (the dump). Returns the named error, which the caller
    raises ``from exc``; None: the caller re-raises ``exc`` as it is.
    """
    named = explain(exc) if isinstance(exc, RuntimeError) else None
    if recorded is not None:
        rec, record = recorded
        rec.fail(record, named or exc)
    if named is not None:
        for hook in on_timeout:
            hook(named)
    return named


def _show(ranks: list) -> str:
    if len(ranks) <= _SHOWN:
        return str(ranks)
    return f"[{', '.join(map(str, ranks[:_SHOWN]))}, ...] ({len(ranks)} ranks)"


def _timeout_s(res: Resolved, exc: Exception) -> Optional[float]:
    """What the backend waited: from gloo's message, else the group's configured timeout."""
    found = _GLOO_WAIT.search(str(exc))
    return int(found.group(1)) / 1000 if found else _torch.group_timeout(res.pg)


def _compare_notes(res: Resolved, seq: int, name: str, grace_s: float) -> set:
    """Leave this rank's key, wait up to ``grace_s`` for the other members' keys; return the ranks seen."""
    store = _torch.default_store()
    prefix = f"polydist/timeout/{res.key}/{seq}/"
    store.set(prefix + str(res.rank), name)
    seen = {res.rank}
    deadline = time.monotonic() + grace_s
    while True:
        seen.update(r for r in res.ranks if r not in seen and store.check([prefix + str(r)]))
        if len(seen) == res.size or time.monotonic() >= deadline:
            return seen
        time.sleep(0.05)


def _explain(name: str, rooted: bool, exc: Exception, res: Resolved, seq: int) -> CollectiveTimeoutError:
    timeout_s = _timeout_s(res, exc)
    # Ranks that entered the call within the grace of each other time out within it too.
    try:
        seen = _compare_notes(res, seq, name, grace(timeout_s))
    except Exception as store_exc:  # the store's host may be gone as well
        return describe(name, seq, res.ranks, res.rank, timeout_s, None, rooted, unknown=f"store: {store_exc}")
    return describe(name, seq, res.ranks, res.rank, timeout_s, seen, rooted)


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
