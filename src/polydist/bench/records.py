"""Benchmark results: measured points as records, their nccl-tests-like table, and the files that keep them.

Its one job is what happens to a time once measured: a :class:`Record` is one
(collective, implementation, size) point made from a
:class:`~polydist.bench.timing.Timing`, with bandwidths in the units of
:mod:`polydist.units`; :func:`format_table` lays records side by side
(times in µs, bandwidths in GB/s); :func:`run_metadata`, :func:`write_json`,
:func:`read_json` and :func:`write_markdown` store them with the facts of the
run that produced them.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional, Sequence, Union

import torch
import torch.distributed as dist

from .. import settings
from .timing import Timing, _distributed
from ..units import bandwidths, format_bandwidth

__all__ = ["Record", "format_table", "run_metadata", "write_json", "read_json", "write_markdown"]

PathLike = Union[str, "os.PathLike[str]"]


@dataclass
class Record:
    """One measured (collective, implementation, size) point.

    ``size`` in bytes (nccl-tests convention, see :mod:`polydist.units`),
    ``time_s`` the median per-call seconds (max over ranks), bandwidths in
    GB/s (1e9 B/s). A failed point has ``time_s`` None and ``error`` set;
    ``wrong`` marks a point whose result was checked and found wrong.
    ``case`` tells apart rows of the same collective and size (e.g. "str" vs
    "dict" payloads); ``extras`` holds anything else worth keeping.
    """

    collective: str
    implementation: str
    backend: Optional[str]
    world_size: int
    size: int
    dtype: str
    time_s: Optional[float]
    algbw_GBps: Optional[float] = None
    busbw_GBps: Optional[float] = None
    count: Optional[int] = None
    case: str = ""
    time_min_s: Optional[float] = None
    iters: int = 0
    repeats: int = 0
    error: Optional[str] = None
    wrong: bool = False
    extras: dict = field(default_factory=dict)

    @classmethod
    def from_timing(
        cls,
        collective: str,
        implementation: str,
        timing: Timing,
        *,
        size: int,
        dtype: str,
        count: Optional[int] = None,
        case: str = "",
        scale: float = 1.0,
        wrong: bool = False,
        group: Any = None,
        **extras: Any,
    ) -> "Record":
        """A record of :func:`~.timing.measure`'s result, with backend and world size of ``group`` and bandwidths.

        ``scale`` multiplies the times, e.g. 0.5 to report one leg of a timed
        ping-pong round trip. Serial: backend None, world size 1.
        """
        backend = str(dist.get_backend(group)) if _distributed() else None
        world_size = dist.get_world_size(group) if _distributed() else 1
        median = timing.median_s * scale if timing.median_s is not None else None
        fastest = timing.min_s * scale if timing.min_s is not None else None
        algbw, busbw = bandwidths(collective, size, median, world_size)
        return cls(
            collective=collective, implementation=implementation, backend=backend, world_size=world_size,
            size=size, dtype=dtype, time_s=median, algbw_GBps=algbw, busbw_GBps=busbw, count=count, case=case,
            time_min_s=fastest, iters=timing.iters, repeats=len(timing.per_repeat_s), error=timing.error,
            wrong=wrong, extras=dict(extras),
        )  # fmt: skip


# ---------------------------------------------------------------- tables


def _cells(r: Optional[Record]) -> list[str]:
    if r is None:
        return ["-", "-", "-"]
    if r.error is not None or r.time_s is None:
        return ["failed", "-", "-"]
    return [f"{r.time_s * 1e6:.1f}" + (" (wrong)" if r.wrong else ""), format_bandwidth(r.algbw_GBps), format_bandwidth(r.busbw_GBps)]


def format_table(records: Sequence[Record], *, reference: Optional[str] = None, markdown: bool = False) -> str:
    """nccl-tests-like table: one row per (collective, case, size, dtype), implementations side by side.

    Columns: collective, case (when any), size (bytes), count (elements),
    dtype, then per implementation time (µs), algbw and busbw (GB/s), then
    time(impl) / time(reference) for each other implementation (above 1:
    slower than the reference). ``reference`` defaults to the last
    implementation seen when there are several. Failed points show "failed",
    points with a wrong result "(wrong)". ``markdown=True``: a GitHub table.
    """
    impls = list(dict.fromkeys(r.implementation for r in records))
    if reference is None and len(impls) > 1:
        reference = impls[-1]
    if reference is not None and reference not in impls:
        raise ValueError(f"reference {reference!r} is not one of the implementations {impls}")
    others = [i for i in impls if i != reference] if reference is not None else []
    rows: dict[tuple, dict[str, Record]] = {}
    for r in records:
        rows.setdefault((r.collective, r.case, r.size, r.dtype), {})[r.implementation] = r
    with_case = any(r.case for r in records)

    head = ["collective"] + ["case"] * with_case + ["size(B)", "count", "type"]
    groups = [""] * len(head)  # labels spanning several columns, above the header
    for impl in impls:
        head += ["time(us)", "algbw(GB/s)", "busbw(GB/s)"]
        groups += [impl, "", ""]
    head += [f"{i}/{reference}" for i in others] if markdown else others
    groups += [f"time / time of {reference}" if k == 0 else "" for k in range(len(others))]

    body = []
    for (collective, case, size, dtype), by_impl in rows.items():
        count = next(iter(by_impl.values())).count
        line = [collective] + [case] * with_case + [str(size), "-" if count is None else str(count), dtype]
        for impl in impls:
            line += _cells(by_impl.get(impl))
        ref = by_impl.get(reference) if reference is not None else None
        for impl in others:
            r = by_impl.get(impl)
            line.append(f"{r.time_s / ref.time_s:.2f}" if r and ref and r.time_s and ref.time_s else "-")
        body.append(line)

    if markdown:
        spread = list(groups)
        for i in range(1, len(spread)):
            spread[i] = spread[i] or (spread[i - 1] if spread[i - 1] in impls else "")
        titles = [f"{g} {h}" if g in impls else h for g, h in zip(spread, head)]
        align = [":---" if h in ("collective", "case", "type") else "---:" for h in head]  # text left, numbers right
        lines = ["| " + " | ".join(titles) + " |", "|" + "|".join(align) + "|"]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(head)]
    starts = [i for i, g in enumerate(groups) if g] + [len(groups)]
    top = ""
    for a, b in zip(starts, starts[1:]):  # a label starts above its first column; its last column may widen
        widths[b - 1] += max(0, len(groups[a]) - (sum(widths[a:b]) + 2 * (b - a - 1)))
        top = top.ljust(sum(widths[:a]) + 2 * a) + groups[a]
    left = [h in ("collective", "case", "type") for h in head]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if lj else c.rjust(w) for c, w, lj in zip(cells, widths, left)).rstrip()

    return "\n".join([top, *map(line, [head, *body])])


# ---------------------------------------------------------------- results files


def _git_describe() -> Optional[str]:
    try:
        cmd = ["git", "describe", "--always", "--dirty", "--abbrev=12"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def run_metadata(group: Any = None, **extra: Any) -> dict:
    """Facts about this run for a results file; ``extra`` entries (e.g. iteration settings) are added as given.

    Keys: date (UTC, ISO 8601), command (this process's argv), launcher,
    backend, world_size, nproc_per_node, hostname, cpu_count, torch_threads,
    torch, polydist, python, platform, git (``git describe`` of the current
    directory, "-dirty" with uncommitted changes).
    """
    from .. import __version__

    distributed = _distributed()
    launcher = settings.LAUNCHER.read() or ("torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else None)
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(sys.argv),
        "launcher": launcher,
        "backend": str(dist.get_backend(group)) if distributed else None,
        "world_size": dist.get_world_size(group) if distributed else 1,
        "nproc_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or None,
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "polydist": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git": _git_describe(),
        **extra,
    }


def _write(path: PathLike, text: str) -> None:
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_json(records: Sequence[Record], path: PathLike, meta: Optional[dict] = None) -> None:
    """Write ``{"meta": meta, "records": [...]}`` to ``path`` (folders created); meta default: :func:`run_metadata`."""
    doc = {"meta": run_metadata() if meta is None else meta, "records": [asdict(r) for r in records]}
    _write(path, json.dumps(doc, indent=1) + "\n")


def read_json(path: PathLike) -> tuple[dict, list[Record]]:
    """``(meta, records)`` from a file written by :func:`write_json`."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    return doc["meta"], [Record(**r) for r in doc["records"]]


def write_markdown(
    records: Sequence[Record],
    path: PathLike,
    meta: dict,
    *,
    title: str,
    reference: Optional[str] = None,
    notes: str = "",
) -> None:
    """Write a markdown report to ``path``: title, the run's facts from ``meta``, ``notes``, the table."""
    keys = ("backend", "world_size", "hostname", "cpu_count", "torch", "git")
    facts = ", ".join(f"{k}: `{meta.get(k)}`" for k in keys)
    text = [f"# {title}", "", f"{facts}, date: {meta.get('date')}", "", f"Command: `{meta.get('command')}`", ""]
    text += [notes.strip(), ""] if notes else []
    _write(path, "\n".join(text + [format_table(records, reference=reference, markdown=True), ""]))
