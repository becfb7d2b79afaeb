"""What polydist's ProcessGroups written in Python (mpi4py, horovod, xla-tpu) share.

A name under which torch registers the group, one :class:`~polydist.backends.work.Lane`
that runs the group's operations in call order, the checks of every call's
arguments (raised by the call, before anything is queued or sent), every
operation that is the same algorithm on any transport, the operations torch
asks for that are compositions of others (the coalesced and list forms), and
torch's other names for the same operations (``_allgather_base``, ...).

A group adds its transport: the reductions (``_reduce_plan``, ``_reduce_now``;
``reduce`` and ``_reduce_scatter_now`` where the transport has its own, else
the all-reduce of a copy) and five moves of contiguous buffers, each on the
lane, by bytes, whatever the dtype:
``_broadcast_now(c, root)``, ``_allgather_into(dst, src)`` (``dst`` holds every
rank's ``src`` in rank order), ``_gather_into(dst, src, root)`` (``dst`` None
off the root), ``_scatter_from(src, dst, root)`` (``src`` None off the root)
and ``_alltoall_into(dst, src, send, recv, even)`` (byte counts per group rank;
``even``: torch's equal split; by default the direct calls' byte all-to-all),
plus ``_barrier_now()``, point-to-point and the direct piece exchanges of
:class:`~polydist.backends.direct.DirectProcessGroup`.
Where its tensors are not plain CPU memory (XLA), ``_cpu`` (the device rule)
and ``_bytes`` (a tensor's bytes as the transport sends them) say so.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

from ..collectives.recorder import RECORDER, RES, SEQ, record_op
from ..errors import InvalidArgumentError
from .direct import DirectProcessGroup
from .tensors import Contiguous, byte_counts, bytes_of, unflatten
from .watchdog import WATCHDOG, GroupTag, end_process, seconds
from .work import Lane, LaneWork

__all__ = ["PythonProcessGroup", "NoPointToPoint", "opt", "check_cpu"]


def opt(opts: Any, name: str, default: Any) -> Any:
    """Field ``name`` of torch's options object (``AllreduceOptions``, ...), or ``default`` without one."""
    return default if opts is None else getattr(opts, name, default)


def check_cpu(t: torch.Tensor, backend: str, why: str = "") -> None:
    """Raise :class:`~polydist.errors.InvalidArgumentError` (a ``ValueError`` and a ``RuntimeError``) naming ``t``'s device unless it is the CPU (``why``: the backend's reason, if any)."""
    if not t.is_cpu:  # not t.device.type: a device object per check
        raise InvalidArgumentError(
            f"the {backend} backend moves CPU tensors only{why}, got a tensor on {t.device}; "
            "use nccl for CUDA tensors or copy to the CPU"
        )


class PythonProcessGroup(DirectProcessGroup):
    """The base of the mpi4py, horovod and xla-tpu groups; ``backend`` is the name ``getBackendName()`` gives.

    Argument errors are :class:`~polydist.errors.InvalidArgumentError`, both
    the ``RuntimeError`` torch's own backends raise for the same mistakes and
    the ``ValueError`` these groups raised before (``TypeError`` for an op
    undefined on a dtype), raised by the call on the rank that made it, before
    anything is sent. The list forms follow torch's rule (``ProcessGroupMPI``'s
    ``checkSameSizeAndType``): one tensor per group rank, each of the other
    side's dtype and number of elements; gloo also asks for the same shape.
    """

    CPU_ONLY_WHY = ""  # a group's reason for moving CPU tensors only, said in the error

    def __init__(self, rank: int, size: int, backend: str) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size  # rank() and size() go through torch's C++ binding: 1 us a call
        self._backend = backend
        self._lane = Lane(backend)
        self._group_name = ""
        self._seq = 0  # operations started on this group, whoever called them: the same count on every member
        self._tag = GroupTag(tuple(range(size)), rank, seconds(None))
        WATCHDOG.watch(self)

    def _configure(self, global_ranks: Optional[Sequence[int]], timeout: Optional[timedelta]) -> None:
        """Set the group's global ranks (None or empty: the world) and timeout (None: torch's default), which its
        records and the watchdog use; the creator calls it with what torch.distributed gave."""
        ranks = tuple(global_ranks) if global_ranks else tuple(range(self._size))
        self._tag = GroupTag(ranks, ranks[self._rank], seconds(timeout))
        WATCHDOG.retune()

    def _configured(self, opts: Any) -> "PythonProcessGroup":
        """:meth:`_configure` with torch's ``_DistributedBackendOptions`` (a creator's ``opts``); returns the group."""
        self._configure(opts.global_ranks_in_group, opts.timeout)
        return self

    def _set_default_timeout(self, timeout: timedelta) -> None:
        """Change the timeout of the group's next and running operations (the Backend method torch's
        ``_set_pg_timeout`` calls on gloo and nccl)."""
        self._tag.timeout_s = seconds(timeout)
        WATCHDOG.retune()

    def getBackendName(self) -> str:  # noqa: N802 - PyTorch's name
        return self._backend

    # torch names each group (destroy_process_group unregisters it by name); the C++
    # ProcessGroup keeps the name on its backend objects, which a Python group has none of.
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        if not self._group_name:
            raise RuntimeError("ProcessGroup name not set")
        return self._group_name

    # ------------------------------------------------------------ recording and the watchdog

    def _begin(self, op: str, inputs: Any, root: Any, red: Any, async_op: bool) -> tuple:
        """The record of the operation starting now and whether this group owns it (marks it ended).

        Inside a polydist call (the pipeline's record is the recorder's
        ``outer``) the group adopts that record, numbered with the group's
        count, so the call is recorded once; otherwise a record of its own
        (kept in the ring unless ``POLYDIST_TRACE=0``; then for the watchdog only).
        """
        self._seq = seq = self._seq + 1
        rec = RECORDER
        record = rec.outer
        if record is not None:
            if record[RES] is not self._tag:  # the call's first operation on this group: its number
                record[RES], record[SEQ] = self._tag, seq
            return record, False
        if not rec.on and not WATCHDOG.enabled:
            return None, False
        if root is not None:
            root = self._tag.ranks[root]  # torch passes group ranks; records hold global ones
        x = inputs[0] if len(inputs) == 1 else inputs  # one tensor: the record's common, cheaper case
        return record_op(rec, self._tag, op, seq, red, root, x, async_op, rec.on), True

    def _p2p_record(self, op: str, t: torch.Tensor, peer: int) -> Optional[list]:
        """The flight-recorder record of a point-to-point call to or from group rank ``peer`` (not numbered: a
        pair of ranks, not the group, takes part); None inside a polydist call (its record is the call's) or
        with ``POLYDIST_TRACE=0``. Not watched: the program's ``wait()`` bounds it."""
        rec = RECORDER
        if rec.outer is not None or not rec.on:
            return None
        return record_op(rec, self._tag, op, None, None, None if peer < 0 else self._tag.ranks[peer], t, True, True)

    def _run(
        self, op: str, body: Callable[[], None], result: Any, opts: Any, inputs: Sequence[torch.Tensor],
        root: Any = None, red: Any = None,
    ) -> LaneWork:  # fmt: skip
        """``body`` on the lane, in call order; blocking when torch asked for ``async_op=False``.

        ``root`` (a group rank) and ``red`` (the reduction op) go into the record."""
        blocking = not opt(opts, "asyncOp", True)
        record, owned = self._begin(op, inputs, root, red, not blocking)
        return self._lane.run(body, result, blocking, op, inputs, record, owned)

    def _call(self, op: str, body: Callable[[], None], inputs: Sequence[torch.Tensor]) -> None:
        """``body`` now, in order with the queued work: polydist's direct calls (blocking, no work handle)."""
        record, owned = self._begin(op, inputs, None, None, False)
        self._lane.call(body, op, inputs, record, owned)

    def _after(self, works: list, result: Any, opts: Any) -> LaneWork:
        """One LaneWork for several queued on this lane: done when the last is (the lane keeps order)."""

        def body() -> None:
            for w in works:
                w.wait()  # already done: the lane ran them first; re-raises their errors

        return self._lane.run(body, result, not opt(opts, "asyncOp", True), "coalesced", ())

    def _cannot_cancel(self) -> str:
        """What the watchdog says of the stuck operation before :meth:`_end_job`."""
        return (f"The {self._backend} backend's blocked operation cannot be cancelled; "
                "this rank ends the job (the launcher ends the other ranks)")  # fmt: skip

    def _end_job(self, error: BaseException, text: str) -> None:
        """End the job after the watchdog's dump: this process exits with status 1 (the launcher ends the rest)."""
        end_process(self._tag.rank, text)

    def shutdown(self) -> None:
        """torch's ``destroy_process_group``: finish the queued operations (a second at most), stop the lane's
        thread and the watchdog's watch of this group. Nothing is sent."""
        WATCHDOG.forget(self)
        self._lane.stop()

    def abort(self) -> None:
        """torch's ``_abort_process_group``: fail the queued operations not yet started (``RuntimeError``), stop
        watching the group. An operation already inside the transport cannot be cancelled and runs on."""
        WATCHDOG.forget(self)
        self._lane.abort(f"{self._backend}: the process group was aborted before this operation started")
        self._lane.stop(0.0)

    # ------------------------------------------------------------ argument checks

    def _cpu(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            check_cpu(t, self._backend, self.CPU_ONLY_WHY)

    def _bytes(self, t: torch.Tensor) -> torch.Tensor:
        """``t``'s memory as a flat uint8 tensor the transport can send (a view of a contiguous CPU tensor)."""
        return bytes_of(t.contiguous())

    def _like(self, what: str, name: str, index: int, t: torch.Tensor, like: torch.Tensor, like_name: str) -> None:
        """``t`` must have ``like``'s dtype and number of elements (torch's rule for the list forms); on the CPU."""
        if t.dtype != like.dtype or t.numel() != like.numel():
            raise InvalidArgumentError(
                f"{what}: invalid {name} tensor at index {index} (expected {like.dtype} of {like.numel()} elements "
                f"as the {like_name}, got {t.dtype} of {t.numel()})"
            )
        self._cpu(t)

    def _per_rank(self, what: str, name: str, tensors: Sequence[torch.Tensor]) -> None:
        """``tensors``: one per group rank."""
        if len(tensors) != self._size:
            raise InvalidArgumentError(
                f"{what}: invalid {name} tensor list (expected length {self._size}, one per group rank, got {len(tensors)})"
            )

    def _one_per_rank(self, what: str, name: str, tensors: Sequence[torch.Tensor], like: torch.Tensor, like_name: str) -> None:
        """``tensors``: one per group rank, each like ``like``."""
        self._per_rank(what, name, tensors)
        for i, t in enumerate(tensors):
            self._like(what, name, i, t, like, like_name)

    def _plans(self, tensors: Sequence[torch.Tensor], op: Any) -> list:
        """The group's reduction plan of each tensor; the op x dtype and device checks."""
        plans = [self._reduce_plan(t, op) for t in tensors]
        self._cpu(*tensors)
        return plans

    # ------------------------------------------------------------ reductions (the transport in _reduce_now)

    def _reduce_plan(self, t: torch.Tensor, op: Any) -> Any:
        """How the group reduces ``t`` under ``op``; raises for an op undefined on the dtype."""
        raise NotImplementedError

    def _reduce_now(self, c: torch.Tensor, plan: Any) -> None:
        """All-reduce contiguous ``c`` in place (on the lane)."""
        raise NotImplementedError

    def _reduce_into(self, t: torch.Tensor, plan: Any) -> None:
        with Contiguous(t) as c:
            self._reduce_now(c, plan)

    def allreduce(self, tensors: list, opts: Any = None) -> LaneWork:
        red = opt(opts, "reduceOp", dist.ReduceOp.SUM)
        plans = self._plans(tensors, red)

        def body() -> None:
            for t, plan in zip(tensors, plans):
                self._reduce_into(t, plan)

        return self._run("all_reduce", body, tensors, opts, tensors, red=red)

    def allreduce_tensor(self, t: torch.Tensor, op: Any = "SUM") -> torch.Tensor:
        plan = self._plans([t], op)[0]
        self._call("all_reduce", lambda: self._reduce_into(t, plan), [t])
        return t

    def allreduce_coalesced(self, tensors: list, opts: Any = None) -> LaneWork:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list, opts: Any = None) -> LaneWork:
        """The all-reduce of a copy, kept on the root: the other ranks' inputs stay untouched (a transport with a
        reduce of its own overrides this)."""
        root = opt(opts, "rootRank", 0)
        red = opt(opts, "reduceOp", dist.ReduceOp.SUM)
        plans = self._plans(tensors, red)

        def body() -> None:
            for t, plan in zip(tensors, plans):
                c = t.clone(memory_format=torch.contiguous_format)
                self._reduce_now(c, plan)
                if self._rank == root:
                    t.copy_(c)

        return self._run("reduce", body, tensors, opts, tensors, root=root, red=red)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> LaneWork:
        size = self._size
        if input.numel() != output.numel() * size:
            raise InvalidArgumentError(
                f"reduce_scatter: input has {input.numel()} elements, need output's {output.numel()} x group size {size}"
            )
        if input.dtype != output.dtype:
            raise InvalidArgumentError(f"reduce_scatter: input dtype {input.dtype} differs from output dtype {output.dtype}")
        red = opt(opts, "reduceOp", dist.ReduceOp.SUM)
        plan = self._plans([input], red)[0]
        self._cpu(output)
        return self._run("reduce_scatter_tensor", lambda: self._reduce_scatter_now(output, input, plan), output, opts, [input],
                         red=red)  # fmt: skip

    def _reduce_scatter_now(self, output: torch.Tensor, input: torch.Tensor, plan: Any) -> None:
        """The all-reduce of a copy of ``input``, this rank's block kept in ``output`` (a transport with a
        reduce-scatter of its own overrides this)."""
        whole = input.clone(memory_format=torch.contiguous_format)
        self._reduce_now(whole, plan)
        output.copy_(whole.reshape(self._size, -1)[self._rank].reshape(output.shape))

    # ------------------------------------------------------------ data movement (the transport in the _*_now/_into)

    def broadcast(self, tensors: list, opts: Any = None) -> LaneWork:
        root = opt(opts, "rootRank", 0)
        self._cpu(*tensors)
        here = self._rank == root

        def body() -> None:
            for t in tensors:
                with Contiguous(t, write_back=not here) as c:
                    self._broadcast_now(c, root)

        return self._run("broadcast", body, tensors, opts, tensors, root=root)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> LaneWork:
        size = self._size
        if output.nbytes != input.nbytes * size:
            raise InvalidArgumentError(f"all_gather: output has {output.nbytes} bytes, need input's {input.nbytes} x group size {size}")
        self._cpu(input, output)

        def body() -> None:
            with Contiguous(input, write_back=False) as src, Contiguous(output) as dst:
                self._allgather_into(dst, src)

        return self._run("all_gather_into_tensor", body, output, opts, [input])

    def allgather(self, output_lists: list, inputs: list, opts: Any = None) -> LaneWork:
        """``output_lists[i][r]`` receives rank r's ``inputs[i]`` (torch's ``all_gather``)."""
        for outs, inp in zip(output_lists, inputs):
            self._cpu(inp)
            self._one_per_rank("all_gather", "output", outs, inp, "input")

        def body() -> None:
            for outs, inp in zip(output_lists, inputs):
                self._gather_list(outs, inp, None)

        return self._run("all_gather", body, output_lists, opts, inputs)

    def _gather_list(self, outs: list, inp: torch.Tensor, root: Any) -> None:
        """Every rank's ``inp`` into ``outs`` (rank order): all ranks' when ``root`` is None, else root's only."""
        flat = torch.empty(inp.nbytes * self._size, dtype=torch.uint8) if root in (None, self._rank) else None
        with Contiguous(inp, write_back=False) as src:
            if root is None:
                self._allgather_into(flat, src)
            else:
                self._gather_into(flat, src, root)
        if flat is not None:
            unflatten(flat, outs, by_bytes=True)

    def allgather_coalesced(self, output_lists: list, inputs: list, opts: Any = None) -> LaneWork:
        """``output_lists[r][i]`` receives rank r's ``inputs[i]`` (torch's ``all_gather_coalesced``), in one all-gather."""
        size = self._size
        if len(output_lists) != size or any(len(outs) != len(inputs) for outs in output_lists):
            raise InvalidArgumentError(
                f"all_gather_coalesced: need {size} output lists (one per rank) of {len(inputs)} tensors each, "
                f"got {[len(outs) for outs in output_lists]}"
            )
        self._cpu(*inputs)
        for outs in output_lists:
            for i, (out, inp) in enumerate(zip(outs, inputs)):
                self._like("all_gather_coalesced", "output", i, out, inp, "input")

        def body() -> None:
            src = torch.cat([self._bytes(t) for t in inputs]) if inputs else torch.empty(0, dtype=torch.uint8)
            flat = torch.empty(src.numel() * size, dtype=torch.uint8)
            self._allgather_into(flat, src)
            for r, outs in enumerate(output_lists):
                unflatten(flat[r * src.numel() : (r + 1) * src.numel()], outs, by_bytes=True)

        return self._run("all_gather_coalesced", body, output_lists, opts, inputs)

    def gather(self, output_lists: list, inputs: list, opts: Any = None) -> LaneWork:
        root = opt(opts, "rootRank", 0)
        self._cpu(inputs[0])
        if self._rank == root:
            self._one_per_rank("gather", "output", output_lists[0], inputs[0], "input")
        outs = output_lists[0] if self._rank == root else []
        return self._run("gather", lambda: self._gather_list(outs, inputs[0], root), output_lists, opts, inputs, root=root)

    def scatter(self, outputs: list, input_lists: list, opts: Any = None) -> LaneWork:
        root = opt(opts, "rootRank", 0)
        here = self._rank == root
        self._cpu(outputs[0])
        if here:
            self._one_per_rank("scatter", "input", input_lists[0], outputs[0], "output")

        def body() -> None:
            with Contiguous(outputs[0]) as dst:
                src = torch.cat([self._bytes(t) for t in input_lists[0]]) if here else None
                self._scatter_from(src, dst, root)

        return self._run("scatter", body, outputs, opts, input_lists[0] if here else outputs, root=root)

    def all_to_all_single(
        self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int], opts: Any = None,
    ) -> LaneWork:  # fmt: skip
        """torch's rule: with no split sizes, dim 0 splits evenly and both sides hold the same bytes."""
        size = self._size
        self._cpu(input, output)
        even = not output_split_sizes and not input_split_sizes
        if even and input.nbytes != output.nbytes:
            raise InvalidArgumentError(f"all_to_all_single: input ({input.nbytes} B) and output ({output.nbytes} B) must be equal")
        send = byte_counts(input, input_split_sizes, size, "input")
        recv = byte_counts(output, output_split_sizes, size, "output")

        def body() -> None:
            with Contiguous(input, write_back=False) as src, Contiguous(output) as dst:
                self._alltoall_into(dst, src, send, recv, even)

        return self._run("all_to_all", body, output, opts, [input])

    def alltoall(self, outputs: list, inputs: list, opts: Any = None) -> LaneWork:
        self._cpu(*inputs, *outputs)
        self._per_rank("all_to_all", "input", inputs)  # the sizes may differ: each pair of ranks agrees on its own
        self._per_rank("all_to_all", "output", outputs)
        send = [t.nbytes for t in inputs]
        recv = [t.nbytes for t in outputs]

        def body() -> None:
            src = torch.cat([self._bytes(t) for t in inputs])
            dst = torch.empty(sum(recv), dtype=torch.uint8)
            self._alltoall_into(dst, src, send, recv, False)
            unflatten(dst, outputs, by_bytes=True)

        return self._run("all_to_all", body, outputs, opts, inputs)

    def barrier(self, opts: Any = None) -> LaneWork:
        return self._run("barrier", self._barrier_now, None, opts, ())

    def _broadcast_now(self, c: torch.Tensor, root: int) -> None:
        raise NotImplementedError

    def _allgather_into(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        raise NotImplementedError

    def _gather_into(self, dst: Any, src: torch.Tensor, root: int) -> None:
        raise NotImplementedError

    def _scatter_from(self, src: Any, dst: torch.Tensor, root: int) -> None:
        raise NotImplementedError

    def _alltoall_into(self, dst: torch.Tensor, src: torch.Tensor, send: list, recv: list, even: bool) -> None:
        """By default the direct calls' byte all-to-all (:meth:`_all_to_all_bytes`); a transport with an
        all-to-all of its own overrides this."""
        got = self._all_to_all_bytes(self._bytes(src), send)
        if got.numel() != sum(recv):
            raise ValueError(f"all_to_all: received {got.numel()} bytes, the outputs hold {sum(recv)}")
        unflatten(got, [dst], by_bytes=True)

    def _barrier_now(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ compositions

    def reduce_scatter(self, outputs: list, input_lists: list, opts: Any = None) -> LaneWork:
        works = [self.reduce_scatter_single(out, torch.cat([t.reshape(-1) for t in ins]), opts) for out, ins in zip(outputs, input_lists)]
        return works[-1] if len(works) == 1 else self._after(works, outputs, opts)

    def _pairs(self, what: str, outputs: list, inputs: list) -> None:
        if len(outputs) != len(inputs):
            raise InvalidArgumentError(f"{what}: {len(outputs)} output tensors for {len(inputs)} input tensors")

    def reduce_scatter_single_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> LaneWork:
        """torch's ``reduce_scatter_tensor`` calls coalesced (``_coalescing_manager``): ``outputs[i]`` receives
        this rank's block of the reduced ``inputs[i]``. One operation of the group (one record, one run on the
        lane), every pair checked before anything is sent; the transport reduces the pairs in
        :meth:`_reduce_scatter_pairs`."""
        what = "reduce_scatter_tensor_coalesced"
        self._pairs(what, outputs, inputs)
        size, red = self._size, opt(opts, "reduceOp", dist.ReduceOp.SUM)
        for i, (out, inp) in enumerate(zip(outputs, inputs)):
            if inp.numel() != out.numel() * size or inp.dtype != out.dtype:
                raise InvalidArgumentError(f"{what}: input {i} ({inp.numel()} x {inp.dtype}) must hold output {i}'s "
                                           f"{out.numel()} x {out.dtype} elements x group size {size}")  # fmt: skip
        self._cpu(*outputs)
        plans = self._plans(inputs, red)
        return self._run(what, lambda: self._reduce_scatter_pairs(outputs, inputs, plans), outputs, opts, inputs, red=red)

    def _reduce_scatter_pairs(self, outputs: list, inputs: list, plans: list) -> None:
        for out, inp, plan in zip(outputs, inputs, plans):
            self._reduce_scatter_now(out, inp, plan)

    def reduce_scatter_tensor_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> LaneWork:
        return self.reduce_scatter_single_coalesced(outputs, inputs, opts)

    def all_gather_single_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> LaneWork:
        """torch's ``all_gather_into_tensor`` calls coalesced (``_coalescing_manager``): ``outputs[i]`` receives
        every rank's ``inputs[i]`` in rank order. One operation of the group (one record, one run on the lane),
        every pair checked before anything is sent; the transport moves the pairs in :meth:`_allgather_pairs`."""
        what = "all_gather_into_tensor_coalesced"
        self._pairs(what, outputs, inputs)
        size = self._size
        for i, (out, inp) in enumerate(zip(outputs, inputs)):
            if out.nbytes != inp.nbytes * size:
                raise InvalidArgumentError(f"{what}: output {i} has {out.nbytes} bytes, need input {i}'s {inp.nbytes} "
                                           f"x group size {size}")  # fmt: skip
        self._cpu(*inputs, *outputs)
        return self._run(what, lambda: self._allgather_pairs(outputs, inputs), outputs, opts, inputs)

    def _allgather_pairs(self, outputs: list, inputs: list) -> None:
        """Every rank's ``inputs[i]`` into ``outputs[i]``, one :meth:`_allgather_into` a pair (a transport with a
        non-blocking all-gather has them all in flight at once instead)."""
        for out, inp in zip(outputs, inputs):
            with Contiguous(inp, write_back=False) as src, Contiguous(out) as dst:
                self._allgather_into(dst, src)

    def allgather_into_tensor_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> LaneWork:
        return self.all_gather_single_coalesced(outputs, inputs, opts)

    # ------------------------------------------------------------ torch's other names for the same operations

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> LaneWork:
        return self.reduce_scatter_single(output, input, opts)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> LaneWork:
        return self.all_gather_single(output, input, opts)

    def alltoall_base(
        self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int], opts: Any = None,
    ) -> LaneWork:  # fmt: skip
        return self.all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts)


class NoPointToPoint:
    """send/recv of a Python group whose transport has none (horovod, xla-tpu): ``NotImplementedError`` naming
    ``_backend``, and ``no_p2p_reason``: why, and what to use instead, raised before anything is sent."""

    _backend: str
    no_p2p_reason = ""

    def _no_p2p(self, op: str) -> LaneWork:
        raise NotImplementedError(f"{op}: the {self._backend} backend has no point-to-point operations {self.no_p2p_reason}")

    def send(self, tensors: list, dst: int, tag: int) -> LaneWork:
        return self._no_p2p("send")

    def recv(self, tensors: list, src: int, tag: int) -> LaneWork:
        return self._no_p2p("recv")

    def recv_anysource(self, tensors: list, tag: int) -> LaneWork:
        return self._no_p2p("recv")
