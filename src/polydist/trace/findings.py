"""The findings of ``polydist trace``'s analysis, as data: read by :mod:`.analyze`, which finds them, and :mod:`.words`, which says them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .reader import Call, Site


@dataclass
class Where:
    """Where one rank is, for a finding about a call it is not waiting in.

    ``relation`` to that call: "completed" (it did its part), "never called",
    "peer" (the other side of a point-to-point call), "unknown" (no dump, an
    unreadable one, or the recorder was off). ``kind``: "in call" (its last
    call has not completed: ``call``), "failed" (its last call failed:
    ``call``), "raised" (it dumped for an exception, ``error``, raised at
    ``site``: the innermost frame of user code of its traceback, None without
    one), "user code" / "library code" (the innermost frame of its main
    thread outside polydist, torch and the standard library / of any kind:
    ``site``), "no stack", "no dump", "unreadable", "finished" (no dump: it
    ended its program normally). With "raised", "user code",
    "library code" and "no stack", ``last`` is its last call, completed
    ``seconds`` before its dump.
    """

    rank: int
    relation: str
    kind: str
    call: Optional[Call] = None
    site: Optional[Site] = None
    last: Optional[Call] = None
    seconds: Optional[float] = None
    error: Optional[str] = None


@dataclass
class Waiter:
    """A rank in the stuck call: waiting ``seconds`` so far (state "started") or until it failed."""

    rank: int
    call: Call
    seconds: float


@dataclass
class Stuck:
    """A call that some ranks wait in or failed in: ``seq`` on ``group`` (None: a point-to-point ``waiting[0]``)."""

    group: tuple
    seq: Optional[int]
    waiting: list
    others: list  # Where, one per other member (the peer for point-to-point)


@dataclass
class Disagreement:
    """The first call ``seq`` on ``group`` that members made differently; ``calls``: rank -> its call."""

    group: tuple
    seq: int
    calls: dict


@dataclass
class Findings:
    """What :func:`~polydist.trace.analyze.diagnose` found, as data (:class:`~polydist.trace.analyze.Diagnosis` adds its text and JSON forms)."""

    directory: str
    world_size: Optional[int]
    dumps: list  # Dump, by rank
    problems: list  # Problem
    missing: list  # ranks of the world with no dump file at all (and not finished)
    finished: list = field(default_factory=list)  # ranks with no dump that finished their program (exit code 0)
    stuck: list = field(default_factory=list)
    disagreements: list = field(default_factory=list)
    # How a rank with no dump ended or stands, where someone who watched its process knows (a launcher, a peer on
    # its host): rank -> "frozen: stopped (process state T) ..., pid N", "killed by SIGKILL, pid N".
    fates: dict = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        """True when nothing is stuck, nothing disagrees, and every rank's dump was read."""
        return not (self.stuck or self.disagreements or self.missing or self.problems)
