"""The ``mpi4py`` backend: MPI for torch.distributed on stock PyTorch wheels.

PyTorch's own MPI backend exists only in builds compiled against an MPI
library (PyTorch docs, "Backends": MPI needs a build from source); the wheels on PyPI have ``is_mpi_available() == False``.
:class:`MPIProcessGroup` fills the gap: a ``torch.distributed.ProcessGroup``
written in Python over mpi4py, registered as backend ``"mpi4py"`` with the
``mpi://`` init method (:mod:`polydist.backends.mpi4py.job`). Whatever calls a
process group runs on it: the ``torch.distributed`` functions (by method name,
in Python), DistributedDataParallel's reducer (from C++, through PyTorch's
pybind trampoline) and polydist's collectives.

How operations map onto MPI:

* Collectives are MPI's blocking collectives on the group's own communicator
  (a ``Dup`` of ``COMM_WORLD`` for the world, ``Create_group`` for a
  subgroup). They are complete when the call returns, so their work is
  already complete and its future already holds the result (DDP chains on
  it); ``async_op=True`` is accepted and gives such completed work.
* Data movement (broadcast, the gathers and scatters, all-to-all,
  point-to-point) moves raw bytes (``MPI.BYTE``), so every dtype travels,
  bfloat16 and complex included.
* Reductions use the MPI datatype of the tensor's dtype. float16/bfloat16,
  which MPI lacks, are reduced in float32 and rounded once. AVG is SUM and one
  division (floating dtypes only, as with NCCL). bool reduces with MPI's
  logical ops. ``reduce`` leaves non-root inputs untouched (``MPI_Reduce``
  only reads them).
* Point-to-point is non-blocking underneath (``Isend``/``Irecv``), so a ring
  of large messages cannot deadlock. ``wait()`` waits on the MPI request;
  a future taken with ``get_future()`` is completed by a progress thread
  without anyone calling ``wait()``.
* Tensors are passed by address (``MPI.buffer.fromaddress``): no copy for
  contiguous CPU tensors. CUDA tensors are rejected with a ``ValueError``
  (the backend is registered for the ``cpu`` device only).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from . import _mpi

__all__ = ["MPIProcessGroup"]


class MPIProcessGroup(dist.ProcessGroup):
    """A ``torch.distributed`` process group over an MPI communicator (backend name ``"mpi4py"``).

    Created by torch.distributed (``init_process_group("mpi4py")``,
    ``new_group``), not by hand. Ranks are the communicator's ranks, which
    are the group ranks torch.distributed assigns. Methods carry PyTorch's
    ProcessGroup signatures, under the names PyTorch 2.2–2.13 call
    (``_allgather_base``/``all_gather_single``, ``alltoall_base``/
    ``all_to_all_single``, ...). Errors: ``ValueError`` for CUDA tensors or
    mismatched sizes; ``TypeError`` for an op undefined on a dtype (the same
    table as polydist's collectives, :func:`polydist.ops.check_op_dtype`); MPI
    errors propagate as ``mpi4py.MPI.Exception``.
    """

    def __init__(self, comm: Any, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self.comm = comm

    def getBackendName(self) -> str:  # noqa: N802 - PyTorch's name
        return _mpi.BACKEND_NAME

    def __repr__(self) -> str:
        return f"<MPIProcessGroup rank={self.rank()} size={self.size()}>"

    # ------------------------------------------------------------ reductions

    def allreduce_tensor(self, t: torch.Tensor, op: Any = "SUM") -> torch.Tensor:
        """Reduce ``t`` in place on every rank and return it (blocking; the lean path polydist takes).

        ``op`` is a canonical name ("SUM", ...) or a ``ReduceOp``. Small
        tensors cost little more than the MPI call itself: the common case
        (contiguous CPU tensor of an MPI dtype, op given by name) is looked up
        once per (dtype, op).
        """
        plan = _mpi.PLANS.get((t.dtype, op)) if isinstance(op, str) else None
        if plan is not None and t.is_cpu and t.is_contiguous():
            self.comm.Allreduce(_mpi.MPI.IN_PLACE, _mpi.cached_buffer(t, plan[0]), plan[1])
            if plan[2]:
                t.div_(self.comm.Get_size())
            return t
        name, mpi_op, wide = _mpi.reduce_setup(t, op)
        if isinstance(op, str) and wide is None and t.dtype in _mpi.REDUCE_TYPES:
            _mpi.PLANS[(t.dtype, op)] = (_mpi.REDUCE_TYPES[t.dtype], mpi_op, name == "AVG")
        with _mpi.Contiguous(t) as c:
            w = c.to(wide) if wide is not None else c
            self.comm.Allreduce(_mpi.MPI.IN_PLACE, _mpi.typed(w), mpi_op)
            if name == "AVG":
                w.div_(self.comm.Get_size())
            if w is not c:
                c.copy_(w)
        return t

    def allreduce(self, tensors: list, opts: Any = None) -> _mpi.Work:
        op = _mpi.opt(opts, "reduceOp", dist.ReduceOp.SUM)
        for t in tensors:
            self.allreduce_tensor(t, op)
        return _mpi.Work(tensors)

    def allreduce_coalesced(self, tensors: list, opts: Any = None) -> _mpi.Work:
        op = _mpi.opt(opts, "reduceOp", dist.ReduceOp.SUM)
        for dtype in dict.fromkeys(t.dtype for t in tensors):
            members = [t for t in tensors if t.dtype == dtype]
            if len(members) == 1:
                self.allreduce_tensor(members[0], op)
                continue
            flat = self.allreduce_tensor(torch.cat([t.reshape(-1) for t in members]), op)
            for t, piece in zip(members, flat.split([t.numel() for t in members])):
                t.copy_(piece.view_as(t))
        return _mpi.Work(tensors)

    def reduce(self, tensors: list, opts: Any = None) -> _mpi.Work:
        root = _mpi.opt(opts, "rootRank", 0)
        op = _mpi.opt(opts, "reduceOp", dist.ReduceOp.SUM)
        me = self.comm.Get_rank()
        for t in tensors:
            name, mpi_op, wide = _mpi.reduce_setup(t, op)
            with _mpi.Contiguous(t, write_back=me == root) as c:
                w = c.to(wide) if wide is not None else c
                if me == root:
                    self.comm.Reduce(_mpi.MPI.IN_PLACE, _mpi.typed(w), mpi_op, root)
                    if name == "AVG":
                        w.div_(self.comm.Get_size())
                    if w is not c:
                        c.copy_(w)
                else:
                    self.comm.Reduce(_mpi.typed(w), None, mpi_op, root)
        return _mpi.Work(tensors)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _mpi.Work:
        op = _mpi.opt(opts, "reduceOp", dist.ReduceOp.SUM)
        if input.numel() != output.numel() * self.comm.Get_size():
            raise ValueError(
                f"reduce_scatter: input has {input.numel()} elements, need output's {output.numel()} "
                f"x group size {self.comm.Get_size()}"
            )
        if input.dtype != output.dtype:
            raise ValueError(f"reduce_scatter: input dtype {input.dtype} differs from output dtype {output.dtype}")
        name, mpi_op, wide = _mpi.reduce_setup(input, op)
        with _mpi.Contiguous(input, write_back=False) as src, _mpi.Contiguous(output) as dst:
            if wide is not None:
                src_w, dst_w = src.to(wide), torch.empty(dst.shape, dtype=wide)
            else:
                src_w, dst_w = src, dst
            self.comm.Reduce_scatter_block(_mpi.typed(src_w), _mpi.typed(dst_w), mpi_op)
            if name == "AVG":
                dst_w.div_(self.comm.Get_size())
            if dst_w is not dst:
                dst.copy_(dst_w)
        return _mpi.Work(output)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs: list, input_lists: list, opts: Any = None) -> _mpi.Work:
        for out, ins in zip(outputs, input_lists):
            self.reduce_scatter_single(out, torch.cat([t.reshape(-1) for t in ins]), opts)
        return _mpi.Work(outputs)

    def reduce_scatter_single_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> _mpi.Work:
        for out, inp in zip(outputs, inputs):
            self.reduce_scatter_single(out, inp, opts)
        return _mpi.Work(outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ------------------------------------------------------------ data movement

    def broadcast(self, tensors: list, opts: Any = None) -> _mpi.Work:
        root = _mpi.opt(opts, "rootRank", 0)
        for t in tensors:
            with _mpi.Contiguous(t, write_back=self.comm.Get_rank() != root) as c:
                self.comm.Bcast(_mpi.raw(c), root)
        return _mpi.Work(tensors)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _mpi.Work:
        if output.nbytes != input.nbytes * self.comm.Get_size():
            raise ValueError(
                f"all_gather: output has {output.nbytes} bytes, need input's {input.nbytes} "
                f"x group size {self.comm.Get_size()}"
            )
        with _mpi.Contiguous(input, write_back=False) as src, _mpi.Contiguous(output) as dst:
            self.comm.Allgather(_mpi.raw(src), _mpi.raw(dst))
        return _mpi.Work(output)

    _allgather_base = all_gather_single

    def allgather(self, output_lists: list, inputs: list, opts: Any = None) -> _mpi.Work:
        for outs, inp in zip(output_lists, inputs):
            flat = torch.empty(inp.numel() * len(outs), dtype=inp.dtype)
            self.all_gather_single(flat, inp)
            _mpi.unflatten(flat, outs)
        return _mpi.Work(output_lists)

    def allgather_coalesced(self, output_lists: list, inputs: list, opts: Any = None) -> _mpi.Work:
        for outs, inp in zip(output_lists, inputs):
            self.allgather([outs], [inp])
        return _mpi.Work(output_lists)

    def all_gather_single_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> _mpi.Work:
        for out, inp in zip(outputs, inputs):
            self.all_gather_single(out, inp)
        return _mpi.Work(outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_lists: list, inputs: list, opts: Any = None) -> _mpi.Work:
        root = _mpi.opt(opts, "rootRank", 0)
        with _mpi.Contiguous(inputs[0], write_back=False) as src:
            if self.comm.Get_rank() == root:
                outs = output_lists[0]
                flat = torch.empty(src.numel() * len(outs), dtype=src.dtype)
                self.comm.Gather(_mpi.raw(src), _mpi.raw(flat), root)
                _mpi.unflatten(flat, outs)
            else:
                self.comm.Gather(_mpi.raw(src), None, root)
        return _mpi.Work(output_lists)

    def scatter(self, outputs: list, input_lists: list, opts: Any = None) -> _mpi.Work:
        root = _mpi.opt(opts, "rootRank", 0)
        with _mpi.Contiguous(outputs[0]) as dst:
            if self.comm.Get_rank() == root:
                flat = torch.cat([t.reshape(-1) for t in input_lists[0]])
                self.comm.Scatter(_mpi.raw(flat), _mpi.raw(dst), root)
            else:
                self.comm.Scatter(None, _mpi.raw(dst), root)
        return _mpi.Work(outputs)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> _mpi.Work:
        size = self.comm.Get_size()
        with _mpi.Contiguous(input, write_back=False) as src, _mpi.Contiguous(output) as dst:
            if not output_split_sizes and not input_split_sizes:
                if src.nbytes % size or src.nbytes != dst.nbytes:
                    raise ValueError(
                        f"all_to_all_single: input ({src.nbytes} B) and output ({dst.nbytes} B) must be "
                        f"equal and divisible by the group size {size}"
                    )
                self.comm.Alltoall(_mpi.raw(src), _mpi.raw(dst))
            else:
                send = _mpi.byte_counts(src, input_split_sizes, size, "input")
                recv = _mpi.byte_counts(dst, output_split_sizes, size, "output")
                self.comm.Alltoallv(_mpi.counted(src, send), _mpi.counted(dst, recv))
        return _mpi.Work(output)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: list, inputs: list, opts: Any = None) -> _mpi.Work:
        src = torch.cat([t.reshape(-1).view(torch.uint8) for t in (c.contiguous() for c in inputs)])
        dst = torch.empty(sum(t.nbytes for t in outputs), dtype=torch.uint8)
        send = [t.nbytes for t in inputs]
        recv = [t.nbytes for t in outputs]
        self.comm.Alltoallv(_mpi.counted(src, send), _mpi.counted(dst, recv))
        _mpi.unflatten(dst, outputs, by_bytes=True)
        return _mpi.Work(outputs)

    def barrier(self, opts: Any = None) -> _mpi.Work:
        self.comm.Barrier()
        return _mpi.Work(None)

    # ------------------------------------------------------------ point-to-point

    def send(self, tensors: list, dst: int, tag: int) -> _mpi.Work:
        t = tensors[0]
        _mpi.check_cpu(t)
        c = t if t.is_contiguous() else t.contiguous()
        work = _mpi.Work(tensors, self.comm.Isend(_mpi.raw(c), dst, tag))
        work._keep = c  # the buffer must outlive the send
        return work

    def recv(self, tensors: list, src: int, tag: int) -> _mpi.Work:
        return _mpi.Work(tensors, self.comm.Irecv(_mpi.raw(_recv_buffer(tensors[0])), src, tag))

    def recv_anysource(self, tensors: list, tag: int) -> _mpi.Work:
        status = _mpi.MPI.Status()  # filled when the request completes; names the sender
        request = self.comm.Irecv(_mpi.raw(_recv_buffer(tensors[0])), _mpi.MPI.ANY_SOURCE, tag)
        return _mpi.Work(tensors, _mpi.StatusRequest(request, status), source=status.Get_source)


def _recv_buffer(t: torch.Tensor) -> torch.Tensor:
    _mpi.check_cpu(t)
    if not t.is_contiguous():
        raise ValueError(f"recv needs a contiguous tensor to write into, got strides {t.stride()}")
    return t
