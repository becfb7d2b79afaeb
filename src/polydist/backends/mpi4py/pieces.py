"""The MPI group's piece exchanges: polydist's any-shape collectives, called directly.

polydist's any-shape collectives call these (:class:`~polydist.backends.direct.DirectProcessGroup`) instead of
torch.distributed's: MPI's v-collectives take sizes that differ per rank as they are. A plan that is ``even``
(every body the same length, every sender agreeing: the same on all ranks) takes the fixed-size collective, which
mpich runs faster than the v-one at large sizes. Each runs on the group's lane (``_call``), blocking.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from . import _mpi

__all__ = ["MPIPieces"]


class MPIPieces:
    """The four piece exchanges of :class:`~polydist.backends.mpi4py.process_group.MPIProcessGroup`, over its
    communicator ``comm``, each run by its ``_call`` (the group's lane, recorded)."""

    comm: Any
    _call: Callable[..., Any]

    def allgather_pieces(self, header: bytes, body: torch.Tensor, plan: Callable[[bytes], Any]) -> tuple[Any, torch.Tensor]:
        heads = bytearray(len(header) * self.comm.Get_size())
        done: list = []

        def run() -> None:
            self.comm.Allgather([header, _mpi.MPI.BYTE], [heads, _mpi.MPI.BYTE])
            p, out = plan(bytes(heads))
            if p.even:
                self.comm.Allgather(_mpi.raw(body), _mpi.raw(out))
            else:
                self.comm.Allgatherv(_mpi.raw(body), [_mpi.address(out), (p.lengths, p.offsets), _mpi.MPI.BYTE])
            done.append((p, out))

        self._call("all_gather", run, [body])
        return done[0]

    def gather_pieces(self, header: bytes, body: torch.Tensor, plan: Callable[[bytes], Any], root: int) -> Any:
        here = self.comm.Get_rank() == root
        heads = bytearray(len(header) * self.comm.Get_size()) if here else None
        done: list = [None]

        def run() -> None:
            self.comm.Gather([header, _mpi.MPI.BYTE], [heads, _mpi.MPI.BYTE] if here else None, root)
            if not here:
                self.comm.Gatherv(_mpi.raw(body), None, root)
                return
            p, out = plan(bytes(heads))
            self.comm.Gatherv(_mpi.raw(body), [_mpi.address(out), (p.lengths, p.offsets), _mpi.MPI.BYTE], root)
            done[0] = (p, out)

        self._call("gather", run, [body])
        return done[0]

    def scatter_pieces(
        self, headers: Optional[bytes], bodies: Optional[torch.Tensor], lengths: Sequence[int], root: int,
        size: int, length_of: Callable[[bytes], Any],
    ) -> tuple[bytes, torch.Tensor]:  # fmt: skip
        here = self.comm.Get_rank() == root
        mine = bytearray(size)
        done: list = []

        def run() -> None:
            self.comm.Scatter([headers, _mpi.MPI.BYTE] if here else None, [mine, _mpi.MPI.BYTE], root)
            length, even = length_of(bytes(mine))
            out = torch.empty(length, dtype=torch.uint8)
            if even:
                self.comm.Scatter(_mpi.raw(bodies) if here else None, _mpi.raw(out), root)
            else:
                send = [_mpi.address(bodies), (list(lengths), _mpi.offsets_of(lengths)), _mpi.MPI.BYTE] if here else None
                self.comm.Scatterv(send, _mpi.raw(out), root)
            done.append((bytes(mine), out))

        self._call("scatter", run, [])
        return done[0]

    def all_to_all_pieces(
        self, headers: bytes, bodies: torch.Tensor, lengths: Sequence[int], plan: Callable[[bytes], Any]
    ) -> tuple[Any, torch.Tensor]:
        heads = bytearray(len(headers))
        done: list = []

        def run() -> None:
            self.comm.Alltoall([headers, _mpi.MPI.BYTE], [heads, _mpi.MPI.BYTE])
            p, out = plan(bytes(heads))
            if p.even:  # every sender's bodies even, all of one length: so are this rank's
                self.comm.Alltoall(_mpi.raw(bodies), _mpi.raw(out))
                done.append((p, out))
                return
            self.comm.Alltoallv(
                [_mpi.address(bodies), (list(lengths), _mpi.offsets_of(lengths)), _mpi.MPI.BYTE],
                [_mpi.address(out), (p.lengths, p.offsets), _mpi.MPI.BYTE],
            )
            done.append((p, out))

        self._call("all_to_all", run, [bodies])
        return done[0]
