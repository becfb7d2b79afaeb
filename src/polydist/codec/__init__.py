"""Python values ↔ bytes, safely: msgpack plus extension types, no pickle.

Decoding never executes code: it only rebuilds the types listed below, so a
payload from another rank cannot run anything here. What travels, and how it
comes back (exactly: same type, same value):

* None, bool, int (any size, exact), float (float64, NaN and infinities
  too), complex, str (UTF-8), bytes (a bytearray arrives as bytes), list,
  tuple, dict (any of these as keys when hashable), set, frozenset,
  ``pathlib.PurePath`` (as ``Path``, or ``PureWindowsPath``);
* ``torch.Tensor`` (dense; dtype and shape kept; arrives on the decoder's
  ``device``; a subclass such as ``nn.Parameter`` as a plain tensor) and
  NumPy arrays and scalars (non-object dtypes). Sparse tensors (COO, CSR,
  ...) are refused with ``TypeError`` naming their layout;
* the standard library's value types and torch's small types
  (:mod:`polydist.codec.stdtypes`): ``datetime``, ``date``, ``time``,
  ``timedelta`` (aware values keep their ``timezone`` or ``ZoneInfo``),
  ``Decimal`` (every digit and the exponent, no rounding), ``Fraction``,
  ``UUID``, ``range``, ``OrderedDict``, ``Counter``, ``defaultdict`` (with a
  builtin factory), ``torch.Size``, ``torch.dtype``, ``torch.device``;
* the program's own dataclasses, named tuples and enums, once allowed with
  :func:`allow` on every rank (:mod:`polydist.codec.classes`): by their
  fields, rebuilt through their constructor; an enum member by its name.

Anything else raises ``TypeError`` naming the type, at encode time.

Bytes from another rank are hostile until checked. :func:`decode` therefore

* allocates nothing the payload does not back: a tensor or array is accepted
  only when its data holds exactly ``numel × itemsize`` bytes for its declared
  dtype and shape (at most :data:`MAX_DIMS` dims), and every msgpack length is
  bounded by the payload's size (msgpack's own rule for ``unpackb``); so
  decoding allocates at most a small multiple of the payload;
* never recurses per nesting level on the C stack: containers travel
  in-band (:mod:`polydist.codec.core`), so the whole structure is one msgpack
  pass, whose unpacker keeps its nesting on a fixed stack. Both sides stop at
  msgpack's limit of :data:`MAX_DEPTH` (1024) levels, a list or dict counting
  one and any other container two: ``encode`` raises ``ValueError`` for a
  deeper structure, so whatever encodes also decodes, and ``decode`` refuses
  a deeper payload;
* looks a class name up in this process's allow-list, never imports it; a
  name not allowed, a field the class does not have or lacks, a value its
  constructor refuses, all raise ``ValueError``;
* raises ``ValueError`` for anything malformed, whatever the corruption.

Pickle is an explicit opt-in: with ``allow_pickle=True`` (per call) or
:func:`polydist.set_allow_pickle` / ``POLYDIST_ALLOW_PICKLE=1`` (process-wide), other
types are pickled inside their own extension type; decoding one requires the
same opt-in on the receiving side, because unpickling can run code.
"""

from ..settings import pickle_allowed  # the pickle rule encode and decode follow, where it was before the split
from .arrays import MAX_DIMS, check_dense, check_shape, dtype_name, tensor_bytes, tensor_from_bytes, torch_dtype
from .classes import allow, allowed, disallow
from .core import MAX_DEPTH, decode, encode

__all__ = [
    "MAX_DIMS",
    "MAX_DEPTH",
    "encode",
    "decode",
    "allow",
    "disallow",
    "allowed",
    "pickle_allowed",
    "dtype_name",
    "torch_dtype",
    "check_shape",
    "check_dense",
    "tensor_bytes",
    "tensor_from_bytes",
]
