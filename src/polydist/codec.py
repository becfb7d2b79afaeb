"""Python values ↔ bytes, safely: msgpack plus extension types, no pickle.

Decoding never executes code: it only rebuilds the types listed below, so a
payload from another rank cannot run anything here. Supported: None, bool,
int (any size, exact), float (float64), complex, str (UTF-8), bytes (a
bytearray arrives as bytes), list, tuple, dict, set, frozenset,
``pathlib.PurePath``, ``torch.Tensor`` (dense; dtype and shape kept; arrives on
the decoder's ``device``) and NumPy arrays and scalars (non-object dtypes).
Anything else raises ``TypeError`` naming the type, at encode time.

Bytes from another rank are hostile until checked. :func:`decode` therefore

* allocates nothing the payload does not back: a tensor or array is accepted
  only when its data holds exactly ``numel × itemsize`` bytes for its declared
  dtype and shape (at most :data:`MAX_DIMS` dims), and every msgpack length is
  bounded by the payload's size (msgpack's own rule for ``unpackb``); so
  decoding allocates at most a small multiple of the payload;
* never recurses per nesting level on the C stack: tuples, sets and
  frozensets travel in-band as one-entry maps keyed by a marker, so the whole
  structure is one msgpack pass, whose unpacker keeps its nesting on a fixed
  stack. Both sides stop at msgpack's limit of :data:`MAX_DEPTH` (1024)
  levels, a list or dict counting one and a tuple, set or frozenset two:
  ``encode`` raises ``ValueError`` for a deeper structure, so whatever
  encodes also decodes, and ``decode`` refuses a deeper payload;
* raises ``ValueError`` for anything malformed, whatever the corruption.

Pickle is an explicit opt-in: with ``allow_pickle=True`` (per call) or
:func:`set_allow_pickle` / ``POLYDIST_ALLOW_PICKLE=1`` (process-wide), other
types are pickled inside their own extension type; decoding one requires the
same opt-in on the receiving side, because unpickling can run code.
"""

from __future__ import annotations

import math
import pathlib
import pickle
import re
import reprlib
from typing import Any, Optional

import msgpack
import numpy as np
import torch

from .settings import pickle_allowed

__all__ = [
    "MAX_DIMS",
    "MAX_DEPTH",
    "encode",
    "decode",
    "dtype_name",
    "torch_dtype",
    "check_shape",
    "tensor_bytes",
    "tensor_from_bytes",
]

# Extension type codes. Part of the wire format: never renumber. _TUPLE, _SET
# and _FROZENSET appear only as empty markers: the key of a one-entry map
# whose value is the list of items.
_TUPLE, _SET, _FROZENSET, _COMPLEX, _BIGINT, _PATH, _TENSOR, _NDARRAY, _NPSCALAR, _PICKLE = range(1, 11)

MAX_DIMS = 64  # NumPy's limit (NPY_MAXDIMS); more than any real tensor has
MAX_DEPTH = 1024  # msgpack's nesting limit, the same in its packer and unpacker


class _Marker:
    """What a container marker decodes to: hashable, never equal to a user's key."""

    __slots__ = ("build",)

    def __init__(self, build: Any) -> None:
        self.build = build


_MARKERS = {_TUPLE: _Marker(tuple), _SET: _Marker(set), _FROZENSET: _Marker(frozenset)}
_MARKER_KEYS = {code: msgpack.ExtType(code, b"") for code in _MARKERS}


def _pack(obj: Any, allow_pickle: bool = False) -> bytes:
    default = _default_with_pickle if allow_pickle else _default
    try:
        return msgpack.packb(obj, default=default, use_bin_type=True, strict_types=True)
    except ValueError as exc:
        if "recursion limit" in str(exc):
            raise ValueError(
                f"cannot encode a value nested deeper than {MAX_DEPTH} levels (msgpack's limit; a tuple, set or "
                "frozenset counts two levels, a list or dict one)"
            ) from None
        raise


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a dense tensor's elements, in row-major order (copied to host memory)."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def check_shape(shape: Any) -> list:
    """``shape`` as a list of ints, or ``ValueError``: at most :data:`MAX_DIMS` non-negative ints.

    For shapes read from another rank's bytes, before anything is sized by them.
    """
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_DIMS:
        raise ValueError(f"a shape is a list of at most {MAX_DIMS} ints, got {reprlib.repr(shape)}")
    for d in shape:
        if type(d) is not int or d < 0:
            raise ValueError(f"a shape holds non-negative ints, got {reprlib.repr(shape)}")
    return list(shape)


def _check_size(what: str, shape: list, itemsize: int, raw: Any) -> None:
    if not isinstance(raw, bytes):
        raise ValueError(f"{what} data must be bytes, got {type(raw).__name__}")
    declared = math.prod(shape) * itemsize
    if declared != len(raw):
        raise ValueError(f"{what} declares shape {shape} ({declared} bytes) but carries {len(raw)} bytes")


def tensor_from_bytes(name: str, shape: list, raw: bytes, device: Optional[torch.device] = None) -> torch.Tensor:
    """Inverse of :func:`tensor_bytes`: a new tensor of dtype ``name`` and ``shape`` (on ``device``).

    Raises ``ValueError`` naming declared and actual sizes unless ``raw``
    holds exactly the bytes of ``shape`` elements of that dtype, before
    allocating anything.
    """
    dtype = torch_dtype(name)
    shape = check_shape(shape)
    _check_size(f"a {name} tensor", shape, dtype.itemsize, raw)
    if raw:
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
    else:
        t = torch.empty(shape, dtype=dtype)
    return t.to(device) if device is not None else t


def _default(obj: Any, allow_pickle: bool = False) -> Any:
    kind = type(obj)
    if kind is tuple:
        return {_MARKER_KEYS[_TUPLE]: list(obj)}
    if kind is set or kind is frozenset:
        return {_MARKER_KEYS[_SET if kind is set else _FROZENSET]: list(obj)}
    if kind is complex:
        return msgpack.ExtType(_COMPLEX, _pack([obj.real, obj.imag]))
    if kind is int:  # only reaches here when outside msgpack's 64-bit range
        size = (obj.bit_length() + 8) // 8
        return msgpack.ExtType(_BIGINT, obj.to_bytes(size, "little", signed=True))
    if isinstance(obj, pathlib.PurePath):
        return msgpack.ExtType(_PATH, _pack([type(obj).__name__, str(obj)]))
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:
            raise TypeError(f"cannot encode a {obj.layout} tensor; only dense (strided) tensors are supported")
        return msgpack.ExtType(_TENSOR, _pack([dtype_name(obj.dtype), list(obj.shape), tensor_bytes(obj)]))
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError("cannot encode a NumPy array of dtype object")
        return msgpack.ExtType(_NDARRAY, _pack([obj.dtype.str, list(obj.shape), np.ascontiguousarray(obj).tobytes()]))
    if isinstance(obj, np.generic) and not isinstance(obj, np.object_):
        return msgpack.ExtType(_NPSCALAR, _pack([obj.dtype.str, obj.tobytes()]))
    if allow_pickle:
        return msgpack.ExtType(_PICKLE, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    raise TypeError(
        f"cannot encode an object of type {kind.__module__}.{kind.__qualname__}: polydist's safe codec "
        "supports None, bool, int, float, complex, str, bytes, list, tuple, dict, set, Path, "
        "tensors and NumPy arrays; pass allow_pickle=True (or polydist.set_allow_pickle(True) on every rank) "
        "to pickle other types"
    )


def _default_with_pickle(obj: Any) -> Any:
    return _default(obj, allow_pickle=True)


def dtype_name(dtype: torch.dtype) -> str:
    """Wire name of a torch dtype ("float32"); inverse of :func:`torch_dtype`."""
    return str(dtype).removeprefix("torch.")


_DTYPES = {dtype_name(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called ``name``; ``ValueError`` when there is none (a table lookup: no code runs)."""
    dtype = _DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise ValueError(f"payload names an unknown torch dtype {reprlib.repr(name)}")
    return dtype


# What ``np.dtype(...).str`` gives for every plain dtype ("<f4", "|b1", "<U3", "<M8[ns]"); anything else
# (comma lists, tuples, field specs) is refused before NumPy parses it.
_NP_DTYPE_STR = re.compile(r"[<>|=][a-zA-Z][0-9]{0,6}(\[[0-9]*[a-zA-Z]{1,3}\])?")


def _np_dtype(spec: Any) -> np.dtype:
    if not isinstance(spec, str) or not _NP_DTYPE_STR.fullmatch(spec):
        raise ValueError(f"payload names a malformed NumPy dtype {reprlib.repr(spec)}")
    dtype = np.dtype(spec)
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"payload names a NumPy dtype polydist does not decode: {spec!r}")
    return dtype


def _fields(data: bytes, n: int, what: str) -> list:
    """The ``n``-field list inside an extension: one flat msgpack pass, no extension allowed inside."""
    fields = msgpack.unpackb(data, ext_hook=_no_ext, raw=False, use_list=True)
    if not isinstance(fields, list) or len(fields) != n:
        raise ValueError(f"a {what} extension holds {n} fields, got {reprlib.repr(fields)}")
    return fields


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"payload nests extension type {code} where none belongs")


def _map(d: dict) -> Any:
    if len(d) != 1:
        return d
    ((marker, items),) = d.items()
    if type(marker) is not _Marker:
        return d
    if not isinstance(items, list):
        raise ValueError("a tuple/set marker must hold a list")
    return marker.build(items)


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
                raise ValueError(f"a tensor extension names its dtype with a string, got {reprlib.repr(name)}")
            return tensor_from_bytes(name, shape, raw, self.device)
        if code == _NDARRAY:
            spec, shape, raw = _fields(data, 3, "array")
            dtype, shape = _np_dtype(spec), check_shape(shape)
            _check_size(f"a {spec} array", shape, dtype.itemsize, raw)
            return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        if code == _NPSCALAR:
            spec, raw = _fields(data, 2, "scalar")
            dtype = _np_dtype(spec)
            _check_size(f"a {spec} scalar", [], dtype.itemsize, raw)
            return np.frombuffer(raw, dtype=dtype)[0]
        if code == _PICKLE:
            if not self.allow_pickle:
                raise _Refused(
                    "payload holds a pickled object, which polydist only unpickles with allow_pickle=True "
                    "(or polydist.set_allow_pickle(True)) on the receiving rank, since unpickling can run code"
                )
            return pickle.loads(data)  # noqa: S301 - explicit opt-in, documented above
        raise ValueError(f"payload holds an unknown extension type code {code}")


class _Refused(ValueError):
    """Pickle refused: passes through :func:`decode` with its own message."""


def encode(obj: Any, allow_pickle: Optional[bool] = None) -> bytes:
    """Encode ``obj`` to bytes.

    ``allow_pickle``: None follows the process-wide setting (:func:`pickle_allowed`).
    Raises ``TypeError`` naming the first unsupported type (without pickle).
    """
    return _pack(obj, pickle_allowed(allow_pickle))


def decode(data: bytes, device: Optional[torch.device] = None, allow_pickle: Optional[bool] = None) -> Any:
    """Rebuild the value :func:`encode` produced; tensors are moved to ``device`` when given.

    Raises ``ValueError`` on a malformed payload (whatever the corruption:
    bad sizes, types, nesting, truncation, trailing bytes), or on a pickled
    one without the pickle opt-in; never executes code unless pickle is
    allowed. See the module docstring for the memory and depth bounds.
    """
    try:
        return _Decoder(device, pickle_allowed(allow_pickle)).unpack(data)
    except _Refused:
        raise
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, RecursionError) as exc:
        detail = str(exc) if type(exc) is ValueError else f"{type(exc).__name__}: {exc}"
        raise ValueError(f"malformed payload: {detail}") from None
