"""Collective timeouts that say which ranks did not arrive.

A backend's own timeout error (gloo: "Timed out waiting 5000ms for recv
operation to complete") does not say who is missing. polydist numbers the
collectives each rank calls on each group (the group's sequence number, set
by :mod:`~polydist.collectives.pipeline`: no communication). When a collective times out, every rank that timed
out in it writes ``polydist/timeout/<group>/<seq>/<rank>`` into the default
group's store (the rendezvous store, which outlives a stuck collective), waits
a short grace for the other ranks that timed out in the same call, and raises
:class:`~polydist.CollectiveTimeoutError` naming the ranks whose keys are
missing. Only the error path communicates. The error's words
(:func:`~polydist.collectives.timeout_error.describe`), that grace and the
hooks run for a named timeout (the flight recorder's dump) are
:mod:`~polydist.collectives.timeout_error`'s, which needs no group.

The timeout itself is the process group's (``initialize(timeout=...)``,
``spawn(timeout=...)``, ``polydist run --timeout``). MPI collectives have no
timeout of their own: polydist's Python groups (mpi4py, horovod, xla-tpu)
are watched by :mod:`polydist.backends.watchdog`, which names the call in the
same words and ends the job; on mpi4py a rank that raises ends the job
through ``MPI_Abort``, and a rank that dies is ended by ``mpiexec``.
"""

from __future__ import annotations

import re
import time
from typing import Callable, Optional

from .. import _torch
from ..errors import CollectiveTimeoutError, PolydistError
from ..groups import Resolved
from . import timeout_error

__all__ = ["explain", "failed"]

_GLOO_WAIT = re.compile(r"Timed out waiting (\d+)ms")
_TIMEOUT_TEXT = re.compile(r"timed out|timeout", re.IGNORECASE)


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
    :data:`timeout_error.on_timeout <polydist.collectives.timeout_error.on_timeout>` (the dump). Returns the
    named error, which the caller raises ``from exc``; None: the caller re-raises ``exc`` as it is.
    """
    named = explain(exc) if isinstance(exc, RuntimeError) else None
    if recorded is not None:
        rec, record = recorded
        rec.fail(record, named or exc)
    if named is not None:
        for hook in timeout_error.on_timeout:
            hook(named)
    return named


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
        seen = _compare_notes(res, seq, name, timeout_error.grace(timeout_s))
    except Exception as store_exc:  # the store's host may be gone as well
        unknown = f"store: {store_exc}"
        return timeout_error.describe(name, seq, res.ranks, res.rank, timeout_s, None, rooted, unknown=unknown)
    return timeout_error.describe(name, seq, res.ranks, res.rank, timeout_s, seen, rooted)
