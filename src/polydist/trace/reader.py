"""Reading the flight recorder's dumps, checked against the format (:mod:`polydist.trace`).

:func:`load` reads the ``rank<R>.json`` files of a trace directory into
:class:`Dumps`; a file that is unreadable, too large, truncated, not JSON or
not in the format becomes one :class:`Problem` (naming the file and what is
wrong with it) and the others are read on. What is read is checked field by
field, so that the analysis (:mod:`polydist.trace.analyze`) and the Chrome
export (:mod:`polydist.trace.chrome`) work on typed values only. Fields a
writer may leave out (host, pid, backend, ...) default to None; the ones an
analysis cannot do without (rank, reason, time, entries; an entry's id,
collective, group, start and state) are required.

Times are wall-clock seconds since the epoch, as in the dumps.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from typing import Any, Optional

from .records import Call, Dump, Dumps, Earlier, Problem, Site, Stack, innermost, is_library, raised_at
from .settle import settle

__all__ = ["Site", "Stack", "Call", "Earlier", "Dump", "Problem", "Dumps", "load", "read_dump", "is_library",
           "innermost", "raised_at"]  # the types: from .records, named here for callers

_FILE = re.compile(r"rank(\d+)\.json")
_FINISHED = re.compile(r"rank(\d{1,9})\.finished")  # written by trace.dump.mark_finished
_MAX_BYTES = 256 << 20  # a 2,000-entry dump is about 1 MB; more is not a dump


class _Bad(ValueError):
    """A dump that does not follow the format; the message says where."""


# Field checks: kind -> test. A kind ending in "?" also allows null.
_KINDS = {
    "int": lambda v: type(v) is int,
    "nat": lambda v: type(v) is int and v >= 0,
    "num": lambda v: type(v) in (int, float) and math.isfinite(v),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: type(v) is bool,
    "ranks": lambda v: isinstance(v, list) and len(v) > 0 and all(type(r) is int and r >= 0 for r in v),
    "strs": lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v),
    "shapes": lambda v: isinstance(v, list) and all(isinstance(s, list) and all(type(d) is int for d in s) for s in v),
    "list": lambda v: isinstance(v, list),
    "dict": lambda v: isinstance(v, dict),
    "nums": lambda v: type(v) in (int, float) and math.isfinite(v) and v >= 0,
}
_REQUIRED = object()
# name -> (kind, default when absent): only what an analysis cannot do without is required.
_DUMP = {"rank": ("nat", _REQUIRED), "world_size": ("nat?", None), "local_rank": ("int?", None),
         "host": ("str?", None), "pid": ("int?", None), "backend": ("str?", None), "reason": ("str", _REQUIRED),
         "time": ("num", _REQUIRED), "error": ("str?", None), "traceback": ("str?", None),
         "error_frames": ("list", ()), "enabled": ("bool", True), "dropped": ("nat", 0),
         "entries": ("list", _REQUIRED), "stacks": ("list", ()), "torch": ("dict?", None),
         "earlier": ("list", ())}  # fmt: skip
_ENTRY = {"id": ("nat", _REQUIRED), "collective": ("str", _REQUIRED), "group": ("ranks", _REQUIRED),
          "seq": ("nat?", None), "op": ("str?", None), "root": ("int?", None), "dtypes": ("strs", ()),
          "shapes": ("shapes", ()), "bytes": ("nat", 0), "value": ("bool", False), "async": ("bool", False),
          "file": ("str?", None), "line": ("int?", None), "function": ("str?", None), "start": ("num", _REQUIRED),
          "end": ("num?", None), "state": ("str", _REQUIRED), "error": ("str?", None)}  # fmt: skip

_STACK = {"thread": ("str", "?"), "main": ("bool", False), "frames": ("list", ())}
_FRAME = {"file": ("str?", None), "line": ("int?", None), "function": ("str?", None)}
_EARLIER = {"reason": ("str", _REQUIRED), "time": ("num", _REQUIRED), "error": ("str?", None), "stack": ("list", ()),
            "torch_waiting": ("list", ())}  # fmt: skip
_MAX_EARLIER = 64  # the writer keeps 8


def _fields(obj: Any, spec: dict, where: str) -> dict:
    """The fields of ``obj`` named in ``spec``, checked; absent optional ones take their default."""
    if not isinstance(obj, dict):
        raise _Bad(f"{where} is not an object")
    out = {}
    for name, (kind, default) in spec.items():
        if name not in obj or (obj[name] is None and kind.endswith("?")):
            if default is _REQUIRED:
                raise _Bad(f"{where} has no {name!r}")
            out[name] = default
        elif not _KINDS[kind.rstrip("?")](obj[name]):
            raise _Bad(f"{where}.{name} is not {kind.rstrip('?')}: {str(obj[name])[:40]!r}")
        else:
            out[name] = obj[name]
    return out


def _call(obj: Any, rank: int, size: Optional[int], where: str) -> Call:
    f = _fields(obj, _ENTRY, where)
    if f["state"] not in ("started", "completed", "failed"):
        raise _Bad(f"{where}.state is {f['state'][:20]!r}, not started, completed or failed")
    if rank not in f["group"] or (size is not None and max(f["group"]) >= size):
        raise _Bad(f"{where}.group {f['group'][:16]} is not a group of rank {rank} in a world of {size}")
    return Call(rank=rank, id=f["id"], collective=f["collective"], group=tuple(f["group"]), seq=f["seq"], op=f["op"],
                root=f["root"], dtypes=tuple(f["dtypes"]), shapes=tuple(map(tuple, f["shapes"])), bytes=f["bytes"],
                value=f["value"], is_async=f["async"], file=f["file"], line=f["line"], function=f["function"],
                start=float(f["start"]), end=f["end"], state=f["state"], error=f["error"])  # fmt: skip


def _sites(frames: list, where: str) -> tuple:
    return tuple(Site(**_fields(x, _FRAME, f"{where}[{i}]")) for i, x in enumerate(frames))


def _stack(obj: Any, where: str) -> Stack:
    f = _fields(obj, _STACK, where)
    return Stack(f["thread"], f["main"], _sites(f["frames"], f"{where}.frames"))


def _earlier(objs: list) -> tuple:
    """The dump's ``earlier``: what this process's earlier dumps showed (see :mod:`polydist.trace`)."""
    if len(objs) > _MAX_EARLIER:
        raise _Bad(f"earlier holds {len(objs)} dumps, more than a writer keeps")
    out = []
    for i, obj in enumerate(objs):
        f = _fields(obj, _EARLIER, f"earlier[{i}]")
        pairs = f["torch_waiting"]
        if not all(isinstance(k, list) and len(k) == 2 and all(_KINDS["nat"](x) for x in k) for k in pairs):
            raise _Bad(f"earlier[{i}].torch_waiting is not a list of [record_id, time_created_ns]")
        out.append(Earlier(f["reason"], float(f["time"]), f["error"], _sites(f["stack"], f"earlier[{i}].stack"),
                           frozenset(map(tuple, pairs))))  # fmt: skip
    return tuple(sorted(out, key=lambda e: e.time))


# torch's entries (torch's names; see the format). Checked as hostile as the rest: a field of the wrong type or
# size makes the dump unreadable, named as such; never a crash.
_TORCH = {"buffer": ("nat", 0), "groups": ("dict", {}), "entries": ("list", [])}
_TORCH_ENTRY = {"record_id": ("nat", _REQUIRED), "process_group": ("strs", _REQUIRED),
                "collective_seq_id": ("nat", 0), "p2p_seq_id": ("nat", 0), "is_p2p": ("bool", False),
                "profiling_name": ("str", _REQUIRED), "input_sizes": ("shapes", ()), "input_dtypes": ("strs", ()),
                "output_sizes": ("shapes", ()), "output_dtypes": ("strs", ()),
                "retired": ("bool", False), "state": ("str?", None), "timeout_ms": ("nums?", None),
                "time_created_ns": ("nat", _REQUIRED), "time_discovered_completed_ns": ("nat?", None),
                "frames": ("list", ())}  # fmt: skip
_TORCH_FRAME = {"name": ("str?", None), "filename": ("str?", None), "line": ("int?", None)}
_NAME_CHARS = 80  # an operation's name longer than this is not torch's
# torch's dtype names (c10::ScalarType) as polydist's dumps spell them
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
           "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool"}  # fmt: skip


def _torch_call(obj: Any, rank: int, size: Optional[int], groups: dict, where: str) -> Optional[Call]:
    """One of torch's entries as a Call (source "torch"); None for one of a group whose ranks the dump lacks."""
    f = _fields(obj, _TORCH_ENTRY, where)
    if not f["process_group"] or len(f["profiling_name"]) > _NAME_CHARS or len(f["input_sizes"]) != len(
            f["input_dtypes"]) or len(f["output_sizes"]) != len(f["output_dtypes"]):  # fmt: skip
        raise _Bad(f"{where} is not one of torch's flight-recorder entries (process_group, profiling_name, sizes)")
    name = f["process_group"][0]
    group = groups.get(name)
    if group is None and name == "0" and size is not None:  # torch's world: its name is "0"
        group = list(range(size))
    if group is None:
        return None
    frames = [Site(**{"file": x["filename"], "line": x["line"], "function": x["name"]})
              for x in (_fields(fr, _TORCH_FRAME, f"{where}.frames[{i}]") for i, fr in enumerate(f["frames"]))]
    site = next((x for x in frames if not is_library(x.file)), frames[0] if frames else Site(None, None))
    completed = f["retired"] or f["state"] == "completed"
    end = f["time_discovered_completed_ns"]
    return Call(rank=rank, id=f["record_id"], collective=f["profiling_name"], group=tuple(group),
                seq=None if f["is_p2p"] else f["collective_seq_id"], op=None, root=None,
                dtypes=tuple(_DTYPES.get(d, d) for d in f["input_dtypes"]),
                shapes=tuple(map(tuple, f["input_sizes"])), bytes=0, value=False, is_async=False, file=site.file,
                line=site.line, function=site.function, start=f["time_created_ns"] / 1e9,
                end=end / 1e9 if end else None, state="completed" if completed else "started", error=None,
                source="torch", timeout=f["timeout_ms"] / 1e3 if f["timeout_ms"] is not None else None,
                out_dtypes=tuple(_DTYPES.get(d, d) for d in f["output_dtypes"]),
                out_shapes=tuple(map(tuple, f["output_sizes"])))  # fmt: skip


def _torch_calls(obj: Optional[dict], rank: int, size: Optional[int]) -> tuple:
    """``(calls, on)`` from a dump's "torch" object (None: this torch had no recorder)."""
    if obj is None:
        return (), None
    f = _fields(obj, _TORCH, "torch")
    groups = {}
    for name, ranks in f["groups"].items():
        if not _KINDS["ranks"](ranks) or len(set(ranks)) != len(ranks) or (size is not None and max(ranks) >= size):
            raise _Bad(f"torch.groups[{name[:20]!r}] is not a group of ranks of a world of {size}: {str(ranks)[:40]}")
        groups[name] = ranks
    calls = (_torch_call(e, rank, size, groups, f"torch.entries[{i}]") for i, e in enumerate(f["entries"]))
    kept = [c for c in calls if c is not None and rank in c.group]
    return tuple(sorted(kept, key=lambda c: (c.start, c.id))), f["buffer"] > 0 or bool(kept)


def _no_constant(name: str) -> Any:
    raise _Bad(f"holds {name}, which is not JSON")


def read_dump(path: str) -> Dump:
    """Read and check one dump file.

    Raises:
        ValueError: (``_Bad``) the file is not a polydist-trace version 1 dump; the message says why.
        OSError: the file cannot be read.
    """
    if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or a device would block or never end
        raise _Bad("is not a regular file")
    with open(path, "rb") as f:
        raw = f.read(_MAX_BYTES + 1)
    if len(raw) > _MAX_BYTES:
        raise _Bad(f"is larger than {_MAX_BYTES >> 20} MiB, too large for a dump")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise _Bad(f"is not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise _Bad(f"is not valid JSON, truncated? ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except _Bad:
        raise
    except (ValueError, RecursionError) as exc:  # an integer of too many digits; nesting deeper than the stack
        raise _Bad(f"is not JSON that a dump can hold ({type(exc).__name__}: {str(exc)[:60]})") from None
    if not isinstance(data, dict) or data.get("format") != "polydist-trace":
        raise _Bad("is not a polydist trace dump (no \"format\": \"polydist-trace\")")
    if data.get("version") != 1:
        raise _Bad(f"is format version {str(data.get('version'))[:20]}; this polydist reads version 1")
    f = _fields(data, _DUMP, "the dump")
    rank, size = f["rank"], f["world_size"]
    if size is not None and rank >= size:
        raise _Bad(f"says rank {rank} of a world of {size}")
    calls = sorted((_call(e, rank, size, f"entries[{i}]") for i, e in enumerate(f["entries"])), key=lambda c: c.id)
    stacks = [_stack(s, f"stacks[{i}]") for i, s in enumerate(f["stacks"])]
    torch_calls, torch_on = _torch_calls(f["torch"], rank, size)
    return settle(Dump(path=path, rank=rank, world_size=size, local_rank=f["local_rank"], host=f["host"],
                       pid=f["pid"], backend=f["backend"], reason=f["reason"], time=float(f["time"]),
                       error=f["error"], traceback=f["traceback"],
                       error_frames=_sites(f["error_frames"], "error_frames"), enabled=f["enabled"],
                       dropped=f["dropped"], calls=tuple(calls), stacks=tuple(sorted(stacks, key=lambda s: not s.main)),
                       torch_calls=torch_calls, torch_on=torch_on, earlier=_earlier(f["earlier"])))  # fmt: skip


def load(directory: str) -> Dumps:
    """Read every ``rank<R>.json`` of ``directory``, and which ranks left ``rank<R>.finished`` instead; other
    files are ignored.

    A file that cannot be used (unreadable, too large, not JSON, not the
    format, a rank that its name or the other dumps contradict) is left out
    and named in ``problems``; never raises for a file.

    Raises:
        FileNotFoundError, NotADirectoryError: ``directory`` is not a directory.
    """
    dumps = Dumps(directory, {}, [], None)
    names = os.listdir(directory)
    files = sorted((int(m.group(1)), m.group(0)) for m in map(_FILE.fullmatch, names) if m)
    for rank, name in files:
        try:
            dump = read_dump(os.path.join(directory, name))
        except (ValueError, OSError) as exc:
            why = str(exc) if isinstance(exc, _Bad) else f"cannot be read: {getattr(exc, 'strerror', None) or exc}"
            dumps.problems.append(Problem(name, rank, why))
            continue
        if dump.rank != rank:
            dumps.problems.append(Problem(name, rank, f"holds the dump of rank {dump.rank}, not of rank {rank}"))
        elif rank in dumps.ranks:
            dumps.problems.append(Problem(name, rank, f"is a second dump of rank {rank}; "
                                                      f"{os.path.basename(dumps.ranks[rank].path)} is used"))
        else:
            dumps.ranks[rank] = dump
    # ranks that ended their program normally and wrote no dump (rank<R>.finished)
    dumps.finished = {int(m.group(1)) for m in map(_FINISHED.fullmatch, names) if m} - set(dumps.ranks)
    sizes = sorted({d.world_size for d in dumps.ranks.values() if d.world_size is not None})
    if len(sizes) > 1:
        said = ", ".join(f"{os.path.basename(d.path)} says {d.world_size}" for d in dumps.ranks.values())
        dumps.problems.append(Problem("", None, f"the dumps disagree on the world size: {said}"))
    # With no world size in any dump (a launcher's variables contradicted each other), the ranks seen bound it.
    seen = [r for d in dumps.ranks.values()
            for r in (d.rank, *(r for c in d.calls + d.torch_calls for r in c.group))]  # fmt: skip
    dumps.world_size = max(sizes) if sizes else max(seen, default=-1) + 1 or None
    return dumps
