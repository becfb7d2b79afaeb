"""The dumps in PyTorch's Flight Recorder format, for its analyser (``polydist trace DIR --fr-trace OUT``).

:func:`write_fr_trace` writes one file per rank with a readable dump,
``OUT/rank_<R>`` (R: the global rank), that
``python -m torch.distributed.flight_recorder.fr_trace OUT`` reads: a pickle of
plain dicts, lists, tuples, str, int, float, bool and None — the Flight
Recorder dump format version ``"2.10"``, as torch 2.13 writes it (for gloo:
``torch._C._distributed_c10d._dump_fr_trace()``) and as its analyser
(``torch/distributed/flight_recorder/components/loader.py``, ``builder.py``,
``types.py``, ``utils.py``) reads it. The analyser matches each process
group's calls across ranks by sequence number and reports the ranks that did
not join a collective, and calls whose type, sizes, dtypes or state differ.
Give it a folder of its own: it reads every file below the folder whose name
holds the prefix common to the names ending in digits (``rank_``). It wants a
file from every rank unless given ``--allow-incomplete-ranks`` (without it, it
stops with ``AssertionError: Missing dump files from ranks {1}``); its ``-j``
(print the entries) needs the ``tabulate`` package in torch 2.13.

One file::

    {"version": "2.10",
     "pg_config": {NAME: {"name": NAME, "desc": DESC, "ranks": "[0, 1, 2]"}, ...},
     "entries": [ENTRY, ...]}                     # oldest first

``pg_config`` holds the world (``"0"``, desc ``"default_pg"``, as torch names
it), every group the rank called on (named by its ranks in group-rank order,
``"[2,3]"``, desc ``"undefined"``), and a two-rank group per pair of ranks that
sent to each other on a group (``"p2p 0<->1"``, or ``"p2p 0<->1 on [0,2,1]"``
for a group other than the world, desc ``"undefined"``). ENTRY, from one call
of the dump (:mod:`polydist.trace`)::

    {"record_id": 17,                  # the dump's "id"
     "pg_id": 0,                       # the group's index in a table common to all ranks' files
     "process_group": ("0", "default_pg"),
     "collective_seq_id": 41,          # "seq"; for send/recv: the pair group's number, see below
     "p2p_seq_id": 0,                  # 0 for a collective; for send/recv: as collective_seq_id
     "op_id": 18,                      # record_id + 1 (polydist has no coalesced calls)
     "profiling_name": "gloo:all_reduce",   # "gloo:send 0->1", "gloo:recv 1<-0" (ranks in the pair group)
     "is_p2p": false,
     "input_sizes": [[4, 2]], "input_dtypes": ["float32"],
     "output_sizes": [[4, 2]], "output_dtypes": ["float32"],
     "state": "completed",             # started | completed
     "retired": true,                  # the call returned (completed or failed)
     "time_created_ns": 1764000000010000000, "time_discovered_started_ns": ..., # the call's start
     "time_discovered_completed_ns": ...,  # its end, None while not completed
     "duration_ms": 0.5,               # completed calls only
     "frames": [{"name": "main", "filename": "/home/u/train.py", "line": 88}]}

Whose records: torch's own, where the dumps hold any (``TORCH_FR_BUFFER_SIZE``,
which polydist's launchers set): on gloo and nccl they are every operation,
DDP's, FSDP2's and polydist's own calls alike, with torch's names
(``"gloo:all_gather"``), numbers and output sizes; a dump's file then
holds those alone, so that the analyser matches the calls of one numbering.
Otherwise polydist's records: on its Python groups (``mpi``, ``horovod``,
``xla-tpu``) the only ones, since torch records nothing there. From torch's
records, point-to-point calls are left out (the dump does not keep their
peer), as are operations whose names torch's analyser does not take (it
stops at the first); ``frames`` is the first frame outside the libraries.

Approximations of polydist's records (what polydist does not record, or records otherwise):

- ``profiling_name``'s library is ``nccl`` for nccl jobs and ``gloo`` for every
  other backend, MPI included: the analyser refuses names outside nccl, ncclx,
  xccl, gloo, rccl, rcclx, mccl and hccl.
- ``state``: a failed call (timed out, lost its peer) is ``"started"``: it never
  completed, as a timed-out collective stays in torch's own dumps; the error
  itself is not in the format. Torch's ``"scheduled"`` is never used.
- Output sizes are derived from the inputs where polydist's result has a fixed
  shape: all_reduce, reduce, broadcast, send, recv (the tensor itself);
  reduce_scatter (this rank's chunk of dim 0); all_gather, and gather on its
  root (``[size * d0, ...]``, assuming every rank passed this rank's shape).
  Where no rank can know them — scatter's result, gather's on other ranks —
  they are ``[]`` on every rank. all_to_all takes any shapes and dtypes per
  item: it is one flat tensor of the total element count, in and out. A call
  of Python values is one tensor of shape ``[0]`` and dtype ``"object"``; a
  barrier has none. polydist's all_gather and gather accept shapes that differ
  between ranks, and reduce_scatter a dim 0 that the group size does not
  divide: the analyser, with torch's rules, reports those as size mismatches.
- ``input_dtypes`` are polydist's names (``"float32"``, torch's are ``"Float"``):
  the analyser only compares them with each other.
- send/recv go to the two-rank group of the pair, not to the group they were
  called on: the analyser expects every member of a call's group to have
  called it, so on a larger group it would report the ranks that take no part
  as missing. polydist numbers point-to-point calls nowhere; a pair group's
  number is the count of calls between the two ranks on that group that the
  dump holds, from 1 — so it lines up with the peer's only when neither ring
  buffer dropped such calls. A send or recv without a peer in its group is
  left out, as is a collective without a sequence number or of a name the
  analyser does not know (all of polydist's are known to it).
- ``time_discovered_started_ns`` is when the call started (torch: when the
  watchdog saw the kernel start); ``frames`` is the call site only (torch: the
  Python stack, innermost first). ``timeout_ms``, ``thread_name``,
  ``thread_id``, ``pg_status`` and ``comm_lib_version`` are left out: polydist
  does not record them and the analyser does not read them.
"""

from __future__ import annotations

import math
import os
import pickle
import re
from typing import Optional

from ..backends import registry
from .reader import Call, Dump, Dumps

__all__ = ["FR_VERSION", "fr_dumps", "write_fr_trace"]

FR_VERSION = "2.10"  # the dump format version torch 2.13 writes and reads
_KNOWN = frozenset({"all_reduce", "reduce", "broadcast", "barrier", "all_gather", "gather", "scatter",
                    "reduce_scatter", "all_to_all", "send", "recv"})  # fmt: skip
_VALUE = ([[0]], ["object"])  # a call of Python values, as one empty tensor
_FILE = re.compile(r"rank_\d+")


def _group_name(group: tuple, world: Optional[int]) -> tuple:
    """``(name, desc)`` of a polydist group in ``pg_config``."""
    if world is not None and group == tuple(range(world)):
        return "0", "default_pg"
    return f"[{','.join(map(str, group))}]", "undefined"


def _pair_name(group: tuple, pair: tuple, world: Optional[int]) -> tuple:
    """``(name, desc)`` of the two-rank group that stands for ``pair``'s sends and receives on ``group``."""
    name = _group_name(group, world)[0]
    return f"p2p {pair[0]}<->{pair[1]}" + ("" if name == "0" else f" on {name}"), "undefined"


def _sizes(call: Call, rank: int) -> tuple:
    """``(input_sizes, input_dtypes, output_sizes, output_dtypes)`` of ``call`` on ``rank`` (see the docstring)."""
    shapes, dtypes = ([list(s) for s in call.shapes], list(call.dtypes)) if not call.value else _VALUE
    n, name = len(call.group), call.collective
    if name == "all_to_all":
        flat = [[sum(math.prod(s) for s in shapes)]]
        return flat, sorted(set(dtypes)), flat, sorted(set(dtypes))
    if name == "scatter" or not shapes:
        return shapes, dtypes, [], []
    first, rest = (shapes[0][0], shapes[0][1:]) if shapes[0] else (1, [])  # a 0-dim tensor counts as (1,)
    if name == "reduce_scatter":
        i = call.group.index(rank)
        return shapes, dtypes, [[first // n + (i < first % n), *rest]], dtypes[:1]
    if name == "all_gather" or (name == "gather" and call.root == rank):
        return shapes, dtypes, [[n * first, *rest]], dtypes[:1]
    if name == "gather":
        return shapes, dtypes, [], []
    return shapes, dtypes, shapes, dtypes


def _ns(seconds: Optional[float]) -> Optional[int]:
    return None if seconds is None else int(round(seconds * 1e9))


class _Groups:
    """The process groups of all ranks' files, with their ``pg_id`` (an index common to all files)."""

    def __init__(self, dumps: Dumps) -> None:
        self.world = dumps.world_size
        self.ids: dict = {}  # (name, desc) -> (pg_id, ranks)
        if self.world:
            self.add(tuple(range(self.world)), _group_name(tuple(range(self.world)), self.world))

    def add(self, ranks: tuple, key: tuple) -> tuple:
        self.ids.setdefault(key, (len(self.ids), ranks))
        return key


def _p2p(call: Call, rank: int, groups: _Groups, pairs: dict) -> Optional[tuple]:
    """``(process group, name, number)`` of a send or recv (``pairs``: (group, peer) -> calls so far); None: no peer."""
    if call.root is None or call.root == rank or call.root not in call.group:
        return None
    pair = tuple(sorted((rank, call.root)))
    key = groups.add(pair, _pair_name(call.group, pair, groups.world))
    seq = pairs[call.group, call.root] = pairs.get((call.group, call.root), 0) + 1
    me, peer = pair.index(rank), pair.index(call.root)
    return key, f"send {me}->{peer}" if call.collective == "send" else f"recv {me}<-{peer}", seq


def _fr_dump(dump: Dump, groups: _Groups, lib: Optional[str]) -> dict:
    """One rank's file (see the module docstring); ``groups`` gathers the process groups of all files. ``lib``:
    the library named in polydist's records' profiling names; None: export torch's records instead."""
    rank, world = dump.rank, groups.world
    config = {_group_name(tuple(range(world)), world)} if world else set()
    pairs: dict = {}
    entries = []
    for call in dump.calls if lib is not None else dump.torch_calls:
        p2p = lib is not None and call.collective in ("send", "recv")  # torch's: seq None, left out below
        found = _p2p(call, rank, groups, pairs) if p2p else None
        if not _known(call.collective, lib) or (p2p and found is None) or (not p2p and call.seq is None):
            continue
        key, name, seq = found or (groups.add(call.group, _group_name(call.group, world)), call.collective, call.seq)
        config.add(key)
        if lib is None:  # torch's record: its own names and sizes
            in_sizes, in_dtypes = [list(x) for x in call.shapes], list(call.dtypes)
            out_sizes, out_dtypes = [list(x) for x in call.out_shapes], list(call.out_dtypes)
        else:
            in_sizes, in_dtypes, out_sizes, out_dtypes = _sizes(call, rank)
        completed = call.state == "completed"
        entry = {
            "record_id": call.id, "pg_id": groups.ids[key][0], "process_group": key, "collective_seq_id": seq,
            "p2p_seq_id": seq if p2p else 0, "op_id": call.id + 1, "profiling_name": f"{lib}:{name}" if lib else name,
            "is_p2p": p2p, "input_sizes": in_sizes, "input_dtypes": in_dtypes, "output_sizes": out_sizes,
            "output_dtypes": out_dtypes, "state": "completed" if completed else "started",
            "retired": call.state != "started", "time_created_ns": _ns(call.start),
            "time_discovered_started_ns": _ns(call.start),
            "time_discovered_completed_ns": _ns(call.end) if completed else None,
            "frames": [{"name": call.function or "", "filename": call.file, "line": call.line}] if call.file else [],
        }  # fmt: skip
        if completed and call.end is not None:
            entry["duration_ms"] = (call.end - call.start) * 1e3
        entries.append(entry)
    pg_config = {}
    for name, desc in sorted(config, key=lambda k: groups.ids[k][0]):
        ranks = groups.ids[name, desc][1]
        pg_config[name] = {"name": name, "desc": desc, "ranks": str(sorted(ranks))}
    return {"version": FR_VERSION, "pg_config": pg_config, "entries": entries}


def _known(name: str, lib: Optional[str]) -> bool:
    """Whether the analyser takes a call of ``name``: polydist's names (``lib`` set), or torch's
    (``"gloo:all_reduce"``) by the analyser's own table, where this torch has one; it stops at any other."""
    if lib is not None:
        return name in _KNOWN
    try:
        from torch.distributed.flight_recorder.components.types import COLLECTIVES, P2P
    except ImportError:
        return True
    return name.partition(":")[2] in COLLECTIVES | P2P | {"coalesced"}


def fr_dumps(dumps: Dumps) -> dict:
    """rank -> its file's object, for every readable dump (see the module docstring). Never raises."""
    groups = _Groups(dumps)
    torchs = any(d.torch_calls for d in dumps.ranks.values())
    lib = None if torchs else registry.fr_library(d.backend for d in dumps.ranks.values())
    return {rank: _fr_dump(dumps.ranks[rank], groups, lib) for rank in sorted(dumps.ranks)}


def write_fr_trace(dumps: Dumps, directory: str) -> list:
    """Write ``directory/rank_<R>`` for every readable dump (creating ``directory``); returns the paths written.

    The ``rank_<N>`` files of an earlier export that this one has no dump for
    are removed, so that the analyser does not read them; other files are left.

    Raises:
        OSError: ``directory`` cannot be created, or a file cannot be written or removed.
    """
    os.makedirs(directory, exist_ok=True)
    files = {f"rank_{rank}": data for rank, data in fr_dumps(dumps).items()}
    for name in os.listdir(directory):
        if _FILE.fullmatch(name) and name not in files and os.path.isfile(os.path.join(directory, name)):
            os.remove(os.path.join(directory, name))
    for name, data in files.items():
        with open(os.path.join(directory, name), "wb") as f:
            pickle.dump(data, f, protocol=4)
    return [os.path.join(directory, name) for name in files]
