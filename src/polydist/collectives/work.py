"""Handles of asynchronous operations (``async_op=True``, ``isend``, ``irecv``).

A :class:`Work` wraps the ``torch.distributed`` work objects a call started
and a ``finish`` step (copy-back, unpadding, division for AVG, decoding) that
runs once, on the first ``wait()``. Its ``wait()`` returns the operation's
result, which ``torch.distributed``'s own handles do not.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Optional, Sequence, Union

from . import timeouts

__all__ = ["Work"]

_PENDING = object()


def _unnamed(exc: RuntimeError) -> None:
    return None  # a handle outside the pipeline (value collectives, serial runs) names no timeout


class Work:
    """Handle of an operation started with ``async_op=True`` (or by ``isend``/``irecv``).

    ``wait(timeout=None)`` blocks until the operation is complete on this rank
    and returns its result (the same value the synchronous call returns);
    later calls return the same result. ``is_completed()`` polls without
    blocking. Before ``wait()`` returns, output tensors must not be read and
    input tensors must not be modified (as with ``torch.distributed``).
    """

    def __init__(self, works: Sequence[Any] = (), finish: Optional[Callable[[], Any]] = None) -> None:
        self._works = [w for w in works if w is not None]
        self._finish = finish
        self._result: Any = _PENDING
        # Set by the collective pipeline: turns a backend error into a better one (a timeout that
        # names the ranks that did not arrive), or returns None to let it pass.
        self.explain: Optional[Callable[[RuntimeError], Optional[Exception]]] = None
        # Set by the collective pipeline: (recorder, record) of the flight recorder, marked
        # completed or failed when the wait ends.
        self.record: Optional[tuple] = None

    @classmethod
    def done(cls, result: Any) -> "Work":
        """A handle that is already complete (serial runs, value collectives)."""
        work = cls()
        work._result = result
        return work

    def wait(self, timeout: Union[None, float, timedelta] = None) -> Any:
        """Wait for completion and return the result.

        Args:
            timeout: seconds (or a ``timedelta``) to wait for each underlying
                transfer; None waits up to the process group's timeout.

        Raises:
            CollectiveTimeoutError: the group's timeout expired in a
                collective; names the ranks that did not arrive.
            RuntimeError: from the backend, e.g. when a peer died.
        """
        if self._result is _PENDING:
            if isinstance(timeout, (int, float)):
                timeout = timedelta(seconds=timeout)
            try:
                for w in self._works:
                    if timeout is None:
                        w.wait()
                    else:
                        w.wait(timeout)
                result = self._finish() if self._finish is not None else None
            except BaseException as exc:
                named = timeouts.failed(exc, self.explain or _unnamed, self.record)
                if named is None:
                    raise
                raise named from exc
            self._result = result
            if self.record is not None:
                rec, record = self.record
                rec.end(record)
        return self._result

    def finished(self) -> bool:
        """Whether the result is already there (a handle made by :meth:`done`, or waited)."""
        return self._result is not _PENDING

    def is_completed(self) -> bool:
        """Whether every underlying transfer has finished (``wait()`` then returns without blocking)."""
        return self._result is not _PENDING or all(w.is_completed() for w in self._works)

    def __repr__(self) -> str:
        state = "completed" if self.is_completed() else "pending"
        return f"<polydist.Work {state}>"
