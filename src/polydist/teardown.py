"""The end of a world polydist made: its ranks meet on the store (finalize's barrier), then its group is destroyed.

:func:`destroy` is called by :func:`polydist.live_world.leave` once the
world's state is dropped: by ``finalize()``, which waits for every rank, and
at the exit of a process that did not call it, which only counts itself out.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from . import _torch, settings
from ._state import World
from .backends import registry

__all__ = ["destroy", "while_leaving"]

# A hook of the modules that build on this one, filled in polydist._wiring, called with no argument over and
# over while finalize waits for the other ranks on the store (MPI's progress); a hook returns whether it wants
# to be called again (False: finalize waits on the store alone).
while_leaving: list = []

_leaves = 0  # finalize barriers so far in this process: the same count on every rank of a job
_COUNT_OUT_S = 2.0  # how long an exit without waiting may spend counting itself out on the store
_LOOK_S = 0.02  # between looks at the store while finalize waits
_LAST_OUT_S = 10.0  # how long a rank waits for the others to read the store before it may take it down


def destroy(state: World, wait: bool) -> None:
    """Destroy the group of ``state``'s world, which polydist made, after every rank reached finalize (``wait``),
    or once this rank counted itself out (not ``wait``: an exit after an error)."""
    meet = state.size > 1 and state.store_shared  # else nobody to wait for, or no store to meet on
    if meet and wait:
        _wait_for_every_rank(state)
    elif meet:  # counted out in a thread of its own: a store that does not answer must not hold the exit
        out = threading.Thread(target=_wait_for_every_rank, args=(state, False), daemon=True)
        out.start()
        out.join(_COUNT_OUT_S)
    dist.destroy_process_group()
    registry.after_destroy_all()  # a backend's runtime that initialize() started (Horovod)


def _wait_for_every_rank(state: World, wait: bool = True) -> None:
    """Return when every rank of ``state``'s world has reached ``finalize`` (a barrier on the job's store).

    Each rank adds itself to a counter; the last to arrive sets a key the
    others wait for. Then each says it has left, and every rank waits (briefly)
    for all to have left, so that the rank serving the store does not close it
    while a peer still waits for its answer. Without ``wait`` (at exit, after
    an error) the rank only counts itself in and out, so that peers already
    in ``finalize`` need not wait out the timeout for a rank that is gone;
    rank 0 then still waits (at most ``_COUNT_OUT_S``) for the others to have
    counted out before its exit takes the store down.
    """
    global _leaves
    _leaves += 1
    run = ".".join(os.environ.get(k, "") for k in ("TORCHELASTIC_RESTART_COUNT", settings.RESTART_COUNT.name))
    key = f"polydist/finalize/{run}/{_leaves}"
    limit = state.timeout.total_seconds() if state.timeout else _torch.group_timeout(state.pg) or 1800.0
    try:
        store = _torch.default_store()
        if store.add(key, 1) == state.size:
            store.set(f"{key}/all", b"1")
        if wait:
            _wait_key(store, f"{key}/all", limit)
    except Exception as exc:  # noqa: BLE001 - a rank gone, a store gone: leave anyway, as before
        if wait:
            print(f"polydist: finalize: rank {state.rank} did not see every rank of the world of {state.size} reach "
                  f"finalize within {limit:g} s ({type(exc).__name__}: {str(exc)[:200]}); destroying the group "
                  f"anyway", file=sys.stderr, flush=True)  # fmt: skip
        return
    try:
        if store.add(f"{key}/out", 1) < state.size:
            # Rank 0 usually serves the store (polydist's rendezvous, torch's env:// without an agent): at exit too it
            # waits, briefly, for the others to be done with it, so that their last add does not meet a closed store.
            if wait:
                store.wait([f"{key}/out/all"], timedelta(seconds=_LAST_OUT_S))
            elif state.rank == 0:  # looks, not a wait: torch's store prints two warnings when a wait times out,
                deadline = time.monotonic() + _COUNT_OUT_S  # and at exit after an error that may well happen
                while not store.check([f"{key}/out/all"]) and time.monotonic() < deadline:
                    time.sleep(_LOOK_S)
        else:
            store.set(f"{key}/out/all", b"1")
    except Exception:  # noqa: BLE001 - every rank arrived; the store's host may already be gone
        pass


def _wait_key(store: Any, key: str, limit: float) -> None:
    """Wait at most ``limit`` s for ``key`` on ``store``, running :data:`while_leaving` between short looks.

    Not one ``store.wait``: a transport with weak progress (Open MPI) may
    complete this rank's part of its last collective while a peer's part still
    needs this rank's MPI calls to arrive (seen across two hosts: host 0's ranks
    out of an all_gather and waiting here, host 1's still in it, for ever).
    Without a hook that asks to be called again (every backend but a live
    MPI), it is one ``store.wait``: no look at the store every
    ``_LOOK_S`` from every rank, which at scale loads the store's host.
    """
    deadline = time.monotonic() + limit
    while not store.check([key]):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{key} not set within {limit:g} s")
        if not any([hook() for hook in while_leaving]):  # a list: every hook runs
            store.wait([key], timedelta(seconds=remaining))
            return
        time.sleep(_LOOK_S)
