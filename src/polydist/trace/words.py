"""The findings of ``polydist trace`` (:mod:`.analyze`) in plain sentences, one line each.

:func:`render` turns a :class:`~polydist.trace.analyze.Diagnosis` into lines like
(one line, folded here)::

    all_reduce #41 on [0,1,2,3]: ranks 0,1,3 waiting since 12.3 s at train.py:88;
        rank 2 never called it — it is in barrier #40 at train.py:95

- one header per dump: ``rank 1 (node1, pid 4242): exception — RuntimeError: rank 1 gives up at train.py:68``
  (why it was written; its error, and where it was raised when the dump has the error's traceback);
- the ranks with no dump, the files that could not be read;
- one line per stuck call, then one per first disagreement of a group; or that nothing is wrong.

Files are named by their base name, with as many parent folders as it takes
to tell two different paths apart. Error messages are shortened to their
essential (:func:`brief`); the full text is in ``--json``. Seconds are shown
to 0.1 s.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

from ..backends import registry
from ..collectives.debug import describe_tensor
from .findings import Disagreement, Findings, Stuck, Waiter, Where
from .reader import Call, Dump, Site, innermost, raised_at

__all__ = ["render", "headline", "describe", "label", "brief"]

_ROOT_NAMES = {"broadcast": "src", "scatter": "src", "reduce": "dst", "gather": "dst"}
_SOURCE = re.compile(r"^\[[^\]\s]+:\d+\] ")  # a C++ source prefix, as gloo's "[/__w/.../pair.cc:553] "
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_BRIEF_CHARS = 120


def brief(error: Optional[str]) -> str:
    """The essential of an error's ``"Type: message"``, for one line of text.

    Its first line, without a leading ``[file:line] `` source prefix, cut to the
    first sentence (without its final period), and to at most 120 characters
    (at a word's end where it can, then "…")::

        RuntimeError: [/__w/.../pair.cc:553] Connection closed by peer [127.0.0.1]:44763. This is typically ...
        -> RuntimeError: Connection closed by peer [127.0.0.1]:44763

    "" for None.
    """
    line = (error or "").strip().split("\n", 1)[0]
    kind, sep, message = line.partition(": ")
    if not sep or " " in kind:  # not "Type: message"
        kind, message = "", line
    message = _SOURCE.sub("", message, count=1)
    first = _SENTENCE_END.split(message, 1)
    message = first[0].rstrip(".") if len(first) > 1 else message
    text = f"{kind}: {message}" if kind else message
    if len(text) <= _BRIEF_CHARS:
        return text
    cut = text[: _BRIEF_CHARS - 1]
    space = cut.rfind(" ", _BRIEF_CHARS // 2)  # at a word's end, unless the words are very long
    return (cut[:space] if space > 0 else cut).rstrip(" ,;:") + "…"


def describe(call: Call) -> str:
    """A call as the user wrote it, roughly: ``all_reduce(float32[4, 2], op=SUM)``, ``broadcast(values, src=0)``."""
    tensors = [describe_tensor(d, s) for d, s in zip(call.dtypes, call.shapes)]
    args = tensors if len(tensors) <= 3 else tensors[:2] + [f"... ({len(tensors)} tensors)"]
    args = ["values"] if call.value else args
    args += [f"op={call.op}"] if call.op is not None else []
    args += [f"{_ROOT_NAMES.get(call.collective, 'root')}={call.root}"] if call.root is not None else []
    return f"{call.collective}({', '.join(args)})"


def _ranks(ranks: Iterable[int]) -> str:
    """``0,1,3``; runs of a long list as ``0-511``."""
    rs = sorted(ranks)
    if len(rs) <= 8:
        return ",".join(map(str, rs))
    runs, start = [], 0
    for i in range(1, len(rs) + 1):
        if i == len(rs) or rs[i] != rs[i - 1] + 1:
            runs.append(str(rs[start]) if i - start == 1 else f"{rs[start]}-{rs[i - 1]}")
            start = i
    return ",".join(runs)


def _who(ranks: list) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranks(ranks)}"


def label(call: Call, on: Optional[tuple] = None) -> str:
    """``all_reduce #41`` (with ``on [2,3]`` when ``on`` is another group), ``send to rank 1``, ``recv from rank 0``."""
    if call.seq is None:
        to = "from" if "recv" in call.collective else "to" if "send" in call.collective else "with"
        return call.collective + (f" {to} rank {call.root}" if call.root is not None else "")
    return f"{call.collective} #{call.seq}" + (f" on [{_ranks(call.group)}]" if on and call.group != on else "")


class _Words:
    """How one diagnosis names files (short, unambiguous), places and calls."""

    def __init__(self, found: Findings) -> None:
        self.found = found
        # The files a finding can name: call sites, each main thread's innermost frame, where errors were raised.
        sites = [site for d in found.dumps for site in (innermost(d.stacks)[0], raised_at(d)[0]) if site]
        paths = {c.file for d in found.dumps for c in d.calls} | {s.file for s in sites}
        parts = {p: p.replace("\\", "/").split("/") for p in paths if p}
        self.short = {}
        for p, comps in parts.items():
            k = 1
            while k < len(comps) and any(q != p and qc[-k:] == comps[-k:] for q, qc in parts.items()):
                k += 1
            self.short[p] = "/".join(comps[-k:])

    def at(self, site: Optional[Site]) -> str:
        if site is None or site.file is None:
            return "an unknown place"
        return f"{self.short.get(site.file, site.file)}:{site.line if site.line is not None else '?'}"

    def raised(self, error: Optional[str], site: Optional[Site]) -> str:
        """``RuntimeError: rank 1 gives up at train.py:68`` (no place without a traceback)."""
        return brief(error) + (f" at {self.at(site)}" if site is not None else "")

    def where(self, w: Where, subject: str, plural: bool, group: Optional[tuple]) -> str:
        """Where ``w``'s rank is, as a clause about ``subject`` ("it", "they", "rank 1")."""
        be = "are" if plural else "is"
        its = {"it": "its", "they": "their"}.get(subject, f"{subject}'s")
        if w.kind == "in call":
            return f"{subject} {be} in {label(w.call, group)} at {self.at(w.call.site)}"
        if w.kind == "failed":
            return f"{its} last call, {label(w.call, group)} at {self.at(w.call.site)}, failed: {brief(w.call.error)}"
        if w.kind == "finished":
            return f"{subject} had finished {its} program (exit code 0)"
        if w.kind == "no stack":
            text = f"{its} dump has no stack of the main thread"
        elif w.kind == "raised":
            text = f"{subject} raised {self.raised(w.error, w.site)}"
        else:
            code = "user" if w.kind == "user code" else "library"
            text = f"{subject} {be} running {code} code at {self.at(w.site)} (in function {w.site.function})"
        if w.last is None:
            return text + (", no call recorded" if w.relation != "unknown" else "")
        text += f", last {'collective' if w.last.seq is not None else 'call'}: {label(w.last, group)} completed"
        return text + (f" {w.seconds:.1f} s before the dump" if w.seconds is not None else "")

    def others(self, found: list, group: Optional[tuple], source: str = "polydist") -> list:
        """Clauses for the members not in a stuck call, ranks with the same clause together."""
        clusters: dict = {}
        for w in found:
            known = w.kind not in ("no dump", "unreadable")
            clusters.setdefault((w.relation, w.kind, self.where(w, "it", False, group) if known else ""), []).append(w)
        out = []
        for (relation, kind, _), ws in clusters.items():
            ranks = [w.rank for w in ws]
            who, plural = _who(ranks), len(ranks) > 1
            if kind == "no dump":
                out += self.no_dump(ranks)
                continue
            if kind == "unreadable":
                out.append(f"the dump of {who} could not be read")
                continue
            where = self.where(ws[0], "they" if plural else "it", plural, group)
            if relation == "peer":
                out.append(self.where(ws[0], who, plural, group))
            elif relation == "unknown":
                recorder = "torch's recorder" if source == "torch" else "the recorder"
                out.append(f"{who} had {recorder} off — {where}")
            else:
                out.append(f"{who} {relation} it — {where}")
        return out

    def no_dump(self, ranks: list) -> list:
        """``no dump from ranks 2,3``; a rank whose fate is known on its own: ``no dump from rank 1 (frozen: ...)``."""
        fates = self.found.fates
        plain = [r for r in ranks if r not in fates]
        return ([f"no dump from {_who(plain)}"] if plain else []) + [
            f"no dump from rank {r} ({fates[r]})" for r in ranks if r in fates]  # fmt: skip

    def stuck(self, st: Stuck) -> str:
        if st.seq is None:  # point-to-point: one rank
            w = st.waiting[0]
            head = f"rank {w.rank}: {label(w.call)} at {self.at(w.call.site)}, {self.wait(w, [w.seconds])}"
            return "; ".join([head] + self.others(st.others, st.group, w.call.source))
        names = {w.call.collective for w in st.waiting}
        mixed = len(names) > 1
        clusters: dict = {}
        for w in st.waiting:
            kind = "waiting" if w.call.state == "started" else "timed out" if w.call.timed_out else "failed"
            clusters.setdefault((w.call.collective, self.at(w.call.site), kind), []).append(w)
        parts = []
        for (name, at, kind), ws in clusters.items():
            inside = f" in {name}" if mixed else ""
            seconds = [w.seconds for w in ws]
            parts.append(f"{_who([w.rank for w in ws])} {self.wait(ws[0], seconds, inside, at)}")
        title = f"{'call' if mixed else names.pop()} #{st.seq} on [{_ranks(st.group)}]"
        return f"{title}: " + "; ".join(parts + self.others(st.others, st.group, st.waiting[0].call.source))

    @staticmethod
    def wait(w: Waiter, seconds: list, inside: str = "", at: str = "") -> str:
        """``waiting since 12.3 s at a.py:1``, ``waited 5.0 s and timed out``, ``failed after 0.2 s (Error: ...)``."""
        at = f" at {at}" if at else ""
        if w.call.state == "started":
            return f"waiting{inside} since {max(seconds):.1f} s{at}"
        if w.call.timed_out:
            return f"waited {max(seconds):.1f} s{inside} and timed out{at}"
        return f"failed{inside} after {max(seconds):.1f} s{at} ({brief(w.call.error)})"

    def disagreement(self, d: Disagreement) -> str:
        clusters: dict = {}
        for rank, call in d.calls.items():
            clusters.setdefault(f"called {describe(call)} at {self.at(call.site)}", []).append(rank)
        calls = "; ".join(f"{_who(ranks)} {text}" for text, ranks in clusters.items())
        return f"first disagreement on group [{_ranks(d.group)}]: call #{d.seq}: {calls}"

    def header(self, dump: Dump) -> str:
        where = ", ".join(str(x) for x in (dump.host, f"pid {dump.pid}" if dump.pid is not None else None) if x)
        text = f"rank {dump.rank}" + (f" ({where})" if where else "") + f": {', then '.join(dump.reasons)}"
        text += f" — {self.raised(dump.error, raised_at(dump)[0])}" if dump.error else ""
        if not dump.enabled:
            site = innermost(dump.stacks)[0]
            text += "; the recorder was off (POLYDIST_TRACE=0), so the analysis has its stacks only"
            text += f": its main thread is at {self.at(site)} (in function {site.function})" if site else ""
        if dump.dropped:
            text += f"; {dump.dropped} older calls were dropped from its ring buffer"
        if dump.torch_on is False and registry.get(dump.backend).torch_recorder:  # DDP's, FSDP2's calls go unseen
            text += "; torch's recorder was off (TORCH_FR_BUFFER_SIZE=0): operations not made through polydist's API are not in the dump"
        return text


def headline(found: Findings) -> Optional[str]:
    """The finding a launcher's failure report starts with: the oldest stuck call (who waited, who never came
    and where it was), else the first disagreement; None when the dumps show neither."""
    words = _Words(found)
    if found.stuck:
        return words.stuck(found.stuck[0])
    return words.disagreement(found.disagreements[0]) if found.disagreements else None


def render(found: Findings) -> list:
    """The lines of :meth:`~polydist.trace.analyze.Diagnosis.text` (see the module docstring)."""
    words = _Words(found)
    size = f" of {found.world_size}" if found.world_size is not None else ""
    lines = [f"polydist trace {found.directory}: dumps from {len(found.dumps)}{size} ranks"]
    lines += [words.header(d) for d in found.dumps]
    unknown = [r for r in found.missing if r not in found.fates]
    if unknown:
        they = len(unknown) > 1
        lines.append(f"no dump from {_who(unknown)} ({'they' if they else 'it'} died before "
                     f"{'they' if they else 'it'} could write one, or {'were' if they else 'was'} killed by SIGKILL)")
    lines += [f"no dump from rank {r} ({found.fates[r]})" for r in found.missing if r in found.fates]
    if found.finished:
        lines.append(f"{_who(found.finished)} finished {'their' if len(found.finished) > 1 else 'its'} program "
                     "(exit code 0) and wrote no dump")
    lines += [p.text() for p in found.problems]
    lines += [words.stuck(s) for s in found.stuck]
    lines += [words.disagreement(d) for d in found.disagreements]
    if not (found.stuck or found.disagreements) and found.dumps:
        off = [d.rank for d in found.dumps if not d.enabled]
        if not off:
            lines.append("no rank is waiting in a collective; last collective on every group completed")
        else:
            lines.append(f"no recorded call is waiting; {_who(off)} had the recorder off (see the stacks above)")
    return lines
