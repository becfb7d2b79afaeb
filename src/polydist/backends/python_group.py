"""What polydist's ProcessGroups written in Python (mpi4py, horovod) share.

A name under which torch registers the group, one :class:`~polydist.backends.work.Lane`
that runs the group's operations in call order, the operations torch asks
for that are compositions of others (the coalesced and list forms), and
torch's other names for the same operations (``_allgather_base``, ...).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from .direct import DirectProcessGroup
from .work import Lane, LaneWork

__all__ = ["PythonProcessGroup", "NoPointToPoint", "opt"]


def opt(opts: Any, name: str, default: Any) -> Any:
    """Field ``name`` of torch's options object (``AllreduceOptions``, ...), or ``default`` without one."""
    return default if opts is None else getattr(opts, name, default)


class PythonProcessGroup(DirectProcessGroup):
    """The base of the mpi4py and horovod groups; ``backend`` is the name ``getBackendName()`` gives."""

    def __init__(self, rank: int, size: int, backend: str) -> None:
        super().__init__(rank, size)
        self._backend = backend
        self._lane = Lane(backend)
        self._group_name = ""

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

    def _run(self, op: str, body: Callable[[], None], result: Any, opts: Any, inputs: Sequence[torch.Tensor]) -> LaneWork:
        """``body`` on the lane, in call order; blocking when torch asked for ``async_op=False``."""
        return self._lane.run(body, result, not opt(opts, "asyncOp", True), op, inputs)

    def _after(self, works: list, result: Any, opts: Any) -> LaneWork:
        """One LaneWork for several queued on this lane: done when the last is (the lane keeps order)."""

        def body() -> None:
            for w in works:
                w.wait()  # already done: the lane ran them first; re-raises their errors

        return self._run("coalesced", body, result, opts, ())

    # ------------------------------------------------------------ compositions (the subclasses define the *_single)

    def reduce_scatter(self, outputs: list, input_lists: list, opts: Any = None) -> LaneWork:
        works = [self.reduce_scatter_single(out, torch.cat([t.reshape(-1) for t in ins]), opts) for out, ins in zip(outputs, input_lists)]
        return works[-1] if len(works) == 1 else self._after(works, outputs, opts)

    def reduce_scatter_single_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> LaneWork:
        return self._after([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)], outputs, opts)

    def reduce_scatter_tensor_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> LaneWork:
        return self.reduce_scatter_single_coalesced(outputs, inputs, opts)

    def all_gather_single_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> LaneWork:
        return self._after([self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)], outputs, opts)

    def allgather_into_tensor_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> LaneWork:
        return self.all_gather_single_coalesced(outputs, inputs, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> LaneWork:
        raise NotImplementedError

    def all_to_all_single(
        self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int], opts: Any = None,
    ) -> LaneWork:  # fmt: skip
        raise NotImplementedError

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

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> LaneWork:
        raise NotImplementedError


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
