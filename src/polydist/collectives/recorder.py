"""The flight recorder: every rank remembers its last collectives and point-to-point calls.

A step of the collective pipeline (:mod:`~polydist.collectives.pipeline`),
always on unless ``POLYDIST_TRACE=0``. Each call appends one record to a ring
buffer of ``POLYDIST_TRACE_BUFFER`` entries (default 2,000): the group, its
sequence number, the collective, op and root, the dtypes and shapes of the
tensor arguments, the caller's file and line, the start and end time and the
state (started, completed, failed). :mod:`polydist.trace.dump` writes the
buffer out when a collective times out, when a rank fails or is stopped, on
``SIGUSR1`` and on request; ``polydist trace`` reads the dumps of all ranks.
The precedent is PyTorch's Flight Recorder, which does the same inside the
NCCL backend only.

A record is a plain list, filled in place; the cost on the caller's path is
one frame walk, one ``time.time()`` at each end and a list store, about a
microsecond (benchmarks/trace_cost.py). The operations polydist's own process
groups run for any caller (torch.distributed, DDP, FSDP2) are recorded by
:func:`record_op`, which is compiled (``_record.c``, built by setup.py where a C
compiler is found) and falls back to Python with the same records; the compiled
walk reads the interpreter's frames without making frame objects
(benchmarks/torch_path_cost.py). The caller's line is found only when a
record is read (:func:`line_of`): the record keeps the frame's instruction
offset, since ``f_lineno`` scans the function's line table on every read.
Tensors are never kept: only their dtype and shape, so the buffer holds no
memory of the program's. Records are
turned into the dump's dictionaries (:func:`as_dict`) only when a dump or a
profile asks.
"""

from __future__ import annotations

import dis
import os
import sys
import time
from typing import Any, Optional

import torch

from .. import codec, settings
from .._compiled import load

__all__ = ["Recorder", "RECORDER", "as_dict", "set_trace"]

# Fields of a record (a list, so that completion updates it in place). DTYPE, SHAPE: of the one
# tensor argument; for anything else DTYPE is _MANY and SHAPE the tensors' ((dtype, shape), ...),
# or None for Python values.
ID, NAME, RES, SEQ, OP, ROOT, DTYPE, SHAPE, CODE, LASTI, START, END, STATE, ERROR, ASYNC = range(15)
STARTED, COMPLETED, FAILED = "started", "completed", "failed"
_MANY = object()
_now = time.time

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # .../polydist/
# A call that reaches a process group through torch.distributed (DDP, FSDP2, the user) is shown at the first
# frame outside polydist and torch: the program's line, not torch's wrapper.
_LIBRARIES = (_PACKAGE, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)


def _tensors(x: Any) -> Optional[tuple]:
    """``((dtype, shape), ...)`` of the tensors in ``x`` (a tensor or a list of them, () for none); None for values."""
    if isinstance(x, torch.Tensor):
        return ((x.dtype, x.shape),)
    if isinstance(x, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in x):  # () : no argument (barrier)
        return tuple((t.dtype, t.shape) for t in x)
    return None


def _outside(frame: Any, inside: Any = _PACKAGE) -> Any:
    """The first frame, from ``frame`` up, whose file is not under ``inside`` (a prefix or a tuple of them;
    the outermost frame if every one is)."""
    while frame.f_back is not None and frame.f_code.co_filename.startswith(inside):
        frame = frame.f_back
    return frame


# id(code object) -> whether its file is under _LIBRARIES. Keyed by id: hashing a code object hashes its
# constants, every time (~0.4 us); the codes are held (_HELD), so no id is reused while its entry lives.
_IN_LIBRARIES: dict = {}
_HELD: list = []


def _classify(code: Any) -> bool:
    """Whether ``code``'s file is polydist's or torch's (the compiled walk caches the answer itself)."""
    return code.co_filename.startswith(_LIBRARIES)


def _in_libraries(code: Any) -> bool:
    """Whether ``code``'s file is polydist's or torch's, learnt once per code object (at most 4096 kept)."""
    if len(_HELD) >= 4096:
        _IN_LIBRARIES.clear()
        _HELD.clear()
    _HELD.append(code)
    inside = _IN_LIBRARIES[id(code)] = _classify(code)
    return inside


def _record_op(rec: "Recorder", res: Any, name: str, seq: Optional[int], op: Any, root: Any, x: Any, async_op: bool,
               ring: bool) -> list:  # fmt: skip
    """Record an operation process group ``res`` (its tag: ``ranks`` its global ranks) starts, whoever called it
    (torch.distributed, DDP, FSDP2); returns the record, kept in ``rec``'s ring when ``ring`` (else for the
    group's watchdog only, with id -1: ``POLYDIST_TRACE=0``).

    ``seq``: the group's count of operations (None for point-to-point); ``x``: the tensor argument, or a
    list of them. The caller shown is the first frame outside polydist and torch. This is the Python
    version; ``record_op`` is the compiled one (``_record.c``) where it was built, making the same record.
    """
    frame = sys._getframe(1)  # the caller's (polydist's) frame, where the compiled walk starts too
    known = _IN_LIBRARIES
    while frame.f_back is not None:  # to the first frame outside polydist and torch, inline: a hot path
        inside = known.get(id(frame.f_code))
        if inside is None:
            inside = _in_libraries(frame.f_code)
        if not inside:
            break
        frame = frame.f_back
    if type(x) is torch.Tensor:
        dtype, shape = x.dtype, x.shape
    else:
        dtype, shape = _MANY, _tensors(x)
    n = rec.count if ring else -1
    record = [n, name, res, seq, op, root, dtype, shape, frame.f_code, frame.f_lasti, _now(), None, STARTED, None, async_op]
    if ring:
        rec.slots[n % rec.size] = record
        rec.count = n + 1
    return record


class Recorder:
    """One process's ring buffer of calls (see the module docstring).

    Attributes:
        on: whether calls are recorded (``POLYDIST_TRACE``, :func:`set_trace`).
        size: the ring's capacity in records.
        count: records made so far; the newest has id ``count - 1``.
        keep: when a list, every record that ends (completed or failed) is
            also appended to it — the comms profile's feed
            (:mod:`polydist.trace.profile`); None otherwise.
        outer: the record of the polydist call now running its body on this
            process (set by the pipeline): a process group that records its
            own operations (:mod:`polydist.backends.python_group`) adopts it
            instead of recording the same call twice.
    """

    __slots__ = ("on", "size", "slots", "count", "keep", "outer")

    def __init__(self, on: bool, size: int) -> None:
        self.on, self.size = on, size
        self.slots: list = [None] * size
        self.count = 0
        self.keep: Optional[list] = None
        self.outer: Optional[list] = None

    def start(self, res: Any, name: str, seq: Optional[int], op: Any, root: Any, x: Any, async_op: bool) -> list:
        """Record a call that is starting; returns its record for :meth:`end`/:meth:`fail`.

        Called by the pipeline's ``run``, itself called by a public function:
        the caller is three frames up, unless that is polydist too (a public
        function calling another); then the first frame outside polydist.
        """
        frame = sys._getframe(3)
        if frame.f_code.co_filename.startswith(_PACKAGE):
            frame = _outside(frame)
        if type(x) is torch.Tensor:  # the common case, inline: a record costs about a microsecond in all
            dtype, shape = x.dtype, x.shape
        else:
            dtype, shape = _MANY, _tensors(x)
        n = self.count
        record = [n, name, res, seq, op, root, dtype, shape, frame.f_code, frame.f_lasti, _now(), None, STARTED, None, async_op]
        self.slots[n % self.size] = record
        self.count = n + 1
        return record

    def end(self, record: list) -> None:
        """Mark ``record`` completed now (unless it failed already: a watchdog's timeout stays)."""
        if record[STATE] is not STARTED:
            return
        record[END] = _now()
        record[STATE] = COMPLETED
        if self.keep is not None:
            self.keep.append(record)

    def fail(self, record: list, exc: BaseException) -> None:
        """Mark ``record`` failed with ``exc`` (a timeout, a lost peer, a mismatch)."""
        if record[STATE] != STARTED:
            return
        record[END] = _now()
        record[STATE] = FAILED
        record[ERROR] = f"{type(exc).__name__}: {exc}"
        if self.keep is not None:
            self.keep.append(record)

    def close(self, record: list, error: Optional[BaseException]) -> None:
        """:meth:`end` ``record``, or :meth:`fail` it with ``error`` when there is one."""
        if error is None:
            self.end(record)
        else:
            self.fail(record, error)

    def records(self) -> tuple[list, int]:
        """The records the ring holds, oldest first, and how many older ones it dropped."""
        n, size = self.count, self.size
        held = min(n, size)
        slots = list(self.slots)  # one copy under the GIL: the calling thread may be recording
        ordered = [slots[i % size] for i in range(n - held, n)]
        return [r for r in ordered if r is not None], n - held


def line_of(code: Any, lasti: int) -> Optional[int]:
    """The source line of the instruction at byte offset ``lasti`` (a frame's ``f_lasti``) in ``code``: what the
    frame's ``f_lineno`` said then (None where no line is). Records keep ``f_lasti`` and the line is found when a
    record is read, because ``f_lineno`` scans the code's line table from the start on every read: about 0.4 us
    in a short function, tens of microseconds near the end of a long one."""
    if lasti < 0:
        return code.co_firstlineno
    if hasattr(code, "co_lines"):  # Python 3.10+
        for start, end, line in code.co_lines():
            if start <= lasti < end:
                return line
        return None
    line = None
    for offset, n in dis.findlinestarts(code):
        if offset > lasti:
            break
        line = n
    return line


def as_dict(record: list) -> dict:
    """A record in the dump's entry format (:mod:`polydist.trace`)."""
    res, code = record[RES], record[CODE]
    tensors = record[SHAPE] if record[DTYPE] is _MANY else ((record[DTYPE], record[SHAPE]),)
    op = record[OP]
    op = getattr(op, "op", op)  # torch's ReduceOp (a group's record) holds its RedOpType
    return {
        "id": record[ID],
        "collective": record[NAME],
        "group": list(res.ranks),
        "seq": record[SEQ],
        "op": op if op is None or isinstance(op, str) else str(op).rsplit(".", 1)[-1],
        "root": record[ROOT],
        "dtypes": [codec.dtype_name(dtype) for dtype, _ in tensors or ()],
        "shapes": [list(shape) for _, shape in tensors or ()],
        "bytes": sum(shape.numel() * dtype.itemsize for dtype, shape in tensors or ()),
        "value": tensors is None,
        "async": record[ASYNC],
        "file": code.co_filename,
        "line": line_of(code, record[LASTI]),
        "function": code.co_name,
        "start": record[START],
        "end": record[END],
        "state": record[STATE],
        "error": record[ERROR],
    }


def _from_env() -> Recorder:
    try:
        on, size = settings.TRACE.read(), settings.TRACE_BUFFER.read()
    except ValueError as exc:  # a bad value must not break import: say so, record with the defaults
        print(f"polydist: {exc}; the flight recorder uses its defaults", file=sys.stderr)
        on, size = settings.TRACE.default, settings.TRACE_BUFFER.default
    return Recorder(bool(on), int(size))


RECORDER = _from_env()


def _compiled() -> Any:
    """The compiled per-call path (``polydist.collectives._record``, built by setup.py where a C compiler is
    found), configured; None where it was not built or is older than ``_record.c`` (:func:`polydist._compiled.load`)."""
    module = load(__package__, "_record", "_record.c")
    if module is not None:
        module.configure(torch.Tensor, _MANY, _tensors, _classify, STARTED, COMPLETED, Recorder, torch.Size)
    return module


COMPILED = _compiled()
# Record an operation a process group starts (see _record_op): compiled where built, the same records either way.
record_op = _record_op if COMPILED is None else COMPILED.record_op


def set_trace(enabled: bool) -> None:
    """Turn the flight recorder on or off for this process (default: ``$POLYDIST_TRACE``, on).

    Off, collectives record nothing and dumps carry the threads' stacks only.
    Records already made are kept.
    """
    RECORDER.on = bool(enabled)
