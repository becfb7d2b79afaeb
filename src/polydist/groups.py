"""Process groups: ``new_group`` and the cache of groups built from rank lists.

Every collective takes ``group`` as ``None`` (the world), a
``torch.distributed.ProcessGroup``, or a list of global ranks. A rank list maps
to one cached group per distinct list, created with
``use_local_synchronization=True`` so only its members need to take part, and
named from a hash of its ranks alone — so members agree on it without the
other ranks' help, whatever other groups each of them made before.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Union

import torch.distributed as dist

from .backends.mpi4py import MPIProcessGroup
from .context import collective_timeout

__all__ = ["GroupLike", "Resolved", "resolve", "new_group", "clear_cache", "direct_world"]

GroupLike = Union[None, "dist.ProcessGroup", Sequence[int]]

_cache: dict[tuple[int, ...], "dist.ProcessGroup"] = {}
_world: Optional[tuple] = None  # (the default ProcessGroup, its Resolved)


@dataclass(frozen=True)
class Resolved:
    """A group as collectives need it."""

    pg: Optional["dist.ProcessGroup"]  # None means the default (world) group
    ranks: tuple[int, ...]  # global ranks, in group-rank order
    rank: int  # this process's global rank
    # The group itself when it is an MPIProcessGroup: its blocking methods can be
    # called directly, skipping torch.distributed's dispatch (which costs more than
    # a small MPI collective).
    direct: Optional[MPIProcessGroup] = None

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def group_rank(self) -> int:
        """This process's rank inside the group."""
        return self.ranks.index(self.rank)

    def check_root(self, root: int, name: str) -> None:
        """Raise ``ValueError`` unless global rank ``root`` is in the group."""
        if isinstance(root, bool) or not isinstance(root, int):
            raise TypeError(f"{name} must be an int global rank, got {root!r}")
        if root not in self.ranks:
            raise ValueError(f"{name}={root} is not a rank of the group {list(self.ranks)}")


def _check_ranks(ranks: Sequence[int]) -> tuple[int, ...]:
    world = dist.get_world_size()
    out = []
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int):
            raise TypeError(f"group ranks must be ints, got {r!r} in {list(ranks)}")
        if not 0 <= r < world:
            raise ValueError(f"rank {r} in group {list(ranks)} is outside the world of size {world}")
        out.append(r)
    if not out:
        raise ValueError("a group needs at least one rank, got an empty list")
    if len(set(out)) != len(out):
        raise ValueError(f"group ranks must be distinct, got {list(ranks)}")
    return tuple(sorted(out))


def new_group(ranks: Sequence[int], **kwargs) -> "dist.ProcessGroup":
    """The process group of global ``ranks`` (any order; duplicates rejected).

    Only the listed ranks need to call it; calling it again with the same
    ranks returns the same cached group (no new communicator). ``kwargs``
    (e.g. ``backend``, ``timeout``) go to ``torch.distributed.new_group`` the
    first time; ``timeout`` defaults to the world's (``initialize(timeout=)``).
    Raises ``ValueError``/``TypeError`` naming a bad rank, and
    ``ValueError`` when this process is not one of ``ranks``.
    """
    key = _check_ranks(ranks)
    me = dist.get_rank()
    if me not in key:
        raise ValueError(f"rank {me} is not in group {list(key)}; only its members may create or use it")
    if key not in _cache:
        if kwargs.get("timeout") is None and collective_timeout() is not None:
            kwargs["timeout"] = collective_timeout()  # torch would give subgroups its default, not the world's
        with _name_from_ranks():
            _cache[key] = dist.new_group(list(key), use_local_synchronization=True, **kwargs)
    return _cache[key]


@contextlib.contextmanager
def _name_from_ranks() -> Iterator[None]:
    """Name the group being created from its ranks alone.

    With ``use_local_synchronization=True``, PyTorch (2.4+) names a group by
    hashing its ranks *and the number of groups this process already has*, so
    members that created different numbers of groups before (overlapping
    rank-list groups used by different ranks) compute different names and
    wait for each other forever. polydist creates each rank list's group at
    most once per process, so the ranks alone name it uniquely.
    """
    c10d = dist.distributed_c10d
    original = getattr(c10d, "_hash_ranks_to_str", None)
    if original is None:  # older PyTorch: the name already depends on the ranks only
        yield
        return
    c10d._hash_ranks_to_str = lambda ranks: hashlib.sha1(
        ("polydist_" + "_".join(map(str, ranks))).encode(), usedforsecurity=False
    ).hexdigest()
    try:
        yield
    finally:
        c10d._hash_ranks_to_str = original


def resolve(group: GroupLike) -> Resolved:
    """Turn a ``group`` argument into a :class:`Resolved` (requires a live default group).

    Raises:
        TypeError: ``group`` is neither None, a ProcessGroup nor a rank list.
        ValueError: a bad rank in the list, or this process is not a member.
    """
    global _world
    if group is None or group is dist.GroupMember.WORLD:
        world = dist.GroupMember.WORLD
        if _world is None or _world[0] is not world:  # every collective asks: build it once per world
            ranks = tuple(range(dist.get_world_size()))
            _world = (world, Resolved(None, ranks, dist.get_rank(), _direct(world)))
        return _world[1]
    me = dist.get_rank()
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(f"rank {me} is not a member of this process group")
    if isinstance(group, dist.ProcessGroup):
        ranks = tuple(dist.get_process_group_ranks(group))
        if me not in ranks:
            raise ValueError(f"rank {me} is not in the process group of ranks {list(ranks)}")
        return Resolved(group, ranks, me, _direct(group))
    if isinstance(group, (list, tuple, range)):
        pg = new_group(group)
        return Resolved(pg, _check_ranks(group), me, _direct(pg))
    raise TypeError(f"group must be None, a ProcessGroup or a list of ranks, got {type(group).__name__}")


def direct_world() -> Optional[MPIProcessGroup]:
    """The world group, when it is an MPIProcessGroup that :func:`resolve` already saw; else None.

    The hot path of small collectives on MPI, where a microsecond counts:
    no rank checks, since the world group has every rank.
    """
    world = _world
    if world is not None and world[1].direct is not None and world[0] is dist.GroupMember.WORLD:
        return world[1].direct
    return None


def _direct(pg: "dist.ProcessGroup") -> Optional[MPIProcessGroup]:
    return pg if isinstance(pg, MPIProcessGroup) else None


def clear_cache() -> None:
    """Forget cached rank-list groups (their communicators die with the default group)."""
    global _world
    _cache.clear()
    _world = None
