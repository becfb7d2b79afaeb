"""polydist._wiring: the hooks the layers run for each other are filled in one place, once, in a known order;
the failure path of a collective (collectives.timeouts.failed) runs them for a named timeout only."""

import os
import subprocess
import sys
import textwrap

import pytest

import polydist  # noqa: F401 - wires the hooks
from polydist import _wiring, context, ft, live_world
from polydist.backends import leaving
from polydist.backends.mpi4py import job as mpi_job
from polydist.collectives import debug, timeout_error, timeouts
from polydist.errors import CollectiveTimeoutError
from polydist.launch import process_setup
from polydist.trace import dump, profile
from conftest import ROOT

pytestmark = pytest.mark.timeout(60)


def test_importing_polydist_wires_each_hook_once_in_order():
    _wiring.wire()  # a second call adds nothing
    assert live_world.on_world_made == [dump.install_signal_handlers, process_setup.dump_when_uncaught, leaving.start]
    assert (debug.announce, debug.entering, debug.leaving_exchange) == (leaving.announce, leaving.entering,
                                                                        leaving.leaving_exchange)  # fmt: skip
    assert leaving.world_leaves is _wiring._world_leaves_at_exit
    assert context.on_initialized == [profile.start_session, ft.start]
    assert live_world.on_finalize == [debug.check_leaving, profile.end_session, ft.stop,
                                      _wiring._finished_at_exit]  # the check communicates first
    assert timeout_error.on_timeout == [dump.timed_out]
    assert mpi_job.before_abort == [dump.failed]


def test_importing_a_layer_alone_fills_no_hook_list():
    # polydist/__init__.py is what wires: with it stubbed, importing the trace modules must leave the lists empty.
    code = textwrap.dedent("""
        import importlib.util, sys, types
        spec = importlib.util.find_spec("polydist")
        pkg = types.ModuleType("polydist"); pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["polydist"] = pkg
        import polydist.trace.dump, polydist.trace.profile, polydist.collectives.debug
        from polydist import context, live_world
        from polydist.collectives import timeout_error
        from polydist.backends import leaving
        from polydist.backends.mpi4py import job
        print(len(live_world.on_world_made), len(context.on_initialized), len(live_world.on_finalize),
              len(timeout_error.on_timeout), len(job.before_abort), int(leaving.world_leaves is not None))
    """)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0"] * 6


class _Recorder:
    def __init__(self):
        self.failed = []

    def fail(self, record, exc):
        self.failed.append((record, exc))


def test_failed_names_a_timeout_marks_the_record_and_runs_the_dump_hook(monkeypatch):
    seen = []
    monkeypatch.setattr(timeout_error, "on_timeout", [seen.append])
    named = CollectiveTimeoutError("all_reduce #1 timed out", collective="all_reduce", seq=1, group=(0, 1), rank=0,
                                   timeout_s=5.0, waiting=[0], missing=[1])  # fmt: skip
    rec = _Recorder()
    exc = RuntimeError("Timed out waiting 5000ms")
    assert timeouts.failed(exc, lambda e: named, (rec, "r1")) is named
    assert rec.failed == [("r1", named)] and seen == [named]
    # an error that is not a timeout passes unchanged: recorded as it is, no dump
    other = ValueError("bad input")
    assert timeouts.failed(other, lambda e: named, (rec, "r2")) is None
    assert rec.failed[-1] == ("r2", other) and seen == [named]
    assert timeouts.failed(exc, lambda e: None, None) is None and seen == [named]
