"""What a backend does at start, join, launch, adoption and finalize, and for training and data loading.

The second half of a backend's registry entry (:class:`polydist.backends.declaration.Backend`'s ``lifecycle``);
the first, the record of what the core asks about communication, is in :mod:`polydist.backends.declaration`;
:mod:`polydist.backends.registry` re-exports :class:`Lifecycle`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

__all__ = ["Lifecycle", "DEFAULT_LIFECYCLE"]


class Lifecycle:
    """What a backend does at start, join, launch, adoption and finalize, and for training and data loading.

    Every method's default is what torch.distributed does for any backend (nothing special). A backend's
    folder subclasses it where its backend does more, and its entry holds an instance
    (:attr:`Backend.lifecycle`); the core calls these methods and never compares a backend's name.

    Attributes (class level, read by the core):
        init_url: the init method by which its ranks meet (``"mpi://"``), when not torch's (env://, tcp://).
        ranks_from_backend: ``init_process_group`` takes rank and world size from the backend itself.
        offers_host_address: its ranks offer the others the address their host name resolves to (gloo).
        needs_launcher: the launcher program that alone starts its ranks (MPI: ``"mpiexec"``): ``polydist.spawn``
            refuses more than one process (:meth:`spawn_refusal`), ``polydist run`` and ``polydist bench`` start
            the ranks with it.
        starts_processes: its own launcher starts :func:`polydist.spawn`'s processes (:meth:`start_processes`).
        training_at_every_size: its :meth:`training` optimizer wrapper applies at world size 1 too (XLA:
            the step goes through ``xm.optimizer_step``, as idist wraps it at every size).
        pin_memory_refused: the warning ``auto_dataloader(pin_memory=True)`` gives before loading unpinned
            (XLA: idist's words); None: pinning follows the device.
        fault_tolerance: the engine behind ``polydist run --fault-tolerant`` on it (``"torchft"``: gloo,
            nccl; :mod:`polydist.backends.torchft`); None: the flag is refused there.
    """

    init_url: Optional[str] = None
    ranks_from_backend: bool = False
    offers_host_address: bool = False
    needs_launcher: Optional[str] = None
    starts_processes: bool = False
    training_at_every_size: bool = False
    pin_memory_refused: Optional[str] = None
    fault_tolerance: Optional[str] = None

    def available(self) -> bool:
        """Whether it is usable in this process (listed by ``polydist.available_backends()``)."""
        return True

    def register(self) -> bool:
        """Register it with torch.distributed (backend name, init method) where it can run; False where it
        cannot (not installed). Called when polydist is imported (:func:`register_all`)."""
        return True

    def sees_device(self, device: str) -> bool:
        """Whether this process sees a device of type ``device`` (the entry's :attr:`Backend.device`): cpu always,
        cuda when ``torch.cuda.is_available()``; a backend whose device torch cannot query says (torch_xla)."""
        return device == "cpu" or (device == "cuda" and torch.cuda.is_available())

    def resolve(self, name: str) -> str:
        """The backend actually created for the name asked for (torch's ``mpi`` on stock wheels: ``mpi4py``);
        raises ``ValueError`` where it cannot be (not installed)."""
        return name.lower()

    def hosts_rendezvous(self, info: Any) -> bool:
        """Whether every backend's ranks meet by this one's :attr:`init_url` in the job ``info`` describes (an
        MPI job without ``MASTER_ADDR``: over ``mpi://``)."""
        return False

    def check_join(self, info: Any, name: str) -> None:
        """Raise ``ValueError`` before the group is made in a world it cannot join (``name``: as asked for)."""

    def after_join(self) -> None:
        """Once a default group exists that met by its :attr:`init_url` or took its ranks from it (MPI: abort the
        job on an uncaught exception, rather than leave the others waiting for the group's timeout). Must be
        idempotent."""

    def launch_advice(self, info: Any, who: str) -> Optional[str]:
        """What to do when its group is not the world a launcher (``who``, in words) announced; None: nothing
        special to say."""
        return None

    def spawn_refusal(self, name: str) -> str:
        """Where :attr:`needs_launcher`: why :func:`polydist.spawn` (backend ``name``) refuses to start several
        processes, and what to do instead."""
        return (f"spawn with backend {name!r}: only {self.needs_launcher} starts its ranks, and spawn's processes "
                f"would each be a world of one; run the script under {self.needs_launcher} (or polydist run "
                f"--backend {name}) and call polydist.initialize({name!r}) there, or spawn with gloo")

    def start_processes(self, work: Callable[[], Any], nproc_per_node: int, nnodes: int) -> list:
        """Where :attr:`starts_processes`: how :func:`polydist.spawn` starts its processes with the backend's own
        launcher (torch_xla's ``xmp.spawn``, ``horovod.run``): runs the picklable ``work()`` in each and returns
        this node's results by local rank. Others: PyTorch's elastic agent starts them, not this."""
        raise NotImplementedError(f"{type(self).__name__} starts no processes of its own")

    def adopt(self) -> bool:
        """When no process group exists: make the default group over a runtime the program started itself
        (``hvd.init()``; an XLA device in use), without communicating, and return True; False when there is none
        (:func:`adopt_any`)."""
        return False

    def after_destroy(self) -> None:
        """After ``polydist.finalize`` destroyed the default group polydist made (Horovod: shut down the Horovod
        ``initialize`` started)."""

    def add_group(self, ranks: list, every_rank: bool) -> None:
        """Called on every rank, members and not, before a group of fewer ranks is made, where the backend's
        groups need the whole job (Horovod's process sets). ``every_rank=True`` from ``new_group``, which every
        rank calls each time; False for a rank list given to a collective."""

    def compute_device(self) -> Optional[torch.device]:
        """The device :func:`polydist.device` gives on it, where that is not the entry's
        :meth:`~Backend.comm_device` (XLA: ``torch_xla.device()``, its byte buffers staying on the CPU)."""
        return None

    def training(self) -> Any:
        """Where it has its own model/optimizer wrappers (Horovod), the module offering ``broadcast_parameters``
        and ``DistributedOptimizer``; None: torch's DDP."""
        return None

    def wrap_loader(self, loader: Any, world_size: int) -> Any:
        """The loader ``auto_dataloader`` returns in place of ``loader`` (XLA: ``MpDeviceLoader`` at world size > 1)."""
        return loader

    def versions(self) -> dict:
        """What carries its traffic and their versions (``{"nccl": "2.21.5"}``), for benchmark reports."""
        return {}


DEFAULT_LIFECYCLE = Lifecycle()
