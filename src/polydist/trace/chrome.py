"""Every rank's calls on one timeline: a Chrome trace for Perfetto or chrome://tracing (``polydist trace --chrome``).

The file is the JSON object form of the Trace Event Format
(``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``):

- one process per rank, named ``rank R (host)`` and sorted by rank; its
  ``pid`` is R + 1, as Perfetto takes pid 0 for the kernel's idle process;
- one thread per group the rank called on, named ``group [0,1,2,3]``,
  largest groups first; ``tid`` is ``pid * 10000 + k`` (k from 1), unique
  across processes. Events of one thread must nest, and calls never do, so
  calls of a group that overlap in time (``async_op`` ones, or several Python
  threads) go to further threads named ``group [0,1] (2)``, ...;
- one complete event (``"ph": "X"``) per call, named ``all_reduce #41`` or
  ``send to rank 1`` (and per operation of torch's own recorder that no
  polydist call made, named ``gloo:all_reduce #11``: DDP's, FSDP2's and the
  program's own ``torch.distributed`` calls on gloo and nccl); ``args``
  carry op, root, dtypes, shapes, bytes, the call site (``file:line``, full
  path), function, state, error, seq, group, async and source (the
  recorder: "polydist" or "torch"). A call that had not completed when its rank dumped ends at the
  dump's time with state "started" and colour ``"cname": "bad"``; a failed
  one has ``"cname": "terrible"``;
- one instant event (``"ph": "i"``, process scope) at each dump, named
  ``dump (timeout)`` and so on.

Times: ``ts`` and ``dur`` in microseconds, ``ts`` from the earliest start or
dump time across all ranks (given in seconds since the epoch as
``otherData.t0``). Ranks on different nodes are only as aligned as the
nodes' clocks.
"""

from __future__ import annotations

import json
from typing import Optional

from .words import label
from .reader import Call, Dump, Dumps
from .records import made_by

__all__ = ["chrome_trace", "write_chrome"]

_CNAME = {"started": "bad", "failed": "terrible"}  # trace-viewer's reserved colours: amber, red


def _ns(seconds: float) -> int:
    # Whole nanoseconds, so that a call ending where the next begins does not overlap it after rounding.
    return round(seconds * 1e9)


def _args(call: Call) -> dict:
    return {
        "op": call.op, "root": call.root, "dtypes": list(call.dtypes), "shapes": [list(s) for s in call.shapes],
        "bytes": call.bytes, "site": f"{call.file}:{call.line}" if call.file else None, "function": call.function,
        "state": call.state, "error": call.error, "seq": call.seq, "group": list(call.group), "async": call.is_async,
        "value": call.value, "id": call.id, "source": call.source,
    }  # fmt: skip


def _end(call: Call, dump: Dump) -> float:
    """When ``call`` ended; one that had not ends at the dump."""
    return call.end if call.end is not None else max(dump.time, call.start)


def _calls(dump: Dump) -> list:
    """polydist's calls, and torch's own records of the operations polydist did not make (DDP's, FSDP2's, the
    program's ``torch.distributed`` calls on gloo and nccl): one event per operation. A torch record that began
    within a polydist call of the same group is that call's own operation."""
    by_group: dict = {}
    for call in dump.calls:
        by_group.setdefault(call.group, []).append(call)
    return list(dump.calls) + [op for op in dump.torch_calls
                               if not any(made_by(op, c) for c in by_group.get(op.group, ()))]  # fmt: skip


def _threads(dump: Dump) -> list:
    """``(thread name, calls)`` per lane: each group's calls, split so that no two calls of a lane overlap."""
    lanes: dict = {}  # group -> [[calls], ...]
    for call in sorted(_calls(dump), key=lambda c: (c.start, c.id)):
        mine = lanes.setdefault(call.group, [])
        lane = next((lane for lane in mine if _end(lane[-1], dump) <= call.start), None)
        if lane is None:
            mine.append(lane := [])
        lane.append(call)
    out = []
    for group in sorted(lanes, key=lambda g: (-len(g), g)):
        name = f"group [{','.join(map(str, group))}]"
        out += [(name if i == 0 else f"{name} ({i + 1})", lane) for i, lane in enumerate(lanes[group])]
    return out


def _process(dump: Dump, t0: float) -> tuple:
    """The metadata and the events of one rank."""
    pid = dump.rank + 1
    name = f"rank {dump.rank}" + (f" ({dump.host})" if dump.host else "")
    meta = [  # process-wide events on tid = pid, the process's main thread (tid 0 is the idle process's too)
        {"ph": "M", "name": "process_name", "pid": pid, "tid": pid, "args": {"name": name}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": pid, "args": {"sort_index": dump.rank}},
    ]
    moment = {"rank": dump.rank, "reason": dump.reason, "error": dump.error, "recorder": dump.enabled,
              "dropped": dump.dropped}  # fmt: skip
    events = [{"ph": "i", "s": "p", "name": f"dump ({dump.reason})", "pid": pid, "tid": pid,
               "ts": _ns(dump.time - t0) / 1e3, "args": moment}]  # fmt: skip
    for k, (name, calls) in enumerate(_threads(dump), start=1):
        tid = pid * 10000 + k
        meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": k}})
        for call in calls:
            start = _ns(call.start - t0)
            end = max(start, _ns(_end(call, dump) - t0))
            event = {"ph": "X", "name": label(call), "cat": "p2p" if call.seq is None else "collective",
                     "pid": pid, "tid": tid, "ts": start / 1e3, "dur": (end - start) / 1e3, "args": _args(call)}
            if call.state in _CNAME:
                event["cname"] = _CNAME[call.state]
            events.append(event)
    return meta, events


def chrome_trace(dumps: Dumps) -> dict:
    """The Chrome trace of ``dumps`` (see the module docstring), as a JSON-ready dict. Never raises."""
    ranks = [dumps.ranks[r] for r in sorted(dumps.ranks)]
    moments = [d.time for d in ranks] + [c.start for d in ranks for c in _calls(d)]
    t0: Optional[float] = min(moments, default=None)
    meta, events = [], []
    for dump in ranks:
        m, e = _process(dump, t0)
        meta += m
        events += sorted(e, key=lambda ev: (ev["ts"], ev["tid"]))  # each rank's events in time order
    other = {"source": "polydist trace", "directory": dumps.directory, "t0": t0, "world_size": dumps.world_size}
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": other}


def write_chrome(dumps: Dumps, path: str) -> int:
    """Write :func:`chrome_trace` of ``dumps`` to ``path``; returns the number of call and dump events.

    Raises:
        OSError: ``path`` cannot be written.
    """
    trace = chrome_trace(dumps)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f, allow_nan=False, separators=(",", ":"))
        f.write("\n")
    return sum(1 for e in trace["traceEvents"] if e["ph"] != "M")
