"""The standard library's value types and torch's small types, as codec extensions: no permission needed.

Each type travels as a flat list of plain fields (ints, strings, bytes,
floats; big ints as the codec's big-int extension) in its own extension type,
and comes back as the same type with the same value:

============================  =====================================================  ==========================
type                          travels as                                              comes back as
============================  =====================================================  ==========================
``datetime.datetime``         its fields, ``fold`` and its tzinfo (below)             equal, same offset and fold
``datetime.date``/``time``    their fields (``time``: ``fold``, tzinfo)               equal
``datetime.timedelta``        days, seconds, microseconds                             equal
tzinfo                        ``datetime.timezone``: offset and its own name;         the same; other tzinfo
                              ``zoneinfo.ZoneInfo``: its key                          classes are refused
``decimal.Decimal``           ``str(d)``: every digit and the exponent                equal digits, exponent, sign
``fractions.Fraction``        numerator, denominator (at most 65536 bits each)        equal
``uuid.UUID``                 its 16 bytes                                            equal
``torch.Size``                its ints                                                ``torch.Size``
``torch.dtype``               its name (``"float32"``)                                 the same dtype object
``torch.device``              ``str(device)`` (``"cuda:1"``)                           equal (not moved)
``range``                     start, stop, step                                       equal
============================  =====================================================  ==========================

``OrderedDict``, ``Counter`` and ``defaultdict`` travel in-band like tuples
(:mod:`polydist.codec.core`): a one-entry map whose key is a marker and whose
value is the dict of items; a ``defaultdict``'s ``default_factory`` is one of
:data:`FACTORIES` (by name) or None, since a callable cannot travel.

Decoding checks every field's type and range before building the value
(``ValueError`` otherwise; ``timedelta`` overflow, a bad Decimal string or an
unknown device type included), and never evaluates a name: dtype names,
factory names and device strings are table lookups or parsed by a pattern.
"""

from __future__ import annotations

import collections
import datetime as dt
import decimal
import fractions
import re
import reprlib
import uuid
import zoneinfo
from typing import Any, Callable

import torch

from .arrays import dtype_name, torch_dtype

__all__ = ["LEAVES", "LEAF_DECODERS", "CONTAINERS", "MARKER_DECODERS", "FACTORIES", "MAX_FRACTION_BITS"]

# Extension type codes: part of the wire format, never renumber (1-10 are polydist.codec.core's).
DATETIME, DATE, TIME, TIMEDELTA, DECIMAL, FRACTION, UUID, TORCH_SIZE, TORCH_DTYPE, TORCH_DEVICE, RANGE = range(11, 22)
ORDERED_DICT, COUNTER, DEFAULT_DICT = 30, 31, 32

MAX_FRACTION_BITS = 65536  # normalizing a Fraction runs a gcd, whose time grows with the square of the size
_INT64 = (-(2**63), 2**63 - 1)


# ---------------------------------------------------------------- checks of decoded fields


def _ints(fields: list, what: str) -> list:
    for x in fields:
        if type(x) is not int:
            raise ValueError(f"a {what} extension holds ints, got {reprlib.repr(fields)}")
    return fields


def _str(x: Any, what: str) -> str:
    if not isinstance(x, str):
        raise ValueError(f"a {what} extension holds a string, got {reprlib.repr(x)}")
    return x


def _parse(text: Any, what: str, pattern: re.Pattern, shape: str, make: Callable[[str], Any], refused: Any, why: str) -> Any:
    """``make(text)`` once ``text`` is a string matching ``pattern``; ``ValueError`` otherwise or when ``make``
    raises one of ``refused``."""
    if not pattern.fullmatch(_str(text, what)):
        raise ValueError(f"a {what} extension holds {shape}, got {reprlib.repr(text)}")
    try:
        return make(text)
    except refused as exc:
        raise ValueError(f"{what} {reprlib.repr(text)} {why} ({type(exc).__name__})") from None


# ---------------------------------------------------------------- datetime


_UTC = [0, 0, 0, None]


def _tz_out(tz: Any) -> Any:
    if tz is None:
        return None
    if tz is dt.timezone.utc:  # the common case, without building a timezone to compare names with
        return _UTC
    if type(tz) is dt.timezone:
        offset = tz.utcoffset(None)
        own = tz.tzname(None)
        named = own != dt.timezone(offset).tzname(None)
        return [offset.days, offset.seconds, offset.microseconds, own if named else None]
    if type(tz) is zoneinfo.ZoneInfo and tz.key is not None:
        return tz.key
    raise TypeError(
        f"cannot encode a datetime with tzinfo of type {type(tz).__module__}.{type(tz).__qualname__}: polydist "
        "sends datetime.timezone and zoneinfo.ZoneInfo offsets; convert with .astimezone(datetime.timezone.utc)"
    )


_ZONE_KEY = re.compile(r"[A-Za-z0-9_+-]{1,64}(?:/[A-Za-z0-9_+-]{1,64}){0,3}")  # no dots: no path out of the database


def _tz_in(tz: Any) -> Any:
    if tz is None:
        return None
    if isinstance(tz, str):  # the tz database's file of that key, read as data
        return _parse(tz, "time zone", _ZONE_KEY, "a key like 'Europe/Paris'", zoneinfo.ZoneInfo,
                      (OSError, KeyError, ValueError), "is not in this rank's tz database")
    if tz == _UTC:
        return dt.timezone.utc
    if not isinstance(tz, list) or len(tz) != 4:
        raise ValueError(f"a timezone is a key or [days, seconds, microseconds, name], got {reprlib.repr(tz)}")
    offset = dt.timedelta(*_ints(tz[:3], "timezone"))
    return dt.timezone(offset) if tz[3] is None else dt.timezone(offset, _str(tz[3], "timezone"))


def _datetime_out(x: dt.datetime) -> list:
    return [x.year, x.month, x.day, x.hour, x.minute, x.second, x.microsecond, x.fold, _tz_out(x.tzinfo)]


def _datetime_in(f: list) -> dt.datetime:
    return dt.datetime(*_ints(f[:7], "datetime"), tzinfo=_tz_in(f[8]), fold=_ints(f[7:8], "datetime")[0])


def _time_out(x: dt.time) -> list:
    return [x.hour, x.minute, x.second, x.microsecond, x.fold, _tz_out(x.tzinfo)]


def _time_in(f: list) -> dt.time:
    return dt.time(*_ints(f[:4], "time"), tzinfo=_tz_in(f[5]), fold=_ints(f[4:5], "time")[0])


# ---------------------------------------------------------------- numbers


# What str(Decimal) writes: a coefficient and exponent, Infinity, or a (signalling) NaN with its payload digits.
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?(?:E[+-][0-9]+)?|Infinity|s?NaN[0-9]*)")


def _decimal_in(f: list) -> decimal.Decimal:  # exact: no context rounding applies to a string
    return _parse(f[0], "Decimal", _DECIMAL, "str(Decimal)", decimal.Decimal, decimal.InvalidOperation,
                  "has an exponent out of range")


def _fraction_out(x: fractions.Fraction) -> list:
    return [_small(x.numerator), _small(x.denominator)]


def _small(n: int) -> int:
    if n.bit_length() > MAX_FRACTION_BITS:
        raise ValueError(f"cannot encode a Fraction with a {n.bit_length()}-bit part (at most {MAX_FRACTION_BITS} bits)")
    return n


def _fraction_in(f: list) -> fractions.Fraction:
    num, den = _ints(f, "Fraction")
    if num.bit_length() > MAX_FRACTION_BITS or den.bit_length() > MAX_FRACTION_BITS:
        raise ValueError(f"a Fraction extension holds parts of at most {MAX_FRACTION_BITS} bits")
    if den <= 0:
        raise ValueError(f"a Fraction extension holds a positive denominator, got {den}")
    return fractions.Fraction(num, den)


def _uuid_in(f: list) -> uuid.UUID:
    if not isinstance(f[0], bytes) or len(f[0]) != 16:
        raise ValueError(f"a UUID extension holds 16 bytes, got {reprlib.repr(f[0])}")
    return uuid.UUID(bytes=f[0])


def _range_in(f: list) -> range:
    return range(*_ints(f, "range"))  # ValueError for a zero step


# ---------------------------------------------------------------- torch's small types


def _size_in(f: list) -> torch.Size:
    dims = f[0]
    if not isinstance(dims, list) or any(type(d) is not int or not _INT64[0] <= d <= _INT64[1] for d in dims):
        raise ValueError(f"a torch.Size extension holds a list of int64s, got {reprlib.repr(dims)}")
    return torch.Size(dims)


_DEVICE = re.compile(r"[a-z][a-z_0-9]{0,31}(?::[0-9]{1,9})?")


def _device_in(f: list) -> torch.device:
    return _parse(f[0], "torch.device", _DEVICE, "'type' or 'type:index'", torch.device, RuntimeError,
                  "names a device type this torch does not know")


# ---------------------------------------------------------------- the leaf table

Leaf = tuple[int, Callable[[Any], list]]

# type → (extension code, its fields); code → (number of fields, rebuild).
LEAVES: dict[type, Leaf] = {
    dt.datetime: (DATETIME, _datetime_out),
    dt.date: (DATE, lambda x: [x.year, x.month, x.day]),
    dt.time: (TIME, _time_out),
    dt.timedelta: (TIMEDELTA, lambda x: [x.days, x.seconds, x.microseconds]),
    decimal.Decimal: (DECIMAL, lambda x: [str(x)]),
    fractions.Fraction: (FRACTION, _fraction_out),
    uuid.UUID: (UUID, lambda x: [x.bytes]),
    torch.Size: (TORCH_SIZE, lambda x: [list(x)]),
    torch.dtype: (TORCH_DTYPE, lambda x: [dtype_name(x)]),
    torch.device: (TORCH_DEVICE, lambda x: [str(x)]),
    range: (RANGE, lambda x: [x.start, x.stop, x.step]),
}
LEAF_DECODERS: dict[int, tuple[int, Callable[[list], Any]]] = {
    DATETIME: (9, _datetime_in),
    DATE: (3, lambda f: dt.date(*_ints(f, "date"))),
    TIME: (6, _time_in),
    TIMEDELTA: (3, lambda f: dt.timedelta(*_ints(f, "timedelta"))),  # OverflowError past 999999999 days
    DECIMAL: (1, _decimal_in),
    FRACTION: (2, _fraction_in),
    UUID: (1, _uuid_in),
    TORCH_SIZE: (1, _size_in),
    TORCH_DTYPE: (1, lambda f: torch_dtype(f[0])),
    TORCH_DEVICE: (1, _device_in),
    RANGE: (3, _range_in),
}


# ---------------------------------------------------------------- containers (in-band, as markers)

# What a defaultdict's default_factory may be: a name the receiver looks up here, never a callable from the wire.
FACTORIES: dict[str, Any] = {
    f.__name__: f for f in (int, float, complex, str, bytes, bool, list, dict, set, frozenset, tuple)
}
FACTORIES.update({"OrderedDict": collections.OrderedDict, "Counter": collections.Counter})
_FACTORY_NAMES = {f: name for name, f in FACTORIES.items()}


def _factory_header(d: collections.defaultdict) -> bytes:
    if d.default_factory is None:
        return b""
    name = _FACTORY_NAMES.get(d.default_factory)
    if name is None:
        raise TypeError(
            f"cannot encode a defaultdict whose default_factory is {reprlib.repr(d.default_factory)}: a callable "
            f"cannot travel; polydist sends default factories {', '.join(FACTORIES)} (or None)"
        )
    return name.encode()


# type → (extension code, marker header); the marker's value is dict(obj).
CONTAINERS: dict[type, tuple[int, Callable[[Any], bytes]]] = {
    collections.OrderedDict: (ORDERED_DICT, lambda d: b""),
    collections.Counter: (COUNTER, lambda d: b""),
    collections.defaultdict: (DEFAULT_DICT, _factory_header),
}


def _items(build: Callable[[dict], Any], what: str) -> Callable[[Any], Any]:
    def make(items: Any) -> Any:
        if not isinstance(items, dict):
            raise ValueError(f"a {what} marker holds a map of its items, got {type(items).__name__}")
        return build(items)

    return make


def _default_dict(header: bytes) -> Callable[[Any], Any]:
    name = header.decode("utf-8", "replace")
    if header and name not in FACTORIES:
        raise ValueError(f"payload names a defaultdict factory {reprlib.repr(name)} polydist does not send")
    factory = FACTORIES[name] if header else None
    return _items(lambda items: collections.defaultdict(factory, items), "defaultdict")


def _plain(code: int, build: Callable[[dict], Any], what: str) -> Callable[[bytes], Callable[[Any], Any]]:
    def marker(header: bytes) -> Callable[[Any], Any]:
        if header:
            raise ValueError(f"a {what} marker (extension type {code}) must be empty")
        return _items(build, what)

    return marker


# code → (marker header → the function that builds the value from the marker's items)
MARKER_DECODERS: dict[int, Callable[[bytes], Callable[[Any], Any]]] = {
    ORDERED_DICT: _plain(ORDERED_DICT, collections.OrderedDict, "OrderedDict"),
    COUNTER: _plain(COUNTER, collections.Counter, "Counter"),
    DEFAULT_DICT: _default_dict,
}
