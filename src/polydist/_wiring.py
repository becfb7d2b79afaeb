"""Where polydist's layers are connected: every hook one module runs for another, in one place.

The lower layers (:mod:`polydist.context`, :mod:`polydist.live_world`,
:mod:`polydist.teardown`, :mod:`polydist.collectives`, the backends, the MPI
job) cannot import what builds on them (the flight recorder's dump, the comms
profile, the launcher's announced world, debug mode's check of the live
world), so they expose hook lists and slots, and :func:`wire` fills them. It
is called once, by ``polydist/__init__.py``: importing any other module fills
nothing by itself, and what runs when, and in what order, is read here.
"""

from __future__ import annotations

from . import context, default_group, ft, live_world, teardown
from .backends import leaving, registry
from .backends.watchdog import WATCHDOG
from .backends import mpi4py
from .backends.mpi4py import job as mpi_job
from .collectives import debug, timeout_error
from .launch import announced, environment, process_setup
from .trace import dump, profile

__all__ = ["wire"]

_wired = False


def wire() -> None:
    """Fill the hook lists (once; a second call does nothing)."""
    global _wired
    if _wired:
        return
    _wired = True
    # a backend that torch starts by itself (the mpi stand-in) checks the launcher's world: launch/ answers
    registry.world = registry.World(environment.launcher, announced.check_group, announced.refuse)
    # whenever a world is made or adopted, from any thread: SIGUSR1 (and a launcher's SIGTERM) dump
    live_world.on_world_made.append(dump.install_signal_handlers)
    # and, with $POLYDIST_TRACE_DIR set, an uncaught exception dumps under any launcher (torchrun, srun, ...)
    live_world.on_world_made.append(process_setup.dump_when_uncaught)
    # and, in debug mode, the watcher that answers a leaving rank (collectives.debug's leaving check)
    live_world.on_world_made.append(leaving.start)
    debug.announce, debug.entering, debug.leaving_exchange = leaving.announce, leaving.entering, leaving.leaving_exchange
    # and its exit handler, with a group alive: polydist's world (made or adopted) checks with its call counts
    leaving.world_leaves = _world_leaves_at_exit
    # at the end of initialize(), where every rank is: polydist run --profile-comms
    context.on_initialized.append(profile.start_session)
    # then, under polydist run --fault-tolerant: this replica group joins the job (torchft's manager)
    context.on_initialized.append(ft.start)
    # in finalize(), while the group lives, in this order: debug mode's leaving check, then the profile's table
    live_world.on_finalize.append(debug.check_leaving)
    live_world.on_finalize.append(profile.end_session)
    # and last, under --fault-tolerant: how this replica group ended, for the launcher's report
    live_world.on_finalize.append(ft.stop)
    # at exit, with the store still up: a rank that ended its program tells a watchdog that may wait for it
    live_world.on_finalize.append(_finished_at_exit)
    # while finalize waits for the other ranks: MPI's progress, which a peer still in a collective may need
    teardown.while_leaving.append(mpi_job.progress)
    # with $POLYDIST_TRACE_DIR set under another launcher: the program's own init_process_group is adopted (dumps)
    process_setup.adopt_own_groups(_adopt_own)
    # a collective timed out (the pipeline, a Python group's watchdog) or, in debug mode, a rank left while others
    # wait: its dump, named in the error's notes
    timeout_error.on_timeout.append(dump.timed_out)
    # MPI_Abort ends every rank at once: this one's dump first
    mpi_job.before_abort.append(dump.failed)
    # and under plain mpiexec, before that rank's own line: the dumps' finding, where another rank caused its error
    mpi4py.explain_abort.append(process_setup.finding_before_abort)
    # and whatever ends it so: no "finished its program" note for the watchdogs of the others
    mpi_job.on_abort.append(WATCHDOG.failing)


def _adopt_own() -> None:
    if not default_group.creating:  # initialize() makes its own world
        live_world.world()


def _world_leaves_at_exit() -> bool:
    if live_world._world is None:  # no world of polydist's: the program's own group, that polydist never used
        return False
    debug.check_leaving(at_exit=True)
    return True


def _finished_at_exit() -> None:
    if live_world.exiting:
        WATCHDOG.finished()
