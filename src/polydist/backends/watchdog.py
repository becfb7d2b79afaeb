"""The watchdog of polydist's Python process groups (mpi4py, horovod, xla-tpu): one thread per process.

torch's own backends bound every operation by the group's timeout (gloo
raises, NCCL's watchdog aborts); a ProcessGroup written in Python gets
neither from torch. Here, each operation such a group runs — called by
polydist, DDP, FSDP2 or the user through ``torch.distributed`` — carries its
group's timeout (``init_process_group(timeout=)``, ``new_group(timeout=)``,
``polydist.initialize``'s; torch's default, 30 minutes, otherwise). The
operation's flight-recorder record (:mod:`polydist.collectives.recorder`) is
what the watchdog reads: a group's :class:`~polydist.backends.lane.Lane`
shows the record it is running and since when, so the hot path pays for
nothing beyond the record itself.

Every ``interval`` (a quarter of the shortest timeout, at most a second) the
thread looks at each group's running operation. One running past its
timeout raises the alarm:

1. this rank writes the alarm into the group's store (the rendezvous store,
   which does not go through the stuck transport), and every rank's watchdog,
   which checks that key every ``interval`` as NCCL's heartbeat monitor checks
   its dump signal, answers with the sequence number it last started on each
   group and writes its flight-recorder dump;
2. this rank waits a short grace for the answers (the grace
   :mod:`~polydist.collectives.timeout_error` gives), names the ranks whose last
   started number is below the stuck one (they did not arrive) with the words
   of polydist's own timeouts (:func:`~polydist.collectives.timeout_error.describe`),
   marks the record failed, writes its dump (the ``on_timeout`` hooks) and
   prints the error;
3. it ends the job (the group's ``_end_job``): a blocked MPI collective cannot
   be cancelled, so the MPI group calls ``MPI_Abort`` after the dump, as NCCL's
   watchdog aborts its communicators, and mpiexec, ``polydist run``, horovodrun
   or Slurm end the other ranks.

A rank that ends its program while the others still wait leaves a note in
the store (:meth:`Watchdog.finished`, at exit): the number it last started on
each group and its exit code where its launcher knows it. The alarm reads it
as that rank's answer, so the error says the rank had finished instead of
that it did not answer.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import time
import weakref
from datetime import timedelta
from typing import Any, Optional

from torch.distributed.constants import default_pg_timeout

from .._failure_record import record_failure
from ..collectives import timeout_error
from ..collectives.recorder import NAME, RECORDER, SEQ, STARTED, STATE, as_dict

__all__ = ["GroupTag", "WATCHDOG", "Watchdog", "seconds", "end_process"]

_PREFIX = "polydist/watchdog/"
_ALARM = _PREFIX + "alarm"
_FINISHED = _PREFIX + "finished/"  # + global rank: the note of a rank that ended its program (Watchdog.finished)


def seconds(timeout: Optional[timedelta]) -> Optional[float]:
    """A group's timeout in seconds: torch's default for None; None (never) for zero or less."""
    s = (default_pg_timeout if timeout is None else timeout).total_seconds()
    return s if s > 0 else None


class GroupTag:
    """What records and the watchdog need of a Python group: ``ranks`` (global, group-rank order), ``rank``
    (this process's global rank), ``key`` (the group in store keys) and ``timeout_s`` (None: never)."""

    __slots__ = ("ranks", "rank", "key", "timeout_s")

    def __init__(self, ranks: tuple, rank: int, timeout_s: Optional[float]) -> None:
        self.ranks, self.rank, self.timeout_s = ranks, rank, timeout_s
        self.key = "-".join(map(str, ranks)) if len(ranks) <= 16 else f"{ranks[0]}-{len(ranks)}-{hash(ranks) & 0xFFFFFF:x}"


class Watchdog:
    """The one watchdog thread of this process; see the module docstring.

    ``store``: the store ranks meet in when the default group has none (the
    ``mpi`` stand-in sets one up); None: the default group's. ``enabled``:
    False stops the checks (benchmarks compare with and without).
    """

    def __init__(self) -> None:
        self.groups: weakref.WeakSet = weakref.WeakSet()
        self.store: Any = None
        self.enabled = True
        self.interval = 1.0
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._polling = True  # the store answers (a dead store or one without keys ends the polling)
        self._answered = False
        self._fired = False
        self._gone: dict = {}  # key -> (rank, last started) of groups destroyed, for the note of finished()
        self._noted = False

    def watch(self, group: Any) -> None:
        """Watch ``group`` (a PythonProcessGroup); starts the thread on the first group."""
        with self._lock:
            self.groups.add(group)
            self.retune()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="polydist-watchdog", daemon=True)
                self._thread.start()
                atexit.register(self.finished)  # a process that errs ends through MPI_Abort or os._exit, not here

    def forget(self, group: Any) -> None:
        """Stop watching ``group`` (destroyed or aborted); what :meth:`finished` tells of it is kept."""
        self.groups.discard(group)
        self._gone[group._tag.key] = (group._tag.rank, group._seq, len(group._tag.ranks))

    def failing(self) -> None:
        """This process ends for a failure (``MPI_Abort``, which may return, then exit handlers run): no note."""
        self._noted = True

    def finished(self, code: Optional[int] = None) -> None:
        """This rank ended its program (exit ``code``; None: at exit, code unknown): leave the number it last
        started on each group in the store, where another rank's alarm finds it (:meth:`_alarm`).

        Called by ``polydist run``'s worker when the program ends, by
        ``finalize`` at exit while the group polydist made lives, and at
        exit. Once per process, one ``set``: a store whose host has gone
        takes a single set without a word (a second one prints torch's
        warning). Not when the default group was destroyed and the store
        went with it.
        """
        if self._noted or code is None and getattr(sys, "last_value", None) is not None:  # an uncaught exception
            return
        self._noted = True
        last = {key: (rank, seq) for key, (rank, seq, size) in self._gone.items() if size > 1}
        last.update({g._tag.key: (g._tag.rank, g._seq) for g in list(self.groups) if len(g._tag.ranks) > 1})
        if not last:
            return
        rank = next(iter(last.values()))[0]
        note = json.dumps({"code": code, "last": {key: seq for key, (_, seq) in last.items()}})
        with contextlib.suppress(Exception):  # no store, or it is gone: nothing to tell
            self._store().set(f"{_FINISHED}{rank}", note)

    def retune(self) -> None:
        """The check interval: a quarter of the shortest timeout, between 50 ms and 1 s."""
        timeouts = [g._tag.timeout_s for g in list(self.groups) if g._tag.timeout_s]
        self.interval = min(1.0, max(0.05, min(timeouts, default=4.0) / 4))

    # ------------------------------------------------------------ the thread

    def _loop(self) -> None:
        while True:
            time.sleep(self.interval)
            if not self.enabled or self._fired:
                continue
            try:
                now = time.time()
                for group in list(self.groups):
                    lane, timeout_s = group._lane, group._tag.timeout_s
                    record, since = lane.current, lane.since
                    if record is not None and timeout_s is not None and now - since > timeout_s:
                        if record[STATE] == STARTED and record is lane.current:
                            self._fired = True
                            self._alarm(group, record)
                            break
                if self._polling and not self._fired:
                    self._poll()
            except Exception as exc:  # noqa: BLE001 - the watchdog must not die silently
                print(f"polydist: the watchdog failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def _store(self) -> Any:
        if self.store is not None:
            return self.store
        from .._torch import default_store

        return default_store()

    def _poll(self) -> None:
        """Another rank's alarm: answer, and dump this rank's flight recorder."""
        try:
            store = self._store()
            if not store.check([_ALARM]):
                return
            alarm = store.get(_ALARM).decode(errors="replace")
            self._answer(store)
        except Exception:  # noqa: BLE001 - no store, or its host is gone: nothing to poll
            self._polling = False
            return
        self._polling = False
        error = RuntimeError(f"the watchdog of {alarm}; this rank {self._last_started()}")
        for hook in timeout_error.on_timeout:  # the flight recorder's dump
            hook(error)

    def _answer(self, store: Any) -> None:
        """Write the number of the last operation this rank started on each group it is in."""
        if self._answered:
            return
        self._answered = True
        for group in list(self.groups):
            tag = group._tag
            store.set(f"{_PREFIX}last/{tag.key}/{tag.rank}", str(group._seq))

    def _last_started(self) -> str:
        return "; ".join(f"last started #{g._seq} on group {list(g._tag.ranks)}" for g in list(self.groups))

    def _answers(self, store: Any, tag: GroupTag) -> tuple:
        """``({rank: last started on the group}, {rank: exit code of a rank that had finished its program})``,
        read within the grace: each rank answers the alarm, or had left its note when it finished."""
        keys = {r: f"{_PREFIX}last/{tag.key}/{r}" for r in tag.ranks}
        started: dict = {}
        ended: dict = {}
        deadline = time.monotonic() + timeout_error.grace(tag.timeout_s)
        while True:
            for r in [r for r in tag.ranks if r not in started]:
                if store.check([keys[r]]):
                    started[r] = int(store.get(keys[r]))
                elif store.check([f"{_FINISHED}{r}"]):
                    note = json.loads(store.get(f"{_FINISHED}{r}"))
                    started[r], ended[r] = int(note["last"].get(tag.key, 0)), note["code"]
            if len(started) == len(tag.ranks) or time.monotonic() >= deadline:
                return started, ended
            time.sleep(0.05)

    def _alarm(self, group: Any, record: list) -> None:
        tag, name, seq = group._tag, record[NAME], record[SEQ]
        entry = as_dict(record)
        shown = ", ".join(f"{d} {s}" for d, s in zip(entry["dtypes"], entry["shapes"]))
        what = f" ({shown}; {entry['bytes']} B)" if shown else ""
        seen: Optional[set] = None
        unknown = last = ""
        try:
            store = self._store()
            store.set(_ALARM, f"rank {tag.rank}: {name} #{seq} on group {list(tag.ranks)} timed out")
            self._answer(store)
            started, ended = self._answers(store, tag)
            seen = {r for r, n in started.items() if n >= seq}
            silent = [r for r in tag.ranks if r not in started]
            last = "; last started: " + ", ".join(f"rank {r} #{n}" for r, n in sorted(started.items()))
            for r, code in sorted(ended.items()):
                last += f"; rank {r} had finished its program" + ("" if code is None else f" (exit code {code})")
            if silent:
                last += f"; ranks {silent} did not answer (frozen or gone)"
        except Exception as exc:  # noqa: BLE001 - the store may be gone too, or the group has none
            unknown = f"the watchdog could not reach the group's store: {type(exc).__name__}: {exc}"
        after = f"{last}. {group._cannot_cancel()}"
        error = timeout_error.describe(name, seq, tag.ranks, tag.rank, tag.timeout_s, seen, False, what=what,
                                       unknown=unknown, after=after)  # fmt: skip
        RECORDER.fail(record, error)
        for hook in timeout_error.on_timeout:  # the flight recorder's dump, named in the error's notes
            hook(error)
        notes = "".join(f"\n{n}" for n in getattr(error, "__notes__", ()))
        text = f"polydist: watchdog: {type(error).__name__}: {error}{notes}\n"
        sys.stderr.write(text)
        sys.stderr.flush()
        group._end_job(error, text)


WATCHDOG = Watchdog()


def end_process(rank: int, text: str, code: int = 1) -> None:
    """End this process now, its error ``text`` left for ``polydist run``: the launcher ends the other ranks."""
    WATCHDOG.failing()
    record_failure(rank, text)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
