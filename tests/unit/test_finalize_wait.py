"""``finalize``'s wait for the other ranks (``polydist.teardown._wait_key``): one ``store.wait`` unless a hook
(MPI's progress) asks to be called while it waits."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from polydist import teardown

pytestmark = pytest.mark.timeout(60)


class _Counting:
    """A store that counts its ``check`` and ``wait`` calls."""

    def __init__(self) -> None:
        self.store, self.checks, self.waits = dist.HashStore(), 0, 0

    def check(self, keys):
        self.checks += 1
        return self.store.check(keys)

    def wait(self, keys, timeout):
        self.waits += 1
        return self.store.wait(keys, timeout)

    def set(self, key, value):
        self.store.set(key, value)


def _set_later(store, key, after_s):
    timer = threading.Timer(after_s, store.set, (key, b"1"))
    timer.start()
    return timer


def test_without_a_hook_that_wants_calls_it_waits_on_the_store(monkeypatch):
    calls = []
    monkeypatch.setattr(teardown, "while_leaving", [lambda: calls.append(1) or False])
    store = _Counting()
    _set_later(store, "k", 0.5)
    teardown._wait_key(store, "k", 10)
    assert store.store.check(["k"])
    assert store.waits == 1 and store.checks == 1 and calls == [1]  # no look every _LOOK_S


def test_a_hook_that_wants_calls_is_called_until_the_key_is_set(monkeypatch):
    calls = []
    monkeypatch.setattr(teardown, "while_leaving", [lambda: calls.append(1) or True])
    store = _Counting()
    _set_later(store, "k", 0.5)
    teardown._wait_key(store, "k", 10)
    assert store.waits == 0
    assert len(calls) >= 0.5 / teardown._LOOK_S / 2  # called every _LOOK_S, give or take a loaded machine


@pytest.mark.parametrize("wants_calls", [False, True])
def test_the_limit_holds(monkeypatch, wants_calls):
    monkeypatch.setattr(teardown, "while_leaving", [lambda: wants_calls])
    start = time.monotonic()
    with pytest.raises((TimeoutError, dist.DistStoreError)):
        teardown._wait_key(_Counting(), "never", 0.3)
    assert time.monotonic() - start < 5
