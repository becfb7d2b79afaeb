"""The ``mpi4py`` backend: MPI for torch.distributed on stock PyTorch wheels.

PyTorch's own MPI backend exists only in builds compiled against an MPI
library (PyTorch docs, "Backends": MPI needs a build from source); the wheels on PyPI have ``is_mpi_available() == False``.
:class:`MPIProcessGroup` fills the gap: a ``torch.distributed.ProcessGroup``
written in Python over mpi4py, registered as backend ``"mpi4py"`` with the
``mpi://`` init method (:mod:`polydist.backends.mpi4py.job`), and standing in
for torch's ``"mpi"`` backend where the wheel has none
(:func:`polydist.backends.mpi4py.provide_torch_mpi`). Whatever calls a
process group runs on it: the ``torch.distributed`` functions (by method name,
in Python), DistributedDataParallel's reducer (from C++, through PyTorch's
pybind trampoline) and polydist's collectives. ``torch.distributed.all_reduce``'s
common blocking call is compiled where ``_lean.cpp`` was built (:data:`LEAN`):
the group is then also a ``LeanGroup``, whose C++ ``allreduce`` records, watches
and calls ``MPI_Allreduce`` without the interpreter and leaves every other call
to the Python one (``_allreduce_python``).

How operations map onto MPI:

* Collectives are MPI's blocking collectives on the group's own communicator
  (a ``Dup`` of ``COMM_WORLD`` for the world, ``Create_group`` for a
  subgroup), run in call order on the communicator's worker thread
  (:class:`~polydist.backends.lane.Lane`, PyTorch's ``ProcessGroupMPI``
  design): ``async_op=True`` returns pending work at once, its future
  completes without ``wait()``, and DDP overlaps gradient all-reduces with
  the backward pass. A blocking call that finds nothing queued runs inline.
  Argument errors are raised by the call itself, before anything is queued.
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
* Every operation is an event ``"<backend>:<op>"`` (``mpi:all_reduce``,
  ``mpi:send``, ...) with its input shapes in ``torch.profiler`` and the
  autograd profiler, as PyTorch's built-in backends record.
* Inputs may alias outputs (FSDP2 all-gathers in place): an all-gather whose
  input is this rank's slot of the output, and an all-to-all over one buffer
  with the same splits on both sides, run with ``MPI_IN_PLACE``; any other
  overlap copies the input first (``MPI_Reduce_scatter_block``'s in-place
  form reads the input from the output buffer, which is not torch's aliasing).
  The list, coalesced and rooted forms stage through buffers of their own.
* Tensors are passed by address (``MPI.buffer.fromaddress``): no copy for
  contiguous CPU tensors. CUDA tensors are rejected with an ``InvalidArgumentError`` (a ``ValueError``)
  (the backend is registered for the ``cpu`` device only).
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch
import torch.distributed as dist

from ..._compiled import load
from ...errors import InvalidArgumentError
from . import _mpi
from .pieces import MPIPieces
from ...collectives.recorder import RECORDER
from .. import dispatch
from ..group_checks import opt
from ..lane import run_recorded
from ..python_group import PythonProcessGroup
from ..tensors import Contiguous, apart, own_slot
from ..watchdog import WATCHDOG
from ..work import LaneWork, StatusRequest, profiling, request_work

__all__ = ["MPIProcessGroup", "LEAN"]

# The compiled torch-level all_reduce (_lean.cpp, built by setup.py against the installed torch), or None: the
# group is then the Python group alone, whose allreduce takes the same path in Python.
LEAN = load(__package__, "_lean", "_lean.cpp")


@functools.cache  # once per process, at the first group's creation (MPI has started then)
def _lean_configure() -> None:
    """Give the compiled all_reduce the MPI library's ``MPI_Allreduce`` (its address, found through mpi4py's own
    module, which links the library), the size of MPI's handles, ``MPI_IN_PLACE``, and the objects it consults."""
    import ctypes

    MPI = _mpi.mpi()
    address = ctypes.cast(ctypes.CDLL(MPI.__file__).MPI_Allreduce, ctypes.c_void_p).value
    LEAN.configure(RECORDER, WATCHDOG, run_recorded, profiling, MPI.Exception, address, MPI._sizeof(MPI.COMM_WORLD),
                   int(MPI.IN_PLACE))  # fmt: skip


def _handle(obj: Any) -> int:
    """An mpi4py object's MPI handle as an unsigned 64-bit word (mpi4py gives MPICH's as Python ints of either sign)."""
    return obj.handle & 0xFFFFFFFFFFFFFFFF


class MPIProcessGroup(MPIPieces, PythonProcessGroup, *(() if LEAN is None else (LEAN.LeanGroup,))):
    """A ``torch.distributed`` process group over an MPI communicator.

    Created by torch.distributed (``init_process_group("mpi4py")`` or, on
    wheels without MPI, ``init_process_group("mpi")``; ``new_group``), not
    by hand. ``getBackendName()`` is the name it was created under. Ranks are
    the communicator's ranks, which are the group ranks torch.distributed
    assigns. Methods carry PyTorch's ProcessGroup signatures, under the names
    PyTorch 2.2–2.13 call (``_allgather_base``/``all_gather_single``,
    ``alltoall_base``/``all_to_all_single``, ...). Errors: ``InvalidArgumentError`` (a ``ValueError`` and a ``RuntimeError``) for
    CUDA tensors or mismatched sizes (torch's rule, the words of every Python
    group: :class:`~polydist.backends.python_group.PythonProcessGroup`);
    ``TypeError`` for an op undefined on a dtype (the same table as
    polydist's collectives, :func:`polydist.ops.check_op_dtype`), both raised
    by the call; MPI errors (``mpi4py.MPI.Exception``) are raised by ``wait()``,
    or by the call itself where a blocking all_reduce ran on the caller's thread.
    """

    def __init__(self, comm: Any, rank: int, size: int, backend: str = _mpi.BACKEND_NAME) -> None:
        super().__init__(rank, size, backend)
        self.comm = comm
        if LEAN is not None and comm is not None:  # None: a group built for its checks alone (unit tests)
            _lean_configure()
            self._lean_setup(_handle(comm), size)

    def __repr__(self) -> str:
        return f"<MPIProcessGroup {self._backend} rank={self._rank} size={self._size}>"

    def for_torch(self) -> "MPIProcessGroup":
        """What a creator gives torch: this group, with its Backend for torch's dispatcher registered where built
        (:func:`~polydist.backends.dispatch.for_torch`, the compiled all_reduce plugged in)."""
        fast = None if LEAN is None or self.comm is None else (LEAN.ALLREDUCE, _handle(self.comm), self._size)
        return dispatch.for_torch(self, self._backend, fast)

    def _cannot_cancel(self) -> str:
        return "A blocked MPI collective cannot be cancelled: MPI_Abort ends the job after this rank's dump"

    def _end_job(self, error: BaseException, text: str) -> None:
        """MPI_Abort (every launcher then ends every rank), after the failure is left for ``polydist run``."""
        from .job import fail

        fail(_mpi.mpi().COMM_WORLD.Get_rank(), error, text, 1)

    # ------------------------------------------------------------ reductions

    def allreduce_tensor(self, t: torch.Tensor, op: Any = "SUM") -> torch.Tensor:
        """Reduce ``t`` in place on every rank and return it (blocking; the lean path polydist takes).

        ``op`` is a canonical name ("SUM", ...) or a ``ReduceOp``. Small
        tensors cost little more than the MPI call itself: the common case
        (contiguous CPU tensor of an MPI dtype, op given by name, nothing
        queued, no profiler) is looked up once per (dtype, op).
        """
        plan = _mpi.PLANS.get((t.dtype, op)) if isinstance(op, str) else None
        if plan is not None and not self._lane.pending and t.is_cpu and t.is_contiguous() and not profiling():
            self._lean_allreduce(t, plan)
            return t
        return super().allreduce_tensor(t, op)

    def _allreduce_python(self, tensors: list, opts: Any = None) -> LaneWork:
        """torch's ``all_reduce``. The common blocking call — one contiguous CPU tensor of a (dtype, op) the
        group has reduced before, nothing queued, no profiler or dispatch mode watching — is the MPI call on the
        caller's thread and the group's completed handle (:class:`~polydist.backends.work.DoneWork`), which
        ``torch.distributed.all_reduce`` waits on and drops; anything else takes the lane (through torch's
        dispatcher while watched: :mod:`~polydist.backends.dispatch`)."""
        if len(tensors) == 1 and opts is not None and not opts.asyncOp:
            t = tensors[0]
            plan = _mpi.PLANS.get((t.dtype, opts.reduceOp.op.value))  # the enum's int: hashing the enum is slow
            if plan is not None and not self._lane.pending and t.is_cpu and t.is_contiguous() and not dispatch.watched():
                self._lean_allreduce(t, plan)
                return self._lane.done.completed(tensors)
        return super().allreduce(tensors, opts)

    # torch's all_reduce, compiled where built (LeanGroup.allreduce: the same path, calling _allreduce_python for
    # any call but the common blocking one), else the Python one. The class's own entry: reading the attribute
    # would unwrap it into a function that does not bind self.
    allreduce = _allreduce_python if LEAN is None else vars(LEAN.LeanGroup)["allreduce"]

    def _lean_allreduce(self, t: torch.Tensor, plan: tuple) -> None:
        """All-reduce contiguous CPU ``t`` in place by its learnt ``plan`` (recorded, watched), on this thread."""
        rec, buf = RECORDER, _mpi.cached_buffer(t, plan[0])
        if rec.outer is None and (rec.on or WATCHDOG.enabled):  # torch's call (DDP's, the program's): _begin's own
            self._seq = seq = self._seq + 1  # record, made, watched and closed around the MPI call in one step
            run_recorded(rec, self._lane, self._tag, "all_reduce", seq, plan[3], t, rec.on,
                         self.comm.Allreduce, _mpi.MPI.IN_PLACE, buf, plan[1])  # fmt: skip
        else:
            record, _ = self._begin("all_reduce", (t,), None, plan[3], False)  # polydist's call's record, or none
            if record is None:
                self.comm.Allreduce(_mpi.MPI.IN_PLACE, buf, plan[1])
            else:  # the pipeline closes its record; the watchdog sees it while MPI runs
                self._lane.inline_call(record, None, self.comm.Allreduce, _mpi.MPI.IN_PLACE, buf, plan[1])
        if plan[2]:
            t.div_(self._size)

    def _reduce_plan(self, t: torch.Tensor, op: Any) -> tuple:
        """``(op name, MPI op, wide dtype or None)``; learns the lean path's plan for an op given by name or
        by torch's ``ReduceOp`` (keyed by its ``RedOpType``; its records name the op as torch does, "BAND", as
        the lane's path records torch's calls)."""
        setup = _mpi.reduce_setup(t, op)
        kind = getattr(op, "op", None)  # torch's ReduceOp: its RedOpType
        if setup[2] is None and t.dtype in _mpi.REDUCE_TYPES and (isinstance(op, str) or kind is not None):
            key, name = (op, setup[0]) if isinstance(op, str) else (kind.value, kind.name)
            _mpi.PLANS[(t.dtype, key)] = plan = (_mpi.REDUCE_TYPES[t.dtype], setup[1], setup[0] == "AVG", name)
            if LEAN is not None and kind is not None:
                LEAN.learn(t.dtype, key, _handle(plan[0]), _handle(plan[1]), plan[2], plan[3])
        return setup

    def _reduce_now(self, c: torch.Tensor, plan: tuple) -> None:
        name, mpi_op, wide = plan
        w = c.to(wide) if wide is not None else c
        self.comm.Allreduce(_mpi.MPI.IN_PLACE, _mpi.typed(w), mpi_op)
        if name == "AVG":
            w.div_(self.comm.Get_size())
        if w is not c:
            c.copy_(w)

    def allreduce_coalesced(self, tensors: list, opts: Any = None) -> LaneWork:
        op = opt(opts, "reduceOp", dist.ReduceOp.SUM)
        setups = {t.dtype: plan for t, plan in zip(tensors, self._plans(tensors, op))}  # one MPI call per dtype
        size = self.comm.Get_size()

        def body() -> None:
            for dtype, (name, mpi_op, wide) in setups.items():
                members = [t for t in tensors if t.dtype == dtype]
                flat = torch.cat([t.reshape(-1) for t in members]).to(wide or dtype)
                self.comm.Allreduce(_mpi.MPI.IN_PLACE, _mpi.typed(flat), mpi_op)
                if name == "AVG":
                    flat.div_(size)
                for t, piece in zip(members, flat.split([t.numel() for t in members])):
                    t.copy_(piece.view_as(t))

        return self._run("allreduce_coalesced", body, tensors, opts, tensors, red=op)

    def reduce(self, tensors: list, opts: Any = None) -> LaneWork:
        root = opt(opts, "rootRank", 0)
        me = self.comm.Get_rank()
        setups = self._plans(tensors, opt(opts, "reduceOp", dist.ReduceOp.SUM))

        def body() -> None:
            for t, (name, mpi_op, wide) in zip(tensors, setups):
                with Contiguous(t, write_back=me == root) as c:
                    w = c.to(wide) if wide is not None else c
                    if me == root:
                        self.comm.Reduce(_mpi.MPI.IN_PLACE, _mpi.typed(w), mpi_op, root)
                        if name == "AVG":
                            w.div_(self.comm.Get_size())
                        if w is not c:
                            c.copy_(w)
                    else:
                        self.comm.Reduce(_mpi.typed(w), None, mpi_op, root)

        return self._run("reduce", body, tensors, opts, tensors, root=root, red=opt(opts, "reduceOp", dist.ReduceOp.SUM))

    def _reduce_scatter_now(self, output: torch.Tensor, input: torch.Tensor, plan: tuple) -> None:
        name, mpi_op, wide = plan
        with Contiguous(input, write_back=False) as src, Contiguous(output) as dst:
            if wide is not None:
                src_w, dst_w = src.to(wide), torch.empty(dst.shape, dtype=wide)
            else:  # MPI_IN_PLACE here means "the input is in the output buffer", not torch's aliasing: a copy
                src_w, dst_w = apart(src, dst), dst
            self.comm.Reduce_scatter_block(_mpi.typed(src_w), _mpi.typed(dst_w), mpi_op)
            if name == "AVG":
                dst_w.div_(self.comm.Get_size())
            if dst_w is not dst:
                dst.copy_(dst_w)

    # ------------------------------------------------------------ data movement: MPI's collectives on bytes

    def _broadcast_now(self, c: torch.Tensor, root: int) -> None:
        self.comm.Bcast(_mpi.raw(c), root)

    def _allgather_buffers(self, dst: torch.Tensor, src: torch.Tensor) -> tuple:
        """``(send, receive, held)`` for an all-gather of contiguous ``src`` into contiguous ``dst``: ``MPI_IN_PLACE``
        for FSDP2's in-place layout (``src`` is this rank's slot of ``dst``), else ``src`` or, where it overlaps
        ``dst``, a copy. ``held``: the send tensor, to keep alive while MPI reads its memory by address."""
        if own_slot(src, dst, self.comm.Get_rank()):
            return _mpi.MPI.IN_PLACE, _mpi.raw(dst), None
        src = apart(src, dst)
        return _mpi.raw(src), _mpi.raw(dst), src

    def _allgather_into(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        send, receive, _held = self._allgather_buffers(dst, src)
        self.comm.Allgather(send, receive)

    def _allgather_pairs(self, outputs: list, inputs: list) -> None:
        """Every pair's ``MPI_Iallgather`` started, then one ``Waitall``: the pairs' messages in flight together,
        so a coalesced call pays one round of latency, not one a pair. Aliasing as :meth:`_allgather_into`."""
        requests, held, back = [], [], []
        for out, inp in zip(outputs, inputs):
            dst = out if out.is_contiguous() else out.contiguous()
            send, receive, src = self._allgather_buffers(dst, inp if inp.is_contiguous() else inp.contiguous())
            held.append(src)  # MPI reads the memory by address until Waitall
            requests.append(self.comm.Iallgather(send, receive))
            if dst is not out:
                back.append((out, dst))
        _mpi.MPI.Request.Waitall(requests)
        for out, dst in back:
            out.copy_(dst)

    def _gather_into(self, dst: Optional[torch.Tensor], src: torch.Tensor, root: int) -> None:
        self.comm.Gather(_mpi.raw(src), None if dst is None else _mpi.raw(dst), root)

    def _scatter_from(self, src: Optional[torch.Tensor], dst: torch.Tensor, root: int) -> None:
        self.comm.Scatter(None if src is None else _mpi.raw(src), _mpi.raw(dst), root)

    def _alltoall_into(self, dst: torch.Tensor, src: torch.Tensor, send: list, recv: list, even: bool) -> None:
        if src.data_ptr() == dst.data_ptr() and send == recv:  # the same buffer, the same layout
            if even:
                self.comm.Alltoall(_mpi.MPI.IN_PLACE, _mpi.raw(dst))
            else:
                self.comm.Alltoallv(_mpi.MPI.IN_PLACE, _mpi.counted(dst, recv))
            return
        src = apart(src, dst)
        if even:
            self.comm.Alltoall(_mpi.raw(src), _mpi.raw(dst))
        else:
            self.comm.Alltoallv(_mpi.counted(src, send), _mpi.counted(dst, recv))

    def _barrier_now(self) -> None:
        self.comm.Barrier()

    # ------------------------------------------------------------ point-to-point

    def send(self, tensors: list, dst: int, tag: int) -> LaneWork:
        t = tensors[0]
        self._cpu(t)
        c = t if t.is_contiguous() else t.contiguous()
        trace = self._p2p_record("send", t, dst)
        work = request_work(tensors, self.comm.Isend(_mpi.raw(c), dst, tag), self._backend, "send", tensors, trace)
        work._keep = c  # the buffer must outlive the send
        return work

    def _recv_buffer(self, t: torch.Tensor) -> torch.Tensor:
        self._cpu(t)
        if not t.is_contiguous():
            raise InvalidArgumentError(f"recv needs a contiguous tensor to write into, got strides {t.stride()}")
        return t

    def recv(self, tensors: list, src: int, tag: int) -> LaneWork:
        request = self.comm.Irecv(_mpi.raw(self._recv_buffer(tensors[0])), src, tag)
        return request_work(tensors, request, self._backend, "recv", tensors, self._p2p_record("recv", tensors[0], src))

    def recv_anysource(self, tensors: list, tag: int) -> LaneWork:
        status = _mpi.MPI.Status()  # filled when the request completes; names the sender
        request = StatusRequest(self.comm.Irecv(_mpi.raw(self._recv_buffer(tensors[0])), _mpi.MPI.ANY_SOURCE, tag), status)
        trace = self._p2p_record("recv", tensors[0], -1)
        return request_work(tensors, request, self._backend, "recvAnySource", tensors, trace, source=status.Get_source)

