"""polydist: one distributed PyTorch program, any backend, any launcher.

``import polydist as pdist`` (or ``as idist``: the ``ignite.distributed`` API
runs unchanged). See DESIGN.md for the contract.
"""

from .backends import mpi4py as _mpi4py_backend
from .codec import set_allow_pickle
from .collectives import all_reduce, barrier, broadcast, reduce, reduce_scatter
from .context import (
    available_backends,
    backend,
    device,
    finalize,
    get_local_rank,
    get_nnodes,
    get_node_rank,
    get_nproc_per_node,
    get_rank,
    get_world_size,
    hostname,
    initialize,
    is_initialized,
    is_main_process,
    show_config,
)
from .debug import is_debug, set_debug
from .errors import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    NotInitializedError,
    PolydistError,
    WorkerFailedError,
)
from .gathering import all_gather, all_to_all, gather, scatter
from .groups import new_group
from .helpers import one_rank_first, one_rank_only
from .launch import Parallel, spawn
from .p2p import irecv, isend, recv, send
from .training import DistributedProxySampler, auto_dataloader, auto_model, auto_optim
from .work import Work

__version__ = "0.1.0"

_mpi4py_backend.register()  # backend "mpi4py" and init method mpi:// (MPI itself starts on first use)

__all__ = [
    # context
    "initialize",
    "finalize",
    "is_initialized",
    "get_rank",
    "get_world_size",
    "get_local_rank",
    "get_nproc_per_node",
    "get_nnodes",
    "get_node_rank",
    "is_main_process",
    "backend",
    "device",
    "hostname",
    "available_backends",
    "show_config",
    # launching
    "spawn",
    "Parallel",
    # collectives
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "gather",
    "scatter",
    "reduce_scatter",
    "all_to_all",
    "barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "Work",
    "new_group",
    "one_rank_only",
    "one_rank_first",
    # training
    "auto_model",
    "auto_optim",
    "auto_dataloader",
    "DistributedProxySampler",
    # settings
    "set_debug",
    "is_debug",
    "set_allow_pickle",
    # errors
    "PolydistError",
    "NotInitializedError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "WorkerFailedError",
]
