"""Every ``POLYDIST_*`` environment variable: its name, how it is parsed, its default.

polydist reads the environment and never writes the user's; the launcher
(``polydist run``) exports some of these for its workers. Each variable is a
:class:`Variable` here, so its name, parser and default live in one place.
Two of them are also process-wide switches that code may set:
:func:`set_debug` and :func:`set_allow_pickle`, which also work as context
managers that restore the previous state::

    pdist.set_debug(True)          # from here on
    with pdist.set_debug(True):    # for this block only
        ...
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Generic, Mapping, Optional, TypeVar

__all__ = [
    "Variable",
    "DEBUG",
    "ALLOW_PICKLE",
    "TIMEOUT",
    "BACKEND",
    "LAUNCHER",
    "LAUNCHER_PID",
    "PREFIX_OUTPUT",
    "FAILURE_DIR",
    "TRACE",
    "TRACE_BUFFER",
    "TRACE_DIR",
    "PROFILE_COMMS",
    "RESTART_COUNT",
    "FROZEN_AFTER",
    "FAULT_TOLERANT",
    "FT_EVENTS",
    "FT_START",
    "FT_MIN_REPLICAS",
    "FT_GROUP_SIZE",
    "FT_COMMAND",
    "FT_REPLACEMENTS",
    "FT_REPLICA",
    "set_debug",
    "is_debug",
    "set_allow_pickle",
    "pickle_allowed",
]

T = TypeVar("T")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"expected one of {', '.join(_TRUE + _FALSE)}")


def _seconds(text: str) -> float:
    seconds = float(text)
    if not 0 < seconds < math.inf:
        raise ValueError("expected a positive number of seconds")
    return seconds


def _seconds_or_off(text: str) -> float:
    seconds = float(text)
    if not 0 <= seconds < math.inf:
        raise ValueError("expected a number of seconds, or 0 for off")
    return seconds


def _count(text: str) -> int:
    count = int(text)
    if count < 1:
        raise ValueError("expected a positive whole number")
    return count


def _text(text: str) -> str:
    return text.strip()


@dataclass(frozen=True)
class Variable(Generic[T]):
    """One ``POLYDIST_*`` environment variable."""

    name: str
    parse: Callable[[str], T]
    default: Optional[T]
    doc: str

    def read(self, env: Optional[Mapping[str, str]] = None) -> Optional[T]:
        """The parsed value, or the default when unset or blank.

        Raises:
            ValueError: the value does not parse, naming the variable and its value.
        """
        text = (os.environ if env is None else env).get(self.name, "")
        if not text.strip():
            return self.default
        try:
            return self.parse(text)
        except ValueError as exc:
            raise ValueError(f"${self.name}={text!r} is not valid: {exc}") from None


DEBUG = Variable("POLYDIST_DEBUG", _flag, False, "compare a fingerprint of every collective across ranks")
ALLOW_PICKLE = Variable("POLYDIST_ALLOW_PICKLE", _flag, False, "pickle values the safe codec does not take")
TIMEOUT = Variable("POLYDIST_TIMEOUT", _seconds, None, "collective timeout in seconds (polydist run --timeout)")
BACKEND = Variable("POLYDIST_BACKEND", _text, None, "backend for initialize() (polydist run --backend)")
LAUNCHER = Variable("POLYDIST_LAUNCHER", _text, None, "set by polydist run: the elastic agent is polydist's")
LAUNCHER_PID = Variable("POLYDIST_LAUNCHER_PID", int, None, "set by polydist run: the process workers die with")
PREFIX_OUTPUT = Variable("POLYDIST_PREFIX_OUTPUT", _flag, False, "set by polydist run --backend mpi: [rankN] prefixes")
TORCH_MPI = Variable("POLYDIST_TORCH_MPI", _flag, True, "on wheels without MPI, torch's 'mpi' backend is polydist's mpi4py group")
DISPATCH = Variable("POLYDIST_DISPATCH", _flag, True, "torch makes the MPI groups' ProcessGroups, so torch-level calls take its dispatcher ops (where built)")
FAILURE_DIR = Variable("POLYDIST_FAILURE_DIR", _text, None, "set by polydist run --backend mpi: where ranks report")
TRACE = Variable("POLYDIST_TRACE", _flag, True, "the flight recorder: every rank keeps its last collectives")
TRACE_BUFFER = Variable("POLYDIST_TRACE_BUFFER", _count, 2000, "how many calls the flight recorder keeps per rank")
TRACE_DIR = Variable("POLYDIST_TRACE_DIR", _text, None, "where flight-recorder dumps go (polydist run --trace-dir)")
PROFILE_COMMS = Variable("POLYDIST_PROFILE_COMMS", _flag, False, "polydist run --profile-comms: profile every collective")
RESTART_COUNT = Variable("POLYDIST_RESTART_COUNT", int, None, "set by polydist run --backend mpi --max-restarts: reruns so far")
FROZEN_AFTER = Variable(
    "POLYDIST_FROZEN_AFTER", _seconds_or_off, 10.0,
    "polydist's launchers end a job whose worker stays stopped (state T/t) this many seconds; 0: off",
)
FAULT_TOLERANT = Variable("POLYDIST_FAULT_TOLERANT", _flag, False, "set by polydist run --fault-tolerant: survive lost replica groups")
FT_EVENTS = Variable("POLYDIST_FT_EVENTS", _text, None, "set by polydist run --fault-tolerant: where faults and recoveries are logged")
FT_START = Variable("POLYDIST_FT_START", _text, None, "set by polydist run --fault-tolerant: HOST:PORT where replica groups meet before step 0")
FT_MIN_REPLICAS = Variable("POLYDIST_FT_MIN_REPLICAS", _count, 1, "polydist run --min-replicas: fewest replica groups a step commits with")
FT_GROUP_SIZE = Variable("POLYDIST_FT_GROUP_SIZE", _count, 1, "polydist run --replica-group-size: ranks per replica group (1: serial)")
FT_COMMAND = Variable("POLYDIST_FT_COMMAND", _text, None, "set by polydist run --fault-tolerant --backend mpi: a replacement's command (JSON)")
FT_REPLACEMENTS = Variable("POLYDIST_FT_REPLACEMENTS", int, 3, "set by polydist run --fault-tolerant: --max-restarts, per replica group")
FT_REPLICA = Variable("POLYDIST_FT_REPLICA", int, None, "set in an MPI replacement's environment: the replica group it replaces")


class _Switch:
    """A process-wide on/off setting: what code set last, else its variable (read once)."""

    __slots__ = ("variable", "value")

    def __init__(self, variable: Variable[bool]) -> None:
        self.variable = variable
        self.value: Optional[bool] = None

    def get(self) -> bool:
        value = self.value
        if value is None:  # asked on every collective: read the environment the first time only
            value = self.value = bool(self.variable.read())
        return value

    def set(self, enabled: bool) -> "_Restore":
        restore = _Restore(self, self.value)
        self.value = bool(enabled)
        return restore


class _Restore:
    """What ``set_debug``/``set_allow_pickle`` return: a context manager that puts the previous state back."""

    __slots__ = ("_switch", "_previous")

    def __init__(self, switch: _Switch, previous: Optional[bool]) -> None:
        self._switch, self._previous = switch, previous

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        self._switch.value = self._previous


DEBUG_SWITCH = _debug = _Switch(DEBUG)  # every collective reads DEBUG_SWITCH.value (None: not read yet)
_allow_pickle = _Switch(ALLOW_PICKLE)


def set_debug(enabled: bool) -> _Restore:
    """Turn debug mode on or off for this process (on every rank, at the same point of the program).

    In debug mode every collective first compares a fingerprint (sequence
    number, collective, op, root, dtypes, shapes) across the ranks of its group
    and raises :class:`~polydist.CollectiveMismatchError` on any difference;
    see :mod:`polydist.collectives.debug`. Default: ``$POLYDIST_DEBUG``.
    Usable as a plain call or as ``with set_debug(True): ...``, which restores
    the previous state at the end of the block.
    """
    return _debug.set(enabled)


def is_debug() -> bool:
    """Whether debug mode is on: :func:`set_debug`, else ``POLYDIST_DEBUG`` = 1/true/yes/on."""
    return _debug.get()


def set_allow_pickle(allow: bool) -> _Restore:
    """Process-wide pickle opt-in for value collectives (default off; set it on every rank).

    With it, values of types the safe codec does not know are pickled, and
    pickled payloads from other ranks are unpickled — which can execute code,
    so only enable it between processes that trust each other. Default:
    ``$POLYDIST_ALLOW_PICKLE``. Usable as ``with set_allow_pickle(True): ...``.
    """
    return _allow_pickle.set(allow)


def pickle_allowed(allow_pickle: Optional[bool] = None) -> bool:
    """The effective opt-in: the per-call flag when given, else the process-wide setting."""
    return _allow_pickle.get() if allow_pickle is None else bool(allow_pickle)
