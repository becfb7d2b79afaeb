"""What polydist's ProcessGroups written in Python (mpi4py, horovod, xla-tpu) share.

A name under which torch registers the group, one :class:`~polydist.backends.lane.Lane`
that runs the group's operations in call order, their records and the
watchdog's watch, and the group's end (``shutdown``, ``abort``). The
operations themselves, written once over the transport's moves, are
:mod:`~polydist.backends.group_operations`; their argument checks
:mod:`~polydist.backends.group_checks`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import torch

from ..collectives.recorder import RECORDER, RES, SEQ, record_op
from . import dispatch
from .direct import DirectProcessGroup
from .group_checks import opt
from .group_operations import GroupOperations
from .lane import Lane
from .watchdog import WATCHDOG, GroupTag, end_process, seconds
from .work import LaneWork

__all__ = ["PythonProcessGroup", "NoPointToPoint"]


class PythonProcessGroup(GroupOperations, DirectProcessGroup):
    """The base of the mpi4py, horovod and xla-tpu groups; ``backend`` is the name ``getBackendName()`` gives.
    Its operations and their checks are :class:`~polydist.backends.group_operations.GroupOperations`'."""

    def __init__(self, rank: int, size: int, backend: str) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size  # rank() and size() go through torch's C++ binding: 1 us a call
        self._backend = backend
        self._lane = Lane(backend)
        self._group_name = ""
        self._seq = 0  # operations started on this group, whoever called them: the same count on every member
        self._tag = GroupTag(tuple(range(size)), rank, seconds(None))
        self._dispatch_backend = None  # its Backend for torch's dispatcher, once registered (dispatch.for_torch)
        WATCHDOG.watch(self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dispatch.install_doors(cls)  # a subclass's own operations of torch's names take the dispatcher when watched

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

    def _get_backend(self, device: Any) -> Any:
        """torch's Backend of this group for ``device``: the dispatcher's one (:func:`dispatch.for_torch`) where
        registered, else the group itself, which runs its operations (torch 2.14's ``batch_isend_irecv`` asks
        the group's Backend whether it coalesces; torch's C++ lookup raised without one)."""
        return self if self._dispatch_backend is None else super()._get_backend(device)

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


dispatch.install_doors(PythonProcessGroup)  # the operations of torch's names it has from GroupOperations
