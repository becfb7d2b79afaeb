"""The watchdog of polydist's Python process groups, in one process: a stuck operation is named and the job ended.

The group's transport is a stand-in whose barrier blocks; the store is a HashStore; ``_end_job`` records
instead of ending the process. The multi-rank scenarios under MPI are in tests/trace/test_watchdog_mpi.py.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from polydist.backends.python_group import PythonProcessGroup
from polydist.backends.watchdog import WATCHDOG
from polydist.collectives import timeout_error
from polydist.collectives.recorder import RECORDER, as_dict

pytestmark = pytest.mark.timeout(60)


class _Stuck(PythonProcessGroup):
    """A group of 2 ranks (this one is rank 0) whose barrier blocks until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__(0, 2, "stuck")
        self.gate, self.ended = threading.Event(), []

    def _barrier_now(self) -> None:
        self.gate.wait(30)

    def _end_job(self, error: BaseException, text: str) -> None:
        self.ended.append((error, text))
        self.gate.set()


@pytest.fixture
def watched(monkeypatch):
    store = dist.HashStore()
    monkeypatch.setattr(WATCHDOG, "store", store)
    monkeypatch.setattr(WATCHDOG, "_fired", False)
    monkeypatch.setattr(WATCHDOG, "_answered", False)
    monkeypatch.setattr(WATCHDOG, "_polling", False)  # this process plays rank 0 only
    monkeypatch.setattr(timeout_error, "on_timeout", [])
    group = _Stuck()
    group._configure([0, 1], timedelta(seconds=0.4))
    yield group, store
    group.gate.set()
    group.shutdown()


def test_an_operation_past_its_timeout_is_named_with_the_rank_that_did_not_arrive(watched):
    group, store = watched
    store.set("polydist/watchdog/last/0-1/1", "0")  # rank 1's answer: it never started an operation here
    start = time.monotonic()
    work = group.barrier(dist.BarrierOptions())  # asyncOp: queued on the lane, which blocks
    while not group.ended and time.monotonic() - start < 20:
        time.sleep(0.05)
    [(error, text)] = group.ended
    assert time.monotonic() - start < 0.4 + 5  # the check interval and the grace, not more
    assert isinstance(error, RuntimeError) and error.missing == [1] and error.waiting == [0]
    assert "barrier #1" in str(error) and "ranks [1] did not arrive" in str(error), error
    assert "rank 0 #1, rank 1 #0" in str(error) and "cannot be cancelled" in str(error), error
    assert store.get("polydist/watchdog/alarm").decode().startswith("rank 0: barrier #1")
    work.wait()
    [entry] = [as_dict(r) for r in RECORDER.records()[0] if r[2] is group._tag]
    assert entry["state"] == "failed" and "did not arrive" in entry["error"]


def test_an_operation_shorter_than_its_timeout_raises_no_alarm(watched):
    group, _ = watched
    group._set_default_timeout(timedelta(seconds=3))
    threading.Timer(1.0, group.gate.set).start()  # longer than the check interval, shorter than the timeout
    group.barrier(dist.BarrierOptions()).wait()
    time.sleep(0.8)
    assert group.ended == []
