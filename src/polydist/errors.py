"""Exception types raised by polydist."""

from __future__ import annotations

__all__ = ["PolydistError", "NotInitializedError", "CollectiveMismatchError", "WorkerFailedError"]


class PolydistError(RuntimeError):
    """Base class of polydist's own runtime errors."""


class NotInitializedError(PolydistError):
    """A collective was called in a launched job before ``initialize()``.

    Raised instead of silently running serially: the environment says this
    process is one rank of several, so a serial result would be wrong.
    """


class CollectiveMismatchError(PolydistError):
    """Ranks disagreed about a collective (shapes, dtypes, op, root, call).

    ``calls`` maps each rank to a description of what it passed.
    """

    def __init__(self, message: str, calls: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.calls = dict(calls or {})


class WorkerFailedError(PolydistError):
    """A launched worker raised or died; the launcher stopped the others.

    ``failures`` maps each failed global rank to ``(exit code, traceback or
    message)``; ``root_rank`` is the rank whose failure caused the others;
    ``str()`` names it and shows each failed rank with its traceback.
    """

    def __init__(self, message: str, failures: dict, root_rank: int) -> None:
        super().__init__(message)
        self.failures = dict(failures)
        self.root_rank = root_rank
