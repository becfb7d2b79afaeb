"""``polydist run``: launch SCRIPT on N ranks per node, under PyTorch's elastic agent or, for MPI, mpiexec.

Its command line (:func:`add_parser`) and what it does (:func:`run`); the
top-level :mod:`polydist.cli` only dispatches to it, as to ``bench`` and ``trace``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
from typing import Any, Callable, Optional

from torch.distributed.elastic.multiprocessing.api import SignalException

from .. import _at_exit, settings
from ..backends import registry
from ..errors import WorkerFailedError
from . import fault_tolerant, mpiexec, torchrun_flags
from .elastic import launch
from .fault_tolerant import DEFAULT_MAX_RESTARTS
from .restarts import rerun
from .trace_dir import job_trace_dir
from .worker_logs import announce_log_dir

__all__ = ["add_parser", "run", "BACKENDS"]

# The backends as --help and the refusal of an unknown name list them: "mpi" also stands for mpi4py (polydist's
# MPI group on stock wheels) and "xla-tpu" for idist's "xla". Any name the backend registry declares is accepted.
BACKENDS = registry.listed_names()


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``run`` subcommand to ``subparsers`` (from ``ArgumentParser.add_subparsers``) and return it."""
    run = subparsers.add_parser(
        "run",
        help="run SCRIPT on N processes per node (PyTorch's elastic agent underneath)",
        description="Run SCRIPT [ARGS...] (or -m MODULE, or with --no-python a program) as every rank of a job. "
        "Output lines are prefixed with the rank; when a rank raises, exits non-zero or dies, the others are "
        "stopped, its traceback is shown and the exit code is 1 (or, with --max-restarts, every worker starts "
        "again). The workers die with the launcher. torchrun's flags mean what they mean to torchrun: a torchrun "
        "command line runs with polydist run in torchrun's place.",
    )
    run.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        type=torchrun_flags.nproc_per_node,
        default=1,
        metavar="N|auto|cpu|gpu|xpu",
        help="ranks started on this node (default 1); auto: one per GPU (accelerator) if there is one, else one "
        "per CPU; cpu: one per CPU; gpu, xpu: one per device of that kind (an error where there is none)",
    )
    run.add_argument("--backend", default=None, help=f"{', '.join(BACKENDS)} (default: nccl with CUDA, else gloo)")
    run.add_argument(
        "--nnodes",
        type=_nnodes,
        default=(1, 1),
        metavar="N|MIN:MAX",
        help="number of nodes; MIN:MAX (with --rdzv-endpoint) lets nodes leave and join between restarts "
        "(torch's c10d rendezvous, as torchrun)",
    )
    run.add_argument("--node-rank", "--node_rank", type=int, default=0, metavar="R")
    run.add_argument("--master-addr", "--master_addr", default=None, metavar="A")
    run.add_argument("--master-port", "--master_port", type=int, default=None, metavar="P")
    run.add_argument(
        "--max-restarts",
        "--max_restarts",
        type=int,
        default=0,
        action=_Given,
        metavar="N",
        help="when a rank fails, stop the others and restart every worker, up to N times (announced on stderr "
        "with the failed rank and its traceback; the program reads polydist.restart_count()). Default 0: the job "
        "ends at the first failure. With --fault-tolerant: replacements per replica group (default "
        f"{DEFAULT_MAX_RESTARTS}), the others going on",
    )
    run.add_argument(
        "--fault-tolerant",
        action="store_true",
        help="train data-parallel replica groups that survive a lost, frozen or hung one: the others discard the "
        "step in flight and go on, a replacement receives their live state and rejoins (torchft on gloo and nccl; "
        "ULFM on --backend mpi under Open MPI; the program uses auto_model/auto_optim or polydist.fault_tolerance(); "
        "one line per fault on stderr). On several nodes: on gloo and nccl one polydist run per node with "
        "--nnodes N --node-rank R --master-addr A --master-port P, node 0 serving the lighthouse; on mpi one "
        "polydist run in all with --nnodes N and Open MPI's hosts (--hostfile FILE, or a Slurm allocation)",
    )
    run.add_argument(
        "--hostfile",
        default=None,
        metavar="FILE",
        help="with --fault-tolerant --backend mpi on several hosts (--nnodes N): Open MPI's hostfile, one host a "
        "line; one polydist run starts --nproc-per-node ranks on each of N of its hosts (not needed inside a Slurm "
        "allocation, which Open MPI reads itself)",
    )
    run.add_argument(
        "--replica-group-size",
        type=int,
        default=1,
        metavar="K",
        help="with --fault-tolerant: ranks per replica group, the unit that is lost and replaced (default 1); "
        "auto_model(use_fsdp=True) shards the model inside each (HSDP; gloo, nccl)",
    )
    run.add_argument(
        "--min-replicas",
        type=int,
        default=1,
        metavar="N",
        help="with --fault-tolerant: fewest replica groups a step commits with (default 1)",
    )
    run.add_argument(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        default=None,
        metavar="HOST:PORT",
        help="elastic jobs: the c10d rendezvous, served by the node that owns HOST; node ranks are assigned",
    )
    run.add_argument("--rdzv-id", "--rdzv_id", default="polydist", metavar="ID", help="elastic jobs: the job's id")
    run.add_argument(
        "--rdzv-conf",
        "--rdzv_conf",
        type=_key_values,
        default={},
        metavar="K=V,...",
        help="elastic jobs: rendezvous settings, as torchrun's (e.g. last_call_timeout=5,join_timeout=600)",
    )
    run.add_argument(
        "--local-addr",
        "--local_addr",
        default=None,
        metavar="A",
        help="this node's address as the other nodes reach it (default: its host name)",
    )
    run.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="collective timeout (with --fault-tolerant: how long the others wait for a hung replica group, "
        "default 60): a collective that waits longer raises polydist.CollectiveTimeoutError naming the "
        "ranks that did not arrive (exported as $POLYDIST_TIMEOUT, which polydist.initialize() reads when given no "
        "timeout, and the default of the groups the program creates with torch's init_process_group or new_group "
        "without one; default: PyTorch's, 30 min on gloo). On --backend mpi the group's watchdog names the operation "
        "and the ranks that did not arrive in the same words, writes the dumps, and ends the job (MPI_Abort: a "
        "blocked MPI call cannot be cancelled)",
    )
    run.add_argument(
        "--trace-dir",
        default=None,
        metavar="DIR",
        help="where the ranks write their flight-recorder dumps (on a timeout, a failure, SIGUSR1, or when the job "
        "is stopped); read them with: polydist trace DIR. Default: a new folder in the temp dir, shown when a dump "
        "was written, removed when none was",
    )
    run.add_argument(
        "--profile-comms",
        action="store_true",
        help="profile every collective and print, on rank 0 when the job ends, a table per collective and size: "
        "calls, bytes, times, algbw/busbw, and the ranks that arrive last (polydist.comms_profile)",
    )
    run.add_argument("--no-prefix", action="store_true", help="do not prefix output lines with the rank")
    run.add_argument("-m", "--module", dest="module", action="store_true", help="SCRIPT is a module name, as python -m")
    torchrun_flags.add(run)
    run.add_argument("script", metavar="SCRIPT")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS")
    return run


class _Given(argparse.Action):
    """Stores the value and notes that it was given (``ns.<dest>_given``): torchrun's default stays in the
    namespace, and a mode whose default differs (``--fault-tolerant``'s replacements) can tell."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def _nnodes(text: str) -> tuple:
    """``N`` or ``MIN:MAX`` (torchrun's form) as (min, max)."""
    low, sep, high = text.partition(":")
    try:
        bounds = (int(low), int(high) if sep else int(low))
    except ValueError:
        bounds = (0, 0)
    if not 1 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"must be N or MIN:MAX with 1 <= MIN <= MAX, got {text!r}")
    return bounds


def _key_values(text: str) -> dict:
    """``k=v,k2=v2`` as a dict of strings (torch's rendezvous parses each value itself)."""
    pairs = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE pairs separated by commas, got {item!r} in {text!r}")
        pairs[key.strip()] = value.strip()
    return pairs


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def run(ns: argparse.Namespace) -> int:
    """Run ``polydist run`` from its parsed arguments (see :func:`add_parser`); returns the exit status."""
    refused = _refusal(ns)
    if refused:  # before any rank, dump folder or log folder
        print(f"polydist run: {refused}", file=sys.stderr)
        return 2
    _at_exit.no_teardown()  # once the job and its report are over, this process ends without torch's teardown
    # This is the launcher's own process: its environment is ours to set, and
    # the workers inherit it.
    os.environ[settings.LAUNCHER.name] = "run"
    if ns.backend:
        os.environ[settings.BACKEND.name] = ns.backend
    if ns.timeout is not None:
        os.environ[settings.TIMEOUT.name] = repr(ns.timeout)
    if ns.profile_comms:
        os.environ[settings.PROFILE_COMMS.name] = "1"

    with job_trace_dir(ns.trace_dir, "polydist run") as trace_dir:
        os.environ[settings.TRACE_DIR.name] = trace_dir
        if ns.fault_tolerant:
            return fault_tolerant.run(ns, _worker(ns), trace_dir)
        return _launch(ns)


def _refusal(ns: argparse.Namespace) -> Optional[str]:
    """What is wrong with the command line that only the launcher can tell (one line), or None."""
    refused = torchrun_flags.settle(ns)  # first: flags that do not go together
    if refused:
        return refused
    if ns.no_python and not shutil.which(ns.script):
        return f"--no-python: no executable program {ns.script} (a path, or a name on PATH)"
    if not ns.module and not ns.no_python and not os.path.exists(ns.script):
        return f"no such script: {ns.script}"
    if ns.backend is not None and ns.backend.lower() not in registry.names():
        return f"unknown backend {ns.backend!r}; use one of: {', '.join(BACKENDS)}"
    if ns.hostfile and not ns.fault_tolerant:
        return ("--hostfile is for --fault-tolerant --backend mpi; otherwise give mpiexec your hosts yourself "
                "(mpiexec -n N --hostfile FILE python SCRIPT), or run one polydist run per node (--nnodes N)")  # fmt: skip
    return _not_on_the_agent(ns) or (fault_tolerant.refusal(ns) if ns.fault_tolerant else None)


def _not_on_the_agent(ns: argparse.Namespace) -> Optional[str]:
    """A refusal of the elastic agent's flags where another launcher starts the ranks, or None."""
    if ns.fault_tolerant:
        return torchrun_flags.refusal(ns, "--fault-tolerant", "each replica group is started on its own, with "
                                      "polydist's worker entry and output")  # fmt: skip
    if _on_mpiexec(ns):
        return torchrun_flags.refusal(ns, f"--backend {ns.backend}", "mpiexec starts the ranks (through polydist's "
                                      "worker entry), not PyTorch's elastic agent, whose setting it is")  # fmt: skip
    return None


def _on_mpiexec(ns: argparse.Namespace) -> bool:
    return bool(ns.backend) and registry.get(ns.backend.lower()).lifecycle.needs_launcher == "mpiexec"


def _worker(ns: argparse.Namespace) -> list:
    """The arguments of every worker process: polydist's worker entry, then the script (or module) and its own."""
    target = ["-m", ns.script] if ns.module else [ns.script]
    return ["-u", "-m", "polydist.launch.worker", *target, *ns.args]


def _launch(ns: argparse.Namespace) -> int:
    worker = _worker(ns)
    if _on_mpiexec(ns):
        return _run_mpi(ns, worker)
    os.environ[settings.LAUNCHER_PID.name] = str(os.getpid())  # the workers' parent: they die with it
    min_nodes, max_nodes = ns.nnodes
    # --no-python: the program itself is each rank, as under torchrun (without polydist's worker entry)
    program, args = (ns.script, ns.args) if ns.no_python else (sys.executable, worker)
    with announce_log_dir(ns.log_dir, "polydist run"):
        return _reporting(
            lambda: launch(
                program,
                args,
                ns.nproc_per_node,
                nnodes=max_nodes,
                node_rank=ns.node_rank,
                master_addr=ns.master_addr,
                master_port=ns.master_port,
                prefix_output=not ns.no_prefix,
                logs=torchrun_flags.logs(ns),
                max_restarts=ns.max_restarts,
                min_nodes=min_nodes,
                rdzv_endpoint=ns.rdzv_endpoint,
                rdzv_id=ns.rdzv_id,
                rdzv_conf=ns.rdzv_conf,
                local_addr=ns.local_addr,
            )
        )


def _reporting(start: Callable[[], Any]) -> int:
    """Run a launch; its outcome as ``polydist run``'s exit code: 0, 1 (a rank failed: report), 2 (bad use)."""
    try:
        start()
    except (KeyboardInterrupt, SignalException) as exc:  # Ctrl-C, or SIGTERM: torch's agent ended the ranks
        signum = getattr(exc, "sigval", signal.SIGINT)
        print(f"polydist run: stopped by {signal.Signals(signum).name}; every rank was ended", file=sys.stderr,
              flush=True)  # fmt: skip
        return 128 + int(signum)
    except WorkerFailedError as exc:
        finding = _finding(exc.fates)  # what the dumps say first: which rank never came, and where it was
        print(f"polydist run: job failed{': ' + finding if finding else ''}\n{exc}", file=sys.stderr, flush=True)
        return 1
    except (ValueError, FileNotFoundError) as exc:  # bad sizes or addresses; no mpiexec
        print(f"polydist run: {exc}", file=sys.stderr)
        return 2
    return 0


def _finding(fates: Optional[dict] = None) -> Optional[str]:
    """The trace's first finding from the job's dumps (polydist trace's stuck call or disagreement), or None.
    ``fates``: how the ranks the launcher saw end without a traceback ended (frozen, killed), said of those that
    left no dump."""
    folder = settings.TRACE_DIR.read()
    if not folder or not os.path.isdir(folder):
        return None
    from ..trace.analyze import diagnose, load  # the reader: only once a job failed

    try:
        return diagnose(load(folder), fates).headline()
    except Exception:  # noqa: BLE001 - the report goes on without it
        return None


def _run_mpi(ns: argparse.Namespace, worker: list) -> int:
    """``polydist run --backend mpi``: the ranks are started by MPI's own launcher (mpiexec)."""
    if ns.nnodes != (1, 1) or ns.rdzv_endpoint:
        print(
            "polydist run: --backend mpi starts the ranks of one node with mpiexec; for several nodes run "
            "mpiexec with your host list yourself: mpiexec -n N -hosts A,B python SCRIPT (polydist.initialize('mpi') "
            "needs no address)",
            file=sys.stderr,
        )
        return 2
    env = dict(os.environ, **{settings.PREFIX_OUTPUT.name: "0" if ns.no_prefix else "1"})

    def start(restarts: int) -> None:  # mpiexec cannot restart ranks: the whole MPI job runs again
        env[settings.RESTART_COUNT.name] = str(restarts)
        mpiexec.run([sys.executable, *worker], ns.nproc_per_node, env=env)

    return _reporting(lambda: rerun(start, ns.max_restarts))
