"""Every operation of polydist's Python groups, written once over the moves of the group's transport.

The operations that are the same algorithm on any transport, the operations
torch asks for that are compositions of others (the coalesced and list forms),
and torch's other names for the same operations (``_allgather_base``, ...),
each checked (:mod:`~polydist.backends.group_checks`) and run on the group's
lane (``_run``, ``_call``, ``_after`` of
:class:`~polydist.backends.python_group.PythonProcessGroup`).

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
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from ..errors import InvalidArgumentError
from .group_checks import GroupChecks, opt
from .tensors import Contiguous, byte_counts, unflatten
from .work import LaneWork

__all__ = ["GroupOperations"]


class GroupOperations(GroupChecks):
    """The operations of :class:`~polydist.backends.python_group.PythonProcessGroup` (``_rank``: this rank in
    the group), over the transport's moves."""

    _rank: int

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

