# Type stub for broadcast.py: overloads so a type checker knows what each call returns
# (tensor -> the same tensor type, a value -> Any, async_op=True -> Work). Keep in step
# with the signatures in broadcast.py.

from typing import Any, Literal, Optional, TypeVar, overload

import torch
from torch import Tensor

from ._aliases import _G, _No, _Yes, _P
from .work import Work


__all__ = ["broadcast", "barrier"]

_TensorT = TypeVar("_TensorT", bound=torch.Tensor)

# ---------------------------------------------------------------- broadcast

# Without safe_mode a tensor is filled in place (src sends a tensor of its shape and dtype).
@overload
def broadcast(tensor: _TensorT, src: int = ..., group: _G = ..., *, safe_mode: _No = ..., async_op: _No = ..., allow_pickle: _P = ...) -> _TensorT: ...

# A value, or safe_mode=True (src may send a tensor of another shape, or a value): what src sent.
@overload
def broadcast(tensor: Any, src: int = ..., group: _G = ..., *, safe_mode: bool = ..., async_op: _No = ..., allow_pickle: _P = ...) -> Any: ...
@overload
def broadcast(tensor: Any, src: int = ..., group: _G = ..., *, safe_mode: bool = ..., async_op: _Yes, allow_pickle: _P = ...) -> Work: ...
@overload
def broadcast(tensor: Any, src: int = ..., group: _G = ..., *, safe_mode: bool = ..., async_op: bool, allow_pickle: _P = ...) -> Any: ...

# ---------------------------------------------------------------- barrier

@overload
def barrier(group: _G = ..., *, async_op: _No = ...) -> None: ...
@overload
def barrier(group: _G = ..., *, async_op: _Yes) -> Work: ...
@overload
def barrier(group: _G = ..., *, async_op: bool) -> Optional[Work]: ...
