"""Launcher detection: what started this process, as one :class:`ProcessInfo`.

:func:`detect` reads environment variables (never writes them) and describes
the process alike whichever launcher started it. The launchers, in order of
precedence, with the variables that mark them (their readers, in
:mod:`polydist.launch._launchers`, list all that are read):

=========  ===================================================================================
torchrun   torchrun, ``polydist.spawn``, any PyTorch elastic agent (TORCHELASTIC_RUN_ID)
polydist   the same when ``polydist run`` started the agent (POLYDIST_LAUNCHER)
horovod    horovodrun with gloo (HOROVOD_RANK)
mpi        Open MPI, MVAPICH, MPICH or Intel MPI (Hydra), any PMI or PMIx process manager
slurm      srun (SLURM_PROCID with SLURM_STEP_ID)
kubeflow   a Kubeflow PyTorchJob pod running one process (RANK with PET_*)
env        anything else that exports RANK and WORLD_SIZE (Ray Train's workers, a wrapper script)
serial     none of these: rank 0 of 1
=========  ===================================================================================

Launchers nest (torchrun under srun, mpirun in a Slurm allocation, horovodrun
over mpirun); the innermost one describes this process:

1. An elastic agent is always innermost: its workers inherit the variables of
   whatever started it, so its values win and no other launcher is read.
2. Otherwise each launcher present is read in the table's order. The first is
   the launcher; each later one must describe the same process (equal rank,
   world size and local/node fields where both give them) and fills in what
   the first leaves out: horovodrun over mpirun, ``RANK=$SLURM_PROCID`` set by
   a wrapper, ``srun --mpi=pmix`` (launcher "slurm" then, mpi_flavor "pmix").
3. Slurm variables with another world size than mpi or horovod are ignored:
   mpirun in an allocation starts its daemons with srun, and its ranks
   inherit the daemons' SLURM_PROCID and SLURM_NTASKS.
4. Any other contradiction raises ``ValueError`` naming both variables.

Slurm is the launcher only when srun started the process: a batch script or
``salloc`` shell sees SLURM_PROCID=0 and the job's SLURM_NTASKS too, but no
SLURM_STEP_ID (or a special batch/extern/interactive one); it is one process,
so serial, with a ``note`` saying why. The master address is the first host of
the step's node list (task 0 runs there under the block, cyclic and plane
distributions), expanded without ``scontrol`` (:mod:`~polydist.launch._slurm`); the port is
:func:`slurm_port`.
MASTER_ADDR and MASTER_PORT, when set, beat anything derived.

:func:`restart_count` reads how many times the launcher restarted this job's workers.
Whether this process is a rank of an MPI job is the MPI backend's question
(:func:`polydist.backends.mpi4py.job.mpi_job`), from ``mpi_flavor``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Tuple

from .. import settings
from ..settings import RESTART_COUNT
from ._launchers import LAYOUT, PET, READERS, UNNAMED, Claim, elastic, first_set, read_int, slurm_port
from ._slurm import expand_nodelist

__all__ = ["ProcessInfo", "detect", "expand_nodelist", "slurm_port", "restart_count", "launcher"]

_FIELDS = LAYOUT + ("master_addr", "master_port")


@dataclass(frozen=True)
class ProcessInfo:
    """Where this process sits in the job, as its launcher described it.

    Layout fields a launcher does not give are ``None``, the same ones on every
    rank, so :mod:`polydist.context` decides alike on all ranks to derive them
    from the process group. MPI and Horovod give no node index, so
    ``node_rank``/``nnodes`` are ``None`` there unless all ranks share a node.
    ``master_addr``/``master_port`` (TCP) locate rank 0 and need not be in
    ``os.environ`` (Slurm's are derived). ``mpi_flavor`` names the MPI whose
    process manager started this process as one of its ranks: "openmpi",
    "mvapich", "mpich" (Hydra), "intelmpi", "pmi" (another PMI-1/2 launcher:
    gforker, ``srun --mpi=pmi2``), "pmix"; else ``None``. ``job_id``: Slurm job
    or elastic run id. ``sources`` pairs each field with the variable(s) it
    came from; ``note`` says why a process inside a job is serial nevertheless.
    """

    launcher: str  # "serial", "polydist", "torchrun", "horovod", "mpi", "slurm", "kubeflow", "env"
    rank: int = 0
    world_size: int = 1
    local_rank: Optional[int] = 0
    local_world_size: Optional[int] = 1
    node_rank: Optional[int] = 0
    nnodes: Optional[int] = 1
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    mpi_flavor: Optional[str] = None
    job_id: Optional[str] = None
    sources: Tuple[Tuple[str, str], ...] = field(default=(), compare=False)
    note: Optional[str] = field(default=None, compare=False)

    @property
    def is_distributed(self) -> bool:
        """True when the launcher started more than one process."""
        return self.world_size > 1

    @property
    def launcher_named(self) -> bool:
        """False when only ``RANK`` and ``WORLD_SIZE`` said it ("env"): a launcher polydist cannot name, which
        might be an MPI it does not know."""
        return self.launcher != UNNAMED


def _check(claim: Claim) -> None:
    values = claim.values
    for index, count in (("rank", "world_size"), ("local_rank", "local_world_size"), ("node_rank", "nnodes")):
        if count in values and values[count] < 1:
            raise ValueError(f"environment has {claim.named(count)}: need at least 1")
        if index in values and count in values and not 0 <= values[index] < values[count]:
            raise ValueError(f"environment has {claim.named(index)} and {claim.named(count)}: "
                             f"need 0 <= {claim.sources[index]} < {claim.sources[count]}")
    for part in ("local_world_size", "nnodes"):
        if part in values and "world_size" in values and values[part] > values["world_size"]:
            raise ValueError(f"environment has {claim.named(part)} > {claim.named('world_size')}")
    if "master_port" in values and not 0 < values["master_port"] < 65536:
        raise ValueError(f"environment has {claim.named('master_port')}: not a TCP port (1-65535)")


def _merge(base: Claim, other: Claim) -> Claim:
    clash = next((k for k in LAYOUT if k in base.values and k in other.values and base.values[k] != other.values[k]),
                 None)
    if clash is not None:
        daemons = base.values.get("world_size") != other.values["world_size"]  # a uniform test: all ranks agree
        if other.launcher == "slurm" and base.launcher in ("mpi", "horovod") and daemons:
            return base  # srun started this launcher's daemons, one per node: SLURM_* describe them
        raise ValueError(f"{base.named(clash)} (from {base.launcher}) contradicts {other.named(clash)} "
                         f"(from {other.launcher}), and no nesting of launchers explains it")
    if other.launcher == "slurm" and base.launcher == "mpi":
        base.launcher = "slurm"  # srun --mpi=pmi2/pmix started the ranks itself
    for key, value in other.values.items():
        if key not in base.values:
            base.put(key, value, other.sources[key])
    base.mpi_flavor = base.mpi_flavor or other.mpi_flavor
    base.job_id = base.job_id or other.job_id
    return base


_SERIAL = ProcessInfo("serial", sources=tuple((key, "no launcher") for key in LAYOUT))


def _serial_note(env: Mapping[str, str]) -> Optional[str]:
    if env.get("SLURM_JOB_ID"):
        return (f"inside Slurm job {env['SLURM_JOB_ID']} but not an srun task (no SLURM_STEP_ID, or a batch, extern "
                "or interactive step): a batch script or salloc shell is one process although it sees "
                "SLURM_PROCID=0 and the job's SLURM_NTASKS; start the ranks with srun")
    if first_set(env, PET):
        return "PET_* variables are torchrun's settings, but torchrun did not start this process"
    return None


def detect(env: Optional[Mapping[str, str]] = None) -> ProcessInfo:
    """Describe this process from its environment (``os.environ`` by default).

    Cheap (a serial process costs a dozen lookups; Slurm node lists are parsed
    once) and read-only. Sources and precedence: see the module docstring.

    Raises:
        ValueError: naming the variables and values, when one is no integer,
            they contradict each other (RANK >= WORLD_SIZE, SLURM_PROCID outside
            SLURM_NTASKS, RANK != PMI_RANK with no nesting to explain it, ...),
            only one of RANK and WORLD_SIZE is set, a Slurm node or task count
            list is malformed, or no variable gives the world size.
    """
    env = os.environ if env is None else env
    claims: List[Claim] = []
    for markers, read in READERS:
        claim = read(env) if first_set(env, markers) else None
        if claim is not None:
            _check(claim)
            claims.append(claim)
            if read is elastic:
                break  # the innermost launcher: outer launchers' variables are inherited, not about this process
    note = None
    if claims:
        merged = claims[0]
        for claim in claims[1:]:
            merged = _merge(merged, claim)
    else:
        note = _serial_note(env)
        if note is None and not first_set(env, ("MASTER_ADDR", "MASTER_PORT")):
            return _SERIAL  # the most frequent answer, kept cheapest
        merged = Claim("serial", {k: getattr(_SERIAL, k) for k in LAYOUT}, dict(_SERIAL.sources),
                        job_id=env.get("SLURM_JOB_ID") or None)
    values = merged.values
    if "world_size" not in values:
        raise ValueError(f"environment has {merged.named('rank')} but no variable gives the world size")
    if values.get("local_world_size") == values["world_size"]:  # every rank on this one node
        for key, value in (("nnodes", 1), ("node_rank", 0)):
            if key not in values:
                merged.put(key, value, f"{merged.sources['local_world_size']} = {merged.sources['world_size']}")
    for key, var in (("master_addr", "MASTER_ADDR"), ("master_port", "MASTER_PORT")):  # explicit beats derived
        if env.get(var):
            merged.put(key, env[var] if key == "master_addr" else read_int(env, var), var)
    _check(merged)
    return ProcessInfo(
        merged.launcher,
        *(values.get(key) for key in _FIELDS),  # type: ignore[arg-type]
        mpi_flavor=merged.mpi_flavor,
        job_id=merged.job_id,
        sources=tuple((key, merged.sources[key]) for key in _FIELDS if key in merged.sources),
        note=note,
    )


_ELASTIC_COUNT = "TORCHELASTIC_RESTART_COUNT"


def restart_count(env: Optional[Mapping[str, str]] = None) -> int:
    """How many times the launcher restarted this job's workers before this run of them: 0 on the first run.

    Read from the launcher's environment (``os.environ`` by default), so it
    works before :func:`polydist.initialize`. Under an elastic agent
    (``polydist run --max-restarts``, ``spawn(max_restarts=...)``, torchrun)
    it is the count of this node's agent, ``$TORCHELASTIC_RESTART_COUNT``:
    restarts after failures only (a node joining restarts the workers
    without counting). Under ``polydist run --backend mpi --max-restarts``
    it is ``$POLYDIST_RESTART_COUNT``. Elsewhere 0.

    Each node's agent counts its own restarts, so after a membership change
    the nodes disagree (a node that joined later says 0): before deciding
    something collective on it, such as whether to resume, agree with
    ``all_reduce(restart_count(), op="MAX")``.

    Raises:
        ValueError: the variable is set but not a non-negative integer, naming it.
    """
    env = os.environ if env is None else env
    count = RESTART_COUNT.read(env)
    if count is None:
        text = env.get(_ELASTIC_COUNT, "").strip()
        if not text:
            return 0
        try:
            count = int(text)
        except ValueError:
            raise ValueError(f"${_ELASTIC_COUNT}={text!r} is not valid: expected a whole number") from None
    if count < 0:
        raise ValueError(f"restart count {count} is negative")
    return count


def launcher() -> ProcessInfo:
    """:func:`detect`'s answer; serial when the variables are incomplete or contradict each other.

    Only :func:`polydist.initialize` lets a bad environment raise, since only
    there does it decide anything; queries and adoption must not fail over
    variables a user-made group does not depend on (e.g. ``WORLD_SIZE``
    exported without ``RANK``). Under ``polydist run --fault-tolerant`` with
    replica groups of one process (always so on MPI, whose ``mpiexec``
    announces every rank), each process is a world of its own: serial.
    """
    if settings.FAULT_TOLERANT.read() and settings.FT_GROUP_SIZE.read() == 1:
        return _SERIAL
    try:
        return detect()
    except ValueError:
        return _SERIAL

