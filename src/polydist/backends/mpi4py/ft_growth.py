"""A lost replica group's replacement, spawned beside the training: the survivors do not wait for it to start.

``MPI_Comm_spawn`` is collective and blocks until the new process has started
(Python, torch: seconds). :class:`Growth` runs it, and the merge with the new
process, on a thread of its own over a duplicate of the live communicator,
while the live ranks go on training on the original (``MPI_THREAD_MULTIPLE``).
The live ranks learn together that every one of them is done through the
step's commit vote (:meth:`Growth.vote_bits`), and switch to the merged
communicator at the same step; a replacement they give up (the spawn failed
on some rank, a rank was lost meanwhile, the job ended first) is told to leave
on the merged communicator, on which it waits for its state: a state of
length 0 (:data:`LEAVE`), then a barrier, so that the live ranks go on (or end)
only once it has left ``MPI_Intercomm_merge``. A bare revoke there raced the
replacement's own merge, which then crashed (Open MPI 5.0.11: a segfault in
``MPI_Intercomm_merge``, about 1 run in 7); the revoke stays the fallback,
after :data:`_LEAVE_S`, for a replacement that never answers.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Optional

import numpy as np

from . import _mpi, ulfm

__all__ = ["Growth", "DONE", "GROWN", "LEAVE", "leave"]

DONE, GROWN = 2, 4  # bits of the commit vote besides bit 0 (no error): this rank's spawn ended; it succeeded
LEAVE = 0  # the length of the state the live ranks announce to a replacement they give up (a real one is >= 1)
_LEAVE_S = 10.0  # how long the live ranks wait for a given-up replacement's barrier before revoking


class Growth:
    """The spawn of ``replica``'s replacement, under way on a thread (see the module docstring).

    Collective to create (a ``Dup`` of ``comm``, on the caller's thread, in step on every live rank).
    ``command``: the replacement's command line; ``env``: what joins its environment; ``host``: where to start
    it (Open MPI's ``host`` spawn key; None: where Open MPI maps it).
    """

    def __init__(self, comm: Any, replica: int, command: list, env: dict, host: Optional[str] = None) -> None:
        MPI = _mpi.mpi()
        self.replica = replica
        self.comm = comm.Dup()
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.merged: Optional[Any] = None
        self.error: Optional[BaseException] = None
        self._done = threading.Event()
        self._lock = threading.Lock()  # give_up vs the thread's merge: the replacement is told either way
        self._given_up = False
        self._thread = threading.Thread(target=self._spawn, args=(command, env, host), name="polydist-ft-spawn", daemon=True)
        self._thread.start()

    def _spawn(self, command: list, env: dict, host: Optional[str]) -> None:
        try:
            info = {"map_by": "slot:oversubscribe", **({"host": host} if host else {})}
            merged = ulfm.grow(self.comm, 1, command[0], command[1:], env=env, info=info)
            with self._lock:
                self.merged = merged
                if self._given_up:  # given up while it was starting
                    self._tell_to_leave()
        except BaseException as exc:  # noqa: BLE001 - the vote makes every live rank give this replacement up
            self.error = exc
        finally:
            self._done.set()

    def vote_bits(self) -> int:
        """This rank's part of the commit vote: :data:`DONE` once its spawn ended, :data:`GROWN` if it succeeded."""
        if not self._done.is_set():
            return 0
        return DONE | (GROWN if self.merged is not None else 0)

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the spawn to end; whether it did."""
        return self._done.wait(seconds)

    def give_up(self) -> None:
        """Tell the replacement to leave, now if it is merged already, else as soon as it is (its wait for the
        state fails: ``MPI_ERR_REVOKED``)."""
        with self._lock:
            self._given_up = True
            self._tell_to_leave()

    def _tell_to_leave(self) -> None:
        if self.merged is not None:
            _send_away(self.merged)


def _send_away(merged: Any) -> None:
    """The live ranks' side of :func:`leave` (collective over ``merged``): announce :data:`LEAVE`, wait (up to
    :data:`_LEAVE_S`) for the replacement's barrier; revoke ``merged`` if it failed or did not come."""
    MPI = _mpi.mpi()
    try:
        # Blocking, as the replacement's receive of a length (a nonblocking collective never matches a blocking
        # one); 8 bytes from the root: sent eagerly, no rank waits on the replacement here
        merged.Bcast([np.array([LEAVE], dtype=np.int64), MPI.INT64_T], root=0)
        request, deadline = merged.Ibarrier(), time.monotonic() + _LEAVE_S
        while not request.Test():
            if time.monotonic() > deadline:
                raise TimeoutError("the given-up replacement did not answer")
            time.sleep(0.005)
    except Exception:  # noqa: BLE001 - failed, revoked or late: the revoke completes whatever is pending
        with contextlib.suppress(Exception):
            merged.Revoke()


def leave(merged: Any) -> None:
    """The replacement's side, once it received :data:`LEAVE` as its state's length: the barrier that lets the
    live ranks go on."""
    with contextlib.suppress(Exception):  # they revoke if it fails: nothing to do but leave
        merged.Ibarrier().Wait()  # nonblocking, as the live ranks' (a blocking barrier would not match it)
