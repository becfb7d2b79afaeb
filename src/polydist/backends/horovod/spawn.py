"""``spawn``/``Parallel`` with backend "horovod": the processes are started by Horovod's own launcher.

As ``ignite.distributed`` does, polydist hands the job to ``horovod.run``
(the Python API of ``horovodrun``, with its Gloo controller), which starts
``nproc_per_node`` processes on this host and returns what ``fn`` returned
on each, by rank. Each process joins with ``initialize("horovod")``. The
Horovod lifecycle's ``start_processes`` (what :func:`polydist.spawn` asks of
a backend that starts its own processes) runs :func:`start_processes`, as
xla-tpu's runs ``xmp.spawn``.
"""

from __future__ import annotations

from typing import Any, Callable

from ...errors import WorkerFailedError

__all__ = ["start_processes"]


def _worker(work: Callable[[], Any]) -> Any:
    """Body of each process Horovod starts: ``work()`` joins the job, calls the function, leaves."""
    return work()


class _HostsError(ValueError, RuntimeError):
    """``nnodes`` > 1 on horovod: a ``ValueError`` as polydist's spawn raises for bad sizes, and the
    ``RuntimeError`` ``ignite.distributed`` raises there (with its words), so code written for either catches it."""


def start_processes(work: Callable[[], Any], nproc_per_node: int, nnodes: int) -> list:
    """:func:`polydist.spawn` on horovod: the picklable ``work()`` in ``nproc_per_node`` Horovod processes on this
    host; their results by rank.

    Raises:
        ValueError: ``nnodes`` > 1 (launch a multi-host Horovod job with ``horovodrun -H``); also a
            ``RuntimeError``, as in idist.
        WorkerFailedError: a process failed; Horovod stopped the others. ``failures`` is empty and
            ``root_rank`` -1: ``horovod.run`` says only that the job failed (its output names the rank).
    """
    if nnodes != 1:
        raise _HostsError(
            "For multi-node configuration, please set 'hosts' argument instead according to horovod.run API: "
            f"spawn with backend 'horovod' starts processes on this host only (nnodes={nnodes}); "
            "for several hosts launch the script with horovodrun -H host1:N,host2:N"
        )
    from horovod import run  # the Horovod launcher, imported only here

    try:
        return run(_worker, args=(work,), num_proc=nproc_per_node, use_gloo=True)
    except RuntimeError as e:
        raise WorkerFailedError(f"a Horovod process failed; the job was stopped: {e}", {}, -1) from e
