"""Every private or version-dependent ``torch.distributed`` API the library touches, in one place.

polydist goes through the public ``torch.distributed`` API wherever one
exists. The few places where none does are here, so that a PyTorch upgrade
that moves them breaks this module only, and each use says why it is needed.
Supported: PyTorch >= 2.2 (tested on 2.13). The elastic agent's, which only
polydist's launchers use, are in :mod:`polydist._torch_elastic`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import socket
import sys
from datetime import timedelta
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist

__all__ = [
    "all_gather_single",
    "reduce_scatter_single",
    "default_pg",
    "default_store",
    "can_set_timeout",
    "set_default_timeout",
    "group_timeout",
    "groups_named_by_ranks",
    "allow_local_synchronization",
    "WorkBase",
    "StoreError",
    "FR_BUFFER_SIZE",
    "fr_available",
    "fr_dumps",
    "group_ranks_by_name",
]

_c10d = dist.distributed_c10d

# PyTorch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor to *_single and deprecated the old names.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# The base class of work handles a Python ProcessGroup returns (the mpi4py backend's).
WorkBase = dist._Work

# Errors of a store wait (e.g. while creating a group): not a collective's timeout. Missing before 2.4.
StoreError: tuple = tuple(t for t in (getattr(dist, "DistStoreError", None),) if t is not None)


def default_pg() -> Optional["dist.ProcessGroup"]:
    """The default (world) process group, or None: ``GroupMember.WORLD`` without its two properties.

    Every collective asks, to see whether the world polydist knows is still
    the live one; this is the cheapest way to read it (the attribute behind
    ``_World.default_pg``, where this PyTorch has it).
    """
    world = _c10d._world
    return world._default_pg if _DIRECT_DEFAULT_PG else world.default_pg


_DIRECT_DEFAULT_PG = hasattr(_c10d._world, "_default_pg")


def default_store() -> "dist.Store":
    """The rendezvous store of the default group (it outlives a stuck collective; timeouts meet there)."""
    return _c10d._get_default_store()


def can_set_timeout() -> bool:
    """Whether this PyTorch can change a group's timeout after creation (``_set_pg_timeout``, PyTorch >= 2.3;
    which backends allow it is their registry entry's word: :func:`polydist.backends.registry.timeout_settable`)."""
    return hasattr(_c10d, "_set_pg_timeout")


def set_default_timeout(timeout: timedelta) -> None:
    """Set the collective timeout of the default group (joining used a longer one)."""
    _c10d._set_pg_timeout(timeout)


def group_timeout(pg: Optional["dist.ProcessGroup"]) -> Optional[float]:
    """The timeout, in seconds, that ``pg``'s CPU backend was created with (None: unknown)."""
    try:
        pg = pg if pg is not None else _c10d._get_default_group()
        return pg._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except Exception:  # a backend without options (e.g. a Python ProcessGroup): say nothing rather than guess
        return None


@contextlib.contextmanager
def groups_named_by_ranks() -> Iterator[None]:
    """Name the groups created inside the block from their ranks alone.

    With ``use_local_synchronization=True``, PyTorch (2.4+) names a group by
    hashing its ranks *and the number of groups this process already has*, so
    members that created different numbers of groups before (overlapping
    rank-list groups used by different ranks) compute different names and
    wait for each other forever. polydist creates each rank list's group at
    most once per world, so the ranks alone name it uniquely.

    torch's count of groups is kept: 2.14 counts these groups too, on their
    members alone, so the next group every rank makes, named by the count,
    would get other names on the members than on the rest (a hang).
    """
    original = getattr(_c10d, "_hash_ranks_to_str", None)
    if original is None:  # older PyTorch: the name already depends on the ranks only
        yield
        return
    _c10d._hash_ranks_to_str = lambda ranks: hashlib.sha1(
        ("polydist_" + "_".join(map(str, ranks))).encode(), usedforsecurity=False
    ).hexdigest()
    count = _c10d._world.group_count
    try:
        yield
    finally:
        _c10d._hash_ranks_to_str = original
        _c10d._world.group_count = count


# ---------------------------------------------------------------- what torch refuses by a backend's name

# The backend names whose member-only groups polydist provides although torch refuses
# use_local_synchronization=True for them by name (allow_local_synchronization).
_LOCAL_SYNCHRONIZATION: set = set()


def allow_local_synchronization(name: str) -> bool:
    """Let ``new_group(ranks, use_local_synchronization=True)`` on backend ``name`` do what it does on any backend
    whose members alone make a group, where torch refuses it by the name; return whether torch does (False:
    nothing to lift).

    torch (2.1 to 2.14, ``_new_group_with_tag``) raises "MPI backend doesn't
    support use_local_synchronization=True" for any backend named ``"mpi"``,
    and its barrier after a new group (``TORCH_DIST_INIT_BARRIER=1``) is then
    the world's, because its native ProcessGroupMPI makes every group with the
    whole world. The stand-in's groups are made by their members alone, so for
    ``name`` the call takes torch's path for other backends: a non-member gets
    None at once; members make the group under the name torch hashes from its
    ranks, and the barrier (when asked for) is the new group's.
    """
    if name != dist.Backend.MPI or not hasattr(_c10d, "_new_group_with_tag"):
        return False
    _LOCAL_SYNCHRONIZATION.add(name)
    if not getattr(_c10d._new_group_with_tag, "_polydist", False):
        _c10d._new_group_with_tag = _with_local_synchronization(_c10d._new_group_with_tag)
    return True


def _with_local_synchronization(original: Any) -> Any:
    """``_new_group_with_tag`` that lets through :data:`_LOCAL_SYNCHRONIZATION`'s backends (see
    :func:`allow_local_synchronization`); any other call is ``original``'s."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def _new_group_with_tag(*args: Any, **kwargs: Any) -> Any:
        call = signature.bind(*args, **kwargs)
        given = call.arguments
        if not given.get("use_local_synchronization") or _backend_asked(given.get("backend")) not in _LOCAL_SYNCHRONIZATION:
            return original(*args, **kwargs)
        ranks = given.get("ranks")
        if ranks is not None and dist.get_rank() not in ranks:
            return None  # torch's rule for a local synchronization: a non-member makes nothing
        # Past the refusal by name, then what use_local_synchronization changes on other backends: the name hashed
        # from the ranks (the members' count of groups may differ) and the barrier among the members only.
        given["use_local_synchronization"] = False
        barrier = _c10d._is_barrier_after_init() == 1
        name, after_init = _c10d._process_group_name, _c10d._is_barrier_after_init
        _c10d._process_group_name = lambda ranks, use_hashed_name: name(ranks, True)  # group creation is collective:
        _c10d._is_barrier_after_init = lambda: 0  # no other thread makes a group meanwhile
        try:
            pg = original(*call.args, **call.kwargs)
        finally:
            _c10d._process_group_name, _c10d._is_barrier_after_init = name, after_init
        if barrier:
            dist.barrier(group=pg)
        return pg

    _new_group_with_tag._polydist = True  # type: ignore[attr-defined]
    return _new_group_with_tag


def _backend_asked(backend: Any) -> Optional[str]:
    """The backend a new group gets: ``backend``, else the default group's (torch's rule); None without one."""
    if backend:
        return str(dist.Backend(backend))
    pg = default_pg()
    return None if pg is None else _c10d._world.pg_map.get(pg, (None,))[0]


# ---------------------------------------------------------------- a store on loopback


def loopback_store_server(world_size: Optional[int], timeout: timedelta, port: int = 0) -> "dist.TCPStore":
    """A master ``TCPStore`` that listens on 127.0.0.1 only (on ``port``; 0: a free one).

    ``TCPStore(..., is_master=True)`` listens on every interface whatever host
    it is given; a single-host job needs loopback only, so the listening
    socket is made here and handed over with ``master_listen_fd`` (the store
    owns it from then on).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(max(128, world_size or 0))
        port = sock.getsockname()[1]
    except OSError:
        sock.close()
        raise
    return dist.TCPStore(
        "127.0.0.1", port, world_size, is_master=True, timeout=timeout, wait_for_workers=False,
        master_listen_fd=sock.detach(),
    )


# ---------------------------------------------------------------- torch's own flight recorder

# torch's flight recorder keeps the last TORCH_FR_BUFFER_SIZE operations of its C++ backends (0: off). gloo's
# recorder (c10::Event) is dumped by _dump_fr_trace (torch >= 2.7); NCCL's (CUDA builds only) by _dump_nccl_trace,
# whose older spelling of the size is TORCH_NCCL_TRACE_BUFFER_SIZE. Older torch, or a CPU build's NCCL: absent.
FR_BUFFER_SIZE = "TORCH_FR_BUFFER_SIZE"
_FR_DUMPERS = ("_dump_fr_trace", "_dump_nccl_trace")


def fr_available() -> bool:
    """Whether this torch has a flight recorder that polydist can read (gloo's or NCCL's)."""
    return any(hasattr(torch._C._distributed_c10d, name) for name in _FR_DUMPERS)


def fr_dumps(stacks: bool = True) -> list:
    """torch's flight-recorder dumps of this process, one dict per recorder that has entries; ``stacks``: with
    each entry's call stack (torch symbolizes its C++ frames then: seconds, more on a loaded machine).

    Each is torch's own dump (``version``, ``pg_status``, ``entries``: see
    ``torch/distributed/flight_recorder``) unpickled from this process's own
    bytes, with ``"recorder"`` (the function's name) added. Empty where torch
    has no recorder or it is off. Never raises: a dump is written on error paths.
    """
    import pickle

    out = []
    for name in _FR_DUMPERS:
        dump = getattr(torch._C._distributed_c10d, name, None)
        if dump is None:
            continue
        try:
            with _inductor_not_imported():
                data = pickle.loads(dump(includeStackTraces=stacks))  # this process's own recorder: trusted bytes
        except Exception:  # noqa: BLE001 - a recorder that cannot be read is left out of the dump
            continue
        if isinstance(data, dict) and data.get("entries"):
            out.append({**data, "recorder": name})
    return out


@contextlib.contextmanager
def _inductor_not_imported() -> Iterator[None]:
    """Inside the block, ``hasattr(torch, "_inductor")`` does not import it where nothing did.

    Symbolizing a stack asks ``hasattr(torch, "_inductor")`` (to map code
    that inductor generated back to its source), and torch's lazy-module
    ``__getattr__`` then imports torch._inductor and torch._dynamo: 1-4 s on
    a loaded machine, in a rank that timed out and is writing its dump while
    the others wait for it to end. Where nothing imported inductor, no frame
    is inductor's: the frames are the same without the import.
    """
    lazy = getattr(torch, "_lazy_modules", None)
    if "torch._inductor" in sys.modules or not isinstance(lazy, set) or "_inductor" not in lazy:
        yield
        return
    lazy.discard("_inductor")
    try:
        yield
    finally:
        lazy.add("_inductor")


def group_ranks_by_name() -> dict:
    """``{process group name: its global ranks in group-rank order}`` of every live group, as torch's
    flight recorder names groups in its entries (``process_group[0]``: the world is ``"0"``)."""
    world, out = _c10d._world, {}
    try:
        for pg, name in list(world.pg_names.items()):
            ranks = world.pg_group_ranks.get(pg)
            if ranks is not None:
                out[str(name)] = [g for g, _ in sorted(ranks.items(), key=lambda kv: kv[1])]
    except Exception:  # noqa: BLE001 - torch's bookkeeping moved: the dump goes without the map
        pass
    return out
