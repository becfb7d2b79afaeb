"""Slurm's node-list notation: ``"node[01-03,07],login5"`` read without calling ``scontrol``.

Its one job is the hostlist grammar: names with bracketed, zero-padded ranges
that may multiply (``"r[1-2]n[1-2]"``), as Slurm writes SLURM_JOB_NODELIST
and its kin. :mod:`polydist.launch.environment` takes rank 0's host from it (the
first name, found without expanding the ranges) and re-exports
:func:`expand_nodelist`, where users import it from.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import List, Optional, Tuple, Union

__all__ = ["expand_nodelist", "first_host"]

_NODELIST_ITEM = re.compile(r"(?:[^,\[\]]|\[[^\[\]]*\])+")  # one name; its brackets hold ranges and may hold commas
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
Segment = Union[str, Tuple[Tuple[int, int, int], ...]]  # literal text, or ranges (low, high, zero-padded width)


@lru_cache(maxsize=16)
def _parse_nodelist(nodelist: str, var: Optional[str] = None) -> Tuple[Tuple[Segment, ...], ...]:
    def bad(why: str) -> ValueError:
        return ValueError(f"{var + '=' if var else ''}{nodelist!r} is not a Slurm node list: {why}")

    items = _NODELIST_ITEM.findall(nodelist)
    if not items or ",".join(items) != nodelist:
        raise bad("empty host name or unbalanced brackets")
    parsed = []
    for item in items:
        segments: List[Segment] = []
        for i, part in enumerate(re.split(r"\[([^\]]*)\]", item)):  # literal, ranges, literal, ..., literal
            if i % 2 == 0:
                segments.append(part)
                continue
            matches = [(piece, _RANGE.fullmatch(piece)) for piece in part.split(",")]
            wrong = next((p for p, m in matches if m is None or int(m[2] or m[1]) < int(m[1])), None)
            if wrong is not None:
                raise bad(f"{wrong!r} in {item!r} is not a range LOW or LOW-HIGH with LOW <= HIGH")
            segments.append(tuple((int(m[1]), int(m[2] or m[1]), len(m[1])) for _, m in matches))  # type: ignore
        parsed.append(tuple(segments))
    return tuple(parsed)


def first_host(var: str, nodelist: str) -> str:
    """The first host of ``nodelist``, read from variable ``var`` (named in errors); ranges are not expanded."""
    segments = _parse_nodelist(nodelist, var)[0]
    return "".join(seg if isinstance(seg, str) else str(seg[0][0]).zfill(seg[0][2]) for seg in segments)


def expand_nodelist(nodelist: str) -> List[str]:
    """Host names of a Slurm node list, in Slurm's order, without calling ``scontrol``.

    ``"node[01-03,07],gpu-a[1-2],login5"`` gives node01, node02, node03,
    node07, gpu-a1, gpu-a2, login5. Zero padding follows the width of the low
    bound (``"n[08-10]"``: n08, n09, n10); several bracket groups in one name
    multiply (``"r[1-2]n[1-2]"``: r1n1, r1n2, r2n1, r2n2), as in Slurm's hostlist.

    Raises:
        ValueError: an empty name, unbalanced brackets, or a range that is not
            ``LOW`` or ``LOW-HIGH`` with LOW <= HIGH.
    """
    hosts: List[str] = []
    for segments in _parse_nodelist(nodelist):
        names = [""]
        for seg in segments:
            texts = [seg] if isinstance(seg, str) else [str(n).zfill(w) for lo, hi, w in seg for n in range(lo, hi + 1)]
            names = [name + text for name in names for text in texts]
        hosts += names
    return hosts
