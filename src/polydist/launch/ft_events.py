"""The log of a fault-tolerant job: what its replica groups and their agents saw, for ``polydist run`` to report.

Under ``polydist run --fault-tolerant`` each replica group's agent records a
rank it lost (``lost``) or gave up replacing (``given_up``), and rank 0 of
each replica group records the steps it had to discard (``failed``), the
first step it committed again (``recovered``, with the count of discarded
steps), the state it received from a live replica (``healed``), the quorums
it trained in (``quorum``) and how it ended (``finished``, with a digest of
its model and optimizer state). Each process appends JSON lines to a file of
its own in ``$POLYDIST_FT_EVENTS`` (one ``write`` a line, so a reader never
sees half a line from a live writer); the launcher reads every file as it
grows (:class:`Reader`) and turns the events into one line per fault
(:mod:`polydist.launch.fault_tolerant`).

On MPI (ULFM) the ranks may run on several hosts, started by one
``mpiexec`` whose forwarded output is the one channel every host has to the
launcher: there ``$POLYDIST_FT_EVENTS`` is ``stderr:TOKEN`` and each event is
one line of the process's standard error, marked with the job's token
(:func:`stream_value`); the launcher reads ``mpiexec``'s standard error
through :class:`StreamReader`, which takes the marked lines out and passes
every other byte through to its own.

The folder is the launcher's own (a fresh temporary one, removed at the
end), but a line is still checked before it is used: an event of an unknown
kind, a missing field or a field of the wrong type is skipped, never trusted.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from typing import Any, BinaryIO, Optional

from .. import settings

__all__ = ["KINDS", "record", "Reader", "StreamReader", "stream_value", "parse"]

# kind -> its fields and their types, besides "kind", "replica" (int) and "t" (float, time.time()).
KINDS: dict[str, dict[str, tuple]] = {
    "lost": {"rank": (int,), "how": (str,), "error": (str,), "replacement": (int,), "of": (int,)},
    "given_up": {"rank": (int,), "how": (str,), "error": (str,)},
    "started": {"incarnation": (int,)},
    "quorum": {"step": (int,), "participants": (int,), "members": (list,), "since": (float, int)},
    "failed": {"step": (int,), "error": (str,), "since": (float, int)},
    "recovered": {"step": (int,), "lost": (int,), "since": (float, int)},
    "healed": {"step": (int,), "seconds": (float, int), "bytes": (int,)},
    "finished": {"step": (int,), "digest": (str,)},
}
_MAX_LINE = 64 * 1024  # an event is a few hundred bytes; a longer line is not one of ours
_STREAM = "stderr:"  # $POLYDIST_FT_EVENTS's value when the events travel on stderr; then the job's token
_MARK = b"\x1epolydist-ft-event "  # then the token, a space and the event (\x1e: ASCII's record separator)

_files: dict[str, Any] = {}  # this process's open log, by folder


def record(kind: str, replica: int, **fields: Any) -> None:
    """Append one event to this process's log in ``$POLYDIST_FT_EVENTS`` (nothing when it is not set).

    ``ValueError`` for an unknown ``kind`` or fields that do not match
    :data:`KINDS` (a bug of the caller, caught in tests).
    """
    folder = settings.FT_EVENTS.read()
    if not folder:
        return
    event = {"kind": kind, "replica": replica, "t": time.time(), **fields}
    if _checked(event) is None:
        raise ValueError(f"not a valid {kind!r} event: {event!r}")
    line = json.dumps(event, separators=(",", ":")) + "\n"
    if folder.startswith(_STREAM):  # one write(2) of a short line: never split by another thread's output
        os.write(2, _mark(folder) + line.encode("utf-8"))
        return
    f = _files.get(folder)
    if f is None:
        path = os.path.join(folder, f"events-{os.getpid()}.jsonl")
        f = _files[folder] = open(path, "a", buffering=1, encoding="utf-8")  # line-buffered: one write a line
    f.write(line)


def _checked(event: Any) -> Optional[dict]:
    """``event`` when it is a well-formed event, else None."""
    if not isinstance(event, dict):
        return None
    fields = KINDS.get(event.get("kind"))  # type: ignore[arg-type]
    if fields is None or set(event) != {"kind", "replica", "t", *fields}:
        return None
    typed = {"replica": (int,), "t": (float, int), **fields}
    for name, types in typed.items():
        value = event[name]
        if isinstance(value, bool) or not isinstance(value, types):
            return None
        if isinstance(value, list) and not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return None
    return event


class Reader:
    """Every event of the logs in ``folder``, each once, in the order they were written per file."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._offsets: dict[str, int] = {}

    def new(self) -> list[dict]:
        """The events written since the last call (complete lines only), sorted by time."""
        events: list[dict] = []
        try:
            names = sorted(os.listdir(self.folder))
        except OSError:
            return events
        for name in names:
            if not (name.startswith("events-") and name.endswith(".jsonl")):
                continue
            path = os.path.join(self.folder, name)
            start = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
            self._offsets[path] = start + end
            events += parse(data[:end])
        events.sort(key=lambda e: e["t"])
        return events

    def close(self, timeout: float = 0.0) -> None:
        """Nothing to wait for: a file's lines are there once written (as :meth:`StreamReader.close`)."""


def _mark(value: str) -> bytes:
    """What starts each event's line on stderr in the job whose ``$POLYDIST_FT_EVENTS`` is ``value``."""
    return _MARK + value[len(_STREAM):].encode("ascii", "replace") + b" "


def stream_value() -> str:
    """A fresh ``$POLYDIST_FT_EVENTS`` for a job whose events travel on stderr (a random token per job: a line
    of another job's log that passes through, or an old log printed by the program, is not taken for an event)."""
    return _STREAM + secrets.token_hex(8)


class StreamReader:
    """The events a job writes on stderr (``value``: its :func:`stream_value`), taken out of ``stream`` (the
    launched ``mpiexec``'s standard error, a pipe) by a thread that passes every other byte on to ``out`` as
    it comes; :meth:`new` as :class:`Reader`'s. The thread ends at the stream's end (:meth:`close` waits)."""

    def __init__(self, value: str, stream: BinaryIO, out: BinaryIO) -> None:
        self._mark = _mark(value)
        self._stream, self._out = stream, out
        self._events: list[dict] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._relay, name="polydist-ft-events", daemon=True)
        self._thread.start()

    def _relay(self) -> None:
        # Raw reads, not lines: a program's progress bar ("\r", no newline) reaches the console as it comes.
        mark, pending, skipping = self._mark, b"", False
        while True:
            try:
                data = os.read(self._stream.fileno(), 65536)
            except OSError:
                data = b""
            if not data:
                break
            pending += data
            if skipping:  # the rest of a marked line too long to be an event: dropped up to its newline
                end = pending.find(b"\n")
                pending, skipping = (b"", True) if end < 0 else (pending[end + 1:], False)
            while True:
                at = pending.find(mark)
                if at < 0:  # pass all on but a tail that may be the start of a mark
                    keep = next((n for n in range(min(len(mark) - 1, len(pending)), 0, -1)
                                 if pending.endswith(mark[:n])), 0)  # fmt: skip
                    self._write(pending[: len(pending) - keep])
                    pending = pending[len(pending) - keep:]
                    break
                self._write(pending[:at])  # a line the program had not ended when the event was written
                end = pending.find(b"\n", at)
                if end < 0:  # the rest of the event is still on its way; a line longer than any event is dropped
                    pending, skipping = (pending[at:], False) if len(pending) - at <= _MAX_LINE else (b"", True)
                    break
                events = parse(pending[at + len(mark): end + 1])
                with self._lock:
                    self._events += events
                pending = pending[end + 1:]
        self._write(pending)

    def _write(self, data: bytes) -> None:
        if data:
            try:
                self._out.write(data)
                self._out.flush()
            except (OSError, ValueError):  # the launcher's own stderr closed: the events still count
                pass

    def new(self) -> list[dict]:
        """The events taken out since the last call, sorted by time."""
        with self._lock:
            events, self._events = self._events, []
        return sorted(events, key=lambda e: e["t"])

    def close(self, timeout: float = 10.0) -> None:
        """Wait (up to ``timeout`` s) for the stream's end, once the job ended: its last lines are relayed and
        its last events are read. (A host's MPI daemon that outlives ``mpiexec`` may hold the stream open: the
        relay then goes on in the background.)"""
        self._thread.join(timeout)


def parse(data: bytes) -> list[dict]:
    """The well-formed events in ``data`` (complete JSON lines); a line too long, not JSON or not an event is
    skipped. Also for the lines another node's launcher sent (:mod:`~polydist.launch.ft_nodes`)."""
    events = []
    for line in data.splitlines():
        if len(line) > _MAX_LINE:
            continue
        try:
            event = _checked(json.loads(line))
        except ValueError:
            event = None
        if event is not None:
            events.append(event)
    return events
