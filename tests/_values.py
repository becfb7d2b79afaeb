"""``exact(a, b)``: two values are the same value of the same type, down to what ``==`` does not compare.

For the codec's round trips (tests/unit/test_codec*.py, tests/collectives/test_value_types.py): types
everywhere (a tuple stays a tuple, an IntEnum its member), tensors' and arrays' dtypes, shapes and bits, a
Decimal's digits and exponent, an aware datetime's tzinfo and fold, a defaultdict's factory, a dataclass's
fields, NaN equal to NaN.
"""

import collections
import dataclasses
import datetime as dt
import decimal
import math

import numpy as np
import torch


def exact(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, decimal.Decimal):
        return str(a) == str(b)  # digits, exponent and sign, NaNs too
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, (dt.datetime, dt.time)):
        return a == b and a.tzinfo == b.tzinfo and a.fold == b.fold and a.tzname() == b.tzname()
    if isinstance(a, collections.defaultdict) and a.default_factory is not b.default_factory:
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(exact(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):  # named tuples and torch.Size too
        return len(a) == len(b) and all(exact(x, y) for x, y in zip(a, b))
    if dataclasses.is_dataclass(a):
        return all(exact(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a == b
