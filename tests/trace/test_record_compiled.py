"""The flight recorder's per-call path in C (``polydist.collectives._record``) makes the records Python makes.

Each behaviour is checked on every implementation this machine has: the Python functions
(``recorder._record_op``, ``lane._run_recorded``), and the compiled ones, with the caller found by reading the
interpreter's frames (CPython 3.11) and through the public frame API. One process, no communication.
"""

from __future__ import annotations

import gc
import platform
import shutil
import sys
import sysconfig

import pytest
import torch

from polydist.backends import lane as lanes
from polydist.backends.lane import Lane
from polydist.collectives import recorder
from polydist.collectives.recorder import Recorder, as_dict

pytestmark = pytest.mark.timeout(60)

COMPILED = recorder.COMPILED


class _Tag:
    ranks = (0, 3)


def _implementations() -> list:
    found = [pytest.param(("python", None), id="python")]
    walks = {"internal": False, "public": True} if COMPILED is not None and COMPILED.INTERNAL_WALK else {"public": True}
    found += [pytest.param(("compiled", public), id=f"compiled-{name}-walk") for name, public in walks.items()]
    return found


@pytest.fixture(params=_implementations())
def impl(request):
    """``(record_op, run_recorded)`` of one implementation."""
    kind, public = request.param
    if kind == "python":
        yield recorder._record_op, lanes._run_recorded
        return
    if COMPILED is None:
        pytest.skip("polydist.collectives._record was not built here")
    was = COMPILED.use_public_walk(public)
    try:
        yield COMPILED.record_op, COMPILED.run_recorded
    finally:
        COMPILED.use_public_walk(was)


def test_the_compiled_path_is_built_where_a_c_compiler_is():
    """setup.py builds it wherever it can (a failed build is optional): here, where a compiler is, a missing or
    stale module means the build broke, and polydist would run the slower Python path without saying why."""
    if platform.python_implementation() != "CPython" or sys.version_info < (3, 11):
        pytest.skip("setup.py builds the module on CPython 3.11 and later only")
    if shutil.which(sysconfig.get_config_var("CC").split()[0]) is None:
        pytest.skip("no C compiler here: polydist runs the Python path")
    assert COMPILED is not None, "polydist.collectives._record is missing or stale: run pip install -e ."
    assert recorder.record_op is COMPILED.record_op and lanes.run_recorded is COMPILED.run_recorded


def _library_frames():
    """``outer(fn, *args)``: ``fn(*args)`` called through two frames whose file is polydist's, as a group method is."""
    scope: dict = {}
    source = "def outer(fn, *args):\n    return inner(fn, args)\ndef inner(fn, args):\n    return fn(*args)\n"
    exec(compile(source, recorder._PACKAGE + "backends/_test_frames.py", "exec"), scope)  # noqa: S102
    return scope["outer"]


def test_a_record_holds_the_call_and_its_caller_outside_polydist_and_torch(impl):
    record_op, _ = impl
    ring, t, outer = Recorder(True, 4), torch.ones(2, 3, dtype=torch.float16), _library_frames()
    line = sys._getframe(0).f_lineno + 1
    record = outer(record_op, ring, _Tag(), "all_reduce", 7, "SUM", 3, t, True, True)
    entry = as_dict(record)
    here = sys._getframe(0).f_code
    assert (entry["file"], entry["function"], entry["line"]) == (here.co_filename, here.co_name, line)
    assert entry["collective"] == "all_reduce" and entry["seq"] == 7 and entry["op"] == "SUM" and entry["root"] == 3
    assert entry["group"] == [0, 3] and entry["dtypes"] == ["float16"] and entry["shapes"] == [[2, 3]]
    assert entry["bytes"] == 12 and entry["async"] is True and entry["state"] == "started" and entry["end"] is None
    assert ring.records()[0] == [record] and ring.count == 1 and record[recorder.ID] == 0


@pytest.mark.parametrize(
    "x, dtypes, shapes",
    [
        ([torch.ones(2), torch.zeros(3, dtype=torch.int64)], ["float32", "int64"], [[2], [3]]),
        (torch.nn.Parameter(torch.ones(4)), ["float32"], [[4]]),  # a Tensor subclass: the general form
        (torch.ones([1] * 9), ["float32"], [[1] * 9]),  # more sizes than a compiled record holds itself
        ((), [], []),  # barrier: no tensor
        ("a value", [], []),  # polydist's values: no tensor
    ],
)
def test_other_arguments_are_described_alike(impl, x, dtypes, shapes):
    record_op, _ = impl
    entry = as_dict(record_op(Recorder(True, 2), _Tag(), "all_gather", 1, None, None, x, False, True))
    assert (entry["dtypes"], entry["shapes"]) == (dtypes, shapes)
    assert entry["value"] is (not isinstance(x, (torch.Tensor, list, tuple)))


def test_the_ring_wraps_and_a_watchdog_only_record_stays_out_of_it(impl):
    record_op, _ = impl
    ring = Recorder(True, 3)
    made = [record_op(ring, _Tag(), "barrier", i, None, None, (), False, True) for i in range(5)]
    records, dropped = ring.records()
    assert records == made[2:] and dropped == 2 and [r[recorder.ID] for r in records] == [2, 3, 4]
    alone = record_op(ring, _Tag(), "barrier", 9, None, None, (), False, False)  # POLYDIST_TRACE=0: for the watchdog
    assert alone[recorder.ID] == -1 and ring.count == 5 and ring.records()[0] == made[2:]


def test_run_recorded_shows_the_running_operation_to_the_watchdog_and_completes_it(impl):
    _, run_recorded = impl
    ring, lane, seen = Recorder(True, 4), Lane("mpi"), []
    ring.keep = []  # the comms profile's feed

    def transport(a, b):
        seen.append((a, b, lane.current, lane.since))

    run_recorded(ring, lane, _Tag(), "all_reduce", 5, "SUM", torch.ones(2), True, transport, "in place", 8)
    [record] = ring.records()[0]
    [(a, b, current, since)] = seen
    assert (a, b) == ("in place", 8) and current is record and since == record[recorder.START]
    assert lane.current is None and ring.keep == [record]
    entry = as_dict(record)
    assert entry["state"] == "completed" and entry["end"] >= entry["start"] and entry["async"] is False
    assert entry["root"] is None and entry["seq"] == 5 and entry["file"] == __file__


def test_run_recorded_fails_the_record_and_raises_the_transports_error(impl):
    _, run_recorded = impl
    ring, lane, error = Recorder(True, 4), Lane("mpi"), RuntimeError("MPI_ERR_TRUNCATE: message truncated")

    def transport():
        raise error

    with pytest.raises(RuntimeError) as raised:
        run_recorded(ring, lane, _Tag(), "all_reduce", 1, "SUM", torch.ones(2), True, transport)
    assert raised.value is error and raised.traceback[-1].name == "transport"
    entry = as_dict(ring.records()[0][0])
    assert entry["state"] == "failed" and entry["error"] == "RuntimeError: MPI_ERR_TRUNCATE: message truncated"
    assert lane.current is None


def test_a_record_the_watchdog_failed_meanwhile_stays_failed(impl):
    _, run_recorded = impl
    ring, lane = Recorder(True, 4), Lane("mpi")

    def transport():  # the watchdog's thread fails the running operation while MPI blocks
        ring.fail(lane.current, TimeoutError("all_reduce #1 timed out"))

    run_recorded(ring, lane, _Tag(), "all_reduce", 1, "SUM", torch.ones(2), True, transport)
    entry = as_dict(ring.records()[0][0])
    assert entry["state"] == "failed" and entry["error"] == "TimeoutError: all_reduce #1 timed out"


@pytest.mark.skipif(COMPILED is None, reason="polydist.collectives._record was not built here")
def test_the_compiled_path_refuses_objects_it_cannot_read():
    """It reads the recorder's and the lane's fields at their offsets, so it checks their exact types first."""
    class Other:
        pass

    with pytest.raises(TypeError, match="expected a Recorder, got Other"):
        COMPILED.record_op(Other(), _Tag(), "barrier", 1, None, None, (), False, True)
    with pytest.raises(TypeError, match="expected a Lane, got Other"):
        COMPILED.run_recorded(Recorder(True, 2), Other(), _Tag(), "barrier", 1, None, (), True, print)
    with pytest.raises(TypeError, match="run_recorded\\(\\) takes"):
        COMPILED.run_recorded(Recorder(True, 2))


@pytest.mark.skipif(COMPILED is None, reason="polydist.collectives._record was not built here")
def test_compiled_records_are_left_out_of_the_cycle_collector():
    """Nothing a record holds refers back to it; the collector would otherwise walk the whole ring at every
    full collection."""
    record = COMPILED.record_op(Recorder(True, 2), _Tag(), "barrier", 1, None, None, (), False, True)
    assert not gc.is_tracked(record)
    record[recorder.ERROR] = "RuntimeError: later"  # filled in place as the Python records are
    assert as_dict(record)["error"] == "RuntimeError: later"


@pytest.mark.skipif(COMPILED is None, reason="polydist.collectives._record was not built here")
def test_a_build_older_than_its_source_is_not_used(monkeypatch, capsys):
    """A source checkout whose _record.c changed after the build runs the Python path, and says so."""
    monkeypatch.setattr(COMPILED, "SOURCE", "0" * 64)
    assert recorder._compiled() is None
    assert "was built from another version of" in capsys.readouterr().err
    monkeypatch.undo()
    assert recorder._compiled() is COMPILED
