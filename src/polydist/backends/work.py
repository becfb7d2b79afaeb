"""Work handles of polydist's Python backends (mpi4py, horovod, xla-tpu) and what completes them (internal).

A :class:`LaneWork` is complete at creation, queued on a group's
:class:`~polydist.backends.lane.Lane` (whose worker completes it), or an MPI
request. Point-to-point calls are MPI requests (``Isend``/``Irecv``) started
on the caller's thread; the :class:`_Progress` thread completes their futures
and profiler events when nobody calls ``wait()``.

Profiling: while the autograd profiler or ``torch.profiler`` records, each
operation opens a record function named ``"<backend>:<op>"`` (``mpi:all_reduce``,
``mpi:send``, ...) with its input tensors, closed by the thread that completes
the operation: an asynchronous event with the input shapes, as PyTorch's
built-in backends record.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import torch
from torch.futures import Future

from .._torch import WorkBase
from ..collectives.recorder import RECORDER

__all__ = ["LaneWork", "DoneWork", "StatusRequest", "profiling", "profiler_event", "request_work", "PROGRESS"]

_enter = torch._C._autograd._record_function_with_args_enter
_exit = torch._C._autograd._record_function_with_args_exit
profiling: Callable[[], bool] = torch._C._autograd._profiler_enabled


def profiler_event(backend: str, op: str, tensors: Sequence[torch.Tensor]) -> Any:
    """Open the profiler event ``"<backend>:<op>"`` with the input tensors (their shapes are recorded)."""
    return _enter(f"{backend}:{op}", *tensors)


class LaneWork(WorkBase):
    """The work handle of one operation of a Python group: complete at creation, queued on a :class:`Lane`,
    or an MPI request (``torch.distributed.Work``'s interface; ``backend`` names the group in profiles).

    ``wait(timeout)`` blocks until done and re-raises the operation's error
    (an ``mpi4py.MPI.Exception`` or whatever the collective raised); a
    ``timeout`` runs out with ``RuntimeError``. ``get_future()`` gives a
    future completed with :meth:`result` (the output tensors) without
    anyone calling ``wait()``, or with the error.
    """

    def __init__(
        self,
        result: Any,
        request: Any = None,
        source: Optional[Callable[[], int]] = None,
        *,
        queued: bool = False,
        record: Any = None,
        backend: str,
    ) -> None:
        super().__init__()
        self._result = result
        self._request = request  # an MPI request still to complete, or None
        self._source = source
        self._done: Optional[threading.Event] = threading.Event() if queued else None
        self._future: Optional[Future] = Future() if queued else None
        self._error: Optional[BaseException] = None
        self._record = record  # an open profiler record function, closed on completion
        self._backend = backend
        self._keep: Any = None  # a buffer that must outlive the operation (a contiguous copy being sent)
        self._trace: Optional[list] = None  # a point-to-point call's flight-recorder record, ended on completion

    # ---------------------------------------------------------------- completion (worker threads)

    def _complete(self, error: Optional[BaseException] = None) -> None:
        if self._record is not None:
            record, self._record = self._record, None
            _exit(record)
        self._error = error
        if self._trace is not None:
            trace, self._trace = self._trace, None
            RECORDER.close(trace, error)
        if self._done is not None:  # completed before the future is (as torch's own LaneWork): whoever the
            self._done.set()  # future wakes finds is_completed() true
        future = self._future
        if future is not None and not future.done():
            if error is None:
                future.set_result(self._result)  # runs its callbacks (DDP's) here, on this thread
            else:
                future.set_exception(error)

    # ---------------------------------------------------------------- the LaneWork API

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        seconds = None if timeout is None or timeout == timedelta(0) else timeout.total_seconds()
        if self._done is not None:
            if not self._done.wait(seconds):
                raise RuntimeError(f"{self._backend}: operation timed out after {timeout}")
        elif self._request is not None:
            request = self._request
            if seconds is None:
                request.Wait()
            else:
                _wait_until(request, seconds, self._backend)
            self._request = None
            self._complete()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        if self._done is not None:
            return self._done.is_set()
        if self._request is not None and self._request.Test():
            self._request = None
            self._complete()
        return self._request is None

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def get_future(self) -> Future:
        if self._future is None:
            self._future = Future()
            if self.is_completed():
                self._future.set_result(self._result)
            else:
                self._done = threading.Event()  # from now on the progress thread owns the request
                PROGRESS.add(self)
        return self._future

    def _source_rank(self) -> int:
        if self._source is None:
            raise RuntimeError("_source_rank() is defined for recv from any source only")
        self.wait()
        return self._source()

    def result(self) -> Any:
        return self._result


class DoneWork(LaneWork):
    """A group's one completed handle, handed out again by every blocking call it ran inline.

    Creating a work handle costs about as much as a small MPI collective;
    ``torch.distributed``'s blocking functions only ``wait()`` on the handle
    and drop it. ``result()`` is the latest call's; ``get_future()`` is a new
    completed future each time.
    """

    def completed(self, result: Any) -> "DoneWork":
        self._result = result
        return self

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        return True  # complete, without error: LaneWork.wait's checks all pass (~0.3 us saved per blocking call)

    def get_future(self) -> Future:
        future: Future = Future()
        future.set_result(self._result)
        return future


def _wait_until(request: Any, seconds: float, backend: str) -> None:
    deadline = time.monotonic() + seconds
    while not request.Test():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{backend}: operation timed out after {timedelta(seconds=seconds)}")
        time.sleep(1e-4)


def request_work(
    result: Any, request: Any, backend: str, op: str, tensors: Sequence[torch.Tensor], trace: Optional[list] = None,
    **kw: Any,
) -> LaneWork:  # fmt: skip
    """LaneWork for a started MPI request; while profiling, the progress thread completes it (an async event).
    ``trace``: the call's flight-recorder record, marked completed (or failed) when the request completes."""
    if not profiling():
        work = LaneWork(result, request, backend=backend, **kw)
        work._trace = trace
        return work
    work = LaneWork(result, request, queued=True, record=profiler_event(backend, op, tensors), backend=backend, **kw)
    work._trace = trace
    PROGRESS.add(work)
    return work


class StatusRequest:
    """An MPI request whose completion status is kept (for recv from any source)."""

    __slots__ = ("request", "status")

    def __init__(self, request: Any, status: Any) -> None:
        self.request, self.status = request, status

    def Wait(self) -> None:  # noqa: N802 - mirrors mpi4py
        self.request.Wait(self.status)

    def Test(self) -> bool:  # noqa: N802
        return self.request.Test(self.status)



class _Progress:
    """A daemon thread that tests pending MPI requests and completes their work.

    Runs only while a point-to-point future handed out by ``get_future()``
    (or a profiled request) is pending; ``wait()`` does not need it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: list = []  # [LaneWork]
        self._thread: Optional[threading.Thread] = None
        self._stopped = False

    def add(self, work: LaneWork) -> None:
        with self._cond:
            self._pending.append(work)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="polydist-request-progress", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                pending, self._pending = self._pending, []
            still = []
            for work in pending:
                request = work._request
                if request is None:  # completed by wait()
                    continue
                if request.Test():
                    work._request = None
                    work._complete()
                else:
                    still.append(work)
            if still:
                with self._cond:
                    self._pending.extend(still)
                time.sleep(1e-4)  # poll politely: the rank's compute thread shares the core

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()


PROGRESS = _Progress()  # the one progress thread of every group's requests
