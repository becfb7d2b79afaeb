"""Timing core for collective benchmarks, in the conventions of nccl-tests.

Used by the scripts in ``benchmarks/`` (and meant for a ``polydist bench``
command): it times zero-argument callables on every rank and turns the times
into records, tables and JSON. It talks to ``torch.distributed`` directly — a
barrier before each timed block and one MAX all-reduce of the times at the
end — so it measures polydist without depending on it. With no process group
(serial, world size 1) it times locally.

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

# ---------------------------------------------------------------- sizes

_UNITS = {"": 1, "B": 1, "K": KiB, "KB": KiB, "KIB": KiB, "M": MiB, "MB": MiB, "MIB": MiB, "G": GiB, "GB": GiB,
          "GIB": GiB}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")


def parse_size(text: Union[str, int]) -> int:
    """Bytes in ``text``: "8", "8B", "4KiB", "4K", "64MiB", "1GiB" (case-insensitive).

    K/KB/KiB all mean 1024 (as nccl-tests' ``-b 4K``). Raises ``ValueError``
    on anything else, e.g. fractions, negative numbers or unknown units.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"a size must be >= 0 bytes, got {text}")
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


def size_range(lo: Union[str, int], hi: Union[str, int], factor: int = 2) -> list[int]:
    """Byte sizes ``lo, lo*factor, lo*factor², ...`` up to and including ``hi`` (nccl-tests ``-b -e -f``)."""
    lo_b, hi_b = parse_size(lo), parse_size(hi)
    if lo_b < 1 or hi_b < lo_b or factor < 2:
        raise ValueError(f"need 1 <= lo <= hi and factor >= 2, got lo={lo!r}, hi={hi!r}, factor={factor!r}")
    sizes = []
    size = lo_b
    while size <= hi_b:
        sizes.append(size)
        size *= factor
    return sizes


# ---------------------------------------------------------------- bandwidth


def _ring(n: int) -> float:
    return (n - 1) / n


# Bus-bandwidth factor per collective, as a function of the rank count n (nccl-tests conventions).
BUSBW_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * _ring(n),
    "all_gather": _ring,
    "reduce_scatter": _ring,
    "all_to_all": _ring,
    "gather": _ring,
    "scatter": _ring,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


def busbw_factor(collective: str, world_size: int) -> Optional[float]:
    """busbw / algbw for ``collective`` on ``world_size`` ranks; None when it has no bandwidth (barrier, unknown)."""
    factor = BUSBW_FACTORS.get(collective)
    return None if factor is None or world_size < 1 else factor(world_size)


def bandwidths(collective: str, size: int, time_s: Optional[float], world_size: int) -> tuple:
    """``(algbw, busbw)`` in GB/s (1e9 B/s) for ``size`` bytes in ``time_s`` seconds; None where undefined."""
    if time_s is None or not time_s > 0 or math.isinf(time_s):
        return None, None
    algbw = size / time_s / 1e9
    factor = busbw_factor(collective, world_size)
    if factor is None:
        return None, None
    return algbw, algbw * factor


# ---------------------------------------------------------------- timing


@dataclass(frozen=True)
class Timing:
    """Times of one callable: seconds per call for each repeat, each the max over ranks.

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


def _comm_device(group: Any) -> torch.device:
    backend = str(dist.get_backend(group))
    return torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")


def _max_over_ranks(values: Sequence[float], group: Any) -> list[float]:
    """Element-wise MAX over the ranks of ``group``, through raw torch.distributed (float64)."""
    if not _distributed() or not values:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64, device=_comm_device(group))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.cpu().tolist()


def _default_sync(group: Any) -> Optional[Callable[[], None]]:
    """Wait for queued device work before reading the clock (CUDA with nccl); None on CPU."""
    if _distributed() and torch.cuda.is_available() and "nccl" in str(dist.get_backend(group)):
        return torch.cuda.synchronize
    return None


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
) -> dict[str, Timing]:
    """Time several callables against each other, interleaving their repeats.

    Every rank must call this with the same ``fns`` keys (in the same order)
    and arguments. Steps: barrier; ``warmup`` untimed calls of each callable
    (timed only to choose ``iters``); then ``repeats`` rounds, each timing every
    callable in turn — barrier, ``iters`` back-to-back calls between two
    ``time.perf_counter()`` reads, per-call mean. Interleaving the rounds
    spreads slow drifts of the machine (other load, clock changes) over all
    callables alike, so their ratio is fair. Finally one MAX all-reduce over
    the ranks of ``group`` (raw torch.distributed) makes the results identical
    on every rank.

    Args:
        fns: label → zero-argument callable that runs one operation (e.g. one
            collective call on a preallocated tensor).
        iters: calls per timed block. None: chosen per callable so that a
            block lasts about ``target_s`` seconds, from the slowest rank's
            median warm-up call (at least 1, at most ``max_iters``).
        warmup: untimed calls before timing (at least 1 when ``iters`` is None).
        repeats: timed blocks per callable (>= 1).
        group: the process group to barrier and reduce over (None: world).
        sync: called before each clock read after the calls, to wait for
            asynchronous device work; default ``torch.cuda.synchronize`` with
            nccl, nothing otherwise.
        catch: record an exception of a callable as ``Timing.error`` and
            drop that callable, instead of raising. Only safe when the failure
            happens on every rank alike (e.g. before any communication);
            a rank failing alone leaves the others waiting in the collective.

    Returns:
        label → :class:`Timing`, the same on every rank. Serial (no process
        group): local times, no barriers.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if iters is not None and iters < 1:
        raise ValueError(f"iters must be >= 1 or None, got {iters}")
    if iters is None:
        warmup = max(warmup, 1)
    distributed = _distributed()
    if sync is None:
        sync = _default_sync(group)

    def barrier() -> None:
        if distributed:
            dist.barrier(group=group)

    labels = list(fns)
    errors: dict[str, str] = {}

    def block(label: str, n: int) -> float:
        """Mean seconds per call of ``n`` back-to-back calls; inf if the callable failed (now or before)."""
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

    # Warm-up; its median single call, slowest rank, sets the iteration count.
    estimates = []
    for label in labels:
        barrier()
        estimates.append(statistics.median([block(label, 1) for _ in range(warmup)]) if warmup else 0.0)
    estimates = _max_over_ranks(estimates, group)
    counts = {}
    for label, est in zip(labels, estimates):
        auto = max_iters if est <= 0 or math.isinf(est) else math.ceil(target_s / est)
        counts[label] = iters if iters is not None else max(1, min(max_iters, auto))

    # Timed rounds, interleaved.
    blocks: dict[str, list[float]] = {label: [] for label in labels}
    for _ in range(repeats):
        for label in labels:
            barrier()
            blocks[label].append(block(label, counts[label]))
    flat = _max_over_ranks([t for label in labels for t in blocks[label]], group)
    results = {}
    for i, label in enumerate(labels):
        times = tuple(flat[i * repeats : (i + 1) * repeats])
        if label in errors or any(math.isinf(t) for t in times):
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
        """Build a record from :func:`measure`'s result, filling backend, world size and bandwidths.

        ``scale`` multiplies the times, e.g. 0.5 to report one leg of a timed
        ping-pong round trip. Backend and world size come from ``group``
        (None when serial: backend None, world size 1).
        """
        if _distributed():
            backend, world_size = str(dist.get_backend(group)), dist.get_world_size(group)
        else:
            backend, world_size = None, 1
        median = timing.median_s * scale if timing.median_s is not None else None
        fastest = timing.min_s * scale if timing.min_s is not None else None
        algbw, busbw = bandwidths(collective, size, median, world_size)
        return cls(
            collective, implementation, backend, world_size, size, dtype, median, algbw, busbw, count, case,
            fastest, timing.iters, len(timing.per_repeat_s), timing.error, wrong, dict(extras),
        )  # fmt: skip


# ---------------------------------------------------------------- tables


def _num(value: Optional[float]) -> str:
    """A bandwidth for a table: 4 decimals below 10, 2 above ("-" for None)."""
    return "-" if value is None else format(value, ".2f" if value >= 10 else ".4f")


def format_table(records: Sequence[Record], *, reference: Optional[str] = None, markdown: bool = False) -> str:
    """nccl-tests-like table: one row per (collective, case, size, dtype), implementations side by side.

    Columns: collective, case (when any), size (bytes), count (elements),
    dtype, then per implementation time (µs), algbw and busbw (GB/s), then one
    ratio column time(impl) / time(reference) for each other implementation
    (above 1: slower than the reference). ``reference``
    defaults to the last implementation seen when there are several. Failed
    points show "failed". ``markdown=True`` gives a GitHub table.
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

    head = ["collective"] + (["case"] if with_case else []) + ["size(B)", "count", "type"]
    groups = [""] * len(head)
    for impl in impls:
        head += ["time(us)", "algbw(GB/s)", "busbw(GB/s)"]
        groups += [impl, "", ""]
    head += others if not markdown else [f"{i}/{reference}" for i in others]
    groups += [f"time / time of {reference}" if k == 0 else "" for k in range(len(others))]

    body = []
    for (collective, case, size, dtype), by_impl in rows.items():
        first = next(iter(by_impl.values()))
        line = [collective] + ([case] if with_case else []) + [str(size), "-" if first.count is None else str(first.count), dtype]
        for impl in impls:
            r = by_impl.get(impl)
            if r is None:
                line += ["-", "-", "-"]
            elif r.error is not None or r.time_s is None:
                line += ["failed", "-", "-"]
            else:
                mark = " (wrong)" if r.wrong else ""
                line += [f"{r.time_s * 1e6:.1f}{mark}", _num(r.algbw_GBps), _num(r.busbw_GBps)]
        ref = by_impl.get(reference) if reference is not None else None
        for impl in others:
            r = by_impl.get(impl)
            ok = r is not None and ref is not None and r.time_s and ref.time_s
            line.append(f"{r.time_s / ref.time_s:.2f}" if ok else "-")
        body.append(line)

    if markdown:
        titles = [f"{g} {h}".strip() if g in impls else h for g, h in zip(_spread(groups), head)]
        align = [":---" if h in ("collective", "case", "type") else "---:" for h in head]
        lines = ["| " + " | ".join(titles) + " |", "|" + "|".join(align) + "|"]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(head)]
    starts = [i for i, g in enumerate(groups) if g] + [len(groups)]
    for a, b in zip(starts, starts[1:]):  # widen a group's last column if its label is longer than the group
        span = sum(widths[a:b]) + 2 * (b - a - 1)
        widths[b - 1] += max(0, len(groups[a]) - span)
    top = ""
    for a in starts[:-1]:  # each label starts above its group's first column
        top = top.ljust(sum(widths[:a]) + 2 * a) + groups[a]
    out = [top, "  ".join(h.rjust(w) for h, w in zip(head, widths))]
    out += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in body]
    return "\n".join(out)


def _spread(groups: list[str]) -> list[str]:
    """Repeat each group label over the blank cells that follow it ("a", "", "" → "a", "a", "a")."""
    out, last = [], ""
    for g in groups:
        last = g or last
        out.append(last)
    return out


# ---------------------------------------------------------------- results files


def _git_commit() -> Optional[str]:
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def run_metadata(group: Any = None, **extra: Any) -> dict:
    """Facts about this run for a results file: versions, backend, world size, host, CPUs, command line, date.

    ``extra`` entries (e.g. iteration settings) are added as they are.
    """
    distributed = _distributed()
    meta = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(sys.argv),
        "launcher": os.environ.get("POLYDIST_LAUNCHER") or ("torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else None),
        "backend": str(dist.get_backend(group)) if distributed else None,
        "world_size": dist.get_world_size(group) if distributed else 1,
        "nproc_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or None,
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git": _git_commit(),
    }
    try:
        from . import __version__

        meta["polydist"] = __version__
    except ImportError:  # pragma: no cover - the package is half-installed
        meta["polydist"] = None
    meta.update(extra)
    return meta


def write_json(records: Sequence[Record], path: Union[str, os.PathLike], meta: Optional[dict] = None) -> None:
    """Write ``{"meta": meta, "records": [...]}`` to ``path`` (directories created); meta defaults to :func:`run_metadata`."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    doc = {"meta": run_metadata() if meta is None else meta, "records": [asdict(r) for r in records]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def read_json(path: Union[str, os.PathLike]) -> tuple[dict, list[Record]]:
    """``(meta, records)`` from a file written by :func:`write_json`."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    return doc["meta"], [Record(**r) for r in doc["records"]]


def write_markdown(
    records: Sequence[Record],
    path: Union[str, os.PathLike],
    meta: dict,
    *,
    title: str,
    reference: Optional[str] = None,
    notes: str = "",
) -> None:
    """Write a markdown report: title, the run's metadata, ``notes``, and :func:`format_table` as markdown."""
    facts = ", ".join(f"{k}: `{meta.get(k)}`" for k in ("backend", "world_size", "hostname", "cpu_count", "torch"))
    text = [f"# {title}", "", f"{facts}, date: {meta.get('date')}", "", f"Command: `{meta.get('command')}`", ""]
    if notes:
        text += [notes.strip(), ""]
    text += [format_table(records, reference=reference, markdown=True), ""]
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(text))
