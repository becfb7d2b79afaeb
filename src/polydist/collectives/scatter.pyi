# Type stub for scatter.py: overloads so a type checker knows what each call returns
# (a list of tensors -> Tensor / list[Tensor]; values -> Any / list[Any]; async_op=True
# -> Work). Keep in step with the signatures in scatter.py.

from typing import Any, Literal, Optional, Sequence, overload

import torch
from torch import Tensor

from ._aliases import _G, _No, _Yes, _P
from .work import Work


__all__ = ["scatter", "all_to_all"]

# ---------------------------------------------------------------- scatter

# Non-src ranks pass None (ignored): they get Any, as do lists of values.
@overload
def scatter(tensors: Sequence[Tensor], src: int = ..., group: _G = ..., *, async_op: _No = ..., allow_pickle: _P = ...) -> Tensor: ...
@overload
def scatter(tensors: Optional[Sequence[Any]], src: int = ..., group: _G = ..., *, async_op: _No = ..., allow_pickle: _P = ...) -> Any: ...
@overload
def scatter(tensors: Optional[Sequence[Any]], src: int = ..., group: _G = ..., *, async_op: _Yes, allow_pickle: _P = ...) -> Work: ...
@overload
def scatter(tensors: Optional[Sequence[Any]], src: int = ..., group: _G = ..., *, async_op: bool, allow_pickle: _P = ...) -> Any: ...

# ---------------------------------------------------------------- all_to_all

@overload
def all_to_all(tensors: Sequence[Tensor], group: _G = ..., *, async_op: _No = ..., allow_pickle: _P = ...) -> list[Tensor]: ...
@overload
def all_to_all(tensors: Sequence[Any], group: _G = ..., *, async_op: _No = ..., allow_pickle: _P = ...) -> list[Any]: ...
@overload
def all_to_all(tensors: Sequence[Any], group: _G = ..., *, async_op: _Yes, allow_pickle: _P = ...) -> Work: ...
@overload
def all_to_all(tensors: Sequence[Any], group: _G = ..., *, async_op: bool, allow_pickle: _P = ...) -> Any: ...
