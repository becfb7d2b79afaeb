"""What ``polydist bench`` prints, writes and draws: the side-by-side table, the memory ceiling, the plot.

The memory ceiling is this machine's rate of one local reduction of the same
data: ``numpy.add(a, b, out=c)`` on arrays of S bytes, reported as ``S / t``
(the algbw sense). Each backend's busbw is shown as a fraction of it.
"""

from __future__ import annotations

import functools
import os
from typing import Sequence

import numpy as np

from .records import Record, format_table
from .timing import measure
from ..units import aligned_columns, busbw_factor, format_size

__all__ = ["CEILING", "memory_ceiling", "add_fractions", "format_report", "plot"]

CEILING = "memory_ceiling"  # the ``collective`` of the ceiling's records in the JSON
_FACTOR_TEXT = {"all_reduce": "2(n-1)/n", "broadcast": "1", "reduce": "1", "send_recv": "1"}  # others: (n-1)/n


# ---------------------------------------------------------------- the memory ceiling


def memory_ceiling(sizes: Sequence[int], dtype: str = "float32", *, warmup: int = 5, repeats: int = 5,
                   target_s: float = 0.01) -> list:  # fmt: skip
    """Time ``numpy.add(a, b, out=c)`` on arrays of each size in bytes, in this process alone.

    Returns one :class:`~polydist.bench.records.Record` per size S, collective
    :data:`CEILING`, ``size`` S: ``time_s`` the median seconds per add,
    ``algbw_GBps`` the ceiling ``S / t`` (GB/s; S rounded down to whole
    elements), ``extras["traffic_GBps"] = 3S / t`` (two reads and a write).
    ``dtype`` is a NumPy dtype name; float32 where NumPy has none (bfloat16).
    Iterations: enough for blocks of ``target_s``.
    """
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        np_dtype = np.dtype("float32")
    out = []
    for size in sizes:
        count = max(1, size // np_dtype.itemsize)
        a, b, c = (np.ones(count, np_dtype) for _ in range(3))
        t = measure(functools.partial(np.add, a, b, out=c), warmup=max(1, warmup), repeats=repeats,
                    target_s=target_s, local=True)  # fmt: skip
        nbytes, median = count * np_dtype.itemsize, t.median_s
        out.append(Record(
            collective=CEILING, implementation="numpy.add", backend=None, world_size=1, size=size,
            dtype=str(np_dtype), time_s=median, algbw_GBps=nbytes / median / 1e9, count=count, time_min_s=t.min_s,
            iters=t.iters, repeats=len(t.per_repeat_s), extras={"traffic_GBps": 3 * nbytes / median / 1e9},
        ))  # fmt: skip
    return out


def add_fractions(records: Sequence[Record], ceiling: Sequence[Record]) -> None:
    """Each record's algbw and busbw as fractions of the ceiling of its size (in its extras)."""
    by_size = {c.size: c.algbw_GBps for c in ceiling}
    for r in records:
        top = by_size.get(r.size)
        if top and r.algbw_GBps is not None:
            r.extras["algbw_of_ceiling"] = r.algbw_GBps / top
            r.extras["busbw_of_ceiling"] = r.busbw_GBps / top


# ---------------------------------------------------------------- output


def _ceiling_table(records: Sequence[Record], ceiling: Sequence[Record]) -> list:
    """Rows (collective, size): the ceiling's time and bandwidth, then busbw / ceiling per implementation."""
    impls = list(dict.fromkeys(r.implementation for r in records))
    by_size = {c.size: c for c in ceiling}
    rows: dict = {}
    for r in records:
        rows.setdefault((r.collective, r.size), {})[r.implementation] = r.extras.get("busbw_of_ceiling")
    body = [["collective", "size(B)", "add(us)", "ceiling(GB/s)", *impls]]
    for (collective, size), fractions in rows.items():
        c = by_size[size]
        cells = ["-" if fractions.get(i) is None else format(fractions[i], ".3g") for i in impls]
        body.append([collective, str(size), f"{c.time_s * 1e6:.1f}", format(c.algbw_GBps, ".3g"), *cells])
    return aligned_columns(body, left=1)


def format_report(records: Sequence[Record], ceiling: Sequence[Record], meta: dict) -> str:
    """The printed report: a heading, the nccl-tests-like table (backends side by side), units, the ceiling table.

    With several implementations the ratio columns are time / time of the
    first one (above 1: slower than it).
    """
    impls = list(dict.fromkeys(r.implementation for r in records))
    n = max((r.world_size for r in records), default=1)
    pairs = dict.fromkeys((r.implementation, r.backend) for r in records)
    backends = ", ".join(impl if impl.split("/")[0] == b else f"{impl} ({b})" for impl, b in pairs)
    lines = [
        f"# polydist bench: {n} ranks; {backends}",
        f"# {meta.get('iters')} calls per block after {meta.get('warmup')} warm-up calls; time = median over "
        f"{meta.get('repeats')} blocks of the max over ranks",
        format_table(records, reference=impls[0] if len(impls) > 1 else None),
    ]
    lines += [f"# failed: {r.collective} {r.size} B {r.implementation}: {r.error}" for r in records if r.error]
    formulas = {c: _FACTOR_TEXT.get(c, "(n-1)/n") for c in dict.fromkeys(r.collective for r in records)}
    factors = ", ".join(f"{c} {f}" + ("" if f == "1" else f" = {busbw_factor(c, n):.3g}") for c, f in formulas.items())
    lines += [
        "# size: bytes; count: elements; time: us per call; algbw = size / time, busbw = algbw * factor, "
        "in GB/s (1e9 B/s)",
        f"# busbw factors (nccl-tests doc/PERFORMANCE.md), n = {n}: {factors}",
    ]
    if ceiling:
        lines += [
            "",
            "# memory ceiling: numpy.add(a, b, out=c) on three arrays of size bytes each, in one process; "
            "ceiling = size / time in GB/s (the algbw sense; the add moves 3 x size)",
            "# last columns: busbw / ceiling, per backend",
            *_ceiling_table(records, ceiling),
        ]
    return "\n".join(lines)


def plot(records: Sequence[Record], ceiling: Sequence[Record], path: str, title: str = "polydist bench") -> None:
    """Draw time (µs) and busbw (GB/s) against size (bytes), log-log, one line per (backend, collective).

    The ceiling (``S / t`` of ``numpy.add``) is dashed on the busbw panel.
    The format follows ``path``'s extension (PNG for .png). Raises
    ``RuntimeError`` when matplotlib is not installed.
    """
    try:
        from matplotlib.figure import Figure  # object API: no pyplot, no global state, no display needed
    except ImportError:
        raise RuntimeError("plotting needs matplotlib: pip install 'polydist[plot]' (or matplotlib)") from None
    from matplotlib.ticker import FuncFormatter, LogLocator

    fig = Figure(figsize=(12, 4.8), layout="constrained")
    time_ax, bw_ax = fig.subplots(1, 2)
    collectives = list(dict.fromkeys(r.collective for r in records))
    impls = list(dict.fromkeys(r.implementation for r in records))
    styles = ["-", ":", "-.", (0, (5, 1, 1, 1, 1, 1))]  # one per backend; a collective keeps its colour
    for collective, impl in dict.fromkeys((r.collective, r.implementation) for r in records):
        ok = [r for r in records if (r.collective, r.implementation) == (collective, impl) and r.time_s]
        bw = [r for r in ok if r.busbw_GBps]  # busbw is 0 on one rank: no place on a log axis
        i, j = collectives.index(collective), impls.index(impl)
        look = dict(color=f"C{i % 10}", linestyle=styles[j % len(styles)], marker="os^vD"[j % 5], markersize=3)
        time_ax.plot([r.size for r in ok], [r.time_s * 1e6 for r in ok], **look)
        bw_ax.plot([r.size for r in bw], [r.busbw_GBps for r in bw], label=f"{collective} {impl}", **look)
    if ceiling:
        bw_ax.plot([c.size for c in ceiling], [c.algbw_GBps for c in ceiling], "k--", linewidth=2,
                   label="memory ceiling: S / t(numpy.add)")  # fmt: skip
    for ax, ylabel in ((time_ax, "time per call (µs)"), (bw_ax, "busbw (GB/s = 1e9 B/s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=2, numticks=10))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_size(int(v)) if v >= 1 else ""))
        ax.tick_params(axis="x", labelrotation=45)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="small")
    fig.suptitle(title)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
