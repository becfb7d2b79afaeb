"""Work handles of polydist's Python backends (mpi4py, horovod, xla-tpu) and the threads that complete them (internal).

Collectives of one communicator run in call order on that communicator's
:class:`Lane`, a worker thread, as in PyTorch's own ``ProcessGroupMPI``: a
call with ``async_op=True`` returns at once with pending :class:`LaneWork`, and
the worker runs MPI's blocking collective while the caller computes (mpi4py
releases the GIL inside MPI). DistributedDataParallel relies on this to
overlap gradient all-reduces with the backward pass. A blocking call
(``opts.asyncOp`` False, as ``torch.distributed`` sets for ``async_op=False``)
finding its lane idle runs inline instead, which saves the thread hand-off;
one finding work queued goes behind it, so the order stays the call order.

Point-to-point calls are MPI requests (``Isend``/``Irecv``) started on the
caller's thread; the :class:`_Progress` thread completes their futures and
profiler events when nobody calls ``wait()``.

Profiling: while the autograd profiler or ``torch.profiler`` records, each
operation opens a record function named ``"<backend>:<op>"`` (``mpi:all_reduce``,
``mpi:send``, ...) with its input tensors, closed by the thread that completes
the operation: an asynchronous event with the input shapes, as PyTorch's
built-in backends record.
"""

from __future__ import annotations

import collections
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import torch
from torch.futures import Future

from .._torch import WorkBase
from ..collectives import recorder
from ..collectives.recorder import RECORDER, START, _record_op

__all__ = ["Lane", "LaneWork", "DoneWork", "StatusRequest", "profiling", "run_recorded"]

_enter = torch._C._autograd._record_function_with_args_enter
_exit = torch._C._autograd._record_function_with_args_exit
_now = time.time
profiling: Callable[[], bool] = torch._C._autograd._profiler_enabled


def _record(backend: str, op: str, tensors: Sequence[torch.Tensor]) -> Any:
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
                _progress.add(self)
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
    work = LaneWork(result, request, queued=True, record=_record(backend, op, tensors), backend=backend, **kw)
    work._trace = trace
    _progress.add(work)
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


# ---------------------------------------------------------------- threads


class Lane:
    """One communicator's collectives, run in call order on one worker thread.

    ``pending`` counts operations handed to the worker and not finished; the
    caller's thread reads it (under the GIL) to decide whether a blocking
    call may run inline. The worker starts on first use and ends at exit.
    ``current`` and ``since``: the record of the operation running now and
    when it started, which the watchdog (:mod:`polydist.backends.watchdog`) reads.
    """

    # fields, not a dict: the compiled run_recorded sets current and since at their offsets
    __slots__ = ("backend", "pending", "current", "since", "done", "_queue", "_cond", "_thread")

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.pending = 0
        self.current: Optional[list] = None  # the record of the operation running now (inline or on the worker)
        self.since = 0.0  # when it started running (time.time())
        self.done = DoneWork(None, backend=backend)  # what every blocking call run inline returns (DoneWork)
        self._queue: collections.deque = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._thread: Optional[threading.Thread] = None

    def run(
        self, body: Callable[[], None], result: Any, blocking: bool, op: str, tensors: Sequence[torch.Tensor],
        record: Optional[list] = None, owned: bool = False,
    ) -> LaneWork:  # fmt: skip
        """Run ``body`` (the MPI calls) in order with this lane's other work; LaneWork for its ``result``.

        Inline when ``blocking`` and nothing is queued and no profiler records,
        returning the lane's one :class:`DoneWork` (``body``'s errors raised here);
        otherwise queued. Errors raised by ``body`` reach ``wait()`` and the future.
        ``op`` names the profiler event ``"<backend>:<op>"``. ``record``: the
        operation's flight-recorder record, shown to the watchdog while ``body``
        runs (:attr:`current`), and marked completed or failed here when ``owned``.
        """
        profiled = profiling()
        if blocking and not self.pending and not profiled:
            self.inline(body, record, owned)
            return self.done.completed(result)
        event = _record(self.backend, op, tensors) if profiled else None
        work = LaneWork(result, queued=True, record=event, backend=self.backend)
        with self._cond:
            self.pending += 1
            self._queue.append((body, work, record, owned))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"polydist-{self.backend}-lane", daemon=True)
                self._thread.start()
                _lanes.append(self)
            self._cond.notify()
        return work

    def inline(self, body: Callable[[], None], record: Optional[list], owned: bool) -> None:
        """Run ``body`` on the caller's thread, its ``record`` (if any) shown to the watchdog from its start."""
        if record is None:
            body()
            return
        error = self._execute(body, record, owned, record[START])
        if error is not None:
            raise error

    def inline_call(self, record: list, closer: Any, fn: Callable[..., Any], *args: Any) -> None:
        """:meth:`inline` of ``fn(*args)`` with a ``record`` (not None), flattened, for the lean all-reduce's path,
        where each Python call saved is a tenth of the MPI call's time. ``closer``: the recorder that marks the
        record completed or failed (``fn``'s error is re-raised), or None where the caller's pipeline does."""
        self.since, self.current = record[START], record  # since first: the watchdog reads current, then since
        try:
            fn(*args)
        except BaseException as e:
            self.current = None
            if closer is not None:
                closer.fail(record, e)
            raise
        self.current = None
        if closer is not None:
            closer.end(record)

    def _execute(
        self, body: Callable[[], None], record: Optional[list], owned: bool, since: float,
    ) -> Optional[BaseException]:  # fmt: skip
        """Run ``body`` with ``record`` as :attr:`current` from ``since``; close the record when ``owned``; return
        the error ``body`` raised (inline re-raises it, the worker hands it to the waiter)."""
        if record is not None:
            self.since, self.current = since, record  # since first: the watchdog reads current, then since
        error: Optional[BaseException] = None
        try:
            body()
        except BaseException as e:  # noqa: BLE001 - returned to the caller, whatever it is
            error = e
        self.current = None
        if owned:
            RECORDER.close(record, error)
        return error

    def call(self, body: Callable[[], None], op: str, tensors: Sequence[torch.Tensor], record: Optional[list] = None,
             owned: bool = False) -> None:  # fmt: skip
        """Run ``body`` now, in order with the queued work (inline when idle, as :meth:`run`), and return when done.

        :meth:`run` and ``wait()`` minus the :class:`LaneWork` handle, which costs as
        much as a small MPI call: polydist's blocking byte exchanges take this.
        """
        if not self.pending and not profiling():
            self.inline(body, record, owned)
        else:
            self.run(body, None, True, op, tensors, record, owned).wait()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                body, work, record, owned = self._queue.popleft()
            if body is None:
                return
            error = self._execute(body, record, owned, _now())  # the timeout runs from here, not from the queueing
            with self._cond:
                self.pending -= 1  # before completing: a future's callback may issue the next call
            work._complete(error)

    def abort(self, why: str) -> None:
        """Fail the operations queued and not started with ``RuntimeError(why)``; the running one cannot be stopped."""
        with self._cond:
            dropped = [entry for entry in self._queue if entry[0] is not None]
            self._queue = collections.deque(entry for entry in self._queue if entry[0] is None)
            self.pending -= len(dropped)
        for _, work, record, owned in dropped:
            error = RuntimeError(why)
            if owned:
                RECORDER.fail(record, error)
            work._complete(error)

    def stop(self, seconds: float = 1.0) -> None:
        """End the worker once the queue drains (at exit, before ``MPI_Finalize``); waits at most ``seconds``."""
        with self._cond:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._queue.append((None, None, None, False))
            self._cond.notify()
        thread.join(seconds)


def _run_recorded(rec: Any, lane: Lane, res: Any, name: str, seq: int, op: Any, x: Any, ring: bool,
                  fn: Callable[..., Any], *args: Any) -> None:  # fmt: skip
    """Run ``fn(*args)`` on the caller's thread as operation ``name`` of the group tagged ``res`` (blocking,
    nothing queued on ``lane``): recorded (:func:`~polydist.collectives.recorder.record_op`), shown to the
    watchdog as ``lane``'s current operation while it runs, and marked completed or failed (``fn``'s error
    is re-raised). This is the Python version; ``run_recorded`` is the compiled one where it was built."""
    lane.inline_call(_record_op(rec, res, name, seq, op, None, x, False, ring), rec, fn, *args)


# A lean path's whole operation, recorded and watched, in one call (see _run_recorded): the MPI group's all_reduce
# on the caller's thread, where each Python call saved is a tenth of the MPI call's time.
run_recorded = _run_recorded if recorder.COMPILED is None else recorder.COMPILED.run_recorded
if recorder.COMPILED is not None:
    recorder.COMPILED.configure_lane(Lane)


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


_progress = _Progress()
_lanes: list = []


def stop_threads() -> None:
    """Stop the worker threads before MPI is finalized (registered at exit once mpi4py is imported, so it runs first)."""
    _progress.stop()
    for lane in _lanes:
        lane.stop()
