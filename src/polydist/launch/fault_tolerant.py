"""``polydist run --fault-tolerant``: replica groups that survive the loss of one, supervised from one launcher.

The launcher:

1. serves torchft's **lighthouse** (which replica groups take part in each
   step) and a small TCP store where the replica groups meet before step 0,
   both in this process, on loopback;
2. starts one **agent** per replica group (:mod:`~polydist.launch.replica`,
   PyTorch's elastic agent over the group's ranks), each in a process of its
   own, so that a lost rank takes down its replica group only and the agent
   starts a replacement (up to ``--max-restarts`` per replica group) while
   the other groups train on;
3. reads the job's **fault log** as it grows (:mod:`~polydist.launch.ft_events`)
   and prints one line per fault, per rejoin and at the end
   (:mod:`~polydist.launch.ft_report`), including whether every replica
   group finished with the same model and optimizer state;
4. stops a replacement that has not received the live state yet once the
   others have finished: with nobody left to heal from it would train alone
   from step 0.

The engine is the backend's (its lifecycle's ``fault_tolerance``): torchft
(:mod:`polydist.backends.torchft`) for gloo, and nccl with GPUs, as above;
MPI's ULFM for ``--backend mpi`` under Open MPI, where MPI itself starts and
replaces the ranks (:mod:`~polydist.launch.fault_tolerant_mpi`), and which
MPICH and Intel MPI lack: refused there before any rank starts, naming the
restart path.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

from .. import settings
from ..backends import registry
from . import fault_tolerant_mpi, ft_events
from .ft_report import Report

__all__ = ["refusal", "run", "DEFAULT_MAX_RESTARTS"]

DEFAULT_MAX_RESTARTS = 3  # replacements per replica group when --max-restarts is not given
_POLL_S = 0.1
_STOP_GRACE_S = 10.0  # SIGTERM -> SIGKILL for agents stopped by the launcher
_FINISHED_GRACE_S = 60.0  # on MPI, how long mpiexec may take to end once every replica group finished


def _engine(ns: argparse.Namespace) -> Optional[str]:
    """The fault-tolerance engine of the job's backend (its lifecycle's ``fault_tolerance``), or None."""
    return registry.get((ns.backend or registry.requested_name()).lower()).lifecycle.fault_tolerance


def refusal(ns: argparse.Namespace) -> Optional[str]:
    """Why ``polydist run --fault-tolerant`` cannot run as asked (one line, naming what to use), else None."""
    backend = (ns.backend or registry.requested_name()).lower()
    engine = _engine(ns)
    if engine is None:
        engines = [n for n in registry.listed_names() if registry.get(n).lifecycle.fault_tolerance]
        return (f"--fault-tolerant runs on {', '.join(engines)}, not on --backend {backend}; without it, "
                "--max-restarts N restarts every rank from the last checkpoint")  # fmt: skip
    if engine == "ulfm":
        return fault_tolerant_mpi.refusal(ns)
    if ns.nnodes != (1, 1) or ns.rdzv_endpoint:
        return "--fault-tolerant runs the replica groups of one node in this version (no --nnodes, --rdzv-endpoint)"
    if ns.replica_group_size < 1 or ns.nproc_per_node % ns.replica_group_size:
        return (f"--nproc-per-node {ns.nproc_per_node} is not a whole number of replica groups of "
                f"--replica-group-size {ns.replica_group_size}")  # fmt: skip
    replicas = ns.nproc_per_node // ns.replica_group_size
    if not 1 <= ns.min_replicas <= replicas:
        return f"--min-replicas {ns.min_replicas} must be between 1 and the {replicas} replica group(s)"
    if importlib.util.find_spec("torchft") is None:  # found, not imported: RUST_LOG is set before its import
        return "--fault-tolerant needs torchft: pip install 'polydist[ft]'"
    return None


def run(ns: argparse.Namespace, worker: list, trace_dir: str) -> int:
    """Run the job (``worker``: the worker's arguments); returns ``polydist run``'s exit code."""
    size = ns.replica_group_size
    replicas = ns.nproc_per_node // size
    most = ns.max_restarts if getattr(ns, "max_restarts_given", False) else DEFAULT_MAX_RESTARTS
    common = {"NUM_REPLICA_GROUPS": str(replicas), settings.FAULT_TOLERANT.name: "1",
              settings.FT_MIN_REPLICAS.name: str(ns.min_replicas), settings.FT_GROUP_SIZE.name: str(size),
              settings.FT_REPLACEMENTS.name: str(most)}  # fmt: skip
    if "OMP_NUM_THREADS" not in os.environ:  # the node's share: each replica group's agent counts only its own ranks
        common["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // ns.nproc_per_node))
    if _engine(ns) == "ulfm":
        with tempfile.TemporaryDirectory(prefix="polydist-ft-") as events:
            env = dict(os.environ, **common, **{settings.FT_EVENTS.name: events})
            return fault_tolerant_mpi.run(ns, worker, env, lambda proc: _supervise(
                {r: proc for r in range(replicas)}, Report(replicas), ft_events.Reader(events), None, one_job=True))
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's Rust side logs every quorum at INFO; read at its import
    import torch.distributed as dist

    from ..backends.torchft.engine import serve_lighthouse

    lighthouse, address = serve_lighthouse("127.0.0.1", ns.min_replicas)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    with tempfile.TemporaryDirectory(prefix="polydist-ft-") as events:
        env = dict(os.environ, TORCHFT_LIGHTHOUSE=address, **common)
        env.update({settings.FT_EVENTS.name: events, settings.FT_START.name: f"127.0.0.1:{store.port}"})
        agents = {r: _start(r, size, most, not ns.no_prefix, worker, env, trace_dir) for r in range(replicas)}
        try:
            code = _supervise(agents, Report(replicas), ft_events.Reader(events), store)
        except KeyboardInterrupt:
            _stop(agents.values())
            print("polydist run: interrupted: every replica group stopped", file=sys.stderr, flush=True)
            code = 130
        finally:
            lighthouse.shutdown()
    return code


def _start(replica: int, size: int, most: int, prefix: bool, worker: list, env: dict, trace_dir: str) -> subprocess.Popen:
    folder = os.path.join(trace_dir, f"replica{replica}")  # each replica group's ranks are 0..size-1: a folder each
    os.makedirs(folder, exist_ok=True)
    spec = dict(replica=replica, group_size=size, max_restarts=most, prefix_output=prefix, worker=worker)
    command = [sys.executable, "-m", "polydist.launch.replica", json.dumps(spec)]
    return subprocess.Popen(command, env=dict(env, **{settings.TRACE_DIR.name: folder}))


def _supervise(agents: dict, report: Report, reader: ft_events.Reader, store: Any, one_job: bool = False) -> int:
    """Follow the job until every agent ended (``agents``: replica group -> its process; ``one_job``: one process,
    mpiexec, runs them all, and a replica group finished when it said so); print the report; the exit code."""
    exits: dict[int, int] = {}
    finished_at: Optional[float] = None  # one_job: when every replica group had finished or was left behind

    def read() -> None:
        for event in reader.new():
            for line in report.feed(event):
                print(line, file=sys.stderr, flush=True)
            if store is not None and event["kind"] == "given_up" and not report.started(event["replica"]):
                store.set(f"started/{event['replica']}", "gone")  # nobody waits for it

    while len(exits) < len(agents):
        time.sleep(_POLL_S)
        read()
        for replica, agent in agents.items():
            if replica not in exits and agent.poll() is not None:
                exits[replica] = agent.returncode
        if one_job and len(exits) < len(agents) and _all_done(report, agents):
            finished_at = finished_at or time.monotonic()
            if time.monotonic() - finished_at > _FINISHED_GRACE_S:  # the state is safe: end what hangs after it
                print(f"polydist: fault-tolerant: every replica group finished, but mpiexec had not ended "
                      f"{_FINISHED_GRACE_S:g} s later (Open MPI's MPI_Finalize after a lost rank): stopping it",
                      file=sys.stderr, flush=True)  # fmt: skip
                _stop({next(iter(agents.values()))})
        if one_job and len(exits) == len(agents):  # mpiexec's exit code says little under ULFM: the log says more
            read()
            exits = {r: 0 if r in report.finished else 1 for r in agents}
            # a replacement still joining when the others finished was told to leave by them (ft_growth)
            report.stopped.update(r for r, code in exits.items() if code and report.left_behind(r))
        if not one_job and any(code == 0 for code in exits.values()):
            doomed = [r for r in agents if r not in exits and r not in report.stopped and report.left_behind(r)]
            if doomed:
                print(f"polydist: fault-tolerant: the others finished while replica group(s) {', '.join(map(str, doomed))} "
                      "had no live state to go on from (a replacement still joining, or left out of the last quorum): "
                      "stopping it", file=sys.stderr, flush=True)  # fmt: skip
                report.stopped.update(doomed)
                _stop([agents[r] for r in doomed])
    read()
    lines, ok = report.end(exits)
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    return 0 if ok else 1


def _all_done(report: Report, replicas: dict) -> bool:
    """Whether every replica group finished, was given up, or was left behind by those that finished (a
    replacement still joining: the others told it to leave)."""
    done = set(report.finished) | report.given_up
    return bool(report.finished) and all(r in done or report.left_behind(r) for r in replicas)


def _stop(agents: object) -> None:
    """SIGTERM the agents (each stops its ranks), SIGKILL those still there after a grace period."""
    live = [a for a in agents if a.poll() is None]  # type: ignore[attr-defined]
    for agent in live:
        agent.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE_S
    for agent in live:
        try:
            agent.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
