"""The backend registry: what each backend is, declared once; core modules ask here and never compare names.

A backend is its folder (``backends/<name>/``, for those polydist provides)
plus one :class:`Backend` entry, declared with :func:`declare`
(:mod:`polydist.backends.declaration`, whose names this module re-exports).
The entry is a small record of what the core asks about communication
(devices, reductions, subgroups, point-to-point, AVG, the mover) and a
:class:`Lifecycle` object: what the backend does at start, join, launch,
adoption and finalize, and for training and data loading, each a method
whose default does nothing special. Declared: torch's own backends in
:mod:`polydist.backends.builtin`, polydist's in their folders
(:mod:`~polydist.backends.mpi4py` declares ``mpi4py`` and torch's ``mpi``,
:mod:`~polydist.backends.horovod` ``horovod``, :mod:`~polydist.backends.xla`
``xla-tpu``). This module answers the core's questions from the declared
entries: which backend a name means, which are available, discovery and
registration with torch. Any other backend registered with
``torch.distributed.Backend.register_backend`` gets the default entry
(:func:`get`): a CPU backend with torch.distributed's semantics and nothing
second-guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch.distributed as dist

from .. import _torch, settings
from .builtin import GLOO, MPI_DTYPES, NCCL, UNSIGNED_WIDE  # noqa: F401 - declared first; re-exported
from .declaration import DECLARED, DIRECT, SLOTS, Backend, declare  # noqa: F401 - the declaration side, re-exported
from .lifecycle import Lifecycle

__all__ = [
    "Backend", "Lifecycle", "declare", "get", "names", "default_name", "available_names", "by_init_url", "rendezvous_for",
    "register_all", "model_names", "after_destroy_all", "listed_names", "fr_library", "discover", "DIRECT", "SLOTS",
    "adopt_any", "registrar", "Installable", "resolve", "resolved_name", "World", "world",
    "requested_name", "timeout_settable",
]

ENTRY_POINT_GROUP = "polydist.backends"
_discovered: list = []


def discover() -> None:
    """Import every module declared in the ``polydist.backends`` entry-point group (once per process), each
    declaring its entries; a package adds a backend by naming its module there (``pyproject.toml``:
    ``[project.entry-points."polydist.backends"] name = "package.module"``). A module that fails to import
    is reported as a warning and skipped: one broken plugin must not stop polydist's import."""
    if _discovered:
        return
    _discovered.append(True)
    import importlib.metadata
    import warnings

    for point in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        try:
            point.load()
        except Exception as exc:  # a third party's import error, reported and not raised
            warnings.warn(f"polydist backend {point.name!r} ({point.value}) could not be loaded: {exc!r}",
                          RuntimeWarning, stacklevel=2)


def get(name: Optional[str]) -> Backend:
    """The entry of backend ``name`` (as a group reports it); the default entry for a backend declared nowhere."""
    entry = DECLARED.get(str(name))
    return entry if entry is not None else Backend(str(name))


def names() -> tuple[str, ...]:
    """Every declared backend, in declaration order."""
    return tuple(DECLARED)


def by_init_url(url: Optional[str]) -> Optional[Backend]:
    """The backend whose ranks meet by init method ``url``, if one declared it."""
    return next((e for e in DECLARED.values() if url is not None and e.lifecycle.init_url == url), None)


def model_names() -> tuple[str, ...]:
    """idist's names of the computation models the declared backends that can run here give, once each, in
    declaration order (``"native-dist"``, then e.g. ``"horovod-dist"`` where Horovod is installed)."""
    usable = (e for e in DECLARED.values() if (e.lifecycle.available() if e.builtin else e.lifecycle.register()))
    return tuple(dict.fromkeys(e.model_name for e in usable))


def register_all() -> None:
    """Register every declared backend that torch does not know by itself (:meth:`Lifecycle.register`), and tell
    torch the devices of each that polydist implements (:func:`tell_torch`)."""
    for entry in tuple(DECLARED.values()):
        if entry.lifecycle.register():
            tell_torch(entry)


def tell_torch(entry: Backend) -> None:
    """Tell torch what a backend polydist implements can do (:attr:`Backend.torch_devices` not None), where torch
    knows its name and assumes otherwise by that name.

    ``Backend.backend_capability[entry.name]`` becomes its devices (the stand-in ``mpi`` on stock wheels:
    ``['cpu']``, not the ``['cpu', 'cuda']`` of torch's native ProcessGroupMPI, which torch's checkpoint code reads
    to pick a device). Where its members alone make groups (:attr:`Backend.no_subgroups` None), torch's refusal of
    ``new_group(..., use_local_synchronization=True)`` by the name ``mpi`` is lifted
    (:func:`polydist._torch.allow_local_synchronization`).
    """
    if entry.torch_devices is None or not dist.is_available() or entry.name not in dist.Backend.backend_capability:
        return
    dist.Backend.backend_capability[entry.name] = list(entry.torch_devices)
    if entry.no_subgroups is None:
        _torch.allow_local_synchronization(entry.name)


def timeout_settable(name: str) -> bool:
    """Whether the default group of backend ``name`` can have its timeout changed once made (its entry's
    :attr:`Backend.timeout_settable`: gloo and nccl, where this PyTorch can)."""
    return get(name).timeout_settable and _torch.can_set_timeout()


def after_destroy_all() -> None:
    """After ``polydist.finalize`` destroyed the group it made: every backend's :meth:`Lifecycle.after_destroy`."""
    for entry in tuple(DECLARED.values()):
        entry.lifecycle.after_destroy()


def listed_names() -> tuple[str, ...]:
    """The backends ``polydist run --help`` names (:attr:`Backend.listed`), in declaration order."""
    return tuple(e.name for e in DECLARED.values() if e.listed)


def fr_library(backends: Any) -> str:
    """The ``lib`` of torch's flight-recorder trace files for a job whose ranks' groups were ``backends``
    (names): "nccl" where any was nccl, else "gloo" (torch's trace analyzer knows these two)."""
    return NCCL.name if any(get(b) is NCCL for b in backends) else GLOO.name


def adopt_any() -> bool:
    """With no process group: the first backend whose runtime the program started makes one (:meth:`Lifecycle.adopt`)."""
    return any(e.lifecycle.adopt() for e in tuple(DECLARED.values()))


def registrar(name: str, available: Callable[[], bool], create: Callable, scheme: str,
              rendezvous: Callable) -> Callable[[], bool]:
    """A :meth:`Lifecycle.register` for a backend written in Python: once ``available()``, registers backend ``name``
    (its creator ``create``, torch's extended API, the devices of its entry's :attr:`Backend.torch_devices`) and
    init method ``scheme://`` (``rendezvous``) with torch.distributed, on the first call; returns whether it is
    registered."""
    done: list = []

    def register() -> bool:
        if done:
            return True
        if not available() or not dist.is_available():
            return False
        if name not in dist.Backend.backend_list:
            devices = list(get(name).torch_devices or ("cpu",))
            dist.Backend.register_backend(name, create, extended_api=True, devices=devices)
        dist.register_rendezvous_handler(scheme, rendezvous)
        done.append(True)
        return True

    return register


class Installable(Lifecycle):
    """The lifecycle of a backend written in Python that needs a package (Horovod, torch_xla): registered by
    ``register`` (a :func:`registrar`) where the package is installed; a name resolves to ``name`` once it is
    registered, else ``ValueError`` naming the backend asked for, ``missing`` (what is not installed) and, in
    ignite's words, the backends there are."""

    def __init__(self, name: str, register: Callable[[], bool], missing: str) -> None:
        self._name, self._register, self._missing = name, register, missing

    def register(self) -> bool:
        return self._register()

    def resolve(self, name: str) -> str:
        if not self._register():
            raise ValueError(
                f"Unknown backend {name!r}: {self._missing}. Backend should be one of {', '.join(available_names())}"
            )
        return self._name


def rendezvous_for(entry: Backend, info: Any) -> Optional[Backend]:
    """The backend whose ``init_url`` the ranks of ``entry`` meet by, launched as ``info`` says; None: torch's way.

    A backend hosting this job's rendezvous first (MPI's, in an MPI job), else ``entry``'s own.
    """
    host = next((e for e in DECLARED.values() if e.lifecycle.hosts_rendezvous(info)), None)
    return host if host is not None else (entry if entry.lifecycle.init_url is not None else None)


def default_name() -> str:
    """The backend :func:`polydist.initialize` uses when none is named: the first declared default for a visible device.

    nccl where CUDA is visible and torch has it, else gloo.
    """
    for entry in DECLARED.values():
        if entry.default_for not in (None, "cpu") and entry.device_visible() and entry.lifecycle.available():
            return entry.name
    return next(e.name for e in DECLARED.values() if e.default_for == "cpu")


def requested_name() -> str:
    """The backend asked for when a call names none: ``POLYDIST_BACKEND``, else :func:`default_name`."""
    return settings.BACKEND.read() or default_name()


def resolve(name: Optional[str]) -> str:
    """The backend :func:`polydist.initialize` creates for ``name`` (None: ``POLYDIST_BACKEND``, else :func:`default_name`).

    Raises ``TypeError`` for a name that is not a string, ``ValueError`` for one no backend answers to (or not
    installed here), or whose device is not visible to this process.
    """
    if name is None:
        name = requested_name()
    if not isinstance(name, str):
        raise TypeError(f"backend must be a string such as {GLOO.name!r} or {NCCL.name!r}, got {name!r}")
    lowered = name.lower()
    entry = get(lowered)
    resolved = entry.lifecycle.resolve(name)  # may register it, or raise
    if resolved not in {b.lower() for b in dist.Backend.backend_list}:
        raise ValueError(  # "Backend should be one of": ignite.distributed's words, which its users match
            f"Unknown backend {name!r}. Available backends: {', '.join(available_names())} (Backend should be one "
            "of these; another must be installed and registered with torch.distributed.Backend.register_backend)"
        )
    if not entry.device_visible():
        raise ValueError(f"backend {lowered!r} needs {entry.device.upper()} devices, and none is visible to this process")
    return resolved


def resolved_name(name: str) -> str:
    """The backend a group asked for as ``name`` has, as far as its entry says without raising (idist's "xla": "xla-tpu")."""
    entry = get(name.lower())
    try:
        return entry.lifecycle.resolve(name)
    except ValueError:  # not installed: no group of it can exist
        return name.lower()


def available_names() -> tuple[str, ...]:
    """Backends usable in this process: torch's own that are built in (nccl: with CUDA visible), then every other registered one."""
    listed = [e.name for e in DECLARED.values() if e.builtin and e.lifecycle.available()]
    builtin = {e.name for e in DECLARED.values() if e.builtin}
    listed.extend(b for b in dist.Backend.backend_list if b not in builtin and b not in listed)
    return tuple(listed)


# ---------------------------------------------------------------- the launcher's world, as a backend asks it


@dataclass(frozen=True)
class World:
    """The world this process's launcher announced, for a backend that torch starts with no polydist code in
    between (the ``mpi`` stand-in's ``init_process_group("mpi")``), which must refuse a world of its own.

    ``launch/`` starts processes through the backends' lifecycles, so it sits above ``backends/``; a backend
    asks it through :data:`world` instead of importing it. :mod:`polydist._wiring` sets :data:`world` when
    polydist is imported, to :func:`polydist.launch.environment.launcher` and
    :mod:`polydist.launch.announced`'s checks; the core passes lifecycles what it read (``info``) itself.
    """

    announced: Callable[[], Any]  #: () -> ProcessInfo: what the launcher said (serial when its variables are bad)
    check_group: Callable[[Any, str, int, int], None]  #: (info, backend, rank, size): raise if not that world
    refuse: Callable[[Any, str, str], None]  #: (info, backend, outcome): raise before joining, saying ``outcome``


world: World  # set by polydist._wiring.wire()
