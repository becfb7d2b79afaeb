"""The live world: the one :class:`polydist._state.World` of this process, made, adopted and left.

This module owns the state of the live world. :func:`polydist.initialize`
makes it (:func:`made`); a process group polydist did not make is adopted
as it is (:func:`world`: the program's own ``init_process_group``, or a
runtime the program started, whose group polydist makes); :func:`finalize`
and the exit of a process that did not call it drop it (:func:`leave`), and
it is replaced as a whole whenever torch's default group changes identity,
so no cache, counter or buffer outlives its world. Destroying a group
polydist made, once the ranks met: :mod:`polydist.teardown`.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch.distributed as dist

from . import _at_exit, _torch, teardown
from ._state import World
from .launch.announced import check_group
from .launch.environment import ProcessInfo, launcher
from .backends import registry
from .errors import NotInitializedError, WorldMismatchError
from .node_layout import layout_from_env, single_node_guess

__all__ = ["world", "require_group", "finalize", "leave", "made", "check_announced"]

_world: Optional[World] = None  # the live world's state; see world()

# Hooks of the modules that build on this one (which therefore cannot be imported
# here), called with no argument and filled in one place, polydist._wiring.
# on_world_made: whenever a world is made or adopted, from any thread;
# on_finalize: in finalize(), while the group lives.
on_world_made: list = []
on_finalize: list = []
exiting = False  # set at interpreter exit before the hooks run: a program that gets there did not finalize


# ---------------------------------------------------------------- made or adopted


def world() -> Optional[World]:
    """The live world's state, or None when there is no process group.

    Every collective asks, so the common case is one identity check. A new
    default group (the user's own ``init_process_group``, or a destroy and
    re-init behind polydist's back) gets a fresh state; its layout is guessed
    without communicating, since adoption may happen on one rank only. With
    no group but a runtime the program started itself — Horovod
    (``hvd.init()``), or torch_xla with its device in use, which idist
    treats as an xla-tpu world — its backend's group is made, without
    communicating either (:func:`polydist.backends.registry.adopt_any`);
    ``finalize`` destroys it and leaves the runtime running.

    Raises:
        WorldMismatchError: the group is not the world a launcher announced
            (e.g. a framework's MPI world of one under torchrun); it is not
            adopted, so every polydist call raises the same.
    """
    global _world
    pg = _torch.default_pg()
    state = _world
    if state is not None and state.pg is pg:
        return state
    owns = False
    if pg is None:
        _world = None  # the group was destroyed behind our back
        if not registry.adopt_any():  # a runtime the program started (hvd.init(), an XLA device): make its group
            return None
        pg, owns = _torch.default_pg(), True
    info = launcher()
    check_announced(info, pg, owned=owns)  # a group is adopted only if it is the job's
    env = layout_from_env(info)
    # A group made over the program's runtime has a process-local store (made without communicating): no meeting there.
    return made(World(pg, owns_group=owns, layout=env or single_node_guess(), timeout=None,
                      layout_known=env is not None, store_shared=not owns))


def made(state: World) -> World:
    """Make ``state`` the live world (a group was made or adopted) and run :data:`on_world_made`'s hooks."""
    global _world
    _world = state
    _at_exit.arm(_leave_at_exit)
    for hook in on_world_made:
        hook()
    return _world


def check_announced(info: ProcessInfo, pg: "dist.ProcessGroup", owned: bool) -> None:
    """Raise :class:`~polydist.errors.WorldMismatchError` if ``pg`` is not the world ``info`` announced;
    a group polydist made (``owned``) is destroyed first, so none is left behind."""
    try:
        check_group(info, str(dist.get_backend(pg)), pg.rank(), pg.size())
    except WorldMismatchError:
        if owned:
            dist.destroy_process_group()
        raise


def require_group() -> Optional[World]:
    """For collectives: the live world, or None when serial.

    Raises:
        NotInitializedError: a launcher started several processes but no
            process group exists yet (serial results would be wrong).
    """
    state = _world
    if state is not None and state.pg is _torch.default_pg():  # every collective asks: the common case inline
        return state
    state = world()
    if state is not None:
        return state
    info = launcher()
    if info.is_distributed:
        raise NotInitializedError(
            f"this process is rank {info.rank} of {info.world_size} (launched by {info.launcher}) "
            "but no process group exists: call polydist.initialize() first"
        )
    return None


# ---------------------------------------------------------------- left


def finalize() -> None:
    """Leave the job: wait until every rank has called it, then destroy the process group polydist created.

    A rank that finishes first must not tear the world down under ranks still
    communicating: Horovod's shutdown ends every rank's Horovod (a subgroup's
    all_reduce on the others then fails with "Horovod has been shut down"), and
    the rank that serves the job's TCP store takes the store with it. So, in a
    world of several ranks that polydist created, each rank waits here, on the
    store (not on the transport, which may be busy), for every rank to arrive,
    at most the world's collective timeout; past it, a warning on stderr and the
    group is destroyed anyway. Every rank must therefore call it (as
    ``spawn`` and ``Parallel`` do when the function returns); the exit of a
    process that did not (an error) does not wait, but counts itself out, so
    that the ranks waiting here go on at once instead of waiting out the timeout.

    A group the user created and polydist adopted is left as it is, without
    waiting (torch's ``destroy_process_group`` does not wait either). A group
    polydist made over a runtime the program started (``hvd.init()``) is
    destroyed without waiting: its store is the process's own, so the ranks
    cannot meet there, and the runtime, which the program owns, stays up. Cached
    subgroups are forgotten. Environment variables are never touched. Calling
    it when serial or twice is harmless.

    In debug mode (``POLYDIST_DEBUG=1``) the other ranks learn that this one
    leaves; if any waits in a collective this rank never called, it raises
    :class:`~polydist.CollectiveMismatchError` (:mod:`polydist.collectives.debug`).
    """
    if _world is None and dist.is_available() and dist.is_initialized():
        with contextlib.suppress(WorldMismatchError):
            world()  # the program's own group: adopted, so that finalize's hooks (debug mode's check) see it
    leave(wait=True)


def leave(wait: bool) -> None:
    """:func:`finalize`, waiting for the other ranks only when ``wait`` (False on error paths: peers stuck in a
    collective with this rank must see it go, not wait for it in turn)."""
    global _world
    if _world is not None:
        for hook in on_finalize:
            hook()
    try:
        state = world()
    except WorldMismatchError:
        state = None  # a group polydist would not adopt: not its to destroy
    _world = None  # its groups, sequence numbers and buffers go with it
    if state is not None and state.owns_group:
        teardown.destroy(state, wait)


def _leave_at_exit() -> None:
    """At exit: :func:`finalize` a group polydist created and not finalized; forget any other (``polydist._at_exit``).

    Without waiting for the other ranks: the process may be ending for an
    error, and its peers, waiting in a collective with it, must see it go.
    """
    global _world, exiting
    exiting = True
    if _world is not None and _world.owns_group:
        leave(wait=False)
    _world = None
