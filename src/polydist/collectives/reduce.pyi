# Type stub for reduce.py: overloads so a type checker knows what each call returns
# (tensor -> the same tensor type, list of tensors -> the same list type, number ->
# number, async_op=True -> Work). Keep in step with the signatures in reduce.py.

from typing import Any, Literal, Sequence, TypeVar, Union, overload

import numpy as np
import torch
from torch import Tensor

from ..ops import OpLike
from ._aliases import _G, _No, _Yes
from .work import Work


__all__ = ["all_reduce", "reduce", "reduce_scatter"]

_TensorT = TypeVar("_TensorT", bound=torch.Tensor)
_FloatT = TypeVar("_FloatT", float, complex)  # a float stays a float, a complex a complex (ints: own overloads)
_TensorsT = TypeVar("_TensorsT", bound=Sequence[torch.Tensor])

# Op names under which the reduction of ints is an int (every op but AVG/MEAN/AVERAGE), in
# the spellings the docs use; other spellings and ReduceOp values get int | float.
_IntOp = Literal[
    "SUM", "sum", "Sum",
    "PRODUCT", "product", "Product", "PROD", "prod", "Prod",
    "MIN", "min", "Min",
    "MAX", "max", "Max",
    "AND", "and", "And", "BAND", "band",
    "OR", "or", "Or", "BOR", "bor",
    "XOR", "xor", "Xor", "BXOR", "bxor",
]  # fmt: skip
_NumpyScalar = Union[np.number[Any], np.bool_]
_NumpyInt = Union[np.integer[Any], np.bool_]  # NumPy scalars are reduced as their Python value (.item())
_Reducible = Union[torch.Tensor, Sequence[torch.Tensor], complex, _NumpyScalar]  # complex: also int, float, bool

# ---------------------------------------------------------------- all_reduce

@overload
def all_reduce(tensor: _TensorT, op: OpLike = ..., group: _G = ..., *, async_op: _No = ...) -> _TensorT: ...
@overload
def all_reduce(tensor: _TensorsT, op: OpLike = ..., group: _G = ..., *, async_op: _No = ...) -> _TensorsT: ...
@overload
def all_reduce(tensor: int, op: _IntOp = ..., group: _G = ..., *, async_op: _No = ...) -> int: ...
@overload
def all_reduce(tensor: int, op: OpLike = ..., group: _G = ..., *, async_op: _No = ...) -> Union[int, float]: ...
@overload
def all_reduce(tensor: _FloatT, op: OpLike = ..., group: _G = ..., *, async_op: _No = ...) -> _FloatT: ...
@overload
def all_reduce(tensor: _NumpyInt, op: _IntOp = ..., group: _G = ..., *, async_op: _No = ...) -> int: ...
@overload
def all_reduce(tensor: _NumpyInt, op: OpLike = ..., group: _G = ..., *, async_op: _No = ...) -> Union[int, float]: ...
@overload
def all_reduce(tensor: np.floating[Any], op: OpLike = ..., group: _G = ..., *, async_op: _No = ...) -> float: ...
@overload
def all_reduce(tensor: np.complexfloating[Any, Any], op: OpLike = ..., group: _G = ..., *, async_op: _No = ...) -> complex: ...
@overload
def all_reduce(tensor: _Reducible, op: OpLike = ..., group: _G = ..., *, async_op: _Yes) -> Work: ...
@overload
def all_reduce(tensor: _Reducible, op: OpLike = ..., group: _G = ..., *, async_op: bool) -> Any: ...

# ---------------------------------------------------------------- reduce

@overload
def reduce(tensor: _TensorT, dst: int = ..., op: OpLike = ..., group: _G = ..., *, async_op: _No = ...) -> _TensorT: ...
@overload
def reduce(tensor: int, dst: int = ..., op: _IntOp = ..., group: _G = ..., *, async_op: _No = ...) -> int: ...
@overload
def reduce(tensor: int, dst: int = ..., op: OpLike = ..., group: _G = ..., *, async_op: _No = ...) -> Union[int, float]: ...
@overload
def reduce(tensor: _FloatT, dst: int = ..., op: OpLike = ..., group: _G = ..., *, async_op: _No = ...) -> _FloatT: ...
@overload
def reduce(tensor: _NumpyInt, dst: int = ..., op: _IntOp = ..., group: _G = ..., *, async_op: _No = ...) -> int: ...
@overload
def reduce(tensor: _NumpyInt, dst: int = ..., op: OpLike = ..., group: _G = ..., *, async_op: _No = ...) -> Union[int, float]: ...
@overload
def reduce(tensor: np.floating[Any], dst: int = ..., op: OpLike = ..., group: _G = ..., *, async_op: _No = ...) -> float: ...
@overload
def reduce(tensor: np.complexfloating[Any, Any], dst: int = ..., op: OpLike = ..., group: _G = ..., *, async_op: _No = ...) -> complex: ...
@overload
def reduce(tensor: Union[Tensor, complex, _NumpyScalar], dst: int = ..., op: OpLike = ..., group: _G = ..., *, async_op: _Yes) -> Work: ...
@overload
def reduce(tensor: Union[Tensor, complex, _NumpyScalar], dst: int = ..., op: OpLike = ..., group: _G = ..., *, async_op: bool) -> Any: ...

# ---------------------------------------------------------------- reduce_scatter

@overload
def reduce_scatter(tensor: Tensor, op: OpLike = ..., group: _G = ..., *, async_op: _Yes) -> Work: ...
@overload
def reduce_scatter(tensor: Tensor, op: OpLike = ..., group: _G = ..., *, async_op: _No = ...) -> Tensor: ...
@overload
def reduce_scatter(tensor: Tensor, op: OpLike = ..., group: _G = ..., *, async_op: bool) -> Any: ...
