"""What torch's records of one rank say once all of that rank's dumps are taken together (:mod:`.reader`).

torch's flight recorder on gloo (CPU) records no completion time and marks an
operation "retired" when it returns, whether it completed or failed; a dump
written by a signal has no frames for its operations (torch's stacks take
seconds to symbolize). So the record of an operation a rank failed in reads
"completed" at an unknown place, and a later dump of the same process (the
launcher's SIGTERM after a SIGUSR1 that showed the rank waiting) no longer
shows the wait. :func:`settle` gives each of torch's operations of a dump its
most informative state:

- an operation that an earlier dump of the process showed waiting (not
  returned) stays waiting, unless a later record shows it completed: a
  completion time, or an operation on the same group that the rank started
  after that dump;
- when the rank's error came from the backend (gloo's or NCCL's message, a
  ``DistBackendError``, polydist's collective timeout), the operation it
  failed in is taken as failed with that error: its last one that returned
  without a completion time (the one started where the error was raised, when
  the records say where), and those kept waiting above; it ended when the first
  dump with that error was written (at the latest at its timeout);
- an operation still waiting or failed with no place of its own gets one: where
  the error was raised (the innermost frame of user code of its traceback) for
  the failed one, else the innermost frame of user code of the main thread of
  the dump that showed it waiting (a signal's, a SIGTERM's or a timeout's,
  written while the main thread waits in it).

polydist's own records need none of this: they say completed, failed, and where.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

from .records import Call, Dump, Earlier, Site, innermost, innermost_of, raised_at

__all__ = ["settle", "backend_error"]

# The errors of a failed operation of a backend: gloo's (its C++ source path, its timeout), NCCL's, torch's
# DistBackendError, polydist's CollectiveTimeoutError. A store's or the program's own errors are not.
_BACKEND = re.compile(r"[/\\]gloo[/\\]|ProcessGroup(Gloo|NCCL)|\bNCCL\b|Timed out waiting \d+ms for \w+ operation|"
                      r"^(torch\.distributed\.)?DistBackendError:|"
                      r"^(polydist\.errors\.)?CollectiveTimeoutError:")  # fmt: skip
# Dumps written while the main thread waits where it called: its innermost frame of user code is the call's place.
_WAITING_MAIN = ("signal", "terminate", "timeout")


def backend_error(error: Optional[str]) -> bool:
    """Whether ``error`` (a dump's ``"Type: message"``) is a collective's failure in the backend."""
    return bool(error) and bool(_BACKEND.search(error))


_SAME_NS = 10_000  # a record's start, read back from float seconds, is within this of its time_created_ns


def _returned(call: Call) -> bool:
    """torch's record says the operation returned, but not that it completed (gloo's "retired")."""
    return call.state == "completed" and call.end is None


def settle(dump: Dump) -> Dump:
    """``dump`` with its torch calls as all of the process's dumps show them (see the module's docstring)."""
    if not dump.torch_calls:
        return dump
    calls = list(dump.torch_calls)
    seen: dict = {}  # record_id -> [(time_created_ns, the earlier dump that showed it waiting)], oldest dump first
    for earlier in dump.earlier:
        for record, ns in earlier.waiting:
            seen.setdefault(record, []).append((ns, earlier))
    # the earliest earlier dump that showed each call waiting, or None
    shown = [next((e for ns, e in seen.get(c.id, ()) if abs(ns - c.start * 1e9) < _SAME_NS), None) for c in calls]
    kept = set()  # indexes of calls kept waiting
    for i, call in enumerate(calls):
        if shown[i] is not None and _returned(call) and not any(
                c.group == call.group and c.start > shown[i].time for c in calls):  # fmt: skip
            calls[i] = dataclasses.replace(call, state="started")
            kept.add(i)
    failed = _failed_in(dump, calls, kept)
    raised, _ = raised_at(dump)
    for i, call in enumerate(calls):
        if i in failed:
            call = calls[i] = dataclasses.replace(call, state="failed", error=dump.error, end=failed[i])
        if call.state == "completed" or call.file is not None:
            continue
        waiting_now = dump.torch_calls[i].state == "started"
        site = raised if i in failed and raised is not None else _waited_at(dump, waiting_now, shown[i])
        if site is not None:
            calls[i] = dataclasses.replace(call, file=site.file, line=site.line, function=site.function)
    return dataclasses.replace(dump, torch_calls=tuple(calls))


def _failed_in(dump: Dump, calls: list, kept: set) -> dict:
    """``{index: end}`` of the calls the rank's backend error failed (none without one)."""
    if not backend_error(dump.error):
        return {}
    when = next((e.time for e in dump.earlier if e.error == dump.error), dump.time)  # the first dump with the error
    returned = [i for i, c in enumerate(calls) if (_returned(c) or i in kept) and c.start <= when]
    if not returned:
        return {}
    raised, user = raised_at(dump)
    there = [i for i in returned if user and (calls[i].file, calls[i].line) == (raised.file, raised.line)]
    chosen = {(there or returned)[-1]} | {i for i in kept if calls[i].start <= when}
    return {i: min(when, calls[i].start + calls[i].timeout) if calls[i].timeout is not None else when
            for i in chosen}  # fmt: skip


def _waited_at(dump: Dump, waiting_now: bool, shown: Optional[Earlier]) -> Optional[Site]:
    """The innermost frame of user code of the main thread of the dump that showed a call waiting, or None:
    this one when the call is waiting in it (``waiting_now``), else the earlier one that did (``shown``)."""
    if waiting_now and dump.reason in _WAITING_MAIN:
        site, user = innermost(dump.stacks)
    elif shown is not None and shown.reason in _WAITING_MAIN:
        site, user = innermost_of(shown.frames)
    else:
        return None
    return site if user else None
