"""``polydist run --fault-tolerant``: replica groups that survive the loss of one, supervised from one launcher.

The launcher:

1. serves torchft's **lighthouse** (which replica groups take part in each
   step) and a small TCP store where the replica groups meet before step 0,
   both in this process, on loopback; on several nodes (``--nnodes N``, one
   launcher per node) node 0's serves them at ``--master-addr``, and every
   node's starts its own replica groups and exchanges its fault log with the
   others (:mod:`~polydist.launch.ft_nodes`);
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
import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from datetime import timedelta
from typing import Any, Callable, Optional, Union

from .. import settings
from ..backends import registry
from . import fault_tolerant_mpi, ft_events, ft_nodes
from .ft_report import Report

__all__ = ["refusal", "run", "DEFAULT_MAX_RESTARTS"]

DEFAULT_MAX_RESTARTS = 3  # replacements per replica group when --max-restarts is not given
_POLL_S = 0.1
_STOP_GRACE_S = 10.0  # SIGTERM -> SIGKILL for agents stopped by the launcher
_FINISHED_GRACE_S = 60.0  # on MPI, how long mpiexec may take to end once every replica group finished
_NODES_GRACE_S = 120.0  # on several nodes, how long node 0 waits for the others' end once its own ended
_JOIN_TIMEOUT = timedelta(seconds=300)  # how long a node's launcher waits for node 0's (torchrun's join timeout: 600)
_LIGHTHOUSE_KEY = "polydist/ft/lighthouse"


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
    if ns.hostfile:
        return "--hostfile is Open MPI's, for --fault-tolerant --backend mpi; here: --nnodes N, one polydist run a node"
    nodes = ns.nnodes[1]
    if ns.nnodes[0] != nodes or ns.rdzv_endpoint:
        return ("--fault-tolerant runs a fixed number of nodes (--nnodes N, not MIN:MAX or --rdzv-endpoint): "
                "replica groups, not nodes, come and go")  # fmt: skip
    if nodes > 1 and not (ns.master_addr and ns.master_port):
        return f"--fault-tolerant on --nnodes {nodes} needs --master-addr and --master-port (node 0's address)"
    if not 0 <= ns.node_rank < nodes:
        return f"--node-rank {ns.node_rank} must be between 0 and {nodes - 1} (--nnodes {nodes})"
    if ns.replica_group_size < 1 or ns.nproc_per_node % ns.replica_group_size:
        return (f"--nproc-per-node {ns.nproc_per_node} is not a whole number of replica groups of "
                f"--replica-group-size {ns.replica_group_size}")  # fmt: skip
    replicas = ns.nproc_per_node // ns.replica_group_size * nodes
    if not 1 <= ns.min_replicas <= replicas:
        return f"--min-replicas {ns.min_replicas} must be between 1 and the {replicas} replica group(s)"
    if importlib.util.find_spec("torchft") is None:  # found, not imported: RUST_LOG is set before its import
        return "--fault-tolerant needs torchft: pip install 'polydist[ft]'"
    return None


def run(ns: argparse.Namespace, worker: list, trace_dir: str) -> int:
    """Run the job (``worker``: the worker's arguments); returns ``polydist run``'s exit code."""
    size, nnodes = ns.replica_group_size, ns.nnodes[1]
    mine = ns.nproc_per_node // size  # this node's replica groups: mine * node_rank ... on
    replicas = mine * nnodes
    most = ns.max_restarts if getattr(ns, "max_restarts_given", False) else DEFAULT_MAX_RESTARTS
    common = {"NUM_REPLICA_GROUPS": str(replicas), settings.FAULT_TOLERANT.name: "1",
              settings.FT_MIN_REPLICAS.name: str(ns.min_replicas), settings.FT_GROUP_SIZE.name: str(size),
              settings.FT_REPLACEMENTS.name: str(most)}  # fmt: skip
    if "OMP_NUM_THREADS" not in os.environ:  # the node's share: each replica group's agent counts only its own ranks
        common["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // ns.nproc_per_node))
    if _engine(ns) == "ulfm":  # the fault log travels in mpiexec's forwarded stderr: the ranks may be on other hosts
        return fault_tolerant_mpi.run(ns, worker, dict(os.environ, **common), lambda proc, reader: _supervise(
            {r: proc for r in range(replicas)}, Report(replicas), reader, None, one_job=True))
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's Rust side logs every quorum at INFO; read at its import
    try:
        job = _Job.open(ns)
    except (OSError, RuntimeError, ValueError) as exc:  # node 0 unreachable, an address that is not this node's
        print(f"polydist run: --fault-tolerant: {exc}", file=sys.stderr, flush=True)
        return 1
    with tempfile.TemporaryDirectory(prefix="polydist-ft-") as events:
        env = dict(os.environ, TORCHFT_LIGHTHOUSE=job.lighthouse, **common)
        env.update({settings.FT_EVENTS.name: events, settings.FT_START.name: job.store_address})
        first = mine * ns.node_rank
        agents = {r: _start(r, size, most, not ns.no_prefix, worker, env, trace_dir) for r in range(first, first + mine)}
        try:
            code = _supervise(agents, Report(replicas), ft_events.Reader(events), job.store, nodes=job.nodes)
        except KeyboardInterrupt:
            _stop(agents.values())
            print("polydist run: interrupted: every replica group stopped", file=sys.stderr, flush=True)
            code = 130
        finally:
            job.close()
    return code


class _Job:
    """What a node's launcher serves or reaches: torchft's lighthouse and the store where the replica groups
    meet before step 0 (node 0 serves both: on loopback for one node, else at ``--master-addr``), and, on
    several nodes, the exchange between the nodes' launchers (:mod:`~polydist.launch.ft_nodes`)."""

    def __init__(self, store: Any, store_address: str, lighthouse: str, server: Any = None,
                 nodes: Optional[ft_nodes.Nodes] = None) -> None:  # fmt: skip
        self.store, self.store_address, self.lighthouse = store, store_address, lighthouse
        self._server, self.nodes = server, nodes

    @classmethod
    def open(cls, ns: argparse.Namespace) -> "_Job":
        import torch.distributed as dist

        nnodes = ns.nnodes[1]
        host, port = ("127.0.0.1", 0) if nnodes == 1 else (ns.master_addr, ns.master_port)  # 0: a free port
        if ns.node_rank == 0:
            from ..backends.torchft.engine import serve_lighthouse

            server, lighthouse = serve_lighthouse(socket.gethostbyname(host), ns.min_replicas)  # OSError: not ours
            store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False)
            nodes = ft_nodes.Nodes(0, nnodes, lambda: store) if nnodes > 1 else None
            if nodes is not None:
                store.set(_LIGHTHOUSE_KEY, lighthouse)  # for the other nodes' launchers
            return cls(store, f"{host}:{store.port}", lighthouse, server, nodes)
        try:
            store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=_JOIN_TIMEOUT)
            store.wait([_LIGHTHOUSE_KEY], _JOIN_TIMEOUT)
            lighthouse = _checked_lighthouse(store.get(_LIGHTHOUSE_KEY))
        except RuntimeError as exc:  # torch's store raises RuntimeError (DistStoreError) on a timeout
            raise RuntimeError(f"node 0's launcher did not answer at {host}:{port} within "
                               f"{_JOIN_TIMEOUT.total_seconds():g} s ({str(exc).splitlines()[0]})") from None
        store.set_timeout(ft_nodes.CALL_TIMEOUT)

        def connect() -> Any:
            return dist.TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=ft_nodes.CALL_TIMEOUT)

        return cls(store, f"{host}:{port}", lighthouse, None, ft_nodes.Nodes(ns.node_rank, nnodes, connect))

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()


def _checked_lighthouse(value: bytes) -> str:
    """The lighthouse's address as node 0 posted it (``http://HOST:PORT``); ValueError for anything else."""
    text = value[:300].decode("ascii", "replace")
    parts = urllib.parse.urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or not port or parts.path or len(value) > 300:
        raise ValueError(f"node 0 posted {text!r} as torchft's lighthouse address, not http://HOST:PORT")
    return text


def _start(replica: int, size: int, most: int, prefix: bool, worker: list, env: dict, trace_dir: str) -> subprocess.Popen:
    folder = os.path.join(trace_dir, f"replica{replica}")  # each replica group's ranks are 0..size-1: a folder each
    os.makedirs(folder, exist_ok=True)
    spec = dict(replica=replica, group_size=size, max_restarts=most, prefix_output=prefix, worker=worker)
    command = [sys.executable, "-m", "polydist.launch.replica", json.dumps(spec)]
    return subprocess.Popen(command, env=dict(env, **{settings.TRACE_DIR.name: folder}))


def _supervise(agents: dict, report: Report, reader: Union[ft_events.Reader, ft_events.StreamReader], store: Any, one_job: bool = False,
               nodes: Optional[ft_nodes.Nodes] = None) -> int:  # fmt: skip
    """Follow the job until every agent ended (``agents``: replica group -> its process; ``one_job``: one process,
    mpiexec, runs them all, and a replica group finished when it said so; ``nodes``: the other nodes' launchers,
    on several nodes); print the report; the exit code."""
    exits: dict[int, int] = {}
    finished_at: Optional[float] = None  # one_job: when every replica group had finished or was left behind

    def read() -> None:
        mine = reader.new()
        theirs = nodes.exchange(mine) if nodes is not None else []
        for event in sorted(mine + theirs, key=lambda e: e["t"]):
            for line in report.feed(event):
                print(line, file=sys.stderr, flush=True)
            if store is not None and event["kind"] == "given_up" and not report.started(event["replica"]) \
                    and event["replica"] in agents:  # fmt: skip
                with contextlib.suppress(Exception):  # a node cut off from node 0: its replacements start anyway
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
            reader.close()
            read()
            exits = {r: 0 if r in report.finished else 1 for r in agents}
            # a replacement still joining when the others finished was told to leave by them (ft_growth)
            report.stopped.update(r for r, code in exits.items() if code and report.left_behind(r))
        others_done = any(code == 0 for code in exits.values()) or any(r not in agents for r in report.finished)
        if not one_job and others_done:
            doomed = [r for r in agents if r not in exits and r not in report.stopped and r not in report.finished
                      and report.left_behind(r)]  # fmt: skip
            if doomed:
                print(f"polydist: fault-tolerant: the others finished while replica group(s) {', '.join(map(str, doomed))} "
                      "had no live state to go on from (a replacement still joining, or left out of the last quorum): "
                      "stopping it", file=sys.stderr, flush=True)  # fmt: skip
                report.stopped.update(doomed)
                _stop([agents[r] for r in doomed])
    read()
    if nodes is not None:
        exits = _nodes_end(nodes, exits, report, read, len(agents))
    lines, ok = report.end(exits)
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    return 0 if ok else 1


def _nodes_end(nodes: ft_nodes.Nodes, exits: dict, report: Report, read: Callable[[], None], mine: int) -> dict:
    """This node's replica groups have all ended: post their exit codes for node 0. Node 0 then waits for every
    other node's (up to :data:`_NODES_GRACE_S`, serving the lighthouse and the store meanwhile) and returns the
    whole job's, adding those the other nodes stopped to ``report.stopped``; a node that never posted counts as
    failed. The others return their own, with the other nodes' replica groups that logged their end as
    finished (so that a node whose replica groups were all left behind reports the job's end, not a failure)."""
    deadline = time.monotonic() + _NODES_GRACE_S
    while not nodes.post_exits(exits, report.stopped) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    if nodes.node_rank != 0:
        return {**{r: 0 for r in report.finished}, **exits}
    while nodes.missing() and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        read()
    read()
    theirs = nodes.exits()
    report.stopped.update(r for r, code in theirs.items() if code == "stopped")
    everyone = {**{r: 143 if code == "stopped" else code for r, code in theirs.items()}, **exits}
    for node in nodes.missing():
        print(f"polydist: fault-tolerant: node {node} did not say how its replica groups ended within "
              f"{_NODES_GRACE_S:g} s of this node's end (its launcher gone, or cut off): counted as failed",
              file=sys.stderr, flush=True)  # fmt: skip
        everyone.update({r: 1 for r in range(node * mine, (node + 1) * mine)})
    return everyone


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
