# Type stub for gather.py: overloads so a type checker knows what each call returns
# (tensor -> Tensor with concat=True, list[Tensor] with concat=False; a value ->
# list[Any]; gather: None off dst; async_op=True -> Work). Keep in step with the
# signatures in gather.py.

from typing import Any, Literal, Optional, Sequence, Union, overload

import torch
from torch import Tensor

from ._aliases import _G, _No, _Yes, _P
from .work import Work


__all__ = ["all_gather", "all_gather_tensors_with_shapes", "gather"]

# ---------------------------------------------------------------- all_gather

@overload
def all_gather(tensor: Tensor, group: _G = ..., *, concat: _Yes = ..., async_op: _No = ..., allow_pickle: _P = ...) -> Tensor: ...  # type: ignore[overload-overlap, unused-ignore]
@overload
def all_gather(tensor: Tensor, group: _G = ..., *, concat: _No, async_op: _No = ..., allow_pickle: _P = ...) -> list[Tensor]: ...
@overload
def all_gather(tensor: Tensor, group: _G = ..., *, concat: bool, async_op: _No = ..., allow_pickle: _P = ...) -> Union[Tensor, list[Tensor]]: ...  # type: ignore[overload-overlap, unused-ignore]
@overload
def all_gather(tensor: Any, group: _G = ..., *, concat: bool = ..., async_op: _No = ..., allow_pickle: _P = ...) -> list[Any]: ...
@overload
def all_gather(tensor: Any, group: _G = ..., *, concat: bool = ..., async_op: _Yes, allow_pickle: _P = ...) -> Work: ...
@overload
def all_gather(tensor: Any, group: _G = ..., *, concat: bool = ..., async_op: bool, allow_pickle: _P = ...) -> Any: ...

def all_gather_tensors_with_shapes(tensor: Tensor, shapes: Sequence[Sequence[int]], group: _G = ...) -> list[Tensor]: ...

# ---------------------------------------------------------------- gather

@overload
def gather(tensor: Tensor, dst: int = ..., group: _G = ..., *, concat: _Yes = ..., async_op: _No = ..., allow_pickle: _P = ...) -> Optional[Tensor]: ...  # type: ignore[overload-overlap, unused-ignore]
@overload
def gather(tensor: Tensor, dst: int = ..., group: _G = ..., *, concat: _No, async_op: _No = ..., allow_pickle: _P = ...) -> Optional[list[Tensor]]: ...
@overload
def gather(tensor: Tensor, dst: int = ..., group: _G = ..., *, concat: bool, async_op: _No = ..., allow_pickle: _P = ...) -> Union[Tensor, list[Tensor], None]: ...  # type: ignore[overload-overlap, unused-ignore]
@overload
def gather(tensor: Any, dst: int = ..., group: _G = ..., *, concat: bool = ..., async_op: _No = ..., allow_pickle: _P = ...) -> Optional[list[Any]]: ...
@overload
def gather(tensor: Any, dst: int = ..., group: _G = ..., *, concat: bool = ..., async_op: _Yes, allow_pickle: _P = ...) -> Work: ...
@overload
def gather(tensor: Any, dst: int = ..., group: _G = ..., *, concat: bool = ..., async_op: bool, allow_pickle: _P = ...) -> Any: ...
