"""The backend registry: what each backend is, declared once; core modules ask here and never compare names.

A backend is its folder (``backends/<name>/``, for those polydist provides)
plus one :class:`Backend` entry, declared with :func:`declare`. The entry is
a small record of what the core asks about communication (devices,
reductions, subgroups, point-to-point, AVG, the mover) and a
:class:`Lifecycle` object: what the backend does at start, join, launch,
adoption and finalize, and for training and data loading, each a method
whose default does nothing special. Declared: torch's own
backends below, polydist's in their folders (:mod:`~polydist.backends.mpi4py`
declares ``mpi4py`` and torch's ``mpi``, :mod:`~polydist.backends.horovod`
``horovod``, :mod:`~polydist.backends.xla` ``xla-tpu``). Any other backend registered with
``torch.distributed.Backend.register_backend`` gets the default entry
(:func:`get`): a CPU backend with torch.distributed's semantics and nothing
second-guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from .. import _torch, ops, settings
from .dispatch import behind
from .lifecycle import DEFAULT_LIFECYCLE, Lifecycle

__all__ = [
    "Backend", "Lifecycle", "declare", "get", "names", "default_name", "available_names", "by_init_url", "rendezvous_for",
    "register_all", "model_names", "after_destroy_all", "listed_names", "fr_library", "discover", "DIRECT", "SLOTS",
    "adopt_any", "registrar", "Installable", "resolve", "resolved_name", "World", "world",
    "requested_name", "timeout_settable",
]

# How polydist's collectives move a group's bytes (:attr:`Backend.mover`; collectives/exchange.py maps them).
DIRECT = "direct"  # the group's own blocking calls, past torch's dispatch (a DirectProcessGroup: the Python groups)
SLOTS = "slots"  # torch.distributed calls, the predicted-slot protocol (collectives/slots.py)




@dataclass(frozen=True, eq=False)  # an entry is itself: compared and hashed by identity
class Backend:
    """What the core asks about one backend's communication (defaults: what torch.distributed promises of any
    backend), and its :class:`Lifecycle`.

    Attributes:
        name: the name ``torch.distributed.get_backend`` gives its groups.
        builtin: one of torch's own backends (listed first by :func:`available_names`, in declaration order).
        device: the device type its byte buffers live on; ``"cuda"``: the current CUDA device (:meth:`comm_device`).
        default_for: the device type it is the default backend for, when that device is visible (:func:`default_name`).
        reduce_keeps_input: ``reduce`` leaves the non-destination ranks' inputs untouched (gloo writes
            partial results into them; unknown backends are assumed to, to be safe).
        native_avg: it has a ``ReduceOp.AVG`` that matches SUM-then-divide.
        no_subgroups: None when its members alone make groups of fewer ranks than the world; else
            the error for such a group of the given global ranks, or None where this job can make it
            with every rank's help (:meth:`Lifecycle.add_group`; horovod with dynamic process sets).
        point_to_point: it has send/recv.
        model_name: ``polydist.model_name()`` on it, as ``ignite.distributed`` names it.
        reductions: what it reduces (op x dtype), checked before any communication; None: not second-guessed.
        mover: how polydist's collectives move its groups' bytes: :data:`DIRECT` (the group's direct calls:
            it must be a :class:`~polydist.backends.direct.DirectProcessGroup`) or :data:`SLOTS`; None: by the
            group (a DirectProcessGroup gets its direct calls, any other the slots). See :meth:`moves_direct`.
        timeout_settable: its default group's timeout can be changed after creation (torch's
            ``_set_pg_timeout``: gloo and nccl).
        torch_recorder: torch's own flight recorder sees its groups' calls (gloo, nccl), so calls not made
            through polydist's API (DDP's) are in torch's dump, not polydist's.
        torch_devices: the device types torch is told its groups take (``Backend.register_backend(devices=...)``,
            ``Backend.backend_capability``) where polydist implements it; None: torch's own backend, left as torch says.
        listed: named in ``polydist run --help`` (False for second spellings and names that never run here).
        lifecycle: what it does at start, join, launch, adoption and finalize (:class:`Lifecycle`).
    """

    name: str
    builtin: bool = False
    device: str = "cpu"
    default_for: Optional[str] = None
    reduce_keeps_input: bool = False
    native_avg: bool = False
    no_subgroups: Optional[Callable[[list], Optional[Exception]]] = None
    point_to_point: bool = True
    model_name: str = "native-dist"
    reductions: Optional[ops.Reductions] = None
    mover: Optional[str] = None
    timeout_settable: bool = False
    torch_recorder: bool = False
    torch_devices: Optional[tuple] = None
    listed: bool = True
    lifecycle: Lifecycle = DEFAULT_LIFECYCLE

    def comm_device(self) -> torch.device:
        """Where a group of this backend communicates: ``cuda:<current device>`` for CUDA backends, else the type."""
        if self.device == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(self.device)

    def device_visible(self) -> bool:
        """Whether this process sees a device of :attr:`device`'s type (:meth:`Lifecycle.sees_device`)."""
        return self.lifecycle.sees_device(self.device)

    def moves_direct(self, group: Any) -> bool:
        """Whether polydist's collectives call the direct calls of ``group``'s Python group (:attr:`mover`; the group
        itself: :func:`~polydist.backends.dispatch.behind`), not torch.distributed's.

        Asked once per group and world (:class:`polydist.groups.Resolved`). Raises ``TypeError`` where the
        entry declares :data:`DIRECT` for a group that has no direct calls.
        """
        direct = behind(group) is not None
        if self.mover is None:
            return direct
        if self.mover == DIRECT and not direct:
            raise TypeError(f"backend {self.name!r} declares the direct mover, but its group is a "
                            f"{type(group).__name__}, not a DirectProcessGroup")
        return self.mover == DIRECT


_ENTRIES: dict[str, Backend] = {}


def declare(entry: Backend) -> Backend:
    """Declare (or replace) the entry of ``entry.name``; what its reduction table refuses is marked in :data:`polydist.ops.SUSPECT`."""
    _ENTRIES[entry.name] = entry
    if entry.reductions is not None:
        ops.mark_suspects(entry.reductions)
    return entry


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
    entry = _ENTRIES.get(str(name))
    return entry if entry is not None else Backend(str(name))


def names() -> tuple[str, ...]:
    """Every declared backend, in declaration order."""
    return tuple(_ENTRIES)


def by_init_url(url: Optional[str]) -> Optional[Backend]:
    """The backend whose ranks meet by init method ``url``, if one declared it."""
    return next((e for e in _ENTRIES.values() if url is not None and e.lifecycle.init_url == url), None)


def model_names() -> tuple[str, ...]:
    """idist's names of the computation models the declared backends that can run here give, once each, in
    declaration order (``"native-dist"``, then e.g. ``"horovod-dist"`` where Horovod is installed)."""
    usable = (e for e in _ENTRIES.values() if (e.lifecycle.available() if e.builtin else e.lifecycle.register()))
    return tuple(dict.fromkeys(e.model_name for e in usable))


def register_all() -> None:
    """Register every declared backend that torch does not know by itself (:meth:`Lifecycle.register`), and tell
    torch the devices of each that polydist implements (:func:`tell_torch`)."""
    for entry in tuple(_ENTRIES.values()):
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
    for entry in tuple(_ENTRIES.values()):
        entry.lifecycle.after_destroy()


def listed_names() -> tuple[str, ...]:
    """The backends ``polydist run --help`` names (:attr:`Backend.listed`), in declaration order."""
    return tuple(e.name for e in _ENTRIES.values() if e.listed)


def fr_library(backends: Any) -> str:
    """The ``lib`` of torch's flight-recorder trace files for a job whose ranks' groups were ``backends``
    (names): "nccl" where any was nccl, else "gloo" (torch's trace analyzer knows these two)."""
    return NCCL.name if any(get(b) is NCCL for b in backends) else GLOO.name


def adopt_any() -> bool:
    """With no process group: the first backend whose runtime the program started makes one (:meth:`Lifecycle.adopt`)."""
    return any(e.lifecycle.adopt() for e in tuple(_ENTRIES.values()))


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
    host = next((e for e in _ENTRIES.values() if e.lifecycle.hosts_rendezvous(info)), None)
    return host if host is not None else (entry if entry.lifecycle.init_url is not None else None)


def default_name() -> str:
    """The backend :func:`polydist.initialize` uses when none is named: the first declared default for a visible device.

    nccl where CUDA is visible and torch has it, else gloo.
    """
    for entry in _ENTRIES.values():
        if entry.default_for not in (None, "cpu") and entry.device_visible() and entry.lifecycle.available():
            return entry.name
    return next(e.name for e in _ENTRIES.values() if e.default_for == "cpu")


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
    listed = [e.name for e in _ENTRIES.values() if e.builtin and e.lifecycle.available()]
    builtin = {e.name for e in _ENTRIES.values() if e.builtin}
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


# ---------------------------------------------------------------- torch's own backends

_FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
_COMPLEX = {torch.complex64, torch.complex128}  # SUM/AVG only (ops.check_op_dtype), as pairs of reals
UNSIGNED_WIDE = frozenset({torch.uint16, torch.uint32, torch.uint64})
# The dtypes MPI reduces (backends/mpi4py/_mpi.py REDUCE_TYPES): every integer width, floats, C bool, complex.
MPI_DTYPES = frozenset(_FLOATS | _COMPLEX | UNSIGNED_WIDE | {torch.int8, torch.uint8, torch.int16, torch.int32,
                                                              torch.int64, torch.bool})

# What torch's backends do beyond the defaults: gloo offers its host's address; nccl needs CUDA.
class _Gloo(Lifecycle):
    offers_host_address = True
    fault_tolerance = "torchft"

    def available(self) -> bool:
        return dist.is_gloo_available()


class _Nccl(Lifecycle):
    fault_tolerance = "torchft"

    def available(self) -> bool:
        return dist.is_nccl_available() and torch.cuda.is_available()

    def versions(self) -> dict:
        return {"nccl": ".".join(map(str, torch.cuda.nccl.version()))}


class _Absent(Lifecycle):
    def available(self) -> bool:
        return False


# gloo: ProcessGroupGloo instantiates its reductions for float, double, half, bfloat16, int8, uint8,
# int32, int64 and bool only (GENERATE_ALL_TYPES); int16 and uint16/32/64 fail inside gloo with
# "Invalid scalar type" under every op (measured on torch 2.13: all_reduce, reduce, reduce_scatter).
GLOO = declare(Backend(
    "gloo", builtin=True, default_for="cpu", lifecycle=_Gloo(), mover=SLOTS, timeout_settable=True, torch_recorder=True,
    reductions=ops.Reductions(
        "gloo", frozenset(_FLOATS | _COMPLEX | {torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool}),
        source="torch's ProcessGroupGloo.cpp (GENERATE_ALL_TYPES); measured on torch 2.13",
    ),
))
# nccl: torch's ncclDataType map (int8, uint8, int32, int64, float16/32/64, bfloat16, bool as uint8, the
# float8 types) and NCCL's ops (sum, prod, max, min, avg: no bitwise ops, torch refuses BAND/BOR/BXOR).
_FLOAT8 = {torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}
_NCCL_DTYPES = frozenset(_FLOATS | _COMPLEX | _FLOAT8 | {torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool})
NCCL = declare(Backend(
    "nccl", builtin=True, lifecycle=_Nccl(), device="cuda", default_for="cuda", reduce_keeps_input=True,
    native_avg=True, mover=SLOTS, timeout_settable=True, torch_recorder=True,
    reductions=ops.Reductions(
        "nccl", _NCCL_DTYPES, refused={op: _NCCL_DTYPES for op in ("AND", "OR", "XOR")},
        source="torch's ProcessGroupNCCL (ncclDataType, ncclOp); NCCL's docs (ncclDataType_t, ncclRedOp_t)",
    ),
))
# torch's other built-in names: never listed as available here (ucc, xccl: not in the wheels polydist supports).
for _name in ("ucc", "xccl", "undefined", "fake"):
    declare(Backend(_name, builtin=True, lifecycle=_Absent(), listed=False))
