"""polydist: one distributed PyTorch program, any backend, any launcher.

``import polydist as pdist`` (or ``as idist``: the ``ignite.distributed`` API
runs unchanged). README.md describes the API and its semantics.
"""

from . import _wiring
from .backends import registry as _registry

_registry.discover()  # the backends declared by entry point (polydist's own and any installed package's), first
from .collectives.broadcast import barrier, broadcast
from .collectives.gather import all_gather, all_gather_tensors_with_shapes, gather
from .collectives.p2p import irecv, isend, recv, send
from .collectives.reduce import all_reduce, reduce, reduce_scatter
from .collectives.scatter import all_to_all, scatter
from .collectives.work import Work
from .context import available_backends, backend, device, finalize, get_local_rank, get_nnodes, get_node_rank
from .context import get_nproc_per_node, get_rank, get_world_size, hostname, initialize, is_initialized
from .context import is_main_process, set_local_rank, show_config
from .compat import has_hvd_support, has_native_dist_support, has_xla_support, model_name, registered_computation_models
from .compat import sync
from .errors import CollectiveMismatchError, CollectiveTimeoutError, NotInitializedError, PolydistError
from .errors import InvalidArgumentError, InvalidGroupError, WorkerFailedError, WorldMismatchError
from .groups import NON_MEMBER as NON_GROUP_MEMBER, new_group
from .helpers import one_rank_first, one_rank_only
from .launch import Parallel, spawn
from .launch.environment import restart_count
from .checkpoint import Checkpointer
from .ft import FaultTolerance, fault_tolerance
from .settings import is_debug, set_allow_pickle, set_debug
from .collectives.recorder import set_trace
from .trace.dump import dump_trace
from .trace.profile import comms_profile
from .training import DistributedProxySampler, auto_dataloader, auto_model, auto_optim

__version__ = "0.1.0"

_wiring.wire()  # the hooks the layers run for each other (trace dumps, the comms profile, the launcher's world)
# mpi4py (and mpi:// ; MPI itself starts on first use) and, where Horovod is installed, horovod (and horovod://)
_registry.register_all()

# Spelled out, by topic, for type checkers and linters (py.typed).
__all__ = [
    "initialize", "finalize", "is_initialized", "get_rank", "get_world_size", "get_local_rank",  # context
    "get_nproc_per_node", "get_nnodes", "get_node_rank", "is_main_process", "backend", "device", "hostname",
    "available_backends", "show_config", "set_local_rank", "model_name", "sync", "registered_computation_models",
    "has_native_dist_support", "has_xla_support", "has_hvd_support",
    "spawn", "Parallel", "restart_count",  # launching
    "Checkpointer",  # checkpoints that restarted jobs resume from
    "fault_tolerance", "FaultTolerance",  # jobs that survive a lost replica group (polydist run --fault-tolerant)
    "all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter", "reduce_scatter",  # collectives
    "all_to_all", "all_gather_tensors_with_shapes", "barrier", "send", "recv", "isend", "irecv", "Work", "new_group",
    "NON_GROUP_MEMBER",
    "one_rank_only", "one_rank_first",  # helpers
    "auto_model", "auto_optim", "auto_dataloader", "DistributedProxySampler",  # training
    "set_debug", "is_debug", "set_allow_pickle",  # settings
    "dump_trace", "set_trace", "comms_profile",  # the flight recorder and the comms profile
    "PolydistError", "NotInitializedError", "CollectiveMismatchError",  # errors
    "CollectiveTimeoutError", "WorkerFailedError", "InvalidGroupError", "InvalidArgumentError", "WorldMismatchError",
]  # fmt: skip
