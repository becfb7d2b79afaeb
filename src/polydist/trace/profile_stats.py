"""The arithmetic and the table of a comms profile: calls matched across ranks, summed per collective and size.

Pure functions over what :mod:`polydist.trace.profile` gathers (each rank's
packed calls, the ranks, their clock offsets); the definitions of every
figure are in :func:`polydist.trace.profile.comms_profile`'s docstring.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any, Optional

from ..units import FAMILY, GiB, KiB, MiB, aligned_columns, bandwidths, format_bandwidth, format_size

__all__ = ["summarize", "format_profile", "bucket", "GATHERED", "FAILED_CALL", "VALUE_CALL"]

GATHERED = ("all_gather", "gather")  # size: the sum of the ranks' bytes (the others: the largest)
FAILED_CALL, VALUE_CALL = 1, 2  # flags of a packed call
_PER_RANK = ("calls", "bytes", "busy_s", "wait_s", "last", "p2p_calls", "p2p_bytes")  # summary["ranks"] keys


def bucket(size: Optional[int]) -> Optional[int]:
    """The power of two at or above ``size`` (0 stays 0, None: a value)."""
    return size if not size else 1 << (size - 1).bit_length()


class _Row:
    """One (collective, group size, bucket) while its calls are added."""

    __slots__ = ("calls", "bytes", "partial", "sized", "times", "spreads", "last")

    def __init__(self) -> None:
        self.calls = self.bytes = self.partial = self.sized = 0  # sized: bytes of the calls with a time
        self.times: list = []
        self.spreads: list = []
        self.last: Counter = Counter()

    def add(self, size: Optional[int], took: Optional[float], spread: Optional[float] = None, last: Any = None) -> None:
        """A call of ``size`` bytes (None: values) that took ``took`` s; None: partial (calls and bytes only)."""
        self.calls, self.bytes = self.calls + 1, self.bytes + (size or 0)
        if took is None:
            self.partial += 1
            return
        self.times.append(took)
        self.sized += size or 0
        if spread is not None:
            self.spreads.append(spread)
        if last is not None:
            self.last[last] += 1

    def figures(self, name: str, n: Optional[int], bucket: Optional[int]) -> dict:
        median = statistics.median(self.times) if self.times else None
        bw = n is not None and bucket is not None and median is not None  # p2p and values: no bandwidth
        algbw, busbw = bandwidths(name, self.sized / len(self.times), median, n) if bw else (None, None)
        return {
            "collective": name, "ranks": n, "size": bucket, "point_to_point": n is None, "calls": self.calls,
            "bytes": self.bytes, "partial": self.partial, "time_s": sum(self.times), "median_s": median,
            "algbw_GBps": algbw, "busbw_GBps": busbw,
            "spread_median_s": statistics.median(self.spreads) if self.spreads else None,
            "spread_s": sum(self.spreads) if self.spreads else None, "last": [list(x) for x in self.last.most_common()],
        }  # fmt: skip


def summarize(payloads: list, ranks: list, offsets: list) -> dict:
    """The summary of the members' packed calls (``payloads[i]`` from global rank ``ranks[i]``).

    Returns a dict:

    - ``group``: ``ranks``; ``clock_offsets_s``: ``offsets``, seconds
      subtracted from each member's times;
    - ``rows``: one dict per (collective, group size, size bucket), collectives
      by name, then point-to-point: ``collective``, ``ranks`` (group size;
      None for point-to-point), ``size`` (the bucket, bytes; None for
      values), ``point_to_point``, ``calls``, ``bytes``, ``partial``,
      ``time_s`` (total), ``median_s``, ``algbw_GBps``, ``busbw_GBps``,
      ``spread_median_s``, ``spread_s`` (total), ``last`` (``[[rank,
      calls], ...]``, most often last first); None where undefined;
    - ``ranks``: one dict per member: ``rank``, ``calls``, ``bytes`` (its
      own tensor bytes), ``busy_s`` (its own time inside collectives,
      waiting included), ``wait_s`` (the total of latest arrival − its
      arrival: how long it waited for others), ``last`` (calls it arrived
      last to), ``p2p_calls``, ``p2p_bytes``;
    - ``calls``, ``partial``, ``p2p_calls``, ``time_s``: totals.
    """
    stats: dict = {r: Counter() for r in ranks}
    calls: dict = {}  # (group, seq) -> [name, value?, {rank: (start, end, bytes, failed)}]
    rows: dict = {}  # (name, group size or None, bucket) -> _Row
    for rank, payload, offset in zip(ranks, payloads, offsets):
        groups, names, mine = [tuple(g) for g in payload["groups"]], payload["names"], stats[rank]
        for (gi, ni, seq, nbytes, flags), (start, end) in zip(payload["ints"].tolist(), payload["times"].tolist()):
            if seq >= 0:
                call = calls.setdefault((groups[gi], seq), [names[ni], flags & VALUE_CALL, {}])
                call[2][rank] = (start - offset, end - offset, nbytes, flags & FAILED_CALL)
                mine.update(calls=1, bytes=nbytes, busy_s=end - start)  # Counter.update adds
                continue
            size = None if flags & VALUE_CALL else nbytes  # point-to-point: this rank's own duration
            row = rows.setdefault((names[ni], None, bucket(size)), _Row())
            row.add(size, None if flags & FAILED_CALL else end - start)
            mine["p2p_calls"] += 1
            mine["p2p_bytes"] += nbytes

    for (group, _), (name, value, seen) in calls.items():
        sizes = [nbytes for _, _, nbytes, _ in seen.values()]
        size = None if value else sum(sizes) if FAMILY.get(name, name) in GATHERED else max(sizes)
        row = rows.setdefault((name, len(group), bucket(size)), _Row())
        if len(seen) < len(group) or any(failed for *_, failed in seen.values()):
            row.add(size, None)
            continue
        arrivals = {r: start for r, (start, *_) in seen.items()}
        latest, spread = max(arrivals.values()), max(arrivals.values()) - min(arrivals.values())
        last = max(arrivals, key=arrivals.__getitem__) if spread > 0 else None  # alone or together: no straggler
        row.add(size, max(0.0, max(end for _, end, _, _ in seen.values()) - latest), spread, last)
        for r, arrival in arrivals.items():
            stats[r]["wait_s"] += latest - arrival
        if last is not None:
            stats[last]["last"] += 1

    order = sorted(rows, key=lambda k: (k[1] is None, k[0], k[1] or 0, -1 if k[2] is None else k[2]))
    out = [rows[key].figures(*key) for key in order]
    return {
        "group": list(ranks), "clock_offsets_s": list(offsets), "rows": out,
        "ranks": [{"rank": r, **{k: stats[r][k] for k in _PER_RANK}} for r in ranks],
        "calls": sum(r["calls"] for r in out if not r["point_to_point"]), "partial": sum(r["partial"] for r in out),
        "p2p_calls": sum(r["calls"] for r in out if r["point_to_point"]), "time_s": sum(r["time_s"] for r in out),
    }  # fmt: skip


# ---------------------------------------------------------------- the printed table


def _duration(s: Optional[float]) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.1f}us" if s < 1e-3 else f"{s * 1e3:.2f}ms" if s < 1 else f"{s:.2f}s"


def _amount(nbytes: int) -> str:
    """A byte total: exact when round ("40KiB"), else to one decimal ("1.5MiB")."""
    scale, unit = next(((s, u) for s, u in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")) if nbytes >= s), (1, "B"))
    return format_size(nbytes) if nbytes % scale == 0 else f"{nbytes / scale:.1f}{unit}"


def _size(row: dict) -> str:
    return "value" if row["size"] is None else "-" if row["size"] == 0 else format_size(row["size"])


def format_profile(summary: dict) -> str:
    """The table of a summary (:func:`summarize`): a heading, one line per row, the legend, then one line per rank.

    Times in us/ms/s, byte totals in B/KiB/MiB/GiB, bandwidths in GB/s (1e9 B/s).
    """
    rows, partial = summary["rows"], summary["partial"]
    head = ["collective", "ranks", "size<=", "calls", "bytes", "total", "median", "algbw(GB/s)", "busbw(GB/s)",
            "spread(med)", "spread(total)", "last most often"] + ["partial"] * bool(partial)  # fmt: skip
    body = [head]
    for r in rows:
        last = ", ".join(f"{rank}x{count}" for rank, count in r["last"][:3]) or "-"
        body.append([
            r["collective"], "p2p" if r["point_to_point"] else str(r["ranks"]), _size(r), str(r["calls"]),
            _amount(r["bytes"]), _duration(r["time_s"]), _duration(r["median_s"]), format_bandwidth(r["algbw_GBps"]),
            format_bandwidth(r["busbw_GBps"]), _duration(r["spread_median_s"]), _duration(r["spread_s"]), last,
        ] + [str(r["partial"])] * bool(partial))  # fmt: skip
    backend = summary.get("backend")
    took = summary.get("duration_s")
    lines = [
        f"# polydist comms profile: ranks {summary['group']}" + (f" ({backend})" if backend else "")
        + (f", {took:.2f} s" if took is not None else "") + f"; {summary['calls']} collective calls"
        + (f" ({partial} partial)" if partial else "") + f", {summary['p2p_calls']} point-to-point",
        *(aligned_columns(body, left=1) if rows else ["(no calls)"]),
        "# size<=: bucket, the power of two at or above a call's size (nccl-tests': the gathered buffer for "
        "all_gather/gather, the largest rank's tensors otherwise); bytes: sum of call sizes",
        "# time per call: latest end - latest arrival over the ranks (p2p: the rank's own); algbw = mean size / "
        "median time, busbw = algbw x nccl-tests factor (doc/PERFORMANCE.md), GB/s",
        "# spread: latest - earliest arrival per call; last most often: rank x calls it arrived last to"
        + ("; partial: calls not completed on every rank (in calls and bytes only)" if partial else ""),
    ]  # fmt: skip
    per_rank = [["rank", "calls", "bytes", "busy", "waited", "last", "p2p calls"]]
    hosts = summary.get("hosts") or [None] * len(summary["ranks"])
    for s, host in zip(summary["ranks"], hosts):
        who = f"{s['rank']}" + (f" ({host})" if host else "")
        per_rank.append([who, str(s["calls"]), _amount(s["bytes"]), _duration(s["busy_s"]), _duration(s["wait_s"]),
                         str(s["last"]), str(s["p2p_calls"])])  # fmt: skip
    lines += ["", "# per rank: own calls and tensor bytes; busy: time inside collectives; waited: for the last rank",
              *aligned_columns(per_rank, left=1)]  # fmt: skip
    return "\n".join(lines)
