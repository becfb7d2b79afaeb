"""The codec's framing: msgpack plus extension types, one pass each way, checked on decode.

Plain values are msgpack's own (None, bool, int in 64 bits, float64, str,
bytes, list, dict). Everything else is an extension type:

* leaves (a complex, a big int, a path, a tensor, an array, a NumPy scalar,
  the standard types of :mod:`~polydist.codec.stdtypes`, an allowed enum's
  member) are one extension whose data is a flat list of plain fields,
  decoded by a separate msgpack pass that admits no extension but the
  big-int one (which nests nothing);
* containers (tuple, set, frozenset, ``OrderedDict``, ``Counter``,
  ``defaultdict``, an allowed dataclass or named tuple) travel *in-band*:
  a one-entry map whose key is an extension marker (empty, or naming the
  class or factory) and whose value holds the items, so the whole structure
  is one msgpack pass whose unpacker keeps its nesting on a fixed stack.
  Such a container counts two levels of nesting, a list or dict one.
"""

from __future__ import annotations

import pathlib
import pickle
from typing import Any, Callable, Optional

import msgpack
import numpy as np
import torch

from ..settings import pickle_allowed
from .arrays import check_dense, check_shape, check_size, dtype_name, np_dtype, tensor_bytes, tensor_from_bytes
from .classes import NotAllowed, entry_of, lookup, not_allowed
from .stdtypes import CONTAINERS, LEAF_DECODERS, LEAVES, MARKER_DECODERS

__all__ = ["MAX_DEPTH", "encode", "decode"]

# Extension type codes. Part of the wire format: never renumber. _TUPLE, _SET and _FROZENSET appear only as
# empty markers: the key of a one-entry map whose value is the list of items. 11-32: stdtypes.
_TUPLE, _SET, _FROZENSET, _COMPLEX, _BIGINT, _PATH, _TENSOR, _NDARRAY, _NPSCALAR, _PICKLE = range(1, 11)
_ENUM = 40  # an allowed enum's member: [class name, member name (or a Flag's int value)]
_RECORD = 41  # marker of an allowed dataclass or named tuple: the class name; the marker's value maps fields

MAX_DEPTH = 1024  # msgpack's nesting limit, the same in its packer and unpacker


class _Marker:
    """What a container marker decodes to: hashable, never equal to a user's key."""

    __slots__ = ("build",)

    def __init__(self, build: Callable[[Any], Any]) -> None:
        self.build = build


def _listed(build: Callable[[list], Any]) -> Callable[[Any], Any]:
    def make(items: Any) -> Any:
        if not isinstance(items, list):
            raise ValueError("a tuple/set marker must hold a list")
        return build(items)

    return make


_MARKERS = {_TUPLE: _Marker(_listed(tuple)), _SET: _Marker(_listed(set)), _FROZENSET: _Marker(_listed(frozenset))}
_MARKER_KEYS = {code: msgpack.ExtType(code, b"") for code in _MARKERS}


def _ext(code: int, fields: list) -> msgpack.ExtType:
    return msgpack.ExtType(code, msgpack.packb(fields, use_bin_type=True, default=_bigint))


def _bigint(obj: Any) -> msgpack.ExtType:
    if type(obj) is int:  # only reaches here when outside msgpack's 64-bit range
        return msgpack.ExtType(_BIGINT, obj.to_bytes((obj.bit_length() + 8) // 8, "little", signed=True))
    raise TypeError(f"cannot encode an object of type {type(obj).__name__} inside a field")


def _tensor(obj: torch.Tensor) -> msgpack.ExtType:
    check_dense(obj, "polydist's codec")
    return _ext(_TENSOR, [dtype_name(obj.dtype), list(obj.shape), tensor_bytes(obj)])


def _path(obj: pathlib.PurePath) -> msgpack.ExtType:
    return _ext(_PATH, [type(obj).__name__, str(obj)])


# Exact types the encoder turns into an extension or an in-band container, by type (the fast path).
_BY_TYPE: dict[type, Callable[[Any], Any]] = {
    tuple: lambda obj: {_MARKER_KEYS[_TUPLE]: list(obj)},
    set: lambda obj: {_MARKER_KEYS[_SET]: list(obj)},
    frozenset: lambda obj: {_MARKER_KEYS[_FROZENSET]: list(obj)},
    complex: lambda obj: _ext(_COMPLEX, [obj.real, obj.imag]),
    int: _bigint,
    torch.Tensor: _tensor,
}
for _kind, (_code, _fields_of) in LEAVES.items():
    _BY_TYPE[_kind] = lambda obj, c=_code, f=_fields_of: _ext(c, f(obj))
for _kind, (_code, _header) in CONTAINERS.items():
    _BY_TYPE[_kind] = lambda obj, c=_code, h=_header: {msgpack.ExtType(c, h(obj)): dict(obj)}


class _Encoder:
    __slots__ = ("allow_pickle",)

    def __init__(self, allow_pickle: bool) -> None:
        self.allow_pickle = allow_pickle

    def default(self, obj: Any) -> Any:
        kind = type(obj)
        fast = _BY_TYPE.get(kind)
        if fast is not None:
            return fast(obj)
        entry = entry_of(kind)
        if entry is not None:
            if entry.kind == "enum":
                return _ext(_ENUM, [entry.name, entry.key(obj)])
            if entry.wire is None:
                entry.wire = msgpack.ExtType(_RECORD, entry.header)
            return {entry.wire: entry.values(obj)}
        if isinstance(obj, pathlib.PurePath):
            return _path(obj)
        if isinstance(obj, torch.Tensor):  # a subclass (nn.Parameter) arrives as a plain tensor
            return _tensor(obj)
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                raise TypeError("cannot encode a NumPy array of dtype object")
            return _ext(_NDARRAY, [obj.dtype.str, list(obj.shape), np.ascontiguousarray(obj).tobytes()])
        if isinstance(obj, np.generic) and not isinstance(obj, np.object_):
            return _ext(_NPSCALAR, [obj.dtype.str, obj.tobytes()])
        if self.allow_pickle:
            return msgpack.ExtType(_PICKLE, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        refusal = not_allowed(obj)
        if refusal is not None:
            raise refusal
        raise TypeError(
            f"cannot encode an object of type {kind.__module__}.{kind.__qualname__}: polydist's safe codec "
            "supports None, bool, int, float, complex, str, bytes, list, tuple, dict, set, Path, tensors, NumPy "
            "arrays, datetime, Decimal, Fraction, UUID, OrderedDict/Counter/defaultdict, range, torch.Size/dtype/"
            "device, and the dataclasses, named tuples and enums allowed with polydist.codec.allow; pass "
            "allow_pickle=True (or polydist.set_allow_pickle(True) on every rank) to pickle other types"
        )


_DEFAULTS = {flag: _Encoder(flag).default for flag in (False, True)}  # stateless: one each


def _pack(obj: Any, allow_pickle: bool = False) -> bytes:
    try:
        return msgpack.packb(obj, default=_DEFAULTS[bool(allow_pickle)], use_bin_type=True, strict_types=True)
    except ValueError as exc:
        if "recursion limit" in str(exc):
            raise ValueError(
                f"cannot encode a value nested deeper than {MAX_DEPTH} levels (msgpack's limit; a tuple, set, "
                "frozenset, OrderedDict, Counter, defaultdict, dataclass or named tuple counts two levels, "
                "a list or dict one)"
            ) from None
        raise


# ---------------------------------------------------------------- decoding


def _leaf_ext(code: int, data: bytes) -> Any:
    if code == _BIGINT:
        return int.from_bytes(data, "little", signed=True)
    raise ValueError(f"payload nests extension type {code} where none belongs")


def _fields(data: bytes, n: int, what: str) -> list:
    """The ``n``-field list inside an extension: one flat msgpack pass, no extension but big ints inside."""
    fields = msgpack.unpackb(data, ext_hook=_leaf_ext, raw=False, use_list=True)
    if not isinstance(fields, list) or len(fields) != n:
        raise ValueError(f"a {what} extension holds {n} fields, got {len(fields) if isinstance(fields, list) else 'no list'}")
    return fields


def _map(d: dict) -> Any:
    if len(d) != 1:
        return d
    ((marker, items),) = d.items()
    if type(marker) is not _Marker:
        return d
    return marker.build(items)


def _record_marker(data: bytes) -> _Marker:
    return _Marker(lookup(data.decode("utf-8", "replace")).build)


class _Decoder:
    def __init__(self, device: Optional[torch.device], allow_pickle: bool) -> None:
        self.device = device
        self.allow_pickle = allow_pickle

    def unpack(self, data: bytes) -> Any:
        return msgpack.unpackb(
            data, ext_hook=self.ext, object_hook=_map, raw=False, strict_map_key=False, use_list=True
        )

    def ext(self, code: int, data: bytes) -> Any:
        marker = _MARKERS.get(code)
        if marker is not None:
            if data:
                raise ValueError(f"a container marker (extension type {code}) must be empty")
            return marker
        leaf = LEAF_DECODERS.get(code)
        if leaf is not None:
            n, build = leaf
            return build(_fields(data, n, f"type {code}"))
        container = MARKER_DECODERS.get(code)
        if container is not None:
            return _Marker(container(data))
        if code == _RECORD:
            return _record_marker(data)
        if code == _ENUM:
            name, key = _fields(data, 2, "enum")
            entry = lookup(name)
            if entry.kind != "enum":
                raise ValueError(f"payload sends {entry.name}, a {entry.kind}, as an enum member")
            return entry.member(key)
        if code == _COMPLEX:
            real, imag = _fields(data, 2, "complex")
            if type(real) is not float or type(imag) is not float:
                raise ValueError("a complex extension holds two floats")
            return complex(real, imag)
        if code == _BIGINT:
            return int.from_bytes(data, "little", signed=True)
        if code == _PATH:
            flavour, text = _fields(data, 2, "path")
            if not isinstance(flavour, str) or not isinstance(text, str):
                raise ValueError("a path extension holds two strings")
            return pathlib.PureWindowsPath(text) if flavour.startswith("PureWindows") else pathlib.Path(text)
        if code == _TENSOR:
            name, shape, raw = _fields(data, 3, "tensor")
            if not isinstance(name, str):
                raise ValueError(f"a tensor extension names its dtype with a string, got {type(name).__name__}")
            return tensor_from_bytes(name, shape, raw, self.device)
        if code == _NDARRAY:
            spec, shape, raw = _fields(data, 3, "array")
            dtype, shape = np_dtype(spec), check_shape(shape)
            check_size(f"a {spec} array", shape, dtype.itemsize, raw)
            return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        if code == _NPSCALAR:
            spec, raw = _fields(data, 2, "scalar")
            dtype = np_dtype(spec)
            check_size(f"a {spec} scalar", [], dtype.itemsize, raw)
            return np.frombuffer(raw, dtype=dtype)[0]
        if code == _PICKLE:
            if not self.allow_pickle:
                raise _Refused(
                    "payload holds a pickled object, which polydist only unpickles with allow_pickle=True "
                    "(or polydist.set_allow_pickle(True)) on the receiving rank, since unpickling can run code"
                )
            return pickle.loads(data)  # noqa: S301 - explicit opt-in, documented above
        raise ValueError(f"payload holds an unknown extension type code {code}")


_PLAIN = _Decoder(None, False)  # the common decoder: no device to move tensors to, no pickle (it holds no state)


class _Refused(ValueError):
    """Pickle refused: passes through :func:`decode` with its own message."""


def encode(obj: Any, allow_pickle: Optional[bool] = None) -> bytes:
    """Encode ``obj`` to bytes (the types: :mod:`polydist.codec`).

    ``allow_pickle``: None follows the process-wide setting (:func:`polydist.settings.pickle_allowed`).

    Raises:
        TypeError: the first value of a type the codec does not take (naming
            it; for a dataclass, named tuple or enum not allowed, the
            ``polydist.codec.allow`` call that allows it), unless pickle is allowed.
        ValueError: nesting deeper than :data:`MAX_DEPTH`; a Fraction part
            over 65536 bits.
    """
    return _pack(obj, pickle_allowed(allow_pickle))


def decode(data: bytes, device: Optional[torch.device] = None, allow_pickle: Optional[bool] = None) -> Any:
    """Rebuild the value :func:`encode` produced; tensors are moved to ``device`` when given.

    Raises ``ValueError`` on a malformed payload (whatever the corruption:
    bad sizes, types, field counts, nesting, truncation, trailing bytes, a
    class this rank has not allowed, fields its class does not have, a
    value its constructor refuses), or on a pickled one without the pickle
    opt-in; never executes code but allowed classes' constructors, unless
    pickle is allowed. See :mod:`polydist.codec` for the memory and depth bounds.
    """
    allow = pickle_allowed(allow_pickle)
    try:
        return (_PLAIN if device is None and not allow else _Decoder(device, allow)).unpack(data)
    except (_Refused, NotAllowed):
        raise
    except (ValueError, TypeError, IndexError, KeyError, ArithmeticError, RecursionError) as exc:
        detail = str(exc) if type(exc) is ValueError else f"{type(exc).__name__}: {exc}"
        raise ValueError(f"malformed payload: {detail}") from None
