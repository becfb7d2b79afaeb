"""A persistent world of N gloo ranks that runs test functions on every rank.

Starting processes that import torch takes seconds on this machine, so each
world size is started once per test session and reused. ``World.run(fn,
*args)`` calls ``fn(*args)`` on every rank and returns the per-rank results;
an exception on any rank fails the test with that rank's traceback. A world
that does not answer within the timeout is killed (and restarted for the next
test), so a hang fails fast.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import time
import traceback
from typing import Any, Callable

ANSWER_TIMEOUT_S = 60.0
COLLECTIVE_TIMEOUT_S = 45.0


def _serve(rank: int, size: int, init_method: str, how: str, conn) -> None:
    os.environ.pop("OMP_NUM_THREADS", None)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    import polydist

    if how == "polydist":
        polydist.initialize("gloo", init_method=init_method, rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT_S)
    else:  # the user's own init_process_group, for adoption tests
        from datetime import timedelta

        dist.init_process_group(
            "gloo", init_method=init_method, rank=rank, world_size=size, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        )
    conn.send(("ready", None))
    while True:
        msg = conn.recv()
        if msg is None:
            break
        fn, args = msg
        try:
            conn.send((True, fn(*args)))
        except BaseException:  # noqa: BLE001 - report everything to the test
            conn.send((False, traceback.format_exc()))


class WorldError(AssertionError):
    pass


class World:
    def __init__(self, size: int, how: str = "polydist") -> None:
        self.size, self.how = size, how
        self._dir = tempfile.mkdtemp(prefix="polydist-world-")
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for rank in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_serve, args=(rank, size, f"file://{self._dir}/store", how, child), daemon=True
            )
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        self._collect(ANSWER_TIMEOUT_S * 2)  # the "ready" messages
        self.broken = False

    def _collect(self, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        answers = []
        for rank, conn in enumerate(self.conns):
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                self.close()
                raise WorldError(f"rank {rank} of the {self.size}-rank world did not answer within {timeout:.0f} s")
            answers.append(conn.recv())
        return answers

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = ANSWER_TIMEOUT_S) -> list:
        """``[fn(*args) on rank 0, on rank 1, ...]``; raises with each failing rank's traceback."""
        for conn in self.conns:
            conn.send((fn, args))
        answers = self._collect(timeout)
        failed = [(rank, tb) for rank, (ok, tb) in enumerate(answers) if not ok]
        if failed:
            raise WorldError("\n".join(f"--- rank {rank} ---\n{tb}" for rank, tb in failed))
        return [value for _, value in answers]

    def close(self) -> None:
        self.broken = True
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
        shutil.rmtree(self._dir, ignore_errors=True)


class WorldPool:
    """Session-wide cache of worlds, by (size, how); broken worlds are replaced."""

    def __init__(self) -> None:
        self._worlds: dict = {}

    def get(self, size: int, how: str = "polydist") -> World:
        world = self._worlds.get((size, how))
        if world is None or world.broken:
            world = self._worlds[(size, how)] = World(size, how)
        return world

    def close(self) -> None:
        for world in self._worlds.values():
            if not world.broken:
                world.close()
