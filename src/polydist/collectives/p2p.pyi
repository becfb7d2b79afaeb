# Type stub for p2p.py: overloads so a type checker knows what each call returns
# (send -> None, isend/irecv -> Work, recv(tensor) -> the same tensor type,
# recv(None) -> the value sent). Keep in step with the signatures in p2p.py.

from typing import Any, Optional, TypeVar, overload

import torch
from torch import Tensor

from ..groups import GroupLike
from ._aliases import _G, _P
from .work import Work


__all__ = ["send", "recv", "isend", "irecv"]

_TensorT = TypeVar("_TensorT", bound=torch.Tensor)

def send(
    tensor: Any, dst: int, group: GroupLike = ..., tag: int = ..., *, allow_pickle: Optional[bool] = ...
) -> None: ...
def isend(
    tensor: Any, dst: int, group: GroupLike = ..., tag: int = ..., *, allow_pickle: Optional[bool] = ...
) -> Work: ...
@overload
def recv(tensor: _TensorT, src: int, group: _G = ..., tag: int = ..., *, allow_pickle: _P = ...) -> _TensorT: ...
@overload
def recv(tensor: None, src: int, group: _G = ..., tag: int = ..., *, allow_pickle: _P = ...) -> Any: ...
@overload
def recv(tensor: Optional[Tensor], src: int, group: _G = ..., tag: int = ..., *, allow_pickle: _P = ...) -> Any: ...
def irecv(
    tensor: Optional[torch.Tensor],
    src: int,
    group: GroupLike = ...,
    tag: int = ...,
    *,
    allow_pickle: Optional[bool] = ...,
) -> Work: ...
