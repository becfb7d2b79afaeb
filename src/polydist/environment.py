"""Launcher detection: what started this process, as one :class:`ProcessInfo`.

:func:`detect` reads environment variables (never writes them) and describes
the process alike whichever launcher started it. The launchers, in order of
precedence, with the variables that mark them (``_READERS`` lists all read):

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
distributions), expanded without ``scontrol`` (:mod:`polydist._slurm`); the port is :func:`slurm_port`.
MASTER_ADDR and MASTER_PORT, when set, beat anything derived.

:func:`restart_count` reads how many times the launcher restarted this job's workers.
:func:`mpi_job` decides whether this process is a rank of an MPI job, which is
when polydist's ``mpi`` stand-in on stock wheels says MPI is there.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._slurm import expand_nodelist, first_host
from .settings import LAUNCHER, RESTART_COUNT

__all__ = ["ProcessInfo", "detect", "expand_nodelist", "slurm_port", "restart_count", "launcher", "mpi_initialized", "mpi_job"]

_LAYOUT = ("rank", "world_size", "local_rank", "local_world_size", "node_rank", "nnodes")
_FIELDS = _LAYOUT + ("master_addr", "master_port")


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


# ---------------------------------------------------------------- claims: what one launcher's variables say


@dataclass
class _Claim:
    launcher: str
    values: Dict[str, Union[int, str]] = field(default_factory=dict)
    sources: Dict[str, str] = field(default_factory=dict)
    mpi_flavor: Optional[str] = None
    job_id: Optional[str] = None

    def put(self, key: str, value: Union[int, str], source: str) -> None:
        self.values[key] = value
        self.sources[key] = source

    def named(self, key: str) -> str:
        return f"{self.sources[key]}={self.values[key]}"


Spec = Dict[str, Tuple[str, ...]]  # field -> the variables it is read from, the first one set wins
Reader = Callable[[Mapping[str, str]], Optional[_Claim]]


def _int(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _first(env: Mapping[str, str], names: Sequence[str]) -> Optional[str]:
    for name in names:
        if env.get(name):  # "" counts as unset
            return name
    return None


def _read(env: Mapping[str, str], launcher: str, spec: Spec, **extra: Optional[str]) -> _Claim:
    claim = _Claim(launcher, **extra)
    for key, names in spec.items():
        name = _first(env, names)
        if name is not None:
            claim.put(key, _int(env, name), name)
    for have, lack in (("rank", "world_size"), ("world_size", "rank")):
        if have in claim.values and lack not in claim.values and lack in spec:
            raise ValueError(f"{claim.named(have)} is set but {' or '.join(spec[lack])} is not; a launcher sets both")
    return claim


def _simple(launcher: str, spec: Spec, flavor: Optional[str] = None) -> Reader:
    return lambda env: _read(env, launcher, spec, mpi_flavor=flavor)


def _spec(prefix: str, rank: str, size: str, local_rank: str, local_size: str) -> Spec:
    names = (rank, size, local_rank, local_size)
    return {key: (prefix + name,) for key, name in zip(_LAYOUT, names)}


_TORCH: Spec = {**_spec("", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
                "node_rank": ("GROUP_RANK",), "nnodes": ("GROUP_WORLD_SIZE",)}


def _elastic(env: Mapping[str, str]) -> Optional[_Claim]:
    launcher = "polydist" if LAUNCHER.read(env) else "torchrun"
    return _read(env, launcher, _TORCH, job_id=env["TORCHELASTIC_RUN_ID"])


def _pmi(env: Mapping[str, str]) -> Optional[_Claim]:
    if any(name.startswith("I_MPI_") for name in env):
        flavor = "intelmpi"  # Intel MPI runs Hydra too; its I_MPI_* settings tell it apart
    elif env.get("MPI_LOCALNRANKS"):
        flavor = "mpich"  # Hydra, MPICH's process manager
    else:
        flavor = "pmi"
    return _read(env, "mpi", _spec("", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"), mpi_flavor=flavor)


# ---------------------------------------------------------------- Slurm

_SLURM: Spec = {
    "rank": ("SLURM_PROCID",),
    # The STEP_ variables describe this srun; SLURM_NTASKS etc. keep the job's values under srun --preserve-env.
    "world_size": ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
    "local_rank": ("SLURM_LOCALID",),
    "node_rank": ("SLURM_NODEID",),
    "nnodes": ("SLURM_STEP_NUM_NODES", "SLURM_NNODES"),
}
_SLURM_SPECIAL_STEPS = 0xFFFFFFF0  # batch 0xfffffffe, extern 0xffffffff, interactive 0xfffffffa: not srun tasks
_TASK_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def slurm_port(job_id: int, step_id: int = 0) -> int:
    """The TCP port of rank 0 of a Slurm step: ``15000 + (31 * job_id + step_id) % 17000``.

    Every task computes it alone. 15000-31999 is below Linux's ephemeral ports
    (32768-60999), which outgoing connections take; the step id keeps
    concurrent steps of a job apart. MASTER_PORT, when set, is used instead.
    """
    return 15000 + (31 * job_id + step_id) % 17000


def _slurm(env: Mapping[str, str]) -> Optional[_Claim]:
    step_var = _first(env, ("SLURM_STEP_ID", "SLURM_STEPID"))
    if step_var is None or _int(env, step_var) >= _SLURM_SPECIAL_STEPS:
        return None
    claim = _read(env, "slurm", _SLURM)
    counts_var = _first(env, ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    if counts_var is not None:
        _apply_task_counts(claim, counts_var, env[counts_var])
    elif env.get("SLURM_NTASKS_PER_NODE") and "nnodes" in claim.values:  # only the --ntasks-per-node option
        uniform = f"{env['SLURM_NTASKS_PER_NODE']}(x{claim.values['nnodes']})"
        _apply_task_counts(claim, "SLURM_NTASKS_PER_NODE", uniform)
    nodelist_var = _first(env, ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"))
    if nodelist_var is not None:
        claim.put("master_addr", first_host(nodelist_var, env[nodelist_var]), nodelist_var)
    job_var = _first(env, ("SLURM_JOB_ID", "SLURM_JOBID"))
    if job_var is not None:
        claim.job_id = env[job_var]
        claim.put("master_port", slurm_port(_int(env, job_var), _int(env, step_var)), f"{job_var}, {step_var}")
    return claim


def _apply_task_counts(claim: _Claim, var: str, raw: str) -> None:
    counts: List[int] = []  # Slurm's compressed per-node task counts: "2(x3),1" -> [2, 2, 2, 1]
    for item in raw.split(","):
        match = _TASK_COUNT.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"{var}={raw!r} is not a Slurm task count list such as '2(x3),1'")
        counts += [int(match[1])] * int(match[2] or 1)
    # Nodes may run different numbers of tasks ("3,1"): this node's count is its entry, never world // nnodes.
    if "nnodes" not in claim.values:
        claim.put("nnodes", len(counts), var)
    elif claim.values["nnodes"] != len(counts):
        raise ValueError(f"{var}={raw!r} lists {len(counts)} nodes but {claim.named('nnodes')}")
    if "world_size" in claim.values and sum(counts) != claim.values["world_size"]:
        raise ValueError(f"{var}={raw!r} adds up to {sum(counts)} tasks but {claim.named('world_size')}")
    node = claim.values.get("node_rank")
    if isinstance(node, int) and 0 <= node < len(counts):  # out of range: _check names it
        claim.put("local_world_size", counts[node], f"{var}[{node}]")


# ---------------------------------------------------------------- Kubeflow training operator

_PET = ("PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE")


def _kubeflow(env: Mapping[str, str]) -> Optional[_Claim]:
    # Contract of kubeflow/training-operator (pkg/controller.v1/pytorch/envvar.go): each pod gets
    # MASTER_ADDR/PORT (read by detect), RANK = PET_NODE_RANK = pod index, PET_NNODES = pods,
    # PET_NPROC_PER_NODE, and WORLD_SIZE = pods * PET_NPROC_PER_NODE (pods * 1 when that is "auto").
    if not _first(env, _PET):
        return None
    claim = _read(env, "kubeflow", {"rank": ("RANK",), "world_size": ("WORLD_SIZE",)})
    nproc = env.get("PET_NPROC_PER_NODE", "")
    if nproc.isdigit() and int(nproc) > 1:
        raise ValueError(f"PET_NPROC_PER_NODE={nproc}: the training operator expects torchrun (or polydist run) "
                         f"to start {nproc} processes in this pod; {claim.named('rank')} is the pod's index and "
                         f"{claim.named('world_size')} counts processes, so a process not started by torchrun is none")
    for key, var, twin in (("node_rank", "PET_NODE_RANK", "rank"), ("nnodes", "PET_NNODES", "world_size")):
        if env.get(var, "").isdigit() and int(env[var]) != claim.values[twin]:  # PET_NNODES may be a range "1:4"
            raise ValueError(f"{var}={env[var]} but {claim.named(twin)}; with one process per pod they are equal")
        claim.put(key, claim.values[twin], claim.sources[twin])
    claim.put("local_rank", 0, "one process per pod")
    claim.put("local_world_size", 1, "one process per pod")
    return claim


# ---------------------------------------------------------------- resolution

# (markers, reader), innermost launcher first; a reader runs when one of its markers is set. Only the markers
# are looked up for a serial process: a missed os.environ lookup costs ~1.5 us and detect() is called often.
_READERS: Tuple[Tuple[Tuple[str, ...], Reader], ...] = (
    (("TORCHELASTIC_RUN_ID",), _elastic),
    # HOROVOD_CROSS_RANK/SIZE are not read: Horovod ranks processes with equal local rank across hosts,
    # which is the node index only when every host runs the same number of processes.
    (("HOROVOD_RANK",), _simple("horovod", _spec("HOROVOD_", "RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE"))),
    # OMPI_COMM_WORLD_NODE_RANK is not the node index either (Open MPI: rank on this node across all jobs).
    (("OMPI_COMM_WORLD_RANK",),
     _simple("mpi", _spec("OMPI_COMM_WORLD_", "RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE"), "openmpi")),
    (("MV2_COMM_WORLD_RANK",),
     _simple("mpi", _spec("MV2_COMM_WORLD_", "RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE"), "mvapich")),
    (("PMI_RANK",), _pmi),
    (("PMIX_RANK",), _simple("mpi", {"rank": ("PMIX_RANK",)}, "pmix")),  # PMIx exports no size: another must
    (("SLURM_PROCID",), _slurm),
    (("RANK",), _kubeflow),
    (("RANK", "WORLD_SIZE"), _simple("env", _TORCH)),
)


def _check(claim: _Claim) -> None:
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


def _merge(base: _Claim, other: _Claim) -> _Claim:
    clash = next((k for k in _LAYOUT if k in base.values and k in other.values and base.values[k] != other.values[k]),
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


_SERIAL = ProcessInfo("serial", sources=tuple((key, "no launcher") for key in _LAYOUT))


def _serial_note(env: Mapping[str, str]) -> Optional[str]:
    if env.get("SLURM_JOB_ID"):
        return (f"inside Slurm job {env['SLURM_JOB_ID']} but not an srun task (no SLURM_STEP_ID, or a batch, extern "
                "or interactive step): a batch script or salloc shell is one process although it sees "
                "SLURM_PROCID=0 and the job's SLURM_NTASKS; start the ranks with srun")
    if _first(env, _PET):
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
    claims: List[_Claim] = []
    for markers, read in _READERS:
        claim = read(env) if _first(env, markers) else None
        if claim is not None:
            _check(claim)
            claims.append(claim)
            if read is _elastic:
                break  # the innermost launcher: outer launchers' variables are inherited, not about this process
    note = None
    if claims:
        merged = claims[0]
        for claim in claims[1:]:
            merged = _merge(merged, claim)
    else:
        note = _serial_note(env)
        if note is None and not _first(env, ("MASTER_ADDR", "MASTER_PORT")):
            return _SERIAL  # the most frequent answer, kept cheapest
        merged = _Claim("serial", {k: getattr(_SERIAL, k) for k in _LAYOUT}, dict(_SERIAL.sources),
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
            merged.put(key, env[var] if key == "master_addr" else _int(env, var), var)
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
    exported without ``RANK``).
    """
    try:
        return detect()
    except ValueError:
        return _SERIAL


def mpi_initialized() -> bool:
    """Whether this program has already started MPI (imported ``mpi4py.MPI``, which calls ``MPI_Init``) and not ended it.

    Looks at ``sys.modules`` only, so it never starts MPI itself.
    """
    module = sys.modules.get("mpi4py.MPI")
    return module is not None and module.Is_initialized() and not module.Is_finalized()


def mpi_job(info: Optional[ProcessInfo] = None) -> bool:
    """Whether this process is a rank of an MPI job: the one place that decides it.

    True when an MPI process manager started this process as one of its ranks
    (``info.mpi_flavor``: MPICH's Hydra, Open MPI, Intel MPI, MVAPICH,
    ``srun --mpi=pmi2/pmix``) or the program already initialized MPI; False
    under any other launcher (torchrun's workers inherit the variables of an
    ``mpiexec`` that started torchrun, but are not its ranks) and in a plain
    ``python`` process. ``info``: :func:`detect`'s answer (:func:`launcher`'s when None). polydist's ``mpi``
    stand-in answers ``torch.distributed.is_mpi_available()`` with it, so a
    framework that prefers MPI when it is available (Accelerate's multi-CPU
    path) picks it only where MPI can see the job's ranks.
    """
    return (info or launcher()).mpi_flavor is not None or mpi_initialized()
