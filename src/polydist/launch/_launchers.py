"""Each launcher's environment variables, read into a claim: what that launcher says about this process.

One reader per launcher (torch's elastic agent, Horovod, Open MPI, MVAPICH,
any PMI or PMIx process manager, srun, Kubeflow's training operator, a bare
``RANK``/``WORLD_SIZE``), listed in :data:`READERS` innermost first with the
variables that mark each. :func:`polydist.launch.environment.detect` checks, merges
and resolves the claims; its module docstring says how. Never imports torch
(a launcher's probe imports this package without its ``__init__``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._slurm import first_host
from ..settings import LAUNCHER

__all__ = [
    "LAYOUT", "Claim", "READERS", "read_int", "first_set", "elastic", "slurm_port", "PET", "TASK_COUNT", "UNNAMED", "who",
]

LAYOUT = ("rank", "world_size", "local_rank", "local_world_size", "node_rank", "nnodes")
UNNAMED = "env"  # the launcher of a bare RANK/WORLD_SIZE, which polydist cannot name (Ray Train, a script)


# ---------------------------------------------------------------- claims: what one launcher's variables say


@dataclass
class Claim:
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
Reader = Callable[[Mapping[str, str]], Optional[Claim]]


def read_int(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def first_set(env: Mapping[str, str], names: Sequence[str]) -> Optional[str]:
    for name in names:
        if env.get(name):  # "" counts as unset
            return name
    return None


def _read(env: Mapping[str, str], launcher: str, spec: Spec, **extra: Optional[str]) -> Claim:
    claim = Claim(launcher, **extra)
    for key, names in spec.items():
        name = first_set(env, names)
        if name is not None:
            claim.put(key, read_int(env, name), name)
    for have, lack in (("rank", "world_size"), ("world_size", "rank")):
        if have in claim.values and lack not in claim.values and lack in spec:
            raise ValueError(f"{claim.named(have)} is set but {' or '.join(spec[lack])} is not; a launcher sets both")
    return claim


def _simple(launcher: str, spec: Spec, flavor: Optional[str] = None) -> Reader:
    return lambda env: _read(env, launcher, spec, mpi_flavor=flavor)


def _spec(prefix: str, rank: str, size: str, local_rank: str, local_size: str) -> Spec:
    names = (rank, size, local_rank, local_size)
    return {key: (prefix + name,) for key, name in zip(LAYOUT, names)}


_TORCH: Spec = {**_spec("", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
                "node_rank": ("GROUP_RANK",), "nnodes": ("GROUP_WORLD_SIZE",)}


def elastic(env: Mapping[str, str]) -> Optional[Claim]:
    launcher = "polydist" if LAUNCHER.read(env) else "torchrun"
    return _read(env, launcher, _TORCH, job_id=env["TORCHELASTIC_RUN_ID"])


def _pmi(env: Mapping[str, str]) -> Optional[Claim]:
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
TASK_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def slurm_port(job_id: int, step_id: int = 0) -> int:
    """The TCP port of rank 0 of a Slurm step: ``15000 + (31 * job_id + step_id) % 17000``.

    Every task computes it alone. 15000-31999 is below Linux's ephemeral ports
    (32768-60999), which outgoing connections take; the step id keeps
    concurrent steps of a job apart. MASTER_PORT, when set, is used instead.
    """
    return 15000 + (31 * job_id + step_id) % 17000


def _slurm(env: Mapping[str, str]) -> Optional[Claim]:
    step_var = first_set(env, ("SLURM_STEP_ID", "SLURM_STEPID"))
    if step_var is None or read_int(env, step_var) >= _SLURM_SPECIAL_STEPS:
        return None
    claim = _read(env, "slurm", _SLURM)
    counts_var = first_set(env, ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    if counts_var is not None:
        _apply_task_counts(claim, counts_var, env[counts_var])
    elif env.get("SLURM_NTASKS_PER_NODE") and "nnodes" in claim.values:  # only the --ntasks-per-node option
        uniform = f"{env['SLURM_NTASKS_PER_NODE']}(x{claim.values['nnodes']})"
        _apply_task_counts(claim, "SLURM_NTASKS_PER_NODE", uniform)
    nodelist_var = first_set(env, ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"))
    if nodelist_var is not None:
        claim.put("master_addr", first_host(nodelist_var, env[nodelist_var]), nodelist_var)
    job_var = first_set(env, ("SLURM_JOB_ID", "SLURM_JOBID"))
    if job_var is not None:
        claim.job_id = env[job_var]
        claim.put("master_port", slurm_port(read_int(env, job_var), read_int(env, step_var)), f"{job_var}, {step_var}")
    return claim


def _apply_task_counts(claim: Claim, var: str, raw: str) -> None:
    counts: List[int] = []  # Slurm's compressed per-node task counts: "2(x3),1" -> [2, 2, 2, 1]
    for item in raw.split(","):
        match = TASK_COUNT.fullmatch(item.strip())
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

PET = ("PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE")


def _kubeflow(env: Mapping[str, str]) -> Optional[Claim]:
    # Contract of kubeflow/training-operator (pkg/controller.v1/pytorch/envvar.go): each pod gets
    # MASTER_ADDR/PORT (read by detect), RANK = PET_NODE_RANK = pod index, PET_NNODES = pods,
    # PET_NPROC_PER_NODE, and WORLD_SIZE = pods * PET_NPROC_PER_NODE (pods * 1 when that is "auto").
    if not first_set(env, PET):
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
READERS: Tuple[Tuple[Tuple[str, ...], Reader], ...] = (
    (("TORCHELASTIC_RUN_ID",), elastic),
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
    (("RANK", "WORLD_SIZE"), _simple(UNNAMED, _TORCH)),
)


# ---------------------------------------------------------------- each launcher in words (messages)

_MPI_NAMES = {
    "openmpi": "Open MPI's mpirun",
    "mvapich": "MVAPICH's mpirun",
    "mpich": "MPICH's mpiexec",
    "intelmpi": "Intel MPI's mpiexec",
    "pmi": "a PMI process manager",
    "pmix": "a PMIx process manager",
}
_NAMES = {
    "torchrun": "torchrun",
    "polydist": "polydist run",
    "horovod": "horovodrun",
    "slurm": "srun",
    "kubeflow": "the Kubeflow PyTorchJob",
    UNNAMED: "the environment",
}


def who(info: Any) -> str:
    """The launcher of ``info`` (a :class:`polydist.launch.environment.ProcessInfo`), in words: "torchrun",
    "MPICH's mpiexec", "srun", ..."""
    if info.launcher == "mpi":
        return _MPI_NAMES.get(info.mpi_flavor or "", "an MPI launcher")
    return _NAMES.get(info.launcher, info.launcher)
