"""``polydist trace DIR``: from every rank's dump, say which ranks wait in which call and where the others are.

:func:`load` (from :mod:`.reader`) reads the ``rank<R>.json`` files of a trace
directory (format: :mod:`polydist.trace`), naming each file it cannot use.
:func:`diagnose` turns the dumps into a :class:`Diagnosis`:

- one header per dump: why it was written, its error;
- the ranks of the world with no dump (killed, or dead before they could write one);
- per group, the stuck call: the highest sequence number that a member's
  *last* call on the group is still in (state "started") or failed in; who
  waits in it and for how long, who completed it, and who never called it and
  where that rank is instead: in its last call if that has not completed;
  else, when it dumped for an exception, where it raised it (the innermost
  frame of user code of the error's traceback); else at the innermost frame
  of user code on its main thread. A point-to-point call that is a rank's
  last call and has not completed is reported with where its peer is;
- per group, the first call the members disagree on (collective, op, root,
  value or tensors; dtypes and shapes too where every rank passes the same),
  among the sequence numbers every member's ring buffer still holds.

The same analysis runs on torch's own flight-recorder entries in the dumps
(gloo's and nccl's operations, whoever called them: DDP, FSDP2, ...), each
group numbered by torch's sequence numbers; a stuck polydist call that torch
also recorded is reported once, from polydist's record.

Times are wall-clock seconds (``time.time()``): "waiting since" is the dump's
time minus the call's start, both on that rank's clock; a failed call waited
from its start to its end. :meth:`Diagnosis.text` says it all in plain lines
(:mod:`.words`, e.g. ``all_reduce #41 on [0,1,2,3]: ranks 0,1,3 waiting since
12.3 s at train.py:88; rank 2 never called it — it is in barrier #40 at
train.py:95``); :meth:`Diagnosis.as_dict` gives it as JSON-ready data.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from .findings import Disagreement, Findings, Stuck, Waiter, Where
from .reader import Call, Dump, Dumps, Problem, Site, innermost, load, raised_at
from .records import made_by
from .words import describe, headline, label, render

__all__ = ["Where", "Waiter", "Stuck", "Disagreement", "Diagnosis", "diagnose", "load", "describe", "label"]
__all__ += ["Call", "Dump", "Dumps", "Problem", "Site"]  # read by .reader, named here for callers

# Collectives whose every rank passes the same dtypes and shapes.
_SAME_SHAPES = frozenset({"all_reduce", "reduce", "broadcast", "reduce_scatter", "barrier"})


@dataclass
class Diagnosis(Findings):
    """All :func:`diagnose` found; :meth:`text` says it in plain lines, :meth:`as_dict` for tools."""

    def text(self) -> str:
        """The diagnosis as lines of plain text (:mod:`.words`; sample in :mod:`polydist.trace.cli`)."""
        return "\n".join(render(self))

    def as_dict(self) -> dict:
        """The diagnosis as JSON-ready data (calls as their dump fields, sites with full paths)."""
        return _as_dict(self)

    def headline(self) -> Optional[str]:
        """The one finding a failure report starts with (:func:`~polydist.trace.words.headline`), or None."""
        return headline(self)


def _where(rank: int, relation: str, dumps: Dumps, source: str = "polydist") -> Where:
    dump = dumps.ranks.get(rank)
    if dump is None:
        if rank in dumps.finished:
            return Where(rank, relation, "finished")
        unreadable = any(p.rank == rank for p in dumps.problems)
        return Where(rank, "unknown", "unreadable" if unreadable else "no dump")
    relation = relation if dump.recorded(source) else "unknown"
    calls = dump.calls_of(source)
    last = calls[-1] if calls else None
    if last is not None and last.state != "completed":
        return Where(rank, relation, "in call" if last.state == "started" else "failed", call=last)
    seconds = dump.time - last.end if last is not None and last.end is not None else None
    if "exception" in dump.reasons and dump.error:  # its main thread is in the handler: where it raised says more
        return Where(rank, relation, "raised", site=raised_at(dump)[0], last=last, seconds=seconds, error=dump.error)
    site, user = innermost(dump.stacks)
    kind = "no stack" if site is None else "user code" if user else "library code"
    return Where(rank, relation, kind, site=site, last=last, seconds=seconds)


def _waited(call: Call, dump: Dump) -> float:
    end = call.end if call.state == "failed" and call.end is not None else dump.time
    return max(0.0, end - call.start)


def _torch_lasts(group: tuple, lasts: dict, dumps: Dumps) -> dict:
    """``lasts`` with torch's view fixed: a call that some member never reached cannot have completed.

    torch marks an operation retired also when it failed (gloo's timeout), and
    gloo records no state beyond that; so where a member (with torch's
    recorder on) got no further than a lower sequence number, the members'
    calls at the highest one are taken as failed with their dump's error, or
    as still waiting when the dump has none.
    """
    reached = {r: (lasts[r].seq if r in lasts else 0) for r in group
               if r in dumps.ranks and dumps.ranks[r].recorded("torch")}  # fmt: skip
    if not reached or len(set(reached.values())) < 2:
        return lasts
    top, fixed = max(reached.values()), dict(lasts)
    for rank, call in lasts.items():
        if call.seq == top and call.state == "completed":
            dump = dumps.ranks[rank]
            end = min(dump.time, call.start + call.timeout) if call.timeout is not None else dump.time
            fixed[rank] = (dataclasses.replace(call, state="failed", error=dump.error, end=end) if dump.error
                           else dataclasses.replace(call, state="started"))  # fmt: skip
    return fixed


def _group_stuck(group: tuple, lasts: dict, dumps: Dumps, source: str = "polydist") -> Optional[Stuck]:
    """The stuck call of ``group``, from each member's last call on it (``lasts``: rank -> Call)."""
    if source == "torch":
        lasts = _torch_lasts(group, lasts, dumps)
    open_seqs = [c.seq for c in lasts.values() if c.state != "completed"]
    if not open_seqs:
        return None
    seq = max(open_seqs)
    stuck = Stuck(group, seq, [], [])
    for rank in group:
        dump, last = dumps.ranks.get(rank), lasts.get(rank)
        if last is not None and last.seq == seq and last.state != "completed":
            stuck.waiting.append(Waiter(rank, last, _waited(last, dump)))
        else:
            called = dump is not None and any(c.group == group and c.seq == seq for c in dump.calls_of(source))
            stuck.others.append(_where(rank, "completed" if called else "never called", dumps, source))
    return stuck


def _fingerprint(call: Call) -> tuple:
    tensors = (call.dtypes, call.shapes) if call.collective in _SAME_SHAPES else ()
    return call.collective, call.op, call.root, call.value, tensors


def _disagreement(group: tuple, dumps: Dumps, source: str = "polydist") -> Optional[Disagreement]:
    """The lowest sequence number held by every member whose calls differ.

    Members with no dump, the recorder off or no call on the group are left out of the comparison.
    """
    by_rank = {}
    for rank in group:
        dump = dumps.ranks.get(rank)
        if dump is not None and dump.recorded(source):
            calls = {c.seq: c for c in dump.calls_of(source) if c.group == group and c.seq is not None}
            by_rank.update({rank: calls} if calls else {})
    if len(by_rank) < 2:
        return None
    for seq in sorted(set.intersection(*(set(calls) for calls in by_rank.values()))):
        if len({_fingerprint(calls[seq]) for calls in by_rank.values()}) > 1:
            return Disagreement(group, seq, {rank: calls[seq] for rank, calls in by_rank.items()})
    return None


def diagnose(dumps: Dumps, fates: Optional[dict] = None) -> Diagnosis:
    """What the dumps say: stuck calls, ranks with no dump, the first disagreement per group. Never raises.

    ``fates``: rank -> how that rank ended or stands, where a watcher of its process knows (a launcher: "killed by
    SIGKILL, pid N", "frozen: stopped (process state T) ..."): said of a rank that left no dump."""
    have = set(dumps.ranks) | {p.rank for p in dumps.problems}
    missing = [r for r in range(dumps.world_size or 0) if r not in have and r not in dumps.finished]
    found = Diagnosis(dumps.directory, dumps.world_size, [dumps.ranks[r] for r in sorted(dumps.ranks)],
                      list(dumps.problems), missing, sorted(dumps.finished),
                      fates={r: f for r, f in (fates or {}).items() if r in missing})  # fmt: skip
    # polydist's own recorder, then torch's (gloo's and nccl's operations, whoever called them): each on its own,
    # since each numbers a group's collectives its own way.
    for source in ("polydist", "torch"):
        _find(found, dumps, source)
    found.stuck.sort(key=lambda s: min(w.call.start for w in s.waiting))  # the oldest wait first: often the cause
    return found


def _said(stuck: Stuck, earlier: list) -> bool:
    """Whether torch's ``stuck`` is a polydist call already found stuck: each of its waiting operations began
    inside a stuck polydist call of the same rank and group (polydist's own calls on gloo and nccl are in
    both recorders; polydist's finding says more)."""
    if stuck.waiting[0].call.source != "torch":
        return False
    mine = [w.call for s in earlier for w in s.waiting if w.call.source == "polydist"]
    return all(any(made_by(w.call, c) for c in mine) for w in stuck.waiting)


def _find(found: Diagnosis, dumps: Dumps, source: str) -> None:
    """Add the stuck calls and disagreements of one recorder's calls (``source``) to ``found``."""
    lasts: dict = {}  # group -> rank -> its last collective on the group
    for dump in found.dumps:
        calls = dump.calls_of(source)
        for call in calls:
            if call.seq is not None:
                lasts.setdefault(call.group, {})[dump.rank] = call
        last = calls[-1] if calls else None
        if last is not None and last.seq is None and last.state != "completed":  # a send or recv holds it up
            peer = last.root is not None and last.root != dump.rank
            peers = [_where(last.root, "peer", dumps, source)] if peer else []
            found.stuck.append(Stuck(last.group, None, [Waiter(dump.rank, last, _waited(last, dump))], peers))
    for group in sorted(lasts, key=lambda g: (-len(g), g)):
        stuck = _group_stuck(group, lasts[group], dumps, source)
        found.stuck += [stuck] if stuck and not _said(stuck, found.stuck) else []
        disagreement = _disagreement(group, dumps, source)
        found.disagreements += [disagreement] if disagreement else []


def _plain(x: Any) -> Any:
    """``x`` with dataclasses as dicts and tuples as lists, for JSON."""
    if dataclasses.is_dataclass(x):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    return x


def _as_dict(found: Diagnosis) -> dict:
    """See :meth:`Diagnosis.as_dict`: per rank, its dump's fields (the error in full, with its traceback), where
    its main thread is (``location``) and where its error was raised (``raised_at``), then the findings."""
    ranks = []
    for d in found.dumps:
        site, user = innermost(d.stacks)
        fields = {k: getattr(d, k) for k in ("rank", "host", "pid", "backend", "reason", "time", "error", "traceback",
                                             "enabled", "dropped", "path")}  # fmt: skip
        ranks.append({**fields, "reasons": list(d.reasons), "calls": len(d.calls), "location": _plain(site),
                      "user_code": user, "raised_at": _plain(raised_at(d)[0])})  # fmt: skip
    stuck = [{**_plain(s), "collective": s.waiting[0].call.collective
              if len({w.call.collective for w in s.waiting}) == 1 else None} for s in found.stuck]  # fmt: skip
    return {
        "directory": found.directory, "world_size": found.world_size, "healthy": found.healthy, "ranks": ranks,
        "missing": found.missing, "fates": found.fates, "finished": found.finished, "problems": _plain(found.problems), "stuck": stuck,
        "disagreements": _plain(found.disagreements), "text": render(found),
    }  # fmt: skip
