"""Python values ↔ bytes, safely: msgpack plus extension types, no pickle.

Decoding never executes code: it only rebuilds the types listed below, so a
payload from another rank cannot run anything here. Supported, nested to any
depth: None, bool, int (any size, exact), float (float64), complex, str
(UTF-8), bytes (a bytearray arrives as bytes), list, tuple, dict, set, frozenset,
``pathlib.PurePath``, ``torch.Tensor`` (dense; dtype and shape kept; arrives on
the decoder's ``device``) and NumPy arrays and scalars (non-object dtypes).
Anything else raises ``TypeError`` naming the type, at encode time.

Pickle is an explicit opt-in: with ``allow_pickle=True`` (per call) or
:func:`set_allow_pickle` / ``POLYDIST_ALLOW_PICKLE=1`` (process-wide), other
types are pickled inside their own extension type; decoding one requires the
same opt-in on the receiving side, because unpickling can run code.
"""

from __future__ import annotations

import os
import pathlib
import pickle
from typing import Any, Optional

import msgpack
import numpy as np
import torch

__all__ = [
    "encode",
    "decode",
    "dtype_name",
    "torch_dtype",
    "tensor_bytes",
    "tensor_from_bytes",
    "set_allow_pickle",
    "pickle_allowed",
]

# Extension type codes. Part of the wire format: never renumber.
_TUPLE, _SET, _FROZENSET, _COMPLEX, _BIGINT, _PATH, _TENSOR, _NDARRAY, _NPSCALAR, _PICKLE = range(1, 11)

_allow_pickle: Optional[bool] = None  # None: follow POLYDIST_ALLOW_PICKLE


def set_allow_pickle(allow: bool) -> None:
    """Process-wide pickle opt-in for value collectives (default off; set it on every rank).

    With it, values of types the safe codec does not know are pickled, and
    pickled payloads from other ranks are unpickled — which can execute code,
    so only enable it between processes that trust each other.
    """
    global _allow_pickle
    _allow_pickle = bool(allow)


def pickle_allowed(allow_pickle: Optional[bool] = None) -> bool:
    """The effective opt-in: the per-call flag when given, else the process-wide setting."""
    if allow_pickle is not None:
        return bool(allow_pickle)
    if _allow_pickle is not None:
        return _allow_pickle
    return os.environ.get("POLYDIST_ALLOW_PICKLE", "0").lower() in ("1", "true", "yes", "on")


def _pack(obj: Any, allow_pickle: bool = False) -> bytes:
    default = _default_with_pickle if allow_pickle else _default
    return msgpack.packb(obj, default=default, use_bin_type=True, strict_types=True)


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a dense tensor's elements, in row-major order (copied to host memory)."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def tensor_from_bytes(name: str, shape: list, raw: bytes, device: Optional[torch.device] = None) -> torch.Tensor:
    """Inverse of :func:`tensor_bytes`: a new tensor of dtype ``name`` and ``shape`` (on ``device``)."""
    dtype = torch_dtype(name)
    if raw:
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
    else:
        t = torch.empty(shape, dtype=dtype)
    return t.to(device) if device is not None else t


def _default(obj: Any, allow_pickle: bool = False) -> msgpack.ExtType:
    kind = type(obj)
    if kind is tuple:
        return msgpack.ExtType(_TUPLE, _pack(list(obj), allow_pickle))
    if kind is set or kind is frozenset:
        code = _SET if kind is set else _FROZENSET
        return msgpack.ExtType(code, _pack(list(obj), allow_pickle))
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


def _default_with_pickle(obj: Any) -> msgpack.ExtType:
    return _default(obj, allow_pickle=True)


def dtype_name(dtype: torch.dtype) -> str:
    """Wire name of a torch dtype ("float32"); inverse of :func:`torch_dtype`."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called ``name``; ``ValueError`` when there is none (no code runs)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"payload names an unknown torch dtype {name!r}")
    return dtype


def _np_dtype(spec: str) -> np.dtype:
    dtype = np.dtype(spec)
    if dtype.hasobject:
        raise ValueError("payload names a NumPy object dtype, which is refused")
    return dtype


class _Decoder:
    def __init__(self, device: Optional[torch.device], allow_pickle: bool) -> None:
        self.device = device
        self.allow_pickle = allow_pickle

    def unpack(self, data: bytes) -> Any:
        return msgpack.unpackb(data, ext_hook=self.ext, raw=False, strict_map_key=False, use_list=True)

    def ext(self, code: int, data: bytes) -> Any:
        if code == _TUPLE:
            return tuple(self.unpack(data))
        if code == _SET:
            return set(self.unpack(data))
        if code == _FROZENSET:
            return frozenset(self.unpack(data))
        if code == _COMPLEX:
            real, imag = self.unpack(data)
            return complex(real, imag)
        if code == _BIGINT:
            return int.from_bytes(data, "little", signed=True)
        if code == _PATH:
            flavour, text = self.unpack(data)
            return pathlib.PureWindowsPath(text) if flavour.startswith("PureWindows") else pathlib.Path(text)
        if code == _TENSOR:
            name, shape, raw = self.unpack(data)
            return tensor_from_bytes(name, shape, raw, self.device)
        if code == _NDARRAY:
            spec, shape, raw = self.unpack(data)
            return np.frombuffer(raw, dtype=_np_dtype(spec)).reshape(shape).copy()
        if code == _NPSCALAR:
            spec, raw = self.unpack(data)
            return np.frombuffer(raw, dtype=_np_dtype(spec))[0]
        if code == _PICKLE:
            if not self.allow_pickle:
                raise ValueError(
                    "payload holds a pickled object, which polydist only unpickles with allow_pickle=True "
                    "(or polydist.set_allow_pickle(True)) on the receiving rank, since unpickling can run code"
                )
            return pickle.loads(data)  # noqa: S301 - explicit opt-in, documented above
        raise ValueError(f"payload holds an unknown extension type code {code}")


def encode(obj: Any, allow_pickle: Optional[bool] = None) -> bytes:
    """Encode ``obj`` to bytes.

    ``allow_pickle``: None follows the process-wide setting (:func:`pickle_allowed`).
    Raises ``TypeError`` naming the first unsupported type (without pickle).
    """
    return _pack(obj, pickle_allowed(allow_pickle))


def decode(data: bytes, device: Optional[torch.device] = None, allow_pickle: Optional[bool] = None) -> Any:
    """Rebuild the value :func:`encode` produced; tensors are moved to ``device`` when given.

    Raises ``ValueError`` on a malformed payload, or on a pickled one without
    the pickle opt-in; never executes code unless pickle is allowed.
    """
    return _Decoder(device, pickle_allowed(allow_pickle)).unpack(data)
