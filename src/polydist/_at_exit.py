"""What polydist does at interpreter exit: leave the world while the interpreter is whole (a workaround for
PyTorch's gloo), and, in the processes of its launchers, skip freeing torch's objects one by one.

PyTorch 2.13 with gloo aborts now and then at interpreter exit ("terminate
called without an active exception", SIGABRT; about 1 exit in 100 on a
loaded machine), which a launcher then reports as a failed rank. The core
dump shows why: a gloo worker thread is still destroying the last
collective's work object when the main thread starts finalizing; its decref
of an output tensor needs the GIL, CPython ends a thread that asks for the
GIL during finalization, and the forced unwind through torch's ``noexcept``
worker loop calls ``std::terminate``. Freeing the group at exit joins its
worker threads while the interpreter is whole (polydist's state may hold the
last reference, also to a group the user destroyed), and a short sleep
releases the GIL to workers of groups others still hold (a DDP model's
reducer).

:func:`no_teardown`: the launchers' processes and their workers end without
the interpreter's last collections (seconds on a loaded machine).
"""

from __future__ import annotations

import atexit
import gc
import time
from typing import Callable, Optional

__all__ = ["arm", "no_teardown"]

_leave: Optional[Callable[[], None]] = None
_frozen = False


def arm(leave: Callable[[], None]) -> None:
    """Run ``leave`` (destroy the group polydist created, drop its state) at interpreter exit.

    Registered again at each call, so that it runs before the exit handlers
    of anything imported earlier, mpi4py's ``MPI_Finalize`` included.
    """
    global _leave
    _leave = leave
    atexit.unregister(_at_exit)
    atexit.register(_at_exit)


def _at_exit() -> None:
    gc.collect()  # a DDP model is often cyclic garbage by now: free it, and its reference to the group, here
    if _leave is not None:
        _leave()
    time.sleep(0.1)  # also after an explicit finalize(): gloo's workers may still be finishing the last work


def no_teardown() -> None:
    """At interpreter exit, once the exit handlers registered after this call ran, leave the objects still alive
    to the operating system instead of freeing them one by one.

    With torch imported, the interpreter's last garbage collections free
    every object of torch's and the program's modules: 0.3 s on an idle
    machine, 2 s on a loaded one, during which a failed rank is not yet seen
    as failed by its launcher, and the launcher's exit waits. ``gc.freeze()``
    as the last exit handler makes those collections skip them; exit handlers
    (``atexit``, ``weakref.finalize``), the flushing of open files and the
    finalizers of objects freed by reference counting still run. Called early
    by ``polydist run``, its worker entry and ``spawn``'s processes, so that
    its handler runs after the program's (and after :func:`arm`'s, whose
    collection frees a DDP model and its group).
    """
    global _frozen
    if not _frozen:
        _frozen = True
        atexit.register(gc.freeze)
