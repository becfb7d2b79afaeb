"""What a later dump of a process keeps of its earlier ones (written by :mod:`.dump`, read by :mod:`.settle`).

One failure often makes a rank dump more than once: the launcher's SIGUSR1
while it waits for a frozen peer, its own exception once that peer is killed,
the launcher's SIGTERM. Each dump replaces the file, so each later one carries,
as ``earlier``, what the ones this process wrote before it to the same file
showed that it may no longer show (format: :mod:`polydist.trace`): when and
why each was written, its error, its main thread's frames, and torch's
operations that had not returned then (``torch_waiting``). torch's entries
also keep the frames an earlier dump symbolized (a signal's dump has none).
The last :data:`KEEP` earlier dumps are kept.
"""

from __future__ import annotations

import os

__all__ = ["keep", "KEEP"]

KEEP = 8
_earlier: dict = {}  # (pid, file) -> what the earlier dumps showed, oldest first
_frames: dict = {}  # (pid, file) -> {(recorder, record_id, time_created_ns): frames} of torch's entries


def keep(target: str, data: dict) -> None:
    """Add ``earlier`` to ``data`` (the dump about to be written to ``target``) and remember what it shows.

    Not thread-safe: :mod:`.dump` writes one dump at a time.
    """
    key = (os.getpid(), os.path.abspath(target))  # a forked child starts its own history
    earlier = _earlier.setdefault(key, [])
    data["earlier"] = list(earlier)
    entries = (data.get("torch") or {}).get("entries") or []
    known, fresh = _frames.get(key, {}), {}
    for e in entries:
        name = (e.get("recorder"), e.get("record_id"), e.get("time_created_ns"))
        if not e.get("frames") and name in known:
            e["frames"] = known[name]
        if e.get("frames"):
            fresh[name] = e["frames"]
    _frames[key] = fresh
    main = next((s for s in data.get("stacks", ()) if s.get("main")), None)
    waiting = [[e["record_id"], e["time_created_ns"]] for e in entries
               if not e.get("retired") and e.get("state") != "completed"
               and isinstance(e.get("record_id"), int) and isinstance(e.get("time_created_ns"), int)]  # fmt: skip
    earlier.append({"reason": data["reason"], "time": data["time"], "error": data["error"],
                    "stack": main["frames"] if main else [], "torch_waiting": waiting})  # fmt: skip
    del earlier[:-KEEP]
