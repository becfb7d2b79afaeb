"""The work lane (``backends/lane.py``) and its handles (``backends/work.py``), without MPI: order, errors, futures, timeouts."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch

from polydist.backends.lane import Lane

pytestmark = pytest.mark.timeout(60)


def test_queued_work_runs_in_call_order_and_completes_futures():
    lane, seen, gate = Lane("mpi4py"), [], threading.Event()
    first = lane.run(lambda: (gate.wait(10), seen.append(1)), "a", False, "t", ())
    works = [lane.run(lambda i=i: seen.append(i), i, False, "t", ()) for i in range(2, 6)]
    assert not first.is_completed() and lane.pending == 5  # held by the gate: really pending
    fut = works[-1].get_future()
    gate.set()
    assert fut.wait() == 5  # completed by the lane; nobody called wait()
    assert seen == [1, 2, 3, 4, 5] and lane.pending == 0
    assert all(w.is_completed() and w.is_success() for w in [first, *works])
    lane.stop()


def test_blocking_call_runs_inline_when_idle_and_queues_behind_pending_work():
    lane, seen, gate = Lane("mpi4py"), [], threading.Event()
    inline = lane.run(lambda: seen.append(threading.current_thread().name), None, True, "t", ())
    assert inline.is_completed() and seen == [threading.current_thread().name]
    lane.run(lambda: gate.wait(10), None, False, "t", ())
    behind = lane.run(lambda: seen.append("behind"), None, True, "t", ())
    assert not behind.is_completed()  # queued, not run ahead of the pending one
    gate.set()
    behind.wait()
    assert seen[-1] == "behind"
    lane.stop()


def test_errors_reach_wait_and_the_future_and_the_lane_goes_on():
    lane = Lane("mpi4py")

    def boom():
        raise ValueError("bad buffer")

    work = lane.run(boom, None, False, "t", ())
    fut = work.get_future()
    with pytest.raises(ValueError, match="bad buffer"):
        work.wait()
    with pytest.raises(ValueError, match="bad buffer"):
        work.wait()  # every wait re-raises
    assert isinstance(work.exception(), ValueError) and not work.is_success()
    with pytest.raises(Exception, match="bad buffer"):
        fut.wait()
    assert lane.run(lambda: None, 7, False, "t", ()).get_future().wait() == 7  # next work still runs
    lane.stop()


def test_wait_with_a_timeout_names_the_backend():
    lane, gate = Lane("mpi"), threading.Event()
    work = lane.run(lambda: gate.wait(10), None, False, "t", ())
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="mpi: operation timed out"):
        work.wait(timedelta(milliseconds=200))
    assert time.monotonic() - start < 5
    gate.set()
    assert work.wait() is True
    lane.stop()


@pytest.mark.skipif(tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 13),
                    reason="torch's profiler before 2.13 drops a record function closed on another thread (the lane's "
                    "worker): measured on 2.9 (make test-xla's venv) and 2.11 (the GPU machine's); 2.13 keeps it")
def test_profiled_work_is_an_async_event_with_input_shapes():
    lane = Lane("mpi")
    t = torch.ones(2, 3)
    with torch.profiler.profile(record_shapes=True) as prof:
        lane.run(lambda: t.add_(1), [t], True, "all_reduce", [t]).wait()  # blocking, but profiled: queued
    events = [e for e in prof.events() if e.name == "mpi:all_reduce"]
    assert [(e.input_shapes, e.is_async) for e in events] == [([[2, 3]], True)]
    lane.stop()


def test_abort_fails_the_queued_work_and_leaves_the_running_one():
    lane, gate, started, ran = Lane("mpi4py"), threading.Event(), threading.Event(), []
    running = lane.run(lambda: (started.set(), gate.wait(10), ran.append("running")), None, False, "t", ())
    queued = lane.run(lambda: ran.append("queued"), None, False, "t", ())
    assert started.wait(10)  # the first is running on the lane's thread, the second queued behind it
    lane.abort("aborted before it started")
    with pytest.raises(RuntimeError, match="aborted before it started"):
        queued.wait()
    gate.set()
    running.wait()
    assert ran == ["running"] and lane.pending == 0
    lane.stop()
