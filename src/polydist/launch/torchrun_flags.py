"""torchrun's flags that ``polydist run`` takes with torchrun's meaning: a torchrun command line runs with
``polydist run`` in torchrun's place.

:func:`add` puts them on ``polydist run``'s parser: ``--standalone``,
``--rdzv-backend``, ``--nproc-per-node`` ``auto``/``cpu``/``gpu``/``xpu``
(:func:`nproc_per_node`, torch's own rule), ``--no-python``, ``--log-dir``,
``-r/--redirects``, ``-t/--tee``, ``--local-ranks-filter`` (each also
spelled with underscores, as torchrun takes them); ``-m/--module`` is
``polydist run``'s own. :func:`settle` applies ``--standalone`` and
``--rdzv-backend`` to the parsed arguments as torchrun does, :func:`logs` turns
the output flags into :class:`~polydist.launch.worker_logs.Logs`, and
:func:`refusal` names a flag that the launcher of the job cannot honour
(mpiexec, the fault-tolerant replica groups), before any rank starts.
"""

from __future__ import annotations

import argparse
from typing import Any, Optional

from torch.distributed.elastic.multiprocessing import Std

from .worker_logs import Logs

__all__ = ["add", "nproc_per_node", "settle", "logs", "refusal"]

_STREAMS = "0 none, 1 stdout, 2 stderr, 3 both; or per local rank, e.g. 0:3,1:2"


def add(run: Any) -> None:
    """Add torchrun's flags to ``run`` (``polydist run``'s parser)."""
    run.add_argument(
        "--standalone",
        action="store_true",
        help="a single-node job on a rendezvous of its own, on a free port of this host (torchrun's flag; "
        "polydist run's default on one node): --rdzv-endpoint, --rdzv-id, --master-addr/--master-port are ignored",
    )
    run.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        default=None,
        metavar="c10d|static",
        help="c10d: torch's c10d rendezvous at --rdzv-endpoint (nodes may join and leave); static: node 0's "
        "--master-addr/--master-port (or --rdzv-endpoint), with --node-rank. Default: c10d with --rdzv-endpoint, "
        "else static",
    )
    run.add_argument(
        "--no-python",
        "--no_python",
        action="store_true",
        help="SCRIPT is a program to execute (a shell script, a binary), not a Python file: each rank runs SCRIPT "
        "ARGS with torch elastic's variables, as torchrun --no-python",
    )
    run.add_argument(
        "--log-dir",
        "--log_dir",
        default=None,
        metavar="DIR",
        help="keep each rank's log files in DIR/<run id>_<random>/attempt_N/LOCAL_RANK/ (stdout.log, stderr.log, "
        "error.json), as torchrun; the folder is named on stderr when the job ends. Default: a temporary folder, "
        "removed afterwards",
    )
    run.add_argument(
        "-r",
        "--redirects",
        type=_streams,
        default=None,
        metavar="SPEC",
        help=f"send these streams of the ranks to their log files only, not the console ({_STREAMS})",
    )
    run.add_argument(
        "-t",
        "--tee",
        type=_streams,
        default=None,
        metavar="SPEC",
        help=f"write these streams of the ranks to their log files as well as the console ({_STREAMS})",
    )
    run.add_argument(
        "--local-ranks-filter",
        "--local_ranks_filter",
        type=_local_ranks,
        default=None,
        metavar="R,...",
        help="show only these local ranks' output on the console (e.g. 0 or 0,1); the others' output still goes "
        "to their log files with --tee or --redirects",
    )


def nproc_per_node(text: str) -> int:
    """``--nproc-per-node``: a positive number, or torchrun's ``auto`` (one per accelerator, else one per CPU),
    ``cpu``, ``gpu``, ``xpu`` (or the name of a PrivateUse1 device), counted by torchrun's own function."""
    try:
        count = int(text)
    except ValueError:
        from torch.distributed.run import determine_local_world_size

        try:
            count = determine_local_world_size(text)
        except ValueError as exc:  # torch's words: "Unsupported nproc_per_node value: x", "Cuda is not available."
            known = not str(exc).startswith("Unsupported")
            raise argparse.ArgumentTypeError(
                f"{text}: {str(exc).rstrip('.')} on this machine" if known
                else f"expected a number, auto, cpu, gpu or xpu; got {text!r}"
            ) from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return count


def _streams(text: str) -> Any:
    try:
        return Std.from_str(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {_STREAMS}; got {text!r}") from None


def _local_ranks(text: str) -> frozenset:
    try:
        ranks = frozenset(int(item) for item in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected local ranks separated by commas, e.g. 0,1; got {text!r}") from None
    if min(ranks) < 0:
        raise argparse.ArgumentTypeError(f"local ranks are 0 or more, got {text!r}")
    return ranks


def settle(ns: argparse.Namespace) -> Optional[str]:
    """Apply ``--standalone`` and ``--rdzv-backend`` to ``ns`` as torchrun does; a refusal (one line) or None."""
    if ns.no_python and ns.module:
        return "--no-python and -m/--module do not go together: -m runs a Python module, --no-python a program"
    if ns.standalone:
        if ns.nnodes != (1, 1):
            low, high = ns.nnodes
            nodes = low if low == high else f"{low}:{high}"
            return (f"--standalone runs one node, but --nnodes is {nodes}; a job of several nodes meets at "
                    "--rdzv-endpoint HOST:PORT or --master-addr/--master-port")  # fmt: skip
        # torchrun: the rendezvous is auto-assigned and any explicitly set values are ignored
        ns.rdzv_backend = ns.rdzv_endpoint = ns.master_addr = ns.master_port = None
        ns.node_rank = 0
        return None
    if ns.rdzv_backend in (None, "c10d"):
        if ns.rdzv_backend and ns.rdzv_endpoint is None and ns.nnodes != (1, 1):
            return "--rdzv-backend c10d on several nodes needs --rdzv-endpoint HOST:PORT, reachable from every node"
        return None
    if ns.rdzv_backend != "static":
        return (f"--rdzv-backend {ns.rdzv_backend}: polydist run meets on torch's c10d rendezvous (--rdzv-backend "
                "c10d --rdzv-endpoint HOST:PORT) or the static one (--master-addr A --master-port P)")  # fmt: skip
    if ns.nnodes[0] != ns.nnodes[1]:
        return "--rdzv-backend static needs a fixed --nnodes N; MIN:MAX needs --rdzv-backend c10d"
    if ns.rdzv_endpoint:  # torchrun's static rendezvous is at --rdzv-endpoint when it is given
        host, _, port = ns.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit():
            return f"--rdzv-endpoint must be HOST:PORT, got {ns.rdzv_endpoint!r}"
        ns.master_addr, ns.master_port, ns.rdzv_endpoint = host.strip("[]"), int(port), None
    return None


def logs(ns: argparse.Namespace) -> Logs:
    """The output flags of ``ns`` (torch's defaults where not given)."""
    return Logs(
        log_dir=ns.log_dir,
        redirects=Std.NONE if ns.redirects is None else ns.redirects,
        tee=Std.NONE if ns.tee is None else ns.tee,
        local_ranks_filter=ns.local_ranks_filter,
    )


# The flags that only PyTorch's elastic agent honours: the agent writes the log files and runs the program.
_AGENT_ONLY = (("no_python", "--no-python"), ("log_dir", "--log-dir"), ("redirects", "--redirects"),
               ("tee", "--tee"), ("local_ranks_filter", "--local-ranks-filter"))  # fmt: skip


def refusal(ns: argparse.Namespace, launcher: str, why: str) -> Optional[str]:
    """A one-line refusal of the first flag of ``ns`` that ``launcher`` (the flag that chose it: "--backend
    mpi") cannot honour, saying ``why``; None when there is none."""
    for dest, flag in _AGENT_ONLY:
        if getattr(ns, dest) not in (None, False):
            return f"{flag} is not available with {launcher}: {why}"
    return None
