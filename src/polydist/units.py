"""Sizes and bandwidths of collective benchmarks, in the units and conventions of nccl-tests.

Its one job is the arithmetic of units (nccl-tests ``doc/PERFORMANCE.md``):
byte sizes written as "4KiB" and read back, ranges of them (nccl-tests ``-b
-e -f`` and ``-i``), and the factors turning a time into bandwidths. Sizes are
in **bytes**: the largest buffer of the operation (the full gathered buffer
for all_gather and gather, the full input for reduce_scatter and scatter, the
whole per-rank send buffer for all_to_all, the tensor itself otherwise).
Bandwidths are in **GB/s = 1e9 bytes per second**: ``algbw = size / time``
and ``busbw = algbw * factor``, with the factor of :data:`BUSBW_FACTORS`
(e.g. ``2(n-1)/n`` for all_reduce), which makes busbw comparable with the
hardware's link bandwidth whatever the rank count. Also how those numbers are
shown in a text table. A leaf (the standard library only): the benchmark tool
and the comms profile (:mod:`polydist.trace.profile_stats`) both build on it.
"""

from __future__ import annotations

import math
import re
from typing import Callable, Optional, Union

__all__ = [
    "KiB", "MiB", "GiB", "parse_size", "format_size", "size_range", "BUSBW_FACTORS", "FAMILY", "busbw_factor", "bandwidths",
    "format_bandwidth", "aligned_columns",
]  # fmt: skip

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

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


# The names torch.distributed's process-group operations go by (as the Python groups record them: FSDP2's
# all-gathers and reduce-scatters, DDP's bucketed all-reduces), by the collective whose bandwidth they have.
FAMILY: dict[str, str] = {
    "all_gather_into_tensor": "all_gather", "all_gather_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "allreduce_coalesced": "all_reduce",
}


def busbw_factor(collective: str, world_size: int) -> Optional[float]:
    """busbw / algbw for ``collective`` (polydist's name or torch's, :data:`FAMILY`) on ``world_size`` ranks; None
    when it has no bandwidth (barrier, unknown)."""
    factor = BUSBW_FACTORS.get(FAMILY.get(collective, collective))
    return None if factor is None or world_size < 1 else factor(world_size)


def bandwidths(collective: str, size: int, time_s: Optional[float], world_size: int) -> tuple:
    """``(algbw, busbw)`` in GB/s (1e9 B/s) for ``size`` bytes in ``time_s`` seconds; ``(None, None)`` if undefined."""
    factor = busbw_factor(collective, world_size)
    if time_s is None or not 0 < time_s < math.inf or factor is None:
        return None, None
    algbw = size / time_s / 1e9
    return algbw, algbw * factor



# ---------------------------------------------------------------- text tables


def format_bandwidth(value: Optional[float]) -> str:
    """A bandwidth for a table: 4 decimals below 10, 2 above ("-" for None)."""
    return "-" if value is None else format(value, ".2f" if value >= 10 else ".4f")


def aligned_columns(rows: list, left: int = 0) -> list:
    """Rows of cells as aligned lines: the first ``left`` columns to the left, the others to the right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
            for row in rows]  # fmt: skip
