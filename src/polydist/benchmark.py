"""Timing core for collective benchmarks, in the conventions of nccl-tests.

Used by the scripts in ``benchmarks/`` and by ``polydist bench``
(:mod:`polydist.bench`): it times zero-argument callables on every rank and
turns the times into records, tables and JSON. It talks to
``torch.distributed`` directly — a barrier before each timed block and one
MAX all-reduce of the times at the end — so it measures polydist without
depending on it. With no process group (serial, world size 1) it times
locally.

Units, everywhere: sizes in **bytes**, times in **seconds**, bandwidths in
**GB/s = 1e9 bytes per second** (tables show times in µs). Conventions follow
nccl-tests (``doc/PERFORMANCE.md``):

* ``size`` is the largest buffer of the operation: the full gathered buffer
  for all_gather and gather, the full input for reduce_scatter and scatter,
  the whole per-rank send buffer for all_to_all, the tensor itself otherwise.
* ``algbw = size / time``; ``busbw = algbw * factor``, with the factor of
  :data:`BUSBW_FACTORS` (e.g. ``2(n-1)/n`` for all_reduce), which makes
  busbw comparable with the hardware's link bandwidth whatever the rank count.
* ``time`` is the mean time of one call over ``iters`` back-to-back calls,
  taken as the maximum over ranks (the collective is as slow as its slowest
  rank), then the median over ``repeats`` such blocks.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import shlex
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist

__all__ = [
    "KiB", "MiB", "GiB", "parse_size", "format_size", "size_range",
    "BUSBW_FACTORS", "busbw_factor", "bandwidths",
    "Timing", "measure", "measure_many",
    "Record", "format_table", "run_metadata", "write_json", "read_json", "write_markdown",
]  # fmt: skip

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
PathLike = Union[str, "os.PathLike[str]"]

# ---------------------------------------------------------------- sizes

_UNITS = {"": 1, "B": 1, "K": KiB, "KB": KiB, "KIB": KiB, "M": MiB, "MB": MiB, "MIB": MiB, "G": GiB, "GB": GiB,
          "GIB": GiB}  # fmt: skip
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")


def parse_size(text: Union[str, int]) -> int:
    """Bytes in ``text``: "8", "8B", "4KiB", "4K", "64MiB", "1GiB" (case-insensitive), or an int.

    K/KB/KiB all mean 1024 (as nccl-tests' ``-b 4K``). Raises ``ValueError``
    on anything else: fractions, negative numbers, unknown units.
    """
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    match = _SIZE_RE.match(str(text))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"cannot parse size {text!r}: expected an integer and a unit B, KiB, MiB or GiB, e.g. '64MiB'")
    return int(match.group(1)) * _UNITS[unit]


def format_size(nbytes: int) -> str:
    """Short binary form of a byte count: 8 → "8B", 4096 → "4KiB", 1536 → "1536B"."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def size_range(
    lo: Union[str, int], hi: Union[str, int], factor: int = 2, *, step: Union[str, int, None] = None
) -> list[int]:
    """Byte sizes ``lo, lo*factor, lo*factor², ...`` up to and including ``hi`` (nccl-tests ``-b -e -f``).

    With ``step`` (bytes, >= 1): ``lo, lo+step, lo+2*step, ...`` instead (nccl-tests ``-i``); ``factor`` is ignored.
    """
    lo_b, hi_b = parse_size(lo), parse_size(hi)
    step_b = None if step is None else parse_size(step)
    if lo_b < 1 or hi_b < lo_b or (factor < 2 if step_b is None else step_b < 1):
        what = f"factor={factor!r}" if step_b is None else f"step={step!r}"
        raise ValueError(f"need 1 <= lo <= hi and factor >= 2 or step >= 1, got lo={lo!r}, hi={hi!r}, {what}")
    sizes = [lo_b]
    grow = (lambda s: s + step_b) if step_b else (lambda s: s * factor)
    while grow(sizes[-1]) <= hi_b:
        sizes.append(grow(sizes[-1]))
    return sizes


# ---------------------------------------------------------------- bandwidth

# busbw / algbw per collective, as a function of the rank count n (nccl-tests doc/PERFORMANCE.md).
BUSBW_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    **dict.fromkeys(("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"), lambda n: (n - 1) / n),
    **dict.fromkeys(("broadcast", "reduce", "send_recv"), lambda n: 1.0),
}


def busbw_factor(collective: str, world_size: int) -> Optional[float]:
    """busbw / algbw for ``collective`` on ``world_size`` ranks; None when it has no bandwidth (barrier, unknown)."""
    factor = BUSBW_FACTORS.get(collective)
    return None if factor is None or world_size < 1 else factor(world_size)


def bandwidths(collective: str, size: int, time_s: Optional[float], world_size: int) -> tuple:
    """``(algbw, busbw)`` in GB/s (1e9 B/s) for ``size`` bytes in ``time_s`` seconds; ``(None, None)`` if undefined."""
    factor = busbw_factor(collective, world_size)
    if time_s is None or not 0 < time_s < math.inf or factor is None:
        return None, None
    algbw = size / time_s / 1e9
    return algbw, algbw * factor


# ---------------------------------------------------------------- timing


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one callable, one value per repeat, each the max over ranks.

    ``error`` is set (and ``per_repeat_s`` empty) when the callable raised.
    """

    per_repeat_s: tuple = ()
    iters: int = 0
    warmup: int = 0
    error: Optional[str] = None

    @property
    def median_s(self) -> Optional[float]:
        """Median over repeats of the per-call time, seconds (None when failed)."""
        return statistics.median(self.per_repeat_s) if self.per_repeat_s else None

    @property
    def min_s(self) -> Optional[float]:
        """Fastest repeat's per-call time, seconds (None when failed)."""
        return min(self.per_repeat_s) if self.per_repeat_s else None


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _nccl(group: Any) -> bool:
    return _distributed() and "nccl" in str(dist.get_backend(group))


def _max_over_ranks(values: list[float], group: Any) -> list[float]:
    """Element-wise MAX over the ranks of ``group``, through raw torch.distributed (float64)."""
    if not _distributed() or not values:
        return values
    device = torch.device("cuda", torch.cuda.current_device()) if _nccl(group) else torch.device("cpu")
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.cpu().tolist()


def measure_many(
    fns: Mapping[str, Callable[[], Any]],
    *,
    iters: Optional[int] = None,
    warmup: int = 3,
    repeats: int = 5,
    target_s: float = 0.05,
    max_iters: int = 10_000,
    group: Any = None,
    sync: Optional[Callable[[], None]] = None,
    catch: bool = False,
    local: bool = False,
) -> dict[str, Timing]:
    """Time several callables against each other, interleaving their repeats.

    Every rank must call this with the same ``fns`` keys (in the same order)
    and arguments. Per callable: barrier, ``warmup`` untimed calls (timed
    singly only to choose ``iters``). Then ``repeats`` rounds, each timing
    every callable in turn (round ``r`` starts with callable ``r mod k``):
    barrier, ``iters`` back-to-back calls between two ``time.perf_counter()``
    reads, per-call mean. Interleaving spreads slow drifts of the machine
    (other load, clock changes) over all callables alike, and rotating the
    order keeps any one from always going first, so their ratios are fair. Last, one MAX all-reduce over the ranks
    of ``group`` (raw torch.distributed) makes the results the same on every
    rank.

    Args:
        fns: label → zero-argument callable running one operation (e.g. one
            collective call on a preallocated tensor).
        iters: calls per timed block. None: per callable, enough for a block
            of about ``target_s`` seconds judging by the slowest rank's median
            warm-up call (1 to ``max_iters``).
        warmup: untimed calls before timing (at least 1 when ``iters`` is None).
        repeats: timed blocks per callable (>= 1).
        group: the process group to barrier and reduce over (None: world).
        sync: called after the calls, before reading the clock, to wait for
            asynchronous device work; default ``torch.cuda.synchronize`` with
            nccl, nothing otherwise.
        catch: record an exception of a callable as ``Timing.error`` and skip
            that callable from then on, instead of raising. Only safe when
            the failure happens on every rank alike (e.g. before any
            communication): a rank failing alone leaves the others waiting.
        local: time in this process only, even inside a job: no barriers,
            no reduction over ranks (e.g. a memory-bandwidth reference that
            one rank measures while the others wait).

    Returns:
        label → :class:`Timing`, the same on every rank. Serial (no process
        group): local times, no barriers.
    """
    if repeats < 1 or (iters is not None and iters < 1):
        raise ValueError(f"repeats and iters must be >= 1, got repeats={repeats}, iters={iters}")
    warmup = max(warmup, 1) if iters is None else warmup
    distributed = _distributed() and not local
    if sync is None and _nccl(group):
        sync = torch.cuda.synchronize
    labels = list(fns)
    errors: dict[str, str] = {}

    def over_ranks(values: list[float]) -> list[float]:
        return values if local else _max_over_ranks(values, group)

    def block(label: str, n: int) -> float:
        """Barrier, then mean seconds per call of ``n`` back-to-back calls; inf once the callable failed."""
        if distributed:
            dist.barrier(group=group)
        if label in errors:
            return math.inf
        try:
            t0 = time.perf_counter()
            for _ in range(n):
                fns[label]()
            if sync is not None:
                sync()
            return (time.perf_counter() - t0) / n
        except Exception as exc:  # noqa: BLE001 - recorded for the report
            if not catch:
                raise
            errors[label] = f"{type(exc).__name__}: {exc}"
            return math.inf

    estimates = [statistics.median([block(label, 1) for _ in range(warmup)]) if warmup else 0.0 for label in labels]
    counts = {}
    for label, est in zip(labels, over_ranks(estimates)):
        auto = math.ceil(target_s / est) if 0 < est < math.inf else max_iters
        counts[label] = iters if iters is not None else max(1, min(max_iters, auto))
    rounds = []
    for r in range(repeats):  # rotate who goes first, so no candidate always pays for leaving the barrier first
        order = labels[r % len(labels) :] + labels[: r % len(labels)]
        times = {label: block(label, counts[label]) for label in order}
        rounds.append([times[label] for label in labels])
    flat = over_ranks([t for row in rounds for t in row])
    results = {}
    for i, label in enumerate(labels):
        times = tuple(flat[r * len(labels) + i] for r in range(repeats))
        if label in errors or math.inf in times:
            results[label] = Timing((), counts[label], warmup, errors.get(label, "failed on another rank"))
        else:
            results[label] = Timing(times, counts[label], warmup)
    return results


def measure(fn: Callable[[], Any], **kwargs: Any) -> Timing:
    """Time one zero-argument callable on every rank; see :func:`measure_many` for the steps and arguments."""
    return measure_many({"": fn}, **kwargs)[""]


# ---------------------------------------------------------------- records


@dataclass
class Record:
    """One measured (collective, implementation, size) point.

    ``size`` in bytes (nccl-tests convention, see the module docstring),
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
        """A record of :func:`measure`'s result, with backend and world size of ``group`` and bandwidths.

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


def _num(value: Optional[float]) -> str:
    """A bandwidth for a table: 4 decimals below 10, 2 above ("-" for None)."""
    return "-" if value is None else format(value, ".2f" if value >= 10 else ".4f")


def _cells(r: Optional[Record]) -> list[str]:
    if r is None:
        return ["-", "-", "-"]
    if r.error is not None or r.time_s is None:
        return ["failed", "-", "-"]
    return [f"{r.time_s * 1e6:.1f}" + (" (wrong)" if r.wrong else ""), _num(r.algbw_GBps), _num(r.busbw_GBps)]


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
    from . import __version__

    distributed = _distributed()
    launcher = os.environ.get("POLYDIST_LAUNCHER") or ("torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else None)
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
