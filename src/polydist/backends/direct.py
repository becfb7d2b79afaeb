"""The calls polydist's collectives make on its own Python process groups, past torch.distributed's dispatch.

A :class:`DirectProcessGroup` (the mpi4py and horovod groups) is a
``torch.distributed.ProcessGroup`` that also offers polydist's collectives
blocking calls of their own, made through their mover
(:class:`polydist.collectives.mover.DirectMover`, the only caller): a small
call then costs about as much as the transport itself, not torch's dispatch
into a Python group, and the any-shape collectives move pieces of different
sizes as they are, without padding.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

from .tensors import bytes_of

__all__ = ["DirectProcessGroup"]


class DirectProcessGroup(dist.ProcessGroup):
    """A ProcessGroup with polydist's direct calls (an interface; the subclasses implement it).

    The piece exchanges are each two steps, in call order with the group's
    queued work: the fixed-size headers, then the bodies at the sizes
    ``plan(headers)`` gives — ``(p, out)``: an object with ``lengths`` (bytes
    per group rank), ``offsets``, ``total`` and ``even``, the same on every
    rank that received the same headers (or an exception, raised by all of
    them alike before the second step), and the contiguous CPU tensor of
    ``total`` bytes, of any dtype and shape, that the bodies land in back to
    back. Sent bodies: contiguous CPU tensors. ``root``: a group rank.
    """

    def allreduce_tensor(self, t: torch.Tensor, op: Any = "SUM") -> torch.Tensor:
        """Reduce ``t`` in place on every rank and return it (blocking); ``op`` a canonical name or ``ReduceOp``."""
        raise NotImplementedError

    def allgather_pieces(self, header: bytes, body: torch.Tensor, plan: Callable[[bytes], Any]) -> tuple[Any, torch.Tensor]:
        """Every rank's header and body; returns ``(plan, bodies)``."""
        raise NotImplementedError

    def gather_pieces(self, header: bytes, body: torch.Tensor, plan: Callable[[bytes], Any], root: int) -> Any:
        """On ``root``: ``(plan, bodies)`` of every rank's piece; elsewhere None. By default an all-gather kept on
        ``root`` (every rank plans alike, so that all of them take the second step or none does)."""
        p, out = self.allgather_pieces(header, body, plan)
        return (p, out) if self.rank() == root else None

    def scatter_pieces(
        self, headers: Optional[bytes], bodies: Optional[torch.Tensor], lengths: Sequence[int], root: int,
        size: int, length_of: Callable[[bytes], Any],
    ) -> tuple[bytes, torch.Tensor]:  # fmt: skip
        """This rank's ``size``-byte header and its body, out of root's ``headers`` and ``bodies`` (``lengths``
        bytes per rank, back to back; read on root only); ``length_of(header)`` is ``(the body's length,
        whether root's bodies are even)``. By default two byte all-to-alls in which only root sends."""
        here, n = self.rank() == root, self.size()
        nothing = torch.empty(0, dtype=torch.uint8)
        sent = torch.frombuffer(bytearray(headers), dtype=torch.uint8) if here and headers else nothing
        mine = self._all_to_all_bytes(sent, [size] * n if here else [0] * n).numpy().tobytes()
        length, _ = length_of(mine)
        out = self._all_to_all_bytes(bytes_of(bodies) if here else nothing, list(lengths) if here else [0] * n)
        if out.numel() != length:
            raise ValueError(f"{self.getBackendName()}: received {out.numel()} bytes where the header announced {length}")
        return mine, out

    def all_to_all_pieces(
        self, headers: bytes, bodies: torch.Tensor, lengths: Sequence[int], plan: Callable[[bytes], Any]
    ) -> tuple[Any, torch.Tensor]:
        """Header ``i`` and body ``i`` (``lengths[i]`` bytes, back to back in ``bodies``) go to group rank ``i``;
        returns ``(plan, bodies)`` of what came in. By default two byte all-to-alls."""
        n = self.size()
        heads = self._all_to_all_bytes(torch.frombuffer(bytearray(headers), dtype=torch.uint8), [len(headers) // n] * n)
        p, out = plan(heads.numpy().tobytes())
        self._land(self._all_to_all_bytes(bytes_of(bodies), list(lengths)), out, p.total)
        return p, out

    def _all_to_all_bytes(self, flat: torch.Tensor, splits: list[int]) -> torch.Tensor:
        """The transport's byte all-to-all, which the default :meth:`scatter_pieces` and :meth:`all_to_all_pieces`
        are made of: ``splits[i]`` bytes of flat uint8 ``flat`` to group rank ``i``; returns what came in, in
        rank order (uint8, CPU)."""
        raise NotImplementedError

    def _land(self, got: torch.Tensor, out: torch.Tensor, total: int) -> None:
        """Copy the ``total`` received bytes ``got`` into contiguous ``out`` (a lying peer's count: ValueError)."""
        if got.numel() != total:
            raise ValueError(f"{self.getBackendName()}: received {got.numel()} bytes where the headers announced {total}")
        bytes_of(out).copy_(got.reshape(-1))
