"""Exception types raised by polydist."""

from __future__ import annotations

from typing import Optional

__all__ = [
    "PolydistError",
    "NotInitializedError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "WorkerFailedError",
    "InvalidGroupError",
    "InvalidArgumentError",
    "WorldMismatchError",
]


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


class CollectiveTimeoutError(PolydistError):
    """A collective waited longer than the group's timeout; says which ranks did not arrive.

    Raised in place of the backend's timeout ``RuntimeError`` (it is one, so
    ``except RuntimeError`` still catches it) by every rank that timed out.
    Attributes: ``collective`` (e.g. "all_reduce"), ``seq`` (polydist's count
    of collectives on the group, from 1), ``group`` (global ranks), ``rank``
    (this rank), ``timeout_s`` (seconds, None if unknown), ``waiting`` (ranks
    that timed out in the same call) and ``missing`` (the others; None when
    the store that ranks compare notes through could not be reached).
    """

    def __init__(
        self,
        message: str,
        *,
        collective: str,
        seq: int,
        group: tuple,
        rank: int,
        timeout_s: float | None,
        waiting: list | None,
        missing: list | None,
    ) -> None:
        super().__init__(message)
        self.collective, self.seq, self.group, self.rank = collective, seq, tuple(group), rank
        self.timeout_s, self.waiting, self.missing = timeout_s, waiting, missing


class WorkerFailedError(PolydistError):
    """A launched worker raised or died; the launcher stopped the others.

    ``failures`` maps each failed global rank to ``(exit code, traceback or
    message)``; ``root_rank`` is the rank whose failure caused the others
    (-1 when it is not known here: a rank on another node, or a process
    mpiexec could not tie to a rank); ``fates`` maps a rank that ended with
    no traceback to how the launcher saw it end (``"killed by SIGKILL, pid
    N"``, ``"frozen: stopped (process state T) for 10.0 s, pid N"``), for the
    report's first line;
    ``str()`` names it and shows each failed rank with its traceback.
    """

    def __init__(self, message: str, failures: dict, root_rank: int, fates: Optional[dict] = None) -> None:
        super().__init__(message)
        self.failures = dict(failures)
        self.root_rank = root_rank
        self.fates = dict(fates or {})


class InvalidGroupError(TypeError, ValueError, PolydistError):
    """A ``group`` argument, or a rank list, of the wrong type.

    A ``TypeError`` as in torch.distributed, and a ``ValueError`` as in
    ``ignite.distributed`` (which raises that for a bad group), so an
    ``except`` written for either catches it; a :class:`PolydistError` like
    polydist's other errors.
    """


class InvalidArgumentError(ValueError, PolydistError):
    """A tensor argument that a process group polydist writes (``mpi4py``, ``horovod``, ``xla-tpu``) refuses:
    a device it cannot move, another dtype or element count than torch's rule asks, a list of the wrong
    length, split sizes that do not split dim 0. Raised by the call, before anything is sent.

    A ``RuntimeError`` as torch's own backends raise for the same mistakes
    (``ProcessGroupGloo``/``ProcessGroupMPI``'s checks), and a ``ValueError``
    as these groups raised before, so an ``except`` written for either
    catches it; a :class:`PolydistError` like polydist's other errors.
    """


class WorldMismatchError(PolydistError):
    """The process group's world is not the one the launcher announced: never a silent world of one.

    Raised by :func:`polydist.initialize`, by adoption of a group the program
    or a framework made, and by the ``mpi`` stand-in's group creation, when a
    launcher announced a world of several processes (torchrun's ``WORLD_SIZE``
    and ``RANK``, Slurm's, an MPI launcher's, Kubeflow's) and the group has
    another size, or gives this process another rank. ``launcher`` names the
    launcher, ``announced`` and ``group`` are ``(rank, world_size)`` pairs (the
    group's is ``(0, 1)`` when raised before MPI would have made this process a
    world of its own), ``backend`` is the group's backend.
    """

    def __init__(self, message: str, *, launcher: str, announced: tuple, group: tuple, backend: str) -> None:
        super().__init__(message)
        self.launcher, self.announced, self.group, self.backend = launcher, tuple(announced), group, backend
