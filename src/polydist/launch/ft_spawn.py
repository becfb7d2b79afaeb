"""``polydist.spawn(..., fault_tolerant=True)``: a function's replica groups that survive a lost one, from Python.

The same job as ``polydist run --fault-tolerant`` (:mod:`~polydist.launch.fault_tolerant`: the lighthouse,
one elastic agent per replica group, the report on stderr), whose workers run ``fn`` instead of a script:
each rank is ``python -m polydist.launch.worker -m polydist.launch.ft_spawn PAYLOAD RESULTS``, and
:func:`main` there loads ``fn`` and its arguments from PAYLOAD, joins the job, calls ``fn(local_rank, *args,
**kwargs)``, and writes its return value into the RESULTS folder once it finished.

PAYLOAD and RESULTS are in a folder of the launching process's own (mode 0700) that lives as long as the
job: what is in them was written by this process or its workers, so pickle is used there as
``multiprocessing``'s spawn uses it (``fn`` by reference: a module-level function; one of the main script is
found by running that script under ``__mp_main__``, as multiprocessing does).
"""

from __future__ import annotations

import argparse
import os
import pickle
import runpy
import sys
import tempfile
from typing import Any, Callable, Optional

from .. import context, settings
from ..errors import WorkerFailedError
from .elastic import _check_positive
from .restarts import check_max_restarts
from .trace_dir import job_trace_dir

__all__ = ["spawn_fault_tolerant", "main"]


def spawn_fault_tolerant(backend: Optional[str], fn: Callable, args: tuple, kwargs: dict, nproc_per_node: int, *,
                         nnodes: int, node_rank: int, master_addr: Optional[str], master_port: Optional[int],
                         init: dict, max_restarts: Optional[int], replica_group_size: int,
                         min_replicas: int) -> list:  # fmt: skip
    """:func:`polydist.spawn` with ``fault_tolerant=True`` (its docstring says what each argument means)."""
    from . import fault_tolerant  # the fault-tolerant launcher (and torchft's lighthouse) only when asked

    _check_positive("nproc_per_node", nproc_per_node)
    if max_restarts is not None:
        check_max_restarts(max_restarts)
    timeout = init.get("timeout")
    ns = argparse.Namespace(
        backend=backend, nproc_per_node=nproc_per_node, nnodes=(nnodes, nnodes), node_rank=node_rank,
        master_addr=master_addr, master_port=master_port, rdzv_endpoint=None, replica_group_size=replica_group_size,
        min_replicas=min_replicas, max_restarts=max_restarts or 0, max_restarts_given=max_restarts is not None,
        no_prefix=False, timeout=getattr(timeout, "total_seconds", lambda: timeout)(), hostfile=None,
    )  # fmt: skip
    refused = fault_tolerant.refusal(ns)
    if refused:
        raise ValueError(f"spawn(fault_tolerant=True): {refused}")
    if init.get("init_method"):
        raise ValueError("spawn(fault_tolerant=True): no init_method (each replica group meets on its own)")
    main_path = getattr(sys.modules.get("__main__"), "__file__", None) if fn.__module__ == "__main__" else None
    saved = {name: os.environ.get(name) for name in (settings.BACKEND.name, settings.TIMEOUT.name)}
    with tempfile.TemporaryDirectory(prefix="polydist-ftspawn-") as folder:  # mode 0700
        payload, results = os.path.join(folder, "payload.pkl"), os.path.join(folder, "results")
        os.mkdir(results)
        with open(payload, "wb") as f:
            pickle.dump((fn.__module__, fn.__qualname__, main_path, tuple(args), dict(kwargs), backend), f)
        worker = ["-u", "-m", "polydist.launch.worker", "-m", __name__, payload, results]
        try:  # the launcher's environment is the workers' (as polydist run sets it); restored after
            if backend:
                os.environ[settings.BACKEND.name] = backend
            if ns.timeout is not None:
                os.environ[settings.TIMEOUT.name] = repr(float(ns.timeout))
            with job_trace_dir(settings.TRACE_DIR.read(), "polydist.spawn") as trace_dir:
                code = fault_tolerant.run(ns, worker, trace_dir)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        if code != 0:
            raise WorkerFailedError(f"the fault-tolerant job failed (exit code {code}): see the report above on "
                                    "stderr", {}, -1)  # fmt: skip
        first = nproc_per_node // replica_group_size * node_rank
        return [_result(results, first + i // replica_group_size, i % replica_group_size) for i in range(nproc_per_node)]


def _result(folder: str, replica: int, rank: int) -> Any:
    """What rank ``rank`` of replica group ``replica`` returned; None for one that did not finish (stopped
    when the others had finished, or given up)."""
    path = os.path.join(folder, f"replica{replica}-rank{rank}.pkl")
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return pickle.load(f)


def _function(module: str, qualname: str, main_path: Optional[str]) -> Callable:
    if main_path is not None:  # the launching script's own function: run the script as multiprocessing does
        namespace = runpy.run_path(main_path, run_name="__mp_main__")
        target: Any = namespace[qualname.split(".")[0]]
        parts = qualname.split(".")[1:]
    else:
        __import__(module)
        target, parts = sys.modules[module], qualname.split(".")
    for part in parts:
        target = getattr(target, part)
    return target


def main(argv: list) -> None:
    """A worker's body (see the module docstring): ``argv`` is ``PAYLOAD RESULTS``."""
    payload, results = argv
    with open(payload, "rb") as f:
        module, qualname, main_path, args, kwargs, backend = pickle.load(f)
    fn = _function(module, qualname, main_path)
    context.initialize(backend)
    value = fn(context.get_local_rank(), *args, **kwargs)
    name = f"replica{os.environ.get('REPLICA_GROUP_ID', '0')}-rank{context.get_rank()}.pkl"
    context.finalize()  # the replica group's end (its digest) is logged there
    with open(os.path.join(results, name + ".part"), "wb") as f:
        pickle.dump(value, f)
    os.replace(os.path.join(results, name + ".part"), os.path.join(results, name))


if __name__ == "__main__":
    main(sys.argv[1:])
