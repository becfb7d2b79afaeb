"""polydist: one distributed PyTorch program, any backend, any launcher.

``import polydist as pdist`` (or ``as idist``: the ``ignite.distributed`` API
runs unchanged). See DESIGN.md for the contract.
"""

from . import collectives, context, errors, launch
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

# The public names are exactly those of the modules' own __all__ lists.
__all__ = [*context.__all__, *collectives.__all__, "new_group", "spawn", "Parallel", *errors.__all__]
