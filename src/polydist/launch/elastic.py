"""Starting processes on PyTorch's elastic agent: the engine behind ``spawn``, ``Parallel`` and ``polydist run``.

``spawn``/``Parallel`` and ``polydist run`` start their processes here, through
PyTorch's elastic agent (``torch.distributed.launcher``, the machinery of
``torchrun``): no home-made process manager. Not here: ``polydist run
--backend mpi`` starts its ranks with the MPI library's ``mpiexec``
(:mod:`~polydist.launch.mpiexec`); ``spawn`` with backend "horovod" with
``horovod.run`` (:mod:`~polydist.backends.horovod.spawn`); with a backend that has its
own launcher (the registry's ``start_processes``: xla-tpu's ``xmp.spawn``),
with that. Single-node jobs
meet on a stand-alone c10d rendezvous whose TCP store binds port 0 on loopback,
so the OS picks a free port and two jobs on one machine never collide.
Multi-node jobs use torchrun's static rendezvous at ``master_addr:master_port``,
or, for elastic membership (``min_nodes`` < ``nnodes``, or an explicit
``rdzv_endpoint``), torch's c10d rendezvous, which lets nodes leave and join
between restarts. When any worker fails, the agent stops the others; with
``max_restarts`` left it starts them all again (announcing the failed rank and
its traceback on stderr; the workers read :func:`polydist.restart_count`),
else the launcher raises :class:`~polydist.errors.WorkerFailedError` naming
the failed ranks with their tracebacks. Workers die with their launcher, also
one killed with SIGKILL (:func:`polydist.launch.process_setup.die_with_parent`). A worker that stays stopped
(``SIGSTOP``) is found by the agent's monitor loop and ended like a failed one
(:mod:`polydist.launch.liveness`), after the others wrote their dumps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import uuid
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from .. import _torch_elastic, settings
from ..errors import WorkerFailedError
from ..trace.dump import DUMP_NOTE
from .liveness import NO_TRACEBACK, Watch, end_frozen, fate, note_of
from .restarts import announce, check_max_restarts, exhausted
from .process_setup import PEER_GONE, signal_name
from .worker_logs import Logs, logs_specs

__all__ = ["launch"]

_SHUTDOWN_TIMEOUT_S = 5  # SIGTERM → SIGKILL grace for the survivors of a failed job
RANK_PREFIX = "[rank${rank}]: "


def _check_positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        # ignite.distributed's wording first, so code matching its messages keeps working
        raise ValueError(f"Argument {name} should positive, but given {value!r}: {name} must be a positive int")
    return value


def check_node_rank(node_rank: Any, nnodes: int) -> int:
    if isinstance(node_rank, bool) or not isinstance(node_rank, int) or not 0 <= node_rank < nnodes:
        raise ValueError(f"Argument node_rank should be between 0 and {nnodes - 1}, but given {node_rank!r}")
    return node_rank


def _is_local_address(host: str) -> bool:
    """Whether ``host`` names an address of this machine (it can be bound here).

    torch's c10d rendezvous decides which node serves its store by comparing
    the endpoint with the host's name, which fails where names resolve to
    loopback or several hosts share one name (containers, network namespaces).
    The node that can bind the endpoint's address is the one it names.
    """
    import socket

    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, kind, proto, _, address in infos:
        with contextlib.suppress(OSError), socket.socket(family, kind, proto) as sock:
            sock.bind((address[0], 0))
            return True
    return False


def _config(
    nproc_per_node: int,
    logs_specs: DefaultLogsSpecs,
    prefix: Optional[str],
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: Optional[str] = None,
    master_port: Optional[int] = None,
    max_restarts: int = 0,
    min_nodes: Optional[int] = None,
    rdzv_endpoint: Optional[str] = None,
    rdzv_id: str = "polydist",
    rdzv_conf: Optional[dict] = None,
    local_addr: Optional[str] = None,
) -> LaunchConfig:
    _check_positive("nproc_per_node", nproc_per_node)
    _check_positive("nnodes", nnodes)
    check_max_restarts(max_restarts)
    min_nodes = nnodes if min_nodes is None else _check_positive("min_nodes", min_nodes)
    if min_nodes > nnodes:
        raise ValueError(f"min_nodes {min_nodes} is larger than nnodes (the maximum) {nnodes}")
    common = dict(
        min_nodes=min_nodes,
        max_nodes=nnodes,
        nproc_per_node=nproc_per_node,
        max_restarts=max_restarts,
        logs_specs=logs_specs,
        log_line_prefix_template=prefix,
        shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
    )
    if rdzv_endpoint is not None or min_nodes < nnodes:
        return _elastic_config(rdzv_endpoint, rdzv_id, dict(rdzv_conf or {}), local_addr, common)
    check_node_rank(node_rank, nnodes)
    if nnodes == 1 and master_addr is None:
        port = master_port or 0  # 0: the store binds a free port chosen by the OS
        return _torch_elastic.launch_config(
            run_id=uuid.uuid4().hex,
            # torch's c10d rendezvous, listening on loopback only
            rdzv_backend=_torch_elastic.register_loopback_rendezvous(),
            rdzv_endpoint=f"127.0.0.1:{port}",
            rdzv_configs={"is_host": True},
            local_addr="127.0.0.1",
            **common,
        )
    if not master_addr or not master_port:
        raise ValueError(
            f"a job on nnodes={nnodes} needs master_addr and master_port (the address of node 0), "
            f"got master_addr={master_addr!r}, master_port={master_port!r}"
        )
    return _torch_elastic.launch_config(
        run_id="polydist",
        rdzv_backend="static",
        rdzv_endpoint=f"{master_addr}:{master_port}",
        rdzv_configs={"rank": node_rank},
        local_addr=local_addr,
        **common,
    )


def _elastic_config(endpoint: Optional[str], run_id: str, conf: dict, local_addr: Optional[str], common: dict) -> LaunchConfig:
    """torch's c10d rendezvous at ``endpoint`` (HOST:PORT): nodes may join and leave between restarts.

    The node whose address ``endpoint`` names serves the rendezvous store
    (unless ``conf`` says ``is_host``); node ranks are assigned by arrival.
    """
    host, sep, port = (endpoint or "").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"an elastic job (min_nodes {common['min_nodes']} < nnodes {common['max_nodes']}, or a rendezvous "
            f"endpoint) needs rdzv_endpoint HOST:PORT, reachable from every node, got {endpoint!r}"
        )
    if not run_id:
        raise ValueError(f"rdzv_id must be a non-empty string shared by the nodes of the job, got {run_id!r}")
    host = host.strip("[]")  # [IPv6]:port
    conf.setdefault("is_host", _is_local_address(host))
    return _torch_elastic.launch_config(
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=f"{host}:{port}" if ":" not in host else f"[{host}]:{port}",
        rdzv_configs=conf,
        local_addr=local_addr,
        **common,
    )


def launch(
    entrypoint: Union[Callable, str],
    args: Sequence[Any],
    nproc_per_node: int,
    *,
    prefix_output: bool = False,
    trace_dir: Optional[str] = None,
    prefix: str = RANK_PREFIX,
    on_restart: Optional[Callable[[Optional[dict], int, int], None]] = None,
    first_rank: int = 0,
    logs: Optional[Logs] = None,
    **job: Any,
) -> dict[int, Any]:
    """Run ``entrypoint(*args)`` (a picklable function or an executable) in
    ``nproc_per_node`` processes on this node under PyTorch's elastic agent.

    ``job``: ``nnodes``, ``node_rank``, ``master_addr``, ``master_port``
    (multi-node, static rendezvous); ``max_restarts``; ``min_nodes``,
    ``rdzv_endpoint``, ``rdzv_id``, ``rdzv_conf``, ``local_addr`` (elastic
    membership over torch's c10d rendezvous when ``min_nodes`` < ``nnodes`` or
    ``rdzv_endpoint`` is given; node ranks are then assigned, not given).

    Returns ``{global rank: return value}`` for this node's workers (None
    values for an executable). With ``prefix_output`` each output line is
    prefixed ``prefix`` (default ``[rankN]: ``; torch's template, ``${rank}`` the global rank). ``logs``: torchrun's
    ``--log-dir``, ``--redirects``, ``--tee`` and ``--local-ranks-filter`` (:mod:`~polydist.launch.worker_logs`;
    default: the console only). A worker stopped for ``POLYDIST_FROZEN_AFTER``
    seconds is ended as failed once the others wrote their flight-recorder
    dumps into ``trace_dir`` (default ``$POLYDIST_TRACE_DIR``). When a worker fails and fewer than
    ``max_restarts`` restarts were made, every worker is stopped and started
    again (announced on stderr, or told to ``on_restart(failures, restarts done, max_restarts)`` instead:
    the fault-tolerant launcher's replica groups); otherwise raises :class:`WorkerFailedError`
    (after the others were stopped). ``ValueError`` for bad sizes or
    addresses.
    """
    with logs_specs(logs, nproc_per_node, prefix_output) as specs:
        cfg = _config(nproc_per_node, specs, prefix if prefix_output else None, **job)
        nnodes = cfg.max_nodes
        announce_restart = on_restart or (lambda failures, done, most: _announce_restart(failures, done, most, nnodes))
        agent_log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
        agent_log.addFilter(_no_traceback)
        try:
            watch = _liveness(trace_dir, first_rank)
            with _quiet_agent(), _torch_elastic.restart_hook(announce_restart, watch):
                with _torch_elastic.fresh_worker_store(cfg.max_restarts > 0 or cfg.rdzv_backend == "c10d"):
                    return elastic_launch(cfg, entrypoint)(*args)
        except ChildFailedError as exc:
            raise _failure_report(exc.failures, nnodes, cfg.max_restarts) from None
        finally:
            agent_log.removeFilter(_no_traceback)


def _liveness(trace_dir: Optional[str], first_rank: int = 0) -> Optional[Callable[[dict], None]]:
    """The agent's liveness check of its workers ``{global rank: pid}``, or None when the watch is off;
    ``first_rank``: the job's rank of the agent's rank 0 (a fault-tolerant job's replica groups), for the words."""
    watch = Watch()
    if not watch.on:
        return None
    folder = trace_dir or settings.TRACE_DIR.read()

    def check(pids: dict) -> None:
        pids = {rank + first_rank: pid for rank, pid in pids.items()}
        frozen = watch.check(pids)
        if frozen is not None:
            end_frozen(frozen, pids, folder)  # the agent sees it end at its next look, as a failed worker

    return check


def _announce_restart(failures: Optional[dict], done: int, most: int, nnodes: int) -> None:
    """Tell the launcher's stderr why every worker is being started again."""
    if failures is not None:
        announce(done, most, "\n".join(_failure_lines(failures, nnodes)[0]))
        return
    sys.stderr.write(
        "polydist: a node joined the job: every worker restarts with the new membership "
        f"(not counted as a restart; {most - done} of {most} left)\n"
    )
    sys.stderr.flush()


@contextlib.contextmanager
def _quiet_agent() -> Iterator[None]:
    """Silence torch elastic's own log lines ("Sending process ... closing signal", "failed (exitcode ...)"),
    which polydist's report says in its words, unless ``$LOGLEVEL`` asks for them (torchrun's setting, read
    by torch's loggers); their levels are put back after."""
    loggers = [] if os.environ.get("LOGLEVEL") else [
        logging.getLogger(n) for n in list(logging.root.manager.loggerDict) if n.startswith("torch.distributed.elastic")
    ]  # the agent's modules are imported by now (launcher.api, at this module's top): their loggers exist
    levels = [(log, log.level) for log in loggers]
    for log in loggers:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in levels:
            log.setLevel(level)


def _no_traceback(record: logging.LogRecord) -> bool:
    """Log torch's "failed (exitcode ...)" line without the worker's traceback.

    polydist's report shows that traceback; and formatting one makes torch's
    log formatter import ``torch._dynamo``, 1-3 s spent exactly while a job
    is failing.
    """
    record.exc_info, record.exc_text = None, None
    return True


# Errors a rank gets when a *peer* went away mid-collective: consequences, not causes.
def _traceback(failure: Any) -> str:
    """The traceback the worker recorded, or "" when it recorded none (killed, crashed, os._exit)."""
    data = failure.error_file_data or {}
    message = data.get("message")
    if isinstance(message, dict):
        return message.get("extraInfo", {}).get("py_callstack") or message.get("message", "")
    return message if isinstance(message, str) and message != "<NONE>" else ""  # torch's "<NONE>": no error file


def _how(code: Optional[int]) -> str:
    """``exit code -9 (killed by SIGKILL)`` for a signal (negative code), ``exit code 3`` otherwise."""
    if code is not None and code < 0:
        return f"exit code {code} (killed by {signal_name(-code)})"
    return f"exit code {code}"


def _no_traceback_text(failure: Any) -> str:
    if failure.exitcode is not None and failure.exitcode < 0:
        return f"(no traceback: the process was killed by {signal_name(-failure.exitcode)}, by someone or by the OS)"
    return (
        f"(no traceback: the process ended with exit code {failure.exitcode} without raising: "
        "os._exit, a crash in native code, or a program run with --no-python; its own output is above)"
    )


def _failure_lines(failures: dict, nnodes: int = 1) -> tuple[list, int]:
    """The report of failed workers ``{global rank: ProcessFailure}``: its lines and the rank blamed.

    torch picks the earliest failure by a timestamp in whole seconds, so a
    rank that died of "connection closed by peer" can tie with, and be
    blamed for, the rank that really raised. Rank causes above consequences
    (peer-gone errors, ranks the agent stopped), then by time. In a
    multi-node job whose local failures are all consequences, the cause is on
    another node: no local rank is blamed (-1).
    """

    def peer_gone(f: Any) -> bool:
        return any(marker in _traceback(f) for marker in PEER_GONE)

    def consequence(item: tuple) -> tuple:
        _, f = item
        return (note_of(f.pid) is None, peer_gone(f) or f.exitcode == -signal.SIGTERM, f.timestamp)

    ordered = sorted(failures.items(), key=consequence)
    root_rank, root = ordered[0]
    if nnodes > 1 and consequence(ordered[0])[1] and any(peer_gone(f) for _, f in ordered):
        root_rank, rest = -1, ordered
        lines = [
            f"no rank of this node failed on its own: ranks {sorted(failures)} lost their connection to a "
            "peer or were stopped; the rank that failed first is on another node (see that node's report)."
        ]
    else:
        rest, frozen = ordered[1:], note_of(root.pid)
        how = f"was {frozen}" if frozen else f"failed first, with {_how(root.exitcode)}"
        lines = [
            f"rank {root_rank} (local rank {root.local_rank}, pid {root.pid}) {how}; the other ranks were stopped.",
            f"--- traceback of rank {root_rank} ---",
            _traceback(root).rstrip() or (NO_TRACEBACK if frozen else _no_traceback_text(root)),
        ]
    for rank, f in rest:
        lines_of = [line for line in _traceback(f).strip().splitlines() if not line.startswith(DUMP_NOTE)]  # a note, not the error
        last = (lines_of or [""])[-1]
        last = last if len(last) <= 160 else last[:157] + "..."
        lines.append(f"rank {rank}: {_how(f.exitcode)}{': ' + last if last else ''}")
    return lines, root_rank


def _failure_report(failures: dict, nnodes: int = 1, max_restarts: int = 0) -> WorkerFailedError:
    """The error a launcher raises for failed workers (:func:`_failure_lines`), after any restarts."""
    lines, root_rank = _failure_lines(failures, nnodes)
    if max_restarts:
        lines.insert(0, exhausted(max_restarts))
    details = {r: (f.exitcode, _traceback(f)) for r, f in failures.items()}
    fates = {r: how for r, f in failures.items() if (how := _fate(f))}
    return WorkerFailedError("\n".join(lines), details, root_rank, fates)


def _fate(failure: Any) -> Optional[str]:
    """How a worker ended where the launcher saw it and its dump may be missing: ``frozen: stopped (process state
    T) for 3.1 s, pid N`` (the liveness watch), ``killed by SIGKILL, pid N``; None otherwise."""
    frozen = note_of(failure.pid)
    if frozen:
        return fate(frozen, failure.pid)
    if failure.exitcode is not None and failure.exitcode < 0:
        return f"killed by {signal_name(-failure.exitcode)}, pid {failure.pid}"
    return None


def first_failure(failures: dict) -> tuple[int, str, str]:
    """Of failed workers ``{global rank: ProcessFailure}``, the one :func:`_failure_lines` blames: its rank, how
    it ended ("killed by SIGKILL", "exit code 1", "frozen: ..."), and the last line of its traceback ("" if none)."""
    _, rank = _failure_lines(failures)
    failure = failures[rank]
    frozen = note_of(failure.pid)
    code = failure.exitcode
    how = frozen.split(";")[0] if frozen else (f"killed by {signal_name(-code)}" if code is not None and code < 0
                                                 else f"exit code {code}")  # fmt: skip
    lines = [line for line in _traceback(failure).strip().splitlines() if not line.startswith(DUMP_NOTE)]
    return rank, how, (lines or [""])[-1][:300]
