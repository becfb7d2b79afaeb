"""What ``polydist trace`` works on: one rank's dump as typed values, and where a rank's own code is.

:mod:`.reader` builds these from the dump files (format: :mod:`polydist.trace`),
checked field by field; :mod:`.settle` makes torch's records of a rank say
what all of its dumps showed together. :func:`innermost` and :func:`raised_at`
find the user's code in a dump's stacks and in its error's traceback.

Times are wall-clock seconds since the epoch, as in the dumps.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["Site", "Stack", "Call", "Earlier", "Dump", "Problem", "Dumps", "is_library", "innermost", "innermost_of",
           "raised_at"]

_TIMEOUT = re.compile(r"timed out|timeout", re.IGNORECASE)  # as collectives.timeouts recognises one

# ---------------------------------------------------------------- the dumps


@dataclass(frozen=True)
class Site:
    """A place in the program: the file as the dump names it, the line, the function (each None when unknown)."""

    file: Optional[str]
    line: Optional[int]
    function: Optional[str] = None


@dataclass(frozen=True)
class Stack:
    """One thread's Python stack: ``frames`` are Sites, outermost first."""

    thread: str
    main: bool
    frames: tuple


@dataclass(frozen=True)
class Call:
    """One entry of a dump: a collective or point-to-point call (fields as in the format; times in s)."""

    rank: int  # whose dump holds it
    id: int
    collective: str
    group: tuple
    seq: Optional[int]
    op: Optional[str]
    root: Optional[int]
    dtypes: tuple
    shapes: tuple
    bytes: int
    value: bool
    is_async: bool
    file: Optional[str]
    line: Optional[int]
    function: Optional[str]
    start: float
    end: Optional[float]
    state: str
    error: Optional[str]
    source: str = "polydist"  # whose recorder: "polydist", or "torch" (torch's own, of gloo's and nccl's operations)
    timeout: Optional[float] = None  # s; torch's entries only
    out_dtypes: tuple = ()  # torch's entries only: the output's, as torch recorded them
    out_shapes: tuple = ()

    @property
    def site(self) -> Site:
        return Site(self.file, self.line, self.function)

    @property
    def timed_out(self) -> bool:
        return self.state == "failed" and bool(_TIMEOUT.search(self.error or ""))


@dataclass(frozen=True)
class Earlier:
    """What an earlier dump of the same process showed (the dump's ``earlier``): when and why it was written, its
    error, its main thread's frames (Sites, outermost first), and ``waiting``: torch's operations that had not
    returned then, as ``(record_id, time_created_ns)``."""

    reason: str
    time: float
    error: Optional[str]
    frames: tuple
    waiting: frozenset


@dataclass(frozen=True)
class Dump:
    """One rank's dump file, checked against the format."""

    path: str
    rank: int
    world_size: Optional[int]
    local_rank: Optional[int]
    host: Optional[str]
    pid: Optional[int]
    backend: Optional[str]
    reason: str
    time: float
    error: Optional[str]
    traceback: Optional[str]  # the error's formatted traceback
    error_frames: tuple  # Site, the error's traceback, outermost first; () without one (or from older writers)
    enabled: bool
    dropped: int
    calls: tuple  # Call, oldest first
    stacks: tuple  # Stack, the main thread's first
    torch_calls: tuple = ()  # Call (source "torch"), oldest first: torch's own recorder's entries
    torch_on: Optional[bool] = None  # torch's recorder was on (TORCH_FR_BUFFER_SIZE > 0); None: no record of it
    earlier: tuple = ()  # Earlier, oldest first: the dumps this process wrote before this one, to the same file

    @property
    def reasons(self) -> tuple:
        """Why this process dumped, oldest first, the same reason twice in a row once: ``("signal", "terminate")``."""
        out: list = []
        for reason in [e.reason for e in self.earlier] + [self.reason]:
            out += [reason] if not out or out[-1] != reason else []
        return tuple(out)

    def calls_of(self, source: str) -> tuple:
        """The calls of one recorder: ``"polydist"`` (:attr:`calls`) or ``"torch"`` (:attr:`torch_calls`)."""
        return self.torch_calls if source == "torch" else self.calls

    def recorded(self, source: str) -> bool:
        """Whether that recorder was on in this rank."""
        return bool(self.torch_on) if source == "torch" else self.enabled


@dataclass(frozen=True)
class Problem:
    """A file of the directory that could not be used: ``file`` (its name), ``rank`` (from the name), why."""

    file: str
    rank: Optional[int]
    message: str

    def text(self) -> str:
        return f"{self.file}: {self.message}" if self.file else self.message


@dataclass
class Dumps:
    """What :func:`load` read: the dumps by rank, the problems, and the job's world size (None: unknown)."""

    directory: str
    ranks: dict
    problems: list
    world_size: Optional[int]
    finished: set = field(default_factory=set)  # ranks with no dump that finished their program (rank<R>.finished)


def made_by(op: Call, call: Call) -> bool:
    """Whether torch's record ``op`` is polydist's ``call``'s own operation (polydist's calls on gloo and nccl are
    in both recorders): the same rank and group, begun while the call ran."""
    return (call.rank == op.rank and call.group == op.group and call.start <= op.start
            and (call.end is None or op.start <= call.end))  # fmt: skip


# ---------------------------------------------------------------- where a rank's own code is

# Frames that are not the user's: installed packages (torch, ...), the standard library, polydist from a checkout.
_LIBRARY = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python[\d.]*[/\\]|[/\\]Lib[/\\]|"
                      r"[/\\]src[/\\]polydist[/\\]|^<frozen ")  # fmt: skip
_POLYDIST = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # this install's, for local dumps


def is_library(file: Optional[str]) -> bool:
    """Whether ``file`` (a frame's path) belongs to polydist, torch, another package or the standard library."""
    return file is None or bool(_LIBRARY.search(file)) or file.startswith(_POLYDIST)


def _innermost(frames: tuple) -> tuple:
    """``(site, user)``: the innermost of ``frames`` (outermost first) in user code, else the innermost frame.

    ``(None, False)`` when there are no frames.
    """
    if not frames:
        return None, False
    user = next((f for f in reversed(frames) if not is_library(f.file)), None)
    return (user, True) if user is not None else (frames[-1], False)


def innermost(stacks: tuple) -> tuple:
    """``(site, user)``: the main thread's innermost frame of user code (user True), else its innermost frame.

    ``(None, False)`` when the dump has no main-thread stack.
    """
    main = next((s for s in stacks if s.main), None)
    return _innermost(main.frames if main is not None else ())


def innermost_of(frames: tuple) -> tuple:
    """``(site, user)`` of ``frames`` (Sites, outermost first), as :func:`innermost` of a main thread's."""
    return _innermost(frames)


def raised_at(dump: Dump) -> tuple:
    """``(site, user)``: where the dump's error was raised — the innermost frame of user code of its traceback
    (user True), else its innermost frame; ``(None, False)`` when the dump has no traceback frames."""
    return _innermost(dump.error_frames)
