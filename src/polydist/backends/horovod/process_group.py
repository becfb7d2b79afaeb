"""The ``horovod`` backend's ProcessGroup: torch.distributed over ``horovod.torch``.

:class:`HorovodProcessGroup` is a ``torch.distributed.ProcessGroup`` written
in Python whose operations are Horovod's (ring all-reduce and friends over
Horovod's Gloo transport), so polydist's collectives, the plain
``torch.distributed`` API and DistributedDataParallel run on Horovod. It is
the world group of a job launched by ``horovodrun`` (or ``horovod.run``);
Horovod's own API (``hvd.DistributedOptimizer``, ``hvd.broadcast_parameters``)
works beside it, on the same ranks.

How torch.distributed's operations map onto Horovod's (``horovod.torch``
0.28):

* **all_reduce**: ``hvd.allreduce_`` for SUM, AVG, MIN, MAX, PRODUCT on the
  dtypes Horovod reduces (int32, int64, float16, float32, float64);
  bfloat16 is reduced in float32 and rounded once, complex SUM/AVG as its real
  view. Everything else — AND/OR/XOR, and bool/uint8/int8/int16 tensors,
  which Horovod cannot reduce — is an ``hvd.allgather`` of every rank's bytes
  and the same reduction in rank order on every rank (exact; traffic grows
  with the world size, as the data is gathered instead of reduced in a ring).
* **reduce** (Horovod has none): the all-reduce of a copy, kept on the root;
  the other ranks' inputs are untouched, as torch's ``reduce`` leaves them.
* **reduce_scatter**: ``hvd.reducescatter`` for SUM/AVG on Horovod's
  dtypes, else the all-reduce of a copy and this rank's chunk.
* **broadcast, all_gather, all_to_all**: Horovod's, on a byte view of the
  tensors, so every dtype travels.
* **gather** (Horovod has none): an all-gather kept on the root.
* **scatter** (Horovod has none): an all-to-all in which only the root sends.
* **barrier**: ``hvd.barrier``.
* **send/recv** raise ``NotImplementedError``: a Horovod operation needs
  every rank of its process set, and torch's point-to-point involves two;
  nothing Horovod offers can carry it without the other ranks' cooperation.
* **Subgroups** are Horovod process sets (``process_set=`` on every call
  above; broadcast roots are global ranks, as Horovod takes them), added by
  every rank of the job (:func:`polydist.backends.horovod.job.process_set`),
  only with ``HOROVOD_DYNAMIC_PROCESS_SETS=1``; without, ``new_group`` of
  fewer ranks raises ``NotImplementedError``.

Inputs may alias outputs (FSDP2 all-gathers in place): Horovod returns new
tensors, which are copied into the outputs after the exchange has read the
inputs, so no op needs a copy of its own for that.

Operations run in call order on one worker thread per group
(:class:`~polydist.backends.lane.Lane`), so ``async_op=True`` returns at once
and a future completes without ``wait()`` (DDP overlaps its gradient
all-reduces with the backward pass); each Horovod operation gets a unique
name from the group's counter, which is how Horovod matches the ranks' calls.
Tensors must be on the CPU (polydist builds Horovod without CUDA): a CUDA
tensor raises ``ValueError``. Horovod's own failures
(``HorovodInternalError``: a rank died, Horovod was shut down) are raised by
``wait()``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

import torch

from ...ops import check_op_dtype, resolve_op
from ..group_checks import check_cpu
from ..python_group import NoPointToPoint, PythonProcessGroup
from ..tensors import bytes_of, reduce_rows

__all__ = ["HorovodProcessGroup", "BACKEND_NAME"]

BACKEND_NAME = "horovod"
_CPU_ONLY_WHY = " (polydist builds Horovod without CUDA)"

# What hvd.allreduce_ reduces (the C++ functions horovod.torch 0.28 registers for CPU tensors)
_NATIVE_DTYPES = frozenset({torch.int32, torch.int64, torch.float16, torch.float32, torch.float64})
_HVD_OPS = {"SUM": "Sum", "AVG": "Average", "MIN": "Min", "MAX": "Max", "PRODUCT": "Product"}


@functools.lru_cache(maxsize=None)
def hvd() -> Any:
    """``horovod.torch``, imported on first use (it loads Horovod's C++ library)."""
    import horovod.torch as module

    return module


def _reduce_plan(t: torch.Tensor, op: Any) -> tuple[str, str]:
    """``(op name, how)``: how is "native", "wide" (bfloat16 in float32), "real" (complex) or "gathered".

    Raises ``ValueError``/``TypeError`` for an unknown op or one undefined on the dtype
    (polydist's one table, :func:`polydist.ops.check_op_dtype`).
    """
    name = resolve_op(op)
    check_op_dtype(name, t.dtype)
    check_cpu(t, BACKEND_NAME, _CPU_ONLY_WHY)
    if name in _HVD_OPS:
        if t.dtype in _NATIVE_DTYPES:
            return name, "native"
        if t.dtype == torch.bfloat16:
            return name, "wide"
        if t.dtype.is_complex:  # SUM/AVG only: check_op_dtype rejects MIN/MAX/PRODUCT
            return name, "real"
    return name, "gathered"


class HorovodProcessGroup(NoPointToPoint, PythonProcessGroup):
    """A ``torch.distributed`` process group over Horovod's global process set, or a subgroup's set.

    Created by torch.distributed (``init_process_group("horovod")``, which
    polydist's ``initialize("horovod")`` calls under ``horovodrun``), not by
    hand. Ranks are Horovod's ranks. Methods carry PyTorch's ProcessGroup
    signatures under the names PyTorch 2.2–2.13 call, as
    :class:`~polydist.backends.mpi4py.MPIProcessGroup` does, and the same
    argument checks (:class:`~polydist.backends.python_group.PythonProcessGroup`).
    Errors: ``ValueError`` for CUDA tensors or mismatched sizes, ``TypeError`` for an
    op undefined on a dtype, ``NotImplementedError`` for point-to-point, all
    raised by the call before anything is sent; Horovod's errors are raised
    by ``wait()``.
    """

    CPU_ONLY_WHY = _CPU_ONLY_WHY

    no_p2p_reason = "(a Horovod operation needs every rank of its process set); use the gloo or mpi backend for send/recv"

    def __init__(self, rank: int, size: int, process_set: Any = None) -> None:
        super().__init__(rank, size, BACKEND_NAME)
        self._count = 0  # operations issued: names them, the same on every rank
        # a subgroup's hvd.ProcessSet goes to every call; Horovod's roots are global ranks
        self._set = {} if process_set is None else {"process_set": process_set}
        self._global_ranks = list(range(size)) if process_set is None else list(process_set.ranks)

    @property
    def ranks(self) -> list[int]:
        """The group's global ranks, in group-rank order: ``hvd.ProcessSet.ranks``, which idist's
        ``new_group`` returns on Horovod (ignite's ``_test_distrib_group`` reads ``group.ranks``)."""
        return list(self._global_ranks)

    def __repr__(self) -> str:
        return f"<HorovodProcessGroup rank={self._rank} size={self._size} ranks={self._global_ranks}>"

    def _on(self, op: str) -> dict:
        """The keywords of the next Horovod operation: a name (Horovod pairs the ranks' calls by name), the set."""
        self._count += 1
        return {"name": f"polydist.{self._group_name or 'world'}.{op}.{self._count}", **self._set}

    # ------------------------------------------------------------ the Horovod calls (on the lane)

    def _all_gather_bytes(self, flat: torch.Tensor) -> torch.Tensor:
        """Every rank's ``flat`` bytes, ``[world size, n]`` (every rank must give the same ``n``)."""
        return hvd().allgather(flat.reshape(1, -1), **self._on("allgather"))

    def _all_to_all_bytes(self, flat: torch.Tensor, splits: list[int]) -> torch.Tensor:
        out, _ = hvd().alltoall(flat, splits=splits, **self._on("alltoall"))
        return out

    def _reduce_now(self, t: torch.Tensor, plan: tuple[str, str]) -> None:
        """All-reduce contiguous CPU ``t`` in place (``plan`` from :func:`_reduce_plan`)."""
        name, how = plan
        if t.numel() == 0:
            return
        if how == "gathered":
            rows = self._all_gather_bytes(bytes_of(t)).view(t.dtype)
            t.copy_(reduce_rows(rows, name, t.dtype).view(t.shape))
            return
        work = t.float() if how == "wide" else torch.view_as_real(t) if how == "real" else t
        hvd().allreduce_(work, op=getattr(hvd(), _HVD_OPS[name]), **self._on("allreduce"))
        if work is not t and how == "wide":
            t.copy_(work)

    # ------------------------------------------------------------ reductions

    def _reduce_plan(self, t: torch.Tensor, op: Any) -> tuple[str, str]:
        return _reduce_plan(t, op)

    def _reduce_scatter_now(self, output: torch.Tensor, input: torch.Tensor, plan: tuple[str, str]) -> None:
        name, how = plan
        if how != "native" or name not in ("SUM", "AVG") or not output.numel():
            super()._reduce_scatter_now(output, input, plan)  # the all-reduce of a copy
            return
        rows = input.reshape(self._size, -1).contiguous()
        mine = hvd().reducescatter(rows, op=getattr(hvd(), _HVD_OPS[name]), **self._on("reducescatter"))
        output.copy_(mine.reshape(output.shape))

    # ------------------------------------------------------------ data movement: Horovod's collectives on bytes

    def _broadcast_now(self, c: torch.Tensor, root: int) -> None:
        if c.numel():
            hvd().broadcast_(bytes_of(c), self._global_ranks[root], **self._on("broadcast"))

    def _allgather_into(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        bytes_of(dst).copy_(self._all_gather_bytes(bytes_of(src)).reshape(-1))

    def _gather_into(self, dst: Optional[torch.Tensor], src: torch.Tensor, root: int) -> None:
        rows = self._all_gather_bytes(bytes_of(src))  # Horovod has no gather: every rank gathers, root keeps
        if dst is not None:
            bytes_of(dst).copy_(rows.reshape(-1))

    def _scatter_from(self, src: Optional[torch.Tensor], dst: torch.Tensor, root: int) -> None:
        n = self._size  # Horovod has no scatter: an all-to-all in which only the root sends
        if src is None:
            src, send = torch.empty(0, dtype=torch.uint8), [0] * n
        else:
            send = [dst.nbytes] * n
        self._alltoall_into(dst, src, send, [dst.nbytes], False)

    def _barrier_now(self) -> None:
        hvd().barrier(**self._set)

    # ------------------------------------------------------------ polydist's direct calls (blocking)

    # Horovod's all-gather and all-to-all take a different dim 0 on every rank, so the bodies move
    # at their own lengths, back to back in rank order: exactly the plan's layout. Horovod has no
    # gather or scatter: gather is an all-gather that every rank plans alike (so that all of them
    # take the second step or none does), scatter an all-to-all in which only the root sends.

    def allgather_pieces(self, header: bytes, body: torch.Tensor, plan: Callable[[bytes], Any]) -> tuple[Any, torch.Tensor]:
        def run() -> tuple[Any, torch.Tensor]:
            heads = self._all_gather_bytes(torch.frombuffer(bytearray(header), dtype=torch.uint8))
            p, out = plan(heads.numpy().tobytes())
            self._land(hvd().allgather(bytes_of(body), **self._on("allgather")), out, p.total)
            return p, out

        return self._in_lane("all_gather", [body], run)

    def scatter_pieces(self, *args: Any) -> tuple[bytes, torch.Tensor]:
        return self._in_lane("scatter", [], super().scatter_pieces, *args)

    def all_to_all_pieces(
        self, headers: bytes, bodies: torch.Tensor, lengths: Sequence[int], plan: Callable[[bytes], Any]
    ) -> tuple[Any, torch.Tensor]:
        return self._in_lane("all_to_all", [bodies], super().all_to_all_pieces, headers, bodies, lengths, plan)

    def _in_lane(self, op: str, tensors: list, body: Callable[..., Any], *args: Any) -> Any:
        """``body(*args)``'s result, run in order with this group's queued work."""
        done: list = []
        self._call(op, lambda: done.append(body(*args)), tensors)
        return done[0]

