"""polydist: one distributed PyTorch program, any backend, any launcher.

``import polydist as pdist`` (or ``as idist``: the ``ignite.distributed`` API
runs unchanged). See DESIGN.md for the contract.
"""

from .collectives import all_gather, all_reduce, barrier, broadcast
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
from .errors import CollectiveMismatchError, NotInitializedError, PolydistError, WorkerFailedError
from .groups import new_group
from .launch import Parallel, spawn

__version__ = "0.1.0"

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
    "broadcast",
    "all_gather",
    "barrier",
    "new_group",
    # errors
    "PolydistError",
    "NotInitializedError",
    "CollectiveMismatchError",
    "WorkerFailedError",
]
