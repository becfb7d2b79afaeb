"""Starting jobs, an application on top of the library, and detecting what started this process.

:mod:`~polydist.launch.spawn` (``spawn``, ``Parallel``) and ``polydist run``
run on :mod:`~polydist.launch.elastic`, PyTorch's elastic agent;
:mod:`~polydist.launch.mpiexec` runs MPI jobs under the MPI library's own
launcher; :mod:`~polydist.launch.worker` is the entry point of every worker
process and :mod:`~polydist.launch.process_setup` what runs in it for the
launcher. Which launcher started *this* process is read by
:mod:`~polydist.launch.environment` through :mod:`~polydist.launch._launchers` (each
launcher's variables) and :mod:`~polydist.launch._slurm` (Slurm's node lists).
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for readers and tools (the API reference resolves polydist.spawn through here)
    from .spawn import Parallel, spawn

__all__ = ["spawn", "Parallel"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: the library's launcher detection imports this
    # package while polydist.context (which spawn needs) is still loading.
    if name in __all__:
        module = importlib.import_module(".spawn", __name__)
        # As before: the package's ``spawn`` is the function, not its module.
        globals().update(spawn=module.spawn, Parallel=module.Parallel)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
