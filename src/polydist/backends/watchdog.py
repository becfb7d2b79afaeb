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
   :mod:`~polydist.collectives.timeouts` gives), names the ranks whose last
   started number is below the stuck one (they did not arrive) with the words
   of polydist's own timeouts (:func:`~polydist.collectives.timeouts.describe`),
   marks the record failed, writes its dump (the ``on_timeout`` hooks) and
   prints the error;
3. it ends the job (the group's ``_end_job``): a blocked MPI collective cannot
   be cancelled, so the MPI group calls ``MPI_Abort`` after the dump, as NCCL's
   watchdog aborts its communicators, and mpiexec, ``polydist run``, horovodrun
   or Slurm end the other ranks.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from datetime import timedelta
from typing import Any, Optional

from torch.distributed.constants import default_pg_timeout

from ..collectives.recorder import NAME, RECORDER, SEQ, STARTED, STATE, as_dict

__all__ = ["GroupTag", "WATCHDOG", "Watchdog", "seconds", "end_process"]

_PREFIX = "polydist/watchdog/"
_ALARM = _PREFIX + "alarm"


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

    def watch(self, group: Any) -> None:
        """Watch ``group`` (a PythonProcessGroup); starts the thread on the first group."""
        with self._lock:
            self.groups.add(group)
            self.retune()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="polydist-watchdog", daemon=True)
                self._thread.start()

    def forget(self, group: Any) -> None:
        self.groups.discard(group)

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
        from ..collectives import timeouts

        error = RuntimeError(f"the watchdog of {alarm}; this rank {self._last_started()}")
        for hook in timeouts.on_timeout:  # the flight recorder's dump
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

    def _alarm(self, group: Any, record: list) -> None:
        from ..collectives import timeouts

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
            keys = {r: f"{_PREFIX}last/{tag.key}/{r}" for r in tag.ranks}
            deadline = time.monotonic() + timeouts.grace(tag.timeout_s)
            while not store.check(list(keys.values())) and time.monotonic() < deadline:
                time.sleep(0.05)
            started = {r: int(store.get(k)) for r, k in keys.items() if store.check([k])}
            seen = {r for r, n in started.items() if n >= seq}
            silent = [r for r in tag.ranks if r not in started]
            last = "; last started: " + ", ".join(f"rank {r} #{n}" for r, n in sorted(started.items()))
            if silent:
                last += f"; ranks {silent} did not answer (frozen or gone)"
        except Exception as exc:  # noqa: BLE001 - the store may be gone too, or the group has none
            unknown = f"the watchdog could not reach the group's store: {type(exc).__name__}: {exc}"
        after = f"{last}. {group._cannot_cancel()}"
        error = timeouts.describe(name, seq, tag.ranks, tag.rank, tag.timeout_s, seen, False, what=what,
                                  unknown=unknown, after=after)  # fmt: skip
        RECORDER.fail(record, error)
        for hook in timeouts.on_timeout:  # the flight recorder's dump, named in the error's notes
            hook(error)
        notes = "".join(f"\n{n}" for n in getattr(error, "__notes__", ()))
        text = f"polydist: watchdog: {type(error).__name__}: {error}{notes}\n"
        sys.stderr.write(text)
        sys.stderr.flush()
        group._end_job(error, text)


WATCHDOG = Watchdog()


def end_process(rank: int, text: str, code: int = 1) -> None:
    """End this process now, its error ``text`` left for ``polydist run``: the launcher ends the other ranks."""
    from .mpi4py.job import record_failure

    record_failure(rank, text)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
