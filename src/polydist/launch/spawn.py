"""``spawn`` and ``Parallel``: start ``fn`` in every process of a job from Python.

Both run on the elastic engine of :mod:`polydist.launch.elastic` (PyTorch's
elastic agent, the machinery of ``torchrun``); ``fn(local_rank, *args)`` runs
in each process after :func:`polydist.initialize`. Semantics of ignite's
``idist.spawn``/``idist.Parallel``.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable, Optional

from .. import _at_exit, context, settings
from ..backends import registry
from .trace_dir import job_trace_dir
from .elastic import _check_positive, check_node_rank, launch
from .process_setup import die_with_parent, worker_errors, worker_setup

__all__ = ["spawn", "Parallel"]


def _spawned(
    fn: Callable,
    args: tuple,
    kwargs: dict,
    backend: Optional[str],
    init: dict,
    parent_pid: Optional[int] = None,
    trace_dir: Optional[str] = None,
) -> Any:
    """Body of each spawned process: join the job, call ``fn(local_rank, ...)``, leave."""
    _at_exit.no_teardown()  # first, as in polydist run's workers: its handler runs after the program's
    die_with_parent(parent_pid)
    if trace_dir:  # this process's own environment: where its flight-recorder dumps go
        os.environ[settings.TRACE_DIR.name] = trace_dir
    worker_setup()
    return _joined(fn, args, kwargs, backend, init)


def _joined(fn: Callable, args: tuple, kwargs: dict, backend: Optional[str], init: dict) -> Any:
    """Join the job, call ``fn(local_rank, ...)``, leave: in a spawned process, or in one a backend's own
    launcher started (``xmp.spawn``; with one process, this very one)."""
    context.initialize(backend, **init)
    with worker_errors():
        result = fn(context.get_local_rank(), *args, **kwargs)
    # Only on success: after an error the process exits and its peers see it
    # at once, whereas tearing the group down first could block.
    context.finalize()
    return result


def spawn(
    backend: Optional[str],
    fn: Callable[..., Any],
    args: tuple = (),
    kwargs_dict: Optional[dict] = None,
    nproc_per_node: int = 1,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: Optional[str] = None,
    master_port: Optional[int] = None,
    init_method: Optional[str] = None,
    timeout: Optional[float] = None,
    max_restarts: Optional[int] = None,
    fault_tolerant: bool = False,
    replica_group_size: int = 1,
    min_replicas: int = 1,
) -> list:
    """Start ``nproc_per_node`` processes on this node, each calling
    ``fn(local_rank, *args, **kwargs_dict)`` inside an initialized job.

    Args:
        backend: as for :func:`polydist.initialize` (None: nccl with CUDA, else gloo).
        fn: a module-level (picklable) function; processes start with the
            ``spawn`` method, so it must be importable.
        nnodes: number of nodes, for multi-node jobs: run ``spawn`` on each
            node with its ``node_rank`` and node 0's address. Single-node jobs
            need none of these four (a free loopback port is used).
        node_rank: this node's rank (0 .. nnodes - 1), for multi-node jobs.
        master_addr: node 0's address, for multi-node jobs.
        master_port: node 0's rendezvous port, for multi-node jobs.
        init_method: passed to :func:`polydist.initialize`.
        timeout: collective timeout, seconds or ``timedelta``, passed to
            :func:`polydist.initialize`: a collective that waits longer raises
            :class:`~polydist.CollectiveTimeoutError` naming the ranks that did
            not arrive, which fails the job. None: ``$POLYDIST_TIMEOUT``, else
            PyTorch's default.
        max_restarts: when a process fails, stop the others and start every
            process again, up to this many times (PyTorch elastic's restart,
            as ``torchrun --max-restarts``). Each restart is announced on
            stderr with the failed rank and its traceback; ``fn`` runs again
            from the start and reads :func:`polydist.restart_count`
            (resume with :class:`polydist.Checkpointer`). None or 0: fail at
            once. With ``fault_tolerant``: replacements per replica group
            (None: 3).
        fault_tolerant: the processes are replica groups that survive a lost
            one, as under ``polydist run --fault-tolerant`` (gloo, nccl: the
            "Surviving failures" how-to): the others discard the step in
            flight and go on, a replacement receives their live state. ``fn``
            trains with :func:`polydist.auto_model`/:func:`polydist.auto_optim`
            (or :func:`polydist.fault_tolerance`); the launcher prints one line
            per fault on stderr. A replica group that did not finish (stopped
            when the others had) returns None.
        replica_group_size: with ``fault_tolerant``: processes per replica
            group (``nproc_per_node`` a multiple of it; FSDP2 inside each).
        min_replicas: with ``fault_tolerant``: fewest replica groups a step
            commits with.

    Returns:
        The return values of ``fn`` on this node, by local rank.

    Raises:
        WorkerFailedError: a process raised, exited non-zero or died (and
            the ``max_restarts`` restarts were all made); the
            others were stopped (SIGTERM, then SIGKILL after 5 s); the message
            names the failed ranks and shows their tracebacks (for
            ``sys.exit(n)``, where it was called). On a 2-vCPU machine it is
            raised 0.1 s (a killed rank) to 0.8 s (a rank that raised) after
            the failure (``benchmarks/failure_latency.py``).
        ValueError: an unknown or unavailable ``backend`` (e.g. "horovod",
            "nccl" without CUDA), bad sizes or ``max_restarts``, multi-node without master
            address/port, or "mpi" on more than one process (MPI cannot see
            the processes spawn starts), ``fault_tolerant`` where it cannot
            run (the backend, the sizes, no torchft) — all before any process
            starts.

    With backend "xla-tpu" the processes are torch_xla's: ``xmp.spawn``
    starts them (``nproc_per_node`` 1: this process; otherwise one per XLA
    device of this host, which must be ``nproc_per_node``), and ``nnodes``
    > 1 or ``max_restarts`` raise ``ValueError``.

    With backend "horovod" the processes are Horovod's: ``horovod.run``
    starts them on this host (as idist does; ``nnodes`` > 1 raises
    ``ValueError``, use ``horovodrun -H``), and a failure raises
    :class:`~polydist.WorkerFailedError` without per-rank details.

    Source: idist ``spawn``, on ``torch.distributed.launcher`` instead of
    ``torch.multiprocessing.spawn``.
    """
    resolved = registry.resolve(backend)  # an unknown or unavailable backend fails here, before any process starts
    init = {"init_method": init_method, "timeout": timeout}
    if fault_tolerant:
        from .ft_spawn import spawn_fault_tolerant

        return spawn_fault_tolerant(
            backend, fn, tuple(args), dict(kwargs_dict or {}), nproc_per_node, nnodes=nnodes, node_rank=node_rank,
            master_addr=master_addr, master_port=master_port, init=init, max_restarts=max_restarts,
            replica_group_size=replica_group_size, min_replicas=min_replicas,
        )  # fmt: skip
    max_restarts = max_restarts or 0
    lifecycle = registry.get(resolved).lifecycle
    if lifecycle.starts_processes:  # the backend's own launcher (xla-tpu: torch_xla's xmp.spawn; horovod: horovod.run)
        if max_restarts:
            raise ValueError(f"max_restarts={max_restarts!r}: spawn with backend {backend!r} cannot restart its processes "
                             "(its own launcher starts them)")
        work = functools.partial(_joined, fn, tuple(args), dict(kwargs_dict or {}), backend, init)
        return lifecycle.start_processes(work, nproc_per_node, nnodes)
    if lifecycle.needs_launcher is not None and (nproc_per_node, nnodes) != (1, 1):  # launch/announced.py's rule
        raise ValueError(lifecycle.spawn_refusal(backend))
    with job_trace_dir(settings.TRACE_DIR.read(), "polydist.spawn") as trace_dir:
        results = launch(
            _spawned,
            (fn, tuple(args), dict(kwargs_dict or {}), backend, init, os.getpid(), trace_dir),
            nproc_per_node,
            nnodes=nnodes,
            node_rank=node_rank,
            master_addr=master_addr,
            master_port=master_port,
            max_restarts=max_restarts,
            trace_dir=trace_dir,
        )
    return [results[rank] for rank in sorted(results)]


def _check_parallel(
    backend: Optional[str],
    nproc_per_node: Optional[int],
    nnodes: Optional[int],
    node_rank: Optional[int],
    master_addr: Optional[str],
    master_port: Optional[int],
    init_method: Optional[str],
) -> None:
    """``ValueError`` at construction for what ``ignite.distributed.Parallel`` rejects there (its messages)."""
    if backend is None:
        given = dict(nnodes=nnodes, node_rank=node_rank, master_addr=master_addr, master_port=master_port)
        for name, value in given.items():
            if value is not None:
                raise ValueError(f"If backend is None, argument '{name}' should be also None, but given {value}")
    else:
        registry.resolve(backend)
    if nproc_per_node is not None:
        _check_positive("nproc_per_node", nproc_per_node)
    if nnodes is not None:
        _check_positive("nnodes", nnodes)
    if (nnodes or 1) > 1:
        if node_rank is None:
            raise ValueError("If number of nodes larger than one, arguments node_rank should be given")
        check_node_rank(node_rank, nnodes)
        if init_method is None and (master_addr is None or master_port is None):
            raise ValueError(
                "If number of nodes larger than one, arguments master_addr and master_port or init_method "
                f"should be specified, but given master_addr={master_addr!r}, master_port={master_port!r}"
            )
    elif node_rank is not None:
        check_node_rank(node_rank, 1)


def _parallel_logger() -> logging.Logger:
    """``Parallel``'s log, as idist's (``ignite.utils.setup_logger``): INFO lines to stderr on rank 0, nothing
    elsewhere. ``logging.getLogger("polydist.Parallel").setLevel(logging.WARNING)`` silences it."""
    log = logging.getLogger("polydist.Parallel")
    if not log.handlers:  # set up once per process, after initialize (as idist), so the rank is known
        handler = logging.StreamHandler() if context.get_rank() == 0 else logging.NullHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


class Parallel:
    """Context manager that runs a function on every rank, however the job was launched.

    ``with Parallel(backend="gloo", nproc_per_node=4) as p: p.run(fn, *args)``
    spawns 4 processes (as :func:`spawn`) and calls ``fn(local_rank, *args)``.
    Without ``nproc_per_node`` it joins the job this process is already in
    (``polydist run``, torchrun, ...) — or runs serially — and calls
    ``fn(local_rank, *args, **kwargs)`` here, finalizing on exit.
    ``timeout=`` (among ``spawn_kwargs``) is the collective timeout, in
    seconds, in both cases (see :func:`spawn`).

    Args:
        backend: as for :func:`polydist.initialize`; None with
            ``nproc_per_node`` spawns on nccl with CUDA, else gloo, and
            without it joins the job as it was launched (or runs serially).
        nproc_per_node: processes to spawn on this node (>= 1); None: spawn
            nothing, join the job this process is in.
        nnodes: number of nodes when spawning (None: 1); > 1 needs
            ``node_rank`` and node 0's ``master_addr``/``master_port`` (or
            ``init_method``).
        node_rank: this node's rank, 0 .. ``nnodes`` - 1 (None: 0).
        master_addr: node 0's address, for multi-node jobs.
        master_port: node 0's rendezvous port, for multi-node jobs.
        init_method: passed to :func:`polydist.initialize` (spawned or
            joined).
        **spawn_kwargs: the rest of :func:`spawn`'s keywords (``timeout``,
            ``max_restarts``).

    Logs its steps as idist's ``Parallel`` does, in idist's words (INFO, to
    stderr, rank 0 only; logger ``polydist.Parallel``): the backend and the
    spawn parameters on entry, ``Spawn function ... in N processes`` or
    ``- Run ... in N processes``, then ``End of run``.

    Raises:
        ValueError: at construction, as ``ignite.distributed.Parallel``: an
            unknown or unavailable ``backend``; ``nnodes``, ``node_rank``,
            ``master_addr`` or ``master_port`` given with backend None;
            sizes below 1; multi-node without ``node_rank`` or rendezvous
            address.

    Source: idist ``Parallel``.
    """

    def __init__(
        self,
        backend: Optional[str] = None,
        nproc_per_node: Optional[int] = None,
        nnodes: Optional[int] = None,
        node_rank: Optional[int] = None,
        master_addr: Optional[str] = None,
        master_port: Optional[int] = None,
        init_method: Optional[str] = None,
        **spawn_kwargs: Any,
    ) -> None:
        _check_parallel(backend, nproc_per_node, nnodes, node_rank, master_addr, master_port, init_method)
        self.backend = backend
        self.spawn_kwargs = dict(
            nnodes=nnodes or 1,
            node_rank=node_rank or 0,
            master_addr=master_addr,
            master_port=master_port,
            init_method=init_method,
            **spawn_kwargs,
        )
        self.nproc_per_node = nproc_per_node

    def __enter__(self) -> "Parallel":
        if self.nproc_per_node is None:
            init = {"timeout": self.spawn_kwargs.get("timeout")}
            if self.spawn_kwargs["init_method"]:
                init["init_method"] = self.spawn_kwargs["init_method"]
            context.initialize(self.backend, **init)
        log = _parallel_logger()
        if self.backend is not None and self.nproc_per_node is None:
            log.info(f"Initialized processing group with backend: '{self.backend}'")
        elif self.backend is not None:
            log.info(f"Initialized distributed launcher with backend: '{self.backend}'")
            params = {"nproc_per_node": self.nproc_per_node, **self.spawn_kwargs}
            listed = "\n\t".join(f"{key}: {value}" for key, value in params.items() if value is not None)
            log.info(f"- Parameters to spawn processes: \n\t{listed}")
        return self

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fn(local_rank, *args, **kwargs)`` on every rank; see the class docstring.

        Returns the list of this node's return values when spawning, else this
        rank's return value.
        """
        log = _parallel_logger()
        if self.nproc_per_node is None:
            log.info(f"- Run '{fn}' in {context.get_world_size()} processes")
            result = fn(context.get_local_rank(), *args, **kwargs)
        else:
            log.info(f"Spawn function '{fn}' in {self.nproc_per_node} processes")
            result = spawn(self.backend, fn, args, kwargs, self.nproc_per_node, **self.spawn_kwargs)
        log.info("End of run")
        return result

    def __exit__(self, *exc: Any) -> None:
        if self.nproc_per_node is None:
            if self.backend is not None:
                _parallel_logger().info(f"Finalized processing group with backend: '{self.backend}'")
            context.leave(wait=exc[0] is None)  # after an error, as at exit: no waiting for the others
