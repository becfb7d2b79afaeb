"""What a training loop holds under ``--fault-tolerant``: the model's DDP and the optimizer that commits.

:class:`FaultTolerantDDP` is torchft's ``DistributedDataParallel`` with
polydist's comm hook (:func:`comm_hook`). torchft 0.2.0's hook waits for
each bucket's all-reduce inside backward, then returns the future it built;
when a peer dies during that all-reduce the wait fails before the future
exists and the hook's ``assert fut._fut`` kills the survivor (the very fault
it should survive; torchft-nightly fixes it by returning the bucket as a
completed future). polydist's hook does not wait: it chains the division by
the participants and the error report onto the all-reduce's future and
returns that, so a bucket's all-reduce runs while backward computes the next,
as with DDP's own hook; a failed or timed-out all-reduce completes the future
with the bucket as it is, and the step is not committed.

:class:`FaultTolerantOptimizer` is torchft's ``OptimizerWrapper`` whose
``step`` goes through the session's commit vote (which logs what the launcher
reports) instead of calling ``should_commit`` itself.
"""

# No "from __future__ import annotations": DDP checks that the hook's bucket annotation *is* dist.GradBucket.
import contextlib
import functools
import os
import sys
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import parallel
from torchft.ddp import DistributedDataParallel
from torchft.process_group import ProcessGroupDummy
from torchft.optim import OptimizerWrapper

__all__ = ["FaultTolerantDDP", "FaultTolerantOptimizer", "average", "comm_hook"]


def _done(value: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(value)
    return done


def average(manager: Any, buffer: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """Start averaging ``buffer`` (in place) over the replica groups taking part in the step; without blocking.

    Returns a future completed with ``buffer`` averaged, or, when the
    all-reduce failed or timed out, with ``buffer`` as it is (the manager
    then holds the error, and the step is not committed). What torchft's
    ``Manager.allreduce`` does, with the future chained here: its own chain
    (``_ManagedWork``) runs its callbacks correctly only on a completed
    all-reduce (the closure in ``_set_future_callback`` reads the loop's last
    future), which is why torchft's hook waits first. Without torchft's
    ``wrap_future`` timer either (a timer per bucket on an event-loop
    thread): the group's own timeout ends a hung all-reduce (gloo's, created
    with the manager's timeout; nccl's through torchft's timed work).
    """
    if manager.errored():  # the step already failed: nothing is sent
        return _done(buffer)
    manager.wait_quorum()
    participants = manager.num_participants()
    if not manager.is_participating():  # a replica group receiving the live state this step contributes zeros
        buffer.zero_()
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    try:
        work = manager._pg.allreduce([buffer], opts)  # torchft 0.2.0: the quorum's reconfigurable group
    except Exception as exc:  # noqa: BLE001 - a group that cannot even start the collective: the step fails
        manager.report_error(exc)
        return _done(buffer)

    def settle(fut: torch.futures.Future) -> torch.Tensor:
        try:
            fut.value()  # the all-reduce's error, if it failed: gloo's own timeout bounds it (nccl's: torchft's work)
        except Exception as exc:  # noqa: BLE001 - any failure fails the step, never the backward
            manager.report_error(exc)
            return buffer
        return buffer.div_(participants)

    return work.get_future().then(settle)


def comm_hook(manager: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: :func:`average` of the bucket over the participating replica groups (backward goes on)."""
    return average(manager, bucket.buffer())


class FaultTolerantDDP(DistributedDataParallel):
    """torchft's DDP over ``manager``'s replica groups, with :func:`comm_hook` (see the module docstring).

    torchft passes ``find_unused_parameters=True`` so that DDP never
    rebuilds its buckets (a replacement's first step would otherwise use
    other buckets than the survivors'); torch then prints, once per
    process, a C++ warning advising to turn it off. polydist takes that
    one warning on a throwaway one-parameter module, with the process's
    stderr closed for those few milliseconds, before the real model's first
    forward pass.
    """

    _comm_hook = staticmethod(comm_hook)  # torchft's __init__ registers self._comm_hook

    def __init__(self, manager: Any, module: nn.Module, **kwargs: Any) -> None:
        _take_unused_parameters_warning()
        super().__init__(manager, module, **kwargs)


@functools.lru_cache(maxsize=None)
def _take_unused_parameters_warning() -> None:
    tiny = nn.Linear(1, 1)
    with _stderr_closed():
        ddp = parallel.DistributedDataParallel(tiny, process_group=ProcessGroupDummy(0, 1), find_unused_parameters=True)
        ddp(torch.zeros(1, 1)).sum().backward()  # the forward pass warns (TORCH_WARN_ONCE: once per process)


@contextlib.contextmanager
def _stderr_closed() -> Iterator[None]:
    """File descriptor 2 on /dev/null inside the block (C++ writes there directly)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class FaultTolerantOptimizer(OptimizerWrapper):
    """torchft's optimizer wrapper: ``zero_grad`` starts the step (``start()``: its quorum), ``step`` applies the
    gradients only when ``commit()`` (the session's vote) says every rank of every live replica group has them."""

    def __init__(self, manager: Any, optimizer: torch.optim.Optimizer, start: Callable[[], None],
                 commit: Callable[[], bool]) -> None:  # fmt: skip
        super().__init__(manager, optimizer)
        self._start, self._commit = start, commit

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._start()
        self.optim.zero_grad(set_to_none)

    def step(self, closure: Optional[Any] = None) -> None:
        if closure is not None:
            raise ValueError("an optimizer under --fault-tolerant takes no closure: a step may be discarded")
        if self._commit():
            self.optim.step()
