"""Tensors and NumPy arrays as raw bytes, checked: dtype names, shapes and sizes from another rank.

Used by the codec (:mod:`polydist.codec.core`) and by the collectives' own
headers (:mod:`polydist.collectives.pieces`), which size buffers from
shapes received from other ranks: every shape is checked here before
anything is allocated by it.
"""

from __future__ import annotations

import math
import re
import reprlib
from typing import Any, Optional

import numpy as np
import torch

__all__ = [
    "MAX_DIMS",
    "dtype_name",
    "torch_dtype",
    "check_shape",
    "check_size",
    "tensor_bytes",
    "tensor_from_bytes",
    "np_dtype",
    "check_dense",
]

MAX_DIMS = 64  # NumPy's limit (NPY_MAXDIMS); more than any real tensor has


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


def check_shape(shape: Any) -> list:
    """``shape`` as a list of ints, or ``ValueError``: at most :data:`MAX_DIMS` non-negative ints.

    For shapes read from another rank's bytes, before anything is sized by them.
    """
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_DIMS:
        raise ValueError(f"a shape is a list of at most {MAX_DIMS} ints, got {reprlib.repr(shape)}")
    for d in shape:
        if type(d) is not int or not 0 <= d < 2**63:
            raise ValueError(f"a shape holds non-negative ints (int64), got {reprlib.repr(shape)}")
    return list(shape)


def check_size(what: str, shape: list, itemsize: int, raw: Any) -> None:
    """``ValueError`` naming both sizes unless ``raw`` is bytes holding exactly ``shape`` items of ``itemsize``."""
    if not isinstance(raw, bytes):
        raise ValueError(f"{what} data must be bytes, got {type(raw).__name__}")
    declared = math.prod(shape) * itemsize
    if declared != len(raw):
        raise ValueError(f"{what} declares shape {shape} ({declared} bytes) but carries {len(raw)} bytes")


def check_dense(t: torch.Tensor, what: str) -> torch.Tensor:
    """``t`` when dense (strided); ``TypeError`` naming its layout otherwise (sparse COO/CSR/CSC/BSR, mkldnn...)."""
    if t.layout != torch.strided:
        raise TypeError(
            f"{what} takes dense (strided) tensors, got a {t.layout} tensor: send t.to_dense(), or the dense "
            "tensors a sparse one is made of (COO: t.indices(), t.values(); CSR: t.crow_indices(), "
            "t.col_indices(), t.values()) and t.shape"
        )
    return t


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a dense tensor's elements, in row-major order (copied to host memory)."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def tensor_from_bytes(name: str, shape: list, raw: bytes, device: Optional[torch.device] = None) -> torch.Tensor:
    """Inverse of :func:`tensor_bytes`: a new tensor of dtype ``name`` and ``shape`` (on ``device``).

    Raises ``ValueError`` naming declared and actual sizes unless ``raw``
    holds exactly the bytes of ``shape`` elements of that dtype, before
    allocating anything.
    """
    dtype = torch_dtype(name)
    shape = check_shape(shape)
    check_size(f"a {name} tensor", shape, dtype.itemsize, raw)
    if raw:
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
    else:
        t = torch.empty(shape, dtype=dtype)
    return t.to(device) if device is not None else t


# What ``np.dtype(...).str`` gives for every plain dtype ("<f4", "|b1", "<U3", "<M8[ns]"); anything else
# (comma lists, tuples, field specs) is refused before NumPy parses it.
_NP_DTYPE_STR = re.compile(r"[<>|=][a-zA-Z][0-9]{0,6}(\[[0-9]*[a-zA-Z]{1,3}\])?")


def np_dtype(spec: Any) -> np.dtype:
    """The plain NumPy dtype ``spec`` names (``"<f4"``); ``ValueError`` for anything else, before NumPy parses it."""
    if not isinstance(spec, str) or not _NP_DTYPE_STR.fullmatch(spec):
        raise ValueError(f"payload names a malformed NumPy dtype {reprlib.repr(spec)}")
    dtype = np.dtype(spec)
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"payload names a NumPy dtype polydist does not decode: {spec!r}")
    return dtype
