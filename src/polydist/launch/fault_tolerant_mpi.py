"""``polydist run --fault-tolerant --backend mpi``: one MPI job whose ranks survive the loss of one (ULFM, Open MPI).

MPI starts the ranks and MPI replaces them: this launcher starts one
``mpiexec`` with ULFM on (``--with-ft ulfm``, its failure detector's timeout
the collective timeout: :func:`polydist.backends.mpi4py.ulfm.launcher_options`),
each rank a replica group of its own; the survivors of a lost rank shrink
their communicator and spawn its replacement themselves
(:mod:`polydist.backends.mpi4py.ft_manager`). The launcher reads the same
fault log as for the other engines and reports alike
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
from . import mpiexec

__all__ = ["refusal", "run", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 60.0  # a rank without MPI progress this long is declared lost (torchft's default timeout)


def refusal(ns: argparse.Namespace) -> Optional[str]:
    """Why this MPI cannot run ``--fault-tolerant`` (one line, naming the restart path), else None."""
    if ns.replica_group_size != 1:
        return "--fault-tolerant on MPI runs replica groups of one rank (no --replica-group-size)"
    if ns.min_replicas != 1:
        return "--fault-tolerant on MPI goes on with any number of live ranks (no --min-replicas)"
    try:
        launcher = mpiexec.find()
    except FileNotFoundError as exc:
        return str(exc)
    reason = ulfm.launcher_support(launcher)
    return f"--fault-tolerant on --backend mpi: {reason}" if reason else None


def run(ns: argparse.Namespace, worker: list, env: dict, supervise: Callable[[subprocess.Popen], int]) -> int:
    """Start the MPI job (``worker``: each rank's arguments after the Python interpreter) and ``supervise`` it."""
    timeout = ns.timeout or DEFAULT_TIMEOUT_S
    command = [mpiexec.find(), *ulfm.launcher_options(timeout), "--map-by", "slot:OVERSUBSCRIBE",
               "-n", str(ns.nproc_per_node), sys.executable, *worker]  # fmt: skip
    env[settings.FT_COMMAND.name] = json.dumps([sys.executable, *worker])  # what a replacement runs
    env[settings.PREFIX_OUTPUT.name] = "0" if ns.no_prefix else "1"
    env.setdefault(settings.TIMEOUT.name, repr(timeout))
    if os.geteuid() == 0:  # Open MPI refuses root unless told twice; a job polydist starts is the user's own
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    job = subprocess.Popen(command, env=env)
    try:
        return supervise(job)
    except KeyboardInterrupt:
        job.send_signal(signal.SIGTERM)
        job.wait()
        print("polydist run: interrupted: the MPI job stopped", file=sys.stderr, flush=True)
        return 130
