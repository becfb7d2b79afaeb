"""Process groups: ``new_group``, the ``group`` argument of every collective, and torch's membership rules.

Every collective takes ``group`` as ``None`` (the world), a
``torch.distributed.ProcessGroup``, or a list of global ranks. The rules are
torch.distributed's (PyTorch docs, "Groups"): :func:`new_group` may be called
by every rank; members get the group, non-members get
``GroupMember.NON_GROUP_MEMBER``; a collective called with a group this rank
is not in returns its input unchanged (see
:mod:`polydist.collectives.pipeline`). A rank list maps to one cached group
per distinct list, created with ``use_local_synchronization=True`` so only its
members need to take part, and named from its ranks alone (see
:func:`polydist._torch.groups_named_by_ranks`) — so members agree on it
without the other ranks' help, whatever other groups each of them made
before. Everything cached here belongs to the live world
(:class:`polydist._state.World`) and goes with it.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional, Sequence, Union

import torch
import torch.distributed as dist

from . import _torch
from ._state import World
from .backends import dispatch, registry
from .context import require_group, world
from .errors import InvalidGroupError

__all__ = ["GroupLike", "Resolved", "resolve", "new_group", "NON_MEMBER"]

GroupLike = Union[None, "dist.ProcessGroup", Sequence[int], int]
NON_MEMBER = dist.GroupMember.NON_GROUP_MEMBER  # what new_group returns to ranks outside the group (-100)


class Resolved:
    """A group as collectives need it; one per process group per world, so its sequence number is the group's.

    Attributes:
        pg: the ProcessGroup (None: the default group).
        ranks: global ranks, in group-rank order.
        rank: this process's global rank; ``group_rank`` its rank in the group.
        size: the number of ranks.
        backend: the group's backend name ("gloo", "nccl", "mpi4py", ...).
        device: where the group's byte buffers live (its entry's :meth:`~polydist.backends.declaration.Backend.comm_device`).
        entry: its backend's registry entry (:mod:`polydist.backends.registry`).
        direct: the group itself when its entry says polydist's collectives call
            its direct calls (:meth:`~polydist.backends.declaration.Backend.moves_direct`:
            mpi4py, horovod, the ``mpi`` stand-in), blocking methods called without
            torch.distributed's dispatch (which costs more than a small MPI collective).
        mover: the :class:`~polydist.collectives.mover.Mover` its collectives use, once chosen.
        seq: collectives called on this group so far (every member counts
            the same calls): debug fingerprints and timeout messages number
            calls with it.
        key: a short name of the group for store keys.
        predictors: slot-width predictors of the any-shape collectives
            (:class:`polydist.collectives.pieces.Predictor`), by (collective, peer).
        scratch: byte buffers those collectives reuse from call to call (never
            a buffer a result is a view of), by name.
    """

    __slots__ = (
        "pg", "ranks", "rank", "size", "group_rank", "backend", "device", "entry", "direct", "mover", "seq", "key",
        "predictors", "scratch",
    )

    def __init__(self, pg: Optional["dist.ProcessGroup"], ranks: tuple[int, ...], rank: int) -> None:
        group = pg if pg is not None else _torch.default_pg()
        self.pg, self.ranks, self.rank = pg, ranks, rank
        self.size, self.group_rank = len(ranks), ranks.index(rank)
        self.backend = str(dist.get_backend(group))
        self.entry = registry.get(self.backend)
        self.device: torch.device = self.entry.comm_device()
        self.direct = dispatch.behind(group) if self.entry.moves_direct(group) else None
        self.mover: Any = None  # how its pieces move: chosen on first use (polydist.collectives.exchange.mover)
        self.seq = 0
        self.predictors: dict = {}
        self.scratch: dict = {}
        text = "-".join(map(str, ranks))
        if len(text) > 64:  # a short store key for large groups (a name, not a secret)
            text = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()
        self.key = "world" if pg is None else text

    def check_root(self, root: Any, name: str) -> None:
        """Raise unless ``root`` is the global rank of a member.

        Raises:
            TypeError: ``root`` is not an int.
            ValueError: ``root`` is not a rank of the group.
        """
        if isinstance(root, bool) or not isinstance(root, int):
            raise TypeError(f"{name} must be an int global rank, got {root!r}")
        if root not in self.ranks:
            raise ValueError(f"{name}={root} is not a rank of the group {list(self.ranks)}")

    def __repr__(self) -> str:
        return f"<group {list(self.ranks)} ({self.backend}), #{self.seq} on rank {self.rank}>"


def _check_rank_types(ranks: Any) -> None:
    # ignite.distributed's wording first ("Argument ranks should be list of int"), then polydist's
    if not isinstance(ranks, (list, tuple, range)):
        raise InvalidGroupError(
            f"Argument ranks should be list of int, but given {type(ranks).__name__}: "
            "a group is None, a ProcessGroup or a list of global ranks"
        )
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int):
            raise InvalidGroupError(f"Argument ranks should be list of int: group ranks must be ints, got {r!r} in {list(ranks)}")


def _check_ranks(ranks: Any, world_size: int) -> tuple[int, ...]:
    """``ranks`` sorted, or ``TypeError``/``ValueError`` naming the bad rank."""
    _check_rank_types(ranks)
    out = []
    for r in ranks:
        if not 0 <= r < world_size:
            raise ValueError(f"rank {r} in group {list(ranks)} is outside the world of size {world_size}")
        out.append(r)
    if not out:
        raise ValueError("a group needs at least one rank, got an empty list")
    if len(set(out)) != len(out):
        raise ValueError(f"group ranks must be distinct, got {list(ranks)}")
    return tuple(sorted(out))


def new_group(ranks: Sequence[int], **kwargs: Any) -> Union["dist.ProcessGroup", int, list[int]]:
    """The process group of global ``ranks`` (any order; duplicates rejected), as ``torch.distributed.new_group``.

    Every rank may call it, as torch requires; only members must. Members get
    the group, created once per rank list and world (calling again returns the
    same group, no new communicator); non-members get
    ``torch.distributed.GroupMember.NON_GROUP_MEMBER`` at once, without
    communicating, and a collective they call with it is a no-op that returns
    its input. ``kwargs`` (e.g. ``backend``, ``timeout``) go to
    ``torch.distributed.new_group`` the first time; ``timeout`` defaults to
    the world's (``initialize(timeout=)``), where torch would give the
    subgroup its own default. On the horovod backend a group is a Horovod
    process set, which the whole job adds: there every rank must call
    ``new_group`` (or a collective with the rank list) for each group, in the
    same order, as ``torch.distributed.new_group`` requires by default.

    Examples:
        >>> group = pdist.new_group([0, 1])              # on every rank of 4
        >>> t = torch.ones(1)
        >>> pdist.all_reduce(t, group=group)             # ranks 0, 1: tensor([2.]); ranks 2, 3: tensor([1.])

    Raises:
        TypeError: a rank that is not an int.
        ValueError: a rank outside the world, a repeated rank, an empty list.
        NotImplementedError: fewer ranks than the world on the horovod
            backend without Horovod's dynamic process sets (on every rank
            that calls).
        NotInitializedError: launched but no process group yet. A serial run
            (no group) gets ``ranks`` back as a list, as from
            ``ignite.distributed.new_group``; collectives take it as ``group=``.

    Source: ``torch.distributed.new_group`` (PyTorch docs, "Groups").
    """
    state = world()
    if state is None:
        require_group()  # raises in a launched job without a group
        _check_rank_types(ranks)
        return list(ranks)  # serial: the list itself, as ignite (group= takes lists)
    key = _check_ranks(ranks, state.size)
    if state.rank not in key:
        _check_backend_has_subgroups(state, key, every_rank=True)  # the members raise it too, in _group_of
        return NON_MEMBER
    return _group_of(state, key, kwargs, every_rank=True)


def has_subgroups(state: World) -> bool:
    """Whether the world's backend can make groups of fewer ranks (all but horovod): its registry entry says."""
    return registry.get(dist.get_backend(state.pg)).no_subgroups is None


def _check_backend_has_subgroups(state: World, key: tuple[int, ...], every_rank: bool) -> None:
    """On members and non-members alike: raise NotImplementedError for a subgroup of a world without
    subgroups (horovod without dynamic process sets), else let a backend whose groups need every rank
    (horovod's process sets) register it. ``every_rank``: the caller is ``new_group``, which every rank
    calls each time, so the backend agrees with the other ranks even on a group this rank has."""
    if len(key) == state.size:
        return
    entry = registry.get(dist.get_backend(state.pg))
    error = entry.no_subgroups(list(key)) if entry.no_subgroups is not None else None
    if error is not None:
        raise error
    entry.lifecycle.add_group(list(key), every_rank=every_rank)


def _group_of(state: World, key: tuple[int, ...], kwargs: dict, every_rank: bool = False) -> "dist.ProcessGroup":
    pg = state.groups.get(key)
    if pg is None or every_rank:
        _check_backend_has_subgroups(state, key, every_rank)
    if pg is None:
        if kwargs.get("timeout") is None and state.timeout is not None:
            kwargs["timeout"] = state.timeout
        with _torch.groups_named_by_ranks():
            pg = state.groups[key] = dist.new_group(list(key), use_local_synchronization=True, **kwargs)
    return pg


def resolve(state: World, group: GroupLike) -> Optional[Resolved]:
    """Turn a ``group`` argument into its :class:`Resolved`; None when this rank is not a member.

    Cached per world: every collective asks, so a group seen before costs one
    dict lookup (a rank list: its tuple).

    Raises:
        TypeError: ``group`` is neither None, a ProcessGroup, a rank list nor
            ``NON_GROUP_MEMBER``; a rank that is not an int.
        ValueError: a rank outside the world, repeated, or an empty list.
    """
    if group is None or group is state.pg:
        key: Any = None
    elif isinstance(group, dist.ProcessGroup):
        key = group
    elif isinstance(group, (list, tuple, range)):
        key = tuple(group)
    elif group == NON_MEMBER and not isinstance(group, bool):
        return None
    else:
        raise InvalidGroupError(  # ignite.distributed's wording first
            f"Argument group should be list of int or ProcessGroup, but given {type(group).__name__}: "
            f"group must be None, a ProcessGroup or a list of ranks, got {type(group).__name__}"
        )
    try:
        found = state.resolved.get(key, state)  # the state itself: "not seen yet" (None means "not a member")
    except TypeError:  # an unhashable item in a rank list
        _check_ranks(group, state.size)
        raise
    if found is not state:
        return found
    res = state.resolved[key] = _make(state, key)
    if key is None:
        state.world_group = res  # the collectives' fast path for group=None
    return res


def _make(state: World, key: Any) -> Optional[Resolved]:
    if key is None:
        return Resolved(None, tuple(range(state.size)), state.rank)
    if isinstance(key, tuple):
        ranks = _check_ranks(key, state.size)
        if state.rank not in ranks:
            _check_backend_has_subgroups(state, ranks, every_rank=False)  # horovod: a non-member registers the set too
            return None
        pg = _group_of(state, ranks, {})
        res = state.resolved.get(pg) or Resolved(pg, ranks, state.rank)
        state.resolved[pg] = res  # the same group passed as an object shares the sequence number
        return res
    ranks = tuple(dist.get_process_group_ranks(key))
    if state.rank not in ranks:
        return None
    return Resolved(key, ranks, state.rank)
