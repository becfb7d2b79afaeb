"""Rank helpers: ``one_rank_only`` (decorator) and ``one_rank_first`` (context manager).

Typical uses: log or save on rank 0 only; let one rank download or preprocess
a data set while the others wait, then read the cached copy.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Optional, TypeVar

from .collectives.broadcast import barrier
from .collectives.gather import all_gather
from .context import get_local_rank, get_node_rank, get_rank, get_world_size, require_group
from .groups import has_subgroups

__all__ = ["one_rank_only", "one_rank_first"]

F = TypeVar("F", bound=Callable[..., Any])


def _check_rank_type(rank: Any) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(f"rank must be an int, got {rank!r}")
    if rank < 0:
        raise ValueError(f"rank {rank} is negative")


def _check_in_world(rank: int, world: int) -> None:
    if not 0 <= rank < world:
        # ignite.distributed's wording first, so code matching its messages keeps working
        raise ValueError(f"rank should be between 0 and {world - 1}, but given {rank}: rank {rank} is out of range for the world size {world}")


def one_rank_only(rank: int = 0, with_barrier: bool = False) -> Callable[[F], F]:
    """Decorator: the function runs on global rank ``rank`` only.

    Returns the function's result on that rank and None on the others. With
    ``with_barrier=True`` every rank then waits in a world barrier until the
    function has finished — also when it raised (the barrier is in a
    ``finally``), so the other ranks are released and the exception
    propagates on ``rank`` only. Every rank must call the decorated function
    when ``with_barrier`` is set.

    Serial (world size 1): the function runs plainly (``rank`` must be 0).
    Raises ``TypeError``/``ValueError`` for a non-int or negative ``rank`` at
    decoration time, and ``ValueError`` naming ``rank`` when it is not below
    the world size, at call time (the world may not exist when decorating),
    on every rank alike and before any communication.

    Source: idist ``one_rank_only``; idist's barrier is skipped when the
    function raises, which leaves the other ranks waiting.
    """
    _check_rank_type(rank)

    def decorator(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            _check_in_world(rank, get_world_size())
            if get_rank() != rank:
                if with_barrier:
                    barrier()
                return None
            try:
                return fn(*args, **kwargs)
            finally:
                if with_barrier:
                    barrier()

        return wrapper  # type: ignore[return-value]

    return decorator


def _node_members(local_rank: int) -> tuple[Optional[list[int]], int]:
    """(global ranks of this node, global rank of its process with ``local_rank``).

    Node membership is gathered, not computed: nodes may run different
    numbers of processes. Every rank computes the same verdict from the same
    gathered table, so an invalid ``local_rank`` raises everywhere alike.
    """
    table = all_gather((get_node_rank(), get_local_rank()))  # [(node, local rank)] per global rank
    nodes: dict[int, dict[int, int]] = {}
    for global_rank, (node, local) in enumerate(table):
        nodes.setdefault(node, {})[local] = global_rank
    short = sorted(node for node, locals_ in nodes.items() if local_rank not in locals_)
    if short:
        sizes = {node: len(nodes[node]) for node in short}
        raise ValueError(f"local rank {local_rank} does not exist on node(s) {short} (processes per node: {sizes})")
    mine = nodes[get_node_rank()]
    members = sorted(mine.values())
    return (None if len(members) == len(table) else members), mine[local_rank]


@contextlib.contextmanager
def one_rank_first(rank: int = 0, local: bool = False) -> Iterator[None]:
    """Context manager: ``rank`` runs the block first; the other ranks enter it once it has finished.

    ``local=False``: ``rank`` is a global rank; one barrier on the world
    group. ``local=True``: ``rank`` is a local rank — on each node, the
    process with that local rank goes first and only that node's processes
    wait for it (one barrier per node, on a group of the node's ranks; on
    the horovod backend, which has no subgroups, one world barrier after
    every node's first process). Node membership is all-gathered, so nodes may run different numbers of
    processes. Every rank must enter the block.

    The first rank reaches the barrier even when its block raises (``try`` /
    ``finally``): the others are released and run their block (which may
    then fail on its own, e.g. find no downloaded file) instead of waiting
    until the process group's timeout. The exception propagates on the first
    rank, and the launcher ends the job. The others wait at most the process
    group's timeout for a first rank that neither finishes nor fails.

    Serial: the block runs plainly (``rank`` must be 0). Raises
    ``TypeError``/``ValueError`` for a non-int or negative ``rank``;
    ``ValueError`` naming ``rank`` when it is not below the world size, or
    with ``local=True`` when some node has no process with that local rank
    (the node layout is gathered first, so every rank raises alike).

    Source: idist ``one_rank_first``, which has no ``try``/``finally``.
    """
    _check_rank_type(rank)
    world = get_world_size()
    if not local:
        _check_in_world(rank, world)  # bad input first, before require_group can raise
    if require_group() is None or world == 1:
        if local:
            _check_in_world(rank, world)
        yield
        return
    group, first = _node_members(rank) if local else (None, rank)
    if group is not None and not has_subgroups(require_group()):
        group = None  # horovod: every node's first rank runs the block, then one world barrier lets the rest in
    is_first = get_rank() == first
    if not is_first:
        barrier(group)
    try:
        yield
    finally:
        if is_first:
            barrier(group)
