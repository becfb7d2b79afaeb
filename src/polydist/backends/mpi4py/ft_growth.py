"""A lost replica group's replacement, spawned beside the training: the survivors do not wait for it to start.

``MPI_Comm_spawn`` is collective and blocks until the new process has started
(Python, torch: seconds). :class:`Growth` runs it, and the merge with the new
process, on a thread of its own over a duplicate of the live communicator,
while the live ranks go on training on the original (``MPI_THREAD_MULTIPLE``).
The live ranks learn together that every one of them is done through the
step's commit vote (:meth:`Growth.vote_bits`), and switch to the merged
communicator at the same step; a replacement they give up (the spawn failed
on some rank, a rank was lost meanwhile, the job ended first) is told to leave
by a revoke of the merged communicator, on which it waits for its state.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Optional

from . import _mpi, ulfm

__all__ = ["Growth", "DONE", "GROWN"]

DONE, GROWN = 2, 4  # bits of the commit vote besides bit 0 (no error): this rank's spawn ended; it succeeded


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
                    self._revoke()
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
            self._revoke()

    def _revoke(self) -> None:
        if self.merged is not None:
            with contextlib.suppress(Exception):
                self.merged.Revoke()
