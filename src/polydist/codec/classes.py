"""The program's own classes, by explicit permission: the allow-list and how an allowed class travels.

A dataclass, a named tuple (``collections.namedtuple`` or
``typing.NamedTuple``) or an enum (``enum.Enum``, ``IntEnum``, ``Flag``...)
travels once the program has called :func:`allow` on it, on every rank
(torch's ``torch.serialization.add_safe_globals`` is the same idea for
``torch.load(weights_only=True)``). On the wire a class is its name,
``module.QualifiedName``; the receiver looks that name up in its own
allow-list and nowhere else: nothing is imported, no attribute is set behind
the constructor's back. A dataclass or named tuple is rebuilt through its
constructor, from the fields sent (a dataclass's ``init`` fields); an enum
member is looked up by name (a combination of flags: by value).
"""

from __future__ import annotations

import dataclasses
import enum
import reprlib
import threading
from typing import Any, Callable, Optional, TypeVar

__all__ = ["allow", "disallow", "allowed", "Allowed", "NotAllowed", "entry_of", "lookup", "kind_of", "not_allowed"]

T = TypeVar("T", bound=type)


class NotAllowed(ValueError):
    """Bytes from another rank name a class this rank has not allowed (passes through ``decode`` as it is)."""


def kind_of(cls: type) -> Optional[str]:
    """``"dataclass"``, ``"named tuple"`` or ``"enum"`` for a class that :func:`allow` takes; None otherwise."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        return "enum"
    if isinstance(cls, type) and issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple):
        return "named tuple"
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        return "dataclass"
    return None


def wire_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class Allowed:
    """One allowed class: its wire name, kind, constructor fields (required ones apart) and ready wire header."""

    __slots__ = ("cls", "name", "header", "kind", "fields", "names", "required", "wire")

    def __init__(self, cls: type, kind: str) -> None:
        self.cls, self.kind, self.name = cls, kind, wire_name(cls)
        self.header = self.name.encode("utf-8")
        self.wire: Any = None  # what the encoder puts on the wire for this class, made once (polydist.codec.core)
        if kind == "dataclass":
            init = [f for f in dataclasses.fields(cls) if f.init]
            self.fields = tuple(f.name for f in init)
            missing = (dataclasses.MISSING,)
            self.required = frozenset(f.name for f in init if f.default in missing and f.default_factory in missing)
        elif kind == "named tuple":
            self.fields = tuple(cls._fields)
            self.required = frozenset(self.fields) - frozenset(getattr(cls, "_field_defaults", {}))
        else:
            self.fields, self.required = (), frozenset()
        self.names = frozenset(self.fields)

    def values(self, obj: Any) -> dict:
        """The fields ``obj`` travels by: name → value, in declaration order."""
        return {name: getattr(obj, name) for name in self.fields}

    def build(self, fields: Any) -> Any:
        """An instance rebuilt through the constructor from ``fields`` (name → value), or ``ValueError``."""
        if not isinstance(fields, dict):
            raise ValueError(f"a {self.name} record holds a map of its fields, got {type(fields).__name__}")
        if fields.keys() == self.names:  # all of them: nothing else to check
            return _construct(self.name, self.cls, fields)
        unknown = [k for k in fields if k not in self.names]
        if unknown:
            raise ValueError(
                f"payload gives {self.name} field(s) {reprlib.repr(unknown)} it does not have "
                f"(its fields here: {', '.join(self.fields) or 'none'})"
            )
        missing = sorted(self.required - fields.keys())
        if missing:
            raise ValueError(f"payload gives {self.name} no value for its required field(s) {', '.join(missing)}")
        return _construct(self.name, self.cls, fields)

    def member(self, key: Any) -> Any:
        """The enum member named ``key`` (a str), or for a ``Flag`` with int ``key``, the flags of that value."""
        if isinstance(key, str):
            member = self.cls.__members__.get(key)
            if member is None:
                raise ValueError(f"payload names member {reprlib.repr(key)}, which enum {self.name} does not have")
            return member
        if type(key) is int and issubclass(self.cls, enum.Flag):
            return _construct(self.name, lambda value: self.cls(value), {"value": key})
        raise ValueError(f"payload names a member of {self.name} by {reprlib.repr(key)}, not by name")

    def key(self, member: Any) -> Any:
        """How an enum member travels: its name, or its value for a combination of flags (which has no member name)."""
        name = member.name
        if isinstance(name, str) and self.cls.__members__.get(name) is member:
            return name
        if isinstance(member.value, int):
            return member.value
        raise TypeError(f"cannot encode {member!r}: a member of {self.name} without a name of its own or an int value")


def _construct(name: str, make: Callable[..., Any], fields: dict) -> Any:
    try:
        return make(**fields)
    except Exception as exc:  # noqa: BLE001 - the allowed class's own code refused what a peer sent
        raise ValueError(f"rebuilding {name} from the payload raised {type(exc).__name__}: {exc}") from None


_lock = threading.Lock()
_by_class: dict[type, Allowed] = {}
_by_name: dict[str, Allowed] = {}


def allow(cls: T, *more: type) -> T:
    """Let instances of ``cls`` (and of each class in ``more``) travel through polydist's value collectives.

    Call it on every rank (at import time, e.g. as a class decorator:
    ``@polydist.codec.allow``), for every class whose values the program
    sends or receives. The anchor for the idea is
    ``torch.serialization.add_safe_globals``.

    Args:
        cls: a dataclass, a named tuple (``collections.namedtuple``,
            ``typing.NamedTuple``) or an enum (any ``enum.Enum`` subclass).
        *more: more such classes, allowed in the same call.

    Returns:
        ``cls``, so that ``allow`` decorates a class.

    Raises:
        TypeError: a class of another kind (named), or not a class.
        ValueError: another class already allowed under the same name
            (``module.QualifiedName``), which the receiver could not tell apart.

    A dataclass travels by its ``init`` fields and a named tuple by its
    fields, rebuilt on the receiver by calling the class with them; an enum
    member by its name. Fields may hold any value the codec takes.
    """
    entries = []
    for c in (cls, *more):
        kind = kind_of(c)
        if kind is None:
            raise TypeError(
                f"polydist.codec.allow takes dataclasses, named tuples and enums, got {reprlib.repr(c)}: "
                "another class has no fields polydist could rebuild it from without running code by name"
            )
        entries.append(Allowed(c, kind))
    with _lock:
        for e in entries:
            other = _by_name.get(e.name)
            if other is not None and other.cls is not e.cls:
                raise ValueError(f"another class named {e.name} is already allowed; the receiver could not tell them apart")
        for e in entries:
            _by_class[e.cls], _by_name[e.name] = e, e
    return cls


def disallow(*classes: type) -> None:
    """Take classes off the allow-list (the opposite of :func:`allow`); classes not on it are ignored."""
    with _lock:
        for c in classes:
            e = _by_class.pop(c, None)
            if e is not None:
                _by_name.pop(e.name, None)


def allowed() -> tuple:
    """The classes allowed in this process, in the order they were allowed."""
    return tuple(_by_class)


def entry_of(cls: type) -> Optional[Allowed]:
    """The allow-list entry of ``cls``, None when not allowed."""
    return _by_class.get(cls)


def lookup(name: Any) -> Allowed:
    """The entry allowed under wire name ``name``; :class:`NotAllowed` naming it otherwise (a lookup, never an import)."""
    e = _by_name.get(name) if isinstance(name, str) else None
    if e is None:
        short = name.rpartition(".")[2] if isinstance(name, str) else "..."
        raise NotAllowed(
            f"payload holds a value of class {reprlib.repr(name)}, which this rank has not allowed: "
            f"call polydist.codec.allow({short}) on every rank, the receivers too"
        )
    return e


def not_allowed(obj: Any) -> Optional[TypeError]:
    """The sender's error for an instance of a class :func:`allow` would take but that is not allowed; else None."""
    cls = type(obj)
    kind = kind_of(cls)
    if kind is None:
        return None
    name = wire_name(cls)
    return TypeError(
        f"cannot encode an instance of {name}, a {kind} this program has not allowed: call "
        f"polydist.codec.allow({cls.__qualname__}) on every rank (or decorate the class with @polydist.codec.allow), "
        "and it travels by its fields, rebuilt through its constructor on the receiver"
    )
