"""How pieces move: the mover a resolved group uses, chosen once, and the one for polydist's Python groups.

Each any-shape collective (:mod:`~polydist.collectives.gather`,
:mod:`~polydist.collectives.scatter`) is written once, against the
:class:`Mover` interface, and moves its :mod:`~polydist.collectives.pieces`
through :mod:`~polydist.collectives.exchange`; what arrives is a
:class:`Received`. Two movers:

* :class:`DirectMover`, for the groups written in Python (mpi4py, horovod:
  :class:`~polydist.backends.direct.DirectProcessGroup`): their blocking
  calls, minus torch.distributed's dispatch — the 64-byte headers in one
  fixed-size collective, then the bodies straight into the result at their
  exact sizes (``Allgatherv``, ``Gatherv``, ``Scatterv``, ``Alltoallv``, or
  the fixed-size form when every length agrees): no padding, no copies, two
  small latencies on shared memory.
* :class:`~polydist.collectives.slots.SlotMover`, for every other backend
  (gloo, nccl, ...): torch.distributed calls moving headers and bodies
  together in slots of a width every rank predicts alike.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ..groups import Resolved
from .pieces import EVEN, HEADER, Header, Piece, Plan, flat_bytes, plan_of

__all__ = ["Received", "Into", "Mover", "DirectMover", "joined", "as_bytes", "body_of"]


class Received:
    """What an exchange brought: the :class:`~polydist.collectives.pieces.Plan` of the headers, and the bodies —
    as a list, or (``buffer``) back to back at the plan's offsets in one tensor (MPI's v-collectives)."""

    __slots__ = ("plan", "buffer", "_bodies")

    def __init__(self, plan: Plan, buffer: Optional[torch.Tensor] = None, bodies: Optional[list] = None) -> None:
        self.plan, self.buffer, self._bodies = plan, buffer, bodies

    @property
    def bodies(self) -> list[torch.Tensor]:
        if self._bodies is None:
            b = flat_bytes(self.buffer)
            self._bodies = [b[o : o + n] for o, n in zip(self.plan.offsets, self.plan.lengths)]
        return self._bodies


Into = Callable[[Plan], Optional[torch.Tensor]]


def as_bytes(data: bytes, device: torch.device) -> torch.Tensor:
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return t if device.type == "cpu" else t.to(device)


def body_of(piece: Piece, device: torch.device) -> torch.Tensor:
    return piece.body if isinstance(piece.body, torch.Tensor) else as_bytes(piece.body, device)


def joined(bodies: list[torch.Tensor], copy: bool = False) -> torch.Tensor:
    """The bodies' bytes back to back, as one flat uint8 tensor: a view when they already lie so in one buffer
    (MPI's v-collectives, or the pieces of ``x.chunk()``) unless ``copy``, else a new tensor."""
    first = bodies[0]
    if copy:
        return torch.cat([flat_bytes(b) for b in bodies])
    ptr, base = first.data_ptr(), first.untyped_storage().data_ptr()
    for b in bodies:
        if b.data_ptr() != ptr or b.untyped_storage().data_ptr() != base:
            return torch.cat([flat_bytes(b) for b in bodies])
        ptr += b.nbytes
    total = ptr - first.data_ptr()
    return torch.empty(0, dtype=torch.uint8, device=first.device).set_(first.untyped_storage(), first.data_ptr() - base, (total,))


class Mover:
    """How a group's transport does the piece exchanges, and a blocking all_reduce of one tensor if it has its own.

    ``res`` is the resolved group (the same on every rank), ``what`` names the
    call in errors; ``dst``/``src`` are global ranks. A malformed header raises
    ``ValueError`` naming the sender (:func:`pieces.read`), on every rank that
    received it, after the call completes on all of them.
    """

    __slots__ = ()

    # all_reduce(t, name): reduce ``t`` in place under canonical op ``name``, blocking, where the transport has a lean
    # call of its own; None: it has none, and torch.distributed.all_reduce does it (a class attribute, so the common
    # all_reduce pays one attribute read to learn it, not a call).
    all_reduce: Optional[Callable[[torch.Tensor, str], None]] = None

    def all_gather(self, res: Resolved, piece: Piece, what: str, views: bool, into: Optional[Into]) -> Received:
        """Every member's piece, in group-rank order. ``views=False``: the caller copies the bodies out before the
        next call on the group; ``into(plan)``: the result tensor the bodies may land in (a concatenation of one
        dtype), or None (a uint8 buffer). ``into`` must not raise: on a gather the senders are already on their way."""
        raise NotImplementedError

    def gather(self, res: Resolved, piece: Piece, dst: int, what: str, into: Optional[Into]) -> Optional[Received]:
        """Every member's piece on ``dst`` (group-rank order); None elsewhere."""
        raise NotImplementedError

    def scatter(self, res: Resolved, pieces: Optional[list[Piece]], src: int, what: str) -> tuple[Header, torch.Tensor]:
        """Piece ``i`` of ``src``'s list on group rank ``i`` (``pieces`` read on ``src`` only): its header and body."""
        raise NotImplementedError

    def all_to_all(self, res: Resolved, pieces: list[Piece], what: str) -> Received:
        """``pieces[i]`` of every rank lands on group rank ``i``; what this rank received, in group-rank order."""
        raise NotImplementedError


def _planner(res: Resolved, what: str, into: Optional[Into]) -> Callable[[bytes], tuple[Plan, torch.Tensor]]:
    """Received headers → ``(plan, where the bodies land)``: ``into(plan)``, allocated in the result's dtype and
    shape so no view has to be taken afterwards, or a uint8 buffer."""

    def planned(raw: bytes) -> tuple[Plan, torch.Tensor]:
        plan = plan_of(raw, res.ranks, what)
        out = into(plan) if into is not None else None
        return plan, out if out is not None else torch.empty(plan.total, dtype=torch.uint8)

    return planned


def _mark_even(pieces: list[Piece]) -> None:
    if len({p.length for p in pieces}) == 1:
        for p in pieces:
            p.flags = EVEN


class DirectMover(Mover):
    """The blocking calls of a :class:`~polydist.backends.direct.DirectProcessGroup` (``group``)."""

    __slots__ = ("group", "all_reduce")

    def __init__(self, group: Any) -> None:
        self.group = group
        self.all_reduce = group.allreduce_tensor  # mpi4py's blocking allreduce, minus torch's dispatch: no frame between

    def all_gather(self, res: Resolved, piece: Piece, what: str, views: bool, into: Optional[Into]) -> Received:
        piece.flags = EVEN  # one body per sender: the plan is even when all lengths agree
        return Received(*self.group.allgather_pieces(piece.header(), body_of(piece, res.device), _planner(res, what, into)))

    def gather(self, res: Resolved, piece: Piece, dst: int, what: str, into: Optional[Into]) -> Optional[Received]:
        root = res.ranks.index(dst)
        got = self.group.gather_pieces(piece.header(), body_of(piece, res.device), _planner(res, what, into), root)
        return Received(*got) if res.rank == dst else None

    def scatter(self, res: Resolved, pieces: Optional[list[Piece]], src: int, what: str) -> tuple[Header, torch.Tensor]:
        here = res.rank == src
        if here:
            _mark_even(pieces)
        heads = b"".join(p.header() for p in pieces) if here else None
        sent = joined([body_of(p, res.device) for p in pieces]) if here else None

        def length_of(raw: bytes) -> tuple[int, bool]:
            plan = plan_of(raw, (src,), what)
            return plan.lengths[0], plan.even

        mine, body = self.group.scatter_pieces(
            heads, sent, [p.length for p in pieces] if here else (), res.ranks.index(src), HEADER, length_of
        )
        return plan_of(mine, (src,), what).headers[0], body

    def all_to_all(self, res: Resolved, pieces: list[Piece], what: str) -> Received:
        _mark_even(pieces)
        heads = b"".join(p.header() for p in pieces)
        plan, out = self.group.all_to_all_pieces(
            heads, joined([body_of(p, res.device) for p in pieces]), [p.length for p in pieces],
            _planner(res, what, None),
        )  # fmt: skip
        return Received(plan, out)
