"""``polydist run --fault-tolerant --backend mpi``: one MPI job whose ranks survive the loss of one (ULFM, Open MPI).

MPI starts the ranks and MPI replaces them: this launcher starts one
``mpiexec`` with ULFM on (``--with-ft ulfm``, its failure detector's timeout
the collective timeout: :func:`polydist.backends.mpi4py.ulfm.launcher_options`),
each rank a replica group of its own; the survivors of a lost rank shrink
their communicator and spawn its replacement themselves
(:mod:`polydist.backends.mpi4py.ft_manager`). The launcher reads the same
fault log as for the other engines, carried in ``mpiexec``'s forwarded
standard error (so the ranks may run on several hosts: ``--nnodes N`` with
Open MPI's ``--hostfile`` or a Slurm allocation), and reports alike
(:mod:`~polydist.launch.fault_tolerant`). Where the MPI has no ULFM (MPICH,
Intel MPI) :func:`refusal` says so before any rank starts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from typing import Callable, Optional

from .. import settings
from ..backends.mpi4py import ulfm
from . import ft_events, mpiexec

__all__ = ["refusal", "command", "run", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 60.0  # a rank without MPI progress this long is declared lost (torchft's default timeout)


def refusal(ns: argparse.Namespace) -> Optional[str]:
    """Why this MPI cannot run ``--fault-tolerant`` (one line, naming the restart path), else None."""
    if ns.replica_group_size != 1:
        return "--fault-tolerant on MPI runs replica groups of one rank (no --replica-group-size)"
    if ns.min_replicas != 1:
        return "--fault-tolerant on MPI goes on with any number of live ranks (no --min-replicas)"
    nodes = ns.nnodes[1]
    if ns.nnodes[0] != nodes or ns.rdzv_endpoint or ns.node_rank:
        return ("--fault-tolerant --backend mpi: one polydist run starts the ranks of every host through mpiexec "
                "(--nnodes N, not MIN:MAX, --rdzv-endpoint or --node-rank)")  # fmt: skip
    if ns.hostfile and not os.path.isfile(ns.hostfile):
        return f"--hostfile {ns.hostfile}: no such file"
    if nodes > 1 and not (ns.hostfile or _hosts_of_their_own()):
        return (f"--fault-tolerant --backend mpi on --nnodes {nodes} needs Open MPI's hosts: --hostfile FILE (one "
                "host a line), or run inside a Slurm allocation")  # fmt: skip
    try:
        launcher = mpiexec.find()
    except FileNotFoundError as exc:
        return str(exc)
    reason = ulfm.launcher_support(launcher)
    return f"--fault-tolerant on --backend mpi: {reason}" if reason else None


def _hosts_of_their_own() -> bool:
    """Whether Open MPI has a host list without ``--hostfile``: a Slurm allocation, or its default hostfile."""
    return bool(os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("PRTE_MCA_prte_default_hostfile"))


def command(ns: argparse.Namespace, worker: list) -> list:
    """The ``mpiexec`` command line: ``--nproc-per-node`` ranks, on each of ``--nnodes`` hosts (Open MPI's
    ``ppr`` mapping, from ``--hostfile`` or the hosts Open MPI has of its own), in rank order."""
    nodes, per_node = ns.nnodes[1], ns.nproc_per_node
    timeout = ns.timeout or DEFAULT_TIMEOUT_S
    if nodes == 1 and not ns.hostfile:
        placement = ["--map-by", "slot:OVERSUBSCRIBE"]
    else:
        placement = ["--map-by", f"ppr:{per_node}:node:OVERSUBSCRIBE", *(["--hostfile", ns.hostfile] if ns.hostfile else [])]
    return [mpiexec.find(), *ulfm.launcher_options(timeout), *placement, "-n", str(nodes * per_node),
            sys.executable, *worker]  # fmt: skip


def run(ns: argparse.Namespace, worker: list, env: dict,
        supervise: Callable[[subprocess.Popen, ft_events.StreamReader], int]) -> int:  # fmt: skip
    """Start the MPI job (``worker``: each rank's arguments after the Python interpreter) and ``supervise`` it
    with the reader of its fault log, which travels in ``mpiexec``'s standard error (the one channel every host
    of the job has to this one: :class:`~polydist.launch.ft_events.StreamReader`)."""
    timeout = ns.timeout or DEFAULT_TIMEOUT_S
    env[settings.FT_COMMAND.name] = json.dumps([sys.executable, *worker])  # what a replacement runs
    env[settings.PREFIX_OUTPUT.name] = "0" if ns.no_prefix else "1"
    env[settings.FT_EVENTS.name] = events = ft_events.stream_value()
    env.setdefault(settings.TIMEOUT.name, repr(timeout))
    if os.geteuid() == 0:  # Open MPI refuses root unless told twice; a job polydist starts is the user's own
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    job = subprocess.Popen(command(ns, worker), env=env, stderr=subprocess.PIPE)
    reader = ft_events.StreamReader(events, job.stderr, sys.stderr.buffer)  # type: ignore[arg-type]
    try:
        return supervise(job, reader)
    except KeyboardInterrupt:
        job.send_signal(signal.SIGTERM)
        job.wait()
        reader.close()
        print("polydist run: interrupted: the MPI job stopped", file=sys.stderr, flush=True)
        return 130
