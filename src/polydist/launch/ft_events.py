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

The folder is the launcher's own (a fresh temporary one, removed at the
end), but a line is still checked before it is used: an event of an unknown
kind, a missing field or a field of the wrong type is skipped, never trusted.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

from .. import settings

__all__ = ["KINDS", "record", "Reader", "parse"]

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
    f = _files.get(folder)
    if f is None:
        path = os.path.join(folder, f"events-{os.getpid()}.jsonl")
        f = _files[folder] = open(path, "a", buffering=1, encoding="utf-8")  # line-buffered: one write a line
    f.write(json.dumps(event, separators=(",", ":")) + "\n")


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
