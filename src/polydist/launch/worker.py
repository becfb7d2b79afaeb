"""Worker-side entry of ``polydist run``: run the user's script as ``__main__``.

Wrapped in torch elastic's ``@record`` so that an uncaught exception (or a
non-zero ``sys.exit``) is written to the agent's error file and the launcher
can show the failing rank's traceback. The worker dies with its launcher
(``$POLYDIST_LAUNCHER_PID``), even one killed with SIGKILL. A failure, a
SIGUSR1 or the launcher's SIGTERM writes the rank's flight-recorder dump
(:mod:`polydist.trace.dump`). Usage (by the
launcher only): ``python -m polydist.launch.worker SCRIPT [ARGS...]`` or ``python -m
polydist.launch.worker -m MODULE [ARGS...]``.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback

from torch.distributed.elastic.multiprocessing.errors import record

from .. import _at_exit, ft
from ..backends.mpi4py import job as mpi_job, ulfm
from ..backends.watchdog import WATCHDOG
from .environment import detect
from .. import settings
from .process_setup import (
    die_with_parent, interrupted, mark_done, pids, prefix_output, record_pid, worker_errors, worker_setup,
)
from ..trace.dump import (
    LEAVING, dump_trace, ignore_exit_notices, install_signal_handlers, mark_finished, peers_dump,
)



@record
def main() -> None:
    argv = sys.argv[1:]
    _at_exit.no_teardown()  # first: its handler runs after the program's
    install_signal_handlers()  # a dump on SIGUSR1 even before the script joins the job
    if settings.FAULT_TOLERANT.read() and settings.FT_COMMAND.read():  # polydist run --fault-tolerant under mpiexec
        _run_fault_tolerant_mpi(argv)
        return
    if settings.FAILURE_DIR.read():  # started by polydist run under mpiexec
        die_with_parent()  # the parent is mpiexec's proxy, which ends the ranks itself when it can
        worker_setup()
        _run_under_mpi(argv)
        return
    die_with_parent(settings.LAUNCHER_PID.read())  # polydist run: the parent every worker must outlive
    worker_setup()
    try:
        with worker_errors():
            try:
                _run(argv)
            except SystemExit as exc:
                if exc.code not in (0, None):
                    raise
            mark_finished()  # if another rank fails waiting for this one, its report says this one had finished
            ft.stop()  # --fault-tolerant: how this replica group ended, for the launcher's report
    except KeyboardInterrupt as exc:  # Ctrl-C: one line (its dump is written), not the frames of three layers
        print(interrupted(exc), file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    finally:
        # torch's excepthook prefixes tracebacks with "[rankN]"; the launcher already
        # prefixes every line, so keep Python's own hook and print them once.
        sys.excepthook = sys.__excepthook__


def _run_under_mpi(argv: list) -> None:
    """Run the script as an MPI rank: prefixed output, and any failure aborts the whole job.

    mpiexec merges the ranks' output, so each rank prefixes its own lines
    (Python-level writes). An uncaught exception or a non-zero ``sys.exit``
    calls ``MPI_Abort`` — otherwise the other ranks would wait forever in
    their next collective.
    """
    rank = detect().rank
    record_pid(rank)  # lets polydist run name this rank if it is killed (no traceback then)
    if settings.PREFIX_OUTPUT.read():
        prefix_output(f"[rank{rank}]: ")
    sys.excepthook = sys.__excepthook__
    mpi_job.install_abort_hook()
    mpi_job.before_abort.append(lambda exc: _ask_peers(rank))
    try:
        _run(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            print(f"polydist: rank {rank} exited with code {exc.code}; aborting the MPI job", file=sys.stderr)
            # the traceback shows where sys.exit was called
            mpi_job.fail(rank, exc, traceback.format_exc(), exc.code if isinstance(exc.code, int) else 1)
        _finishing(rank)
        raise
    _finishing(rank)


def _run_fault_tolerant_mpi(argv: list) -> None:
    """Run the script as a rank of a fault-tolerant MPI job (ULFM): its output prefixed with its replica group,
    its dumps in a folder of that replica group, and a failure that ends this rank only: no ``MPI_Abort``, and
    ``os._exit`` rather than ``MPI_Finalize`` (where the others would wait for it), so that the others see a
    process failure and go on."""
    die_with_parent()  # mpiexec's proxy
    worker_setup()
    replica = settings.FT_REPLICA.read()
    replica = detect().rank or 0 if replica is None else replica  # a first start: its COMM_WORLD rank
    if settings.PREFIX_OUTPUT.read():
        prefix_output(f"[rank{replica}]: ")
    base = settings.TRACE_DIR.read()
    if base:  # every rank is rank 0 of its own world: a folder per replica group, as under the elastic agents
        os.environ[settings.TRACE_DIR.name] = os.path.join(base, f"replica{replica}")
    sys.excepthook = sys.__excepthook__
    try:
        _run(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            _end_alone(exc)
    except BaseException as exc:  # noqa: BLE001 - whatever it is, this rank ends and the others go on
        _end_alone(exc)
    ft.stop()
    ulfm.finalize()  # with the failure detector's heartbeats until then, not after the interpreter's teardown


def _end_alone(exc: BaseException) -> None:
    traceback.print_exception(type(exc), exc, exc.__traceback__)
    # The dump without torch's symbolized stacks (seconds): until this process is gone the others wait for it
    dump_trace(reason=LEAVING, error=exc)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _ask_peers(rank: int) -> None:
    """Before ``MPI_Abort`` kills every rank: the other ranks of this node write their flight-recorder dumps."""
    folder = settings.FAILURE_DIR.read()
    if folder and os.path.isdir(folder):
        peers_dump({r: pid for r, pid in pids(folder).items() if r != rank})


def _finishing(rank: int) -> None:
    mark_done(rank)  # this rank's exit is not a failure, whenever the others end
    WATCHDOG.finished(0)  # and a rank whose watchdog waits for this one says it had finished, not that it is silent
    mark_finished()  # and polydist trace says it had finished, if the others wait for it
    ignore_exit_notices()  # Hydra's SIGUSR1s as the other ranks exit


def _run(argv: list) -> None:
    if argv[0] == "-m":
        module, rest = argv[1], argv[2:]
        sys.argv = [module, *rest]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, rest = argv[0], argv[1:]
        sys.argv = [script, *rest]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
