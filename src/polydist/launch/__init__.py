"""Starting jobs, an application on top of the library.

:mod:`~polydist.launch.spawn` (``spawn``, ``Parallel``) and ``polydist run``
run on :mod:`~polydist.launch.elastic`, PyTorch's elastic agent;
:mod:`~polydist.launch.mpiexec` runs MPI jobs under the MPI library's own
launcher; :mod:`~polydist.launch.worker` is the entry point of every worker
process. Which launcher started *this* process is read by
:mod:`polydist.environment`, which the library itself needs.
"""

from .spawn import Parallel, spawn

__all__ = ["spawn", "Parallel"]
