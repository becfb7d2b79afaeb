"""The lane of a Python group (mpi4py, horovod, xla-tpu): its collectives, run in call order on one worker thread (internal).

Collectives of one communicator run in call order on that communicator's
:class:`Lane`, a worker thread, as in PyTorch's own ``ProcessGroupMPI``: a
call with ``async_op=True`` returns at once with pending
:class:`~polydist.backends.work.LaneWork`, and the worker runs MPI's blocking
collective while the caller computes (mpi4py releases the GIL inside MPI).
DistributedDataParallel relies on this to overlap gradient all-reduces with
the backward pass. A blocking call (``opts.asyncOp`` False, as
``torch.distributed`` sets for ``async_op=False``) finding its lane idle runs
inline instead, which saves the thread hand-off; one finding work queued goes
behind it, so the order stays the call order.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Optional, Sequence

import torch

from ..collectives import recorder
from ..collectives.recorder import RECORDER, START, _record_op
from .work import PROGRESS, DoneWork, LaneWork, profiler_event, profiling

__all__ = ["Lane", "run_recorded", "stop_threads"]

_now = time.time


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
        event = profiler_event(self.backend, op, tensors) if profiled else None
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


_lanes: list = []


def stop_threads() -> None:
    """Stop the worker threads before MPI is finalized (registered at exit once mpi4py is imported, so it runs first)."""
    PROGRESS.stop()
    for lane in _lanes:
        lane.stop()
