"""The flight recorder itself: what each call records, the ring buffer, switching it off, and dumps on request.

Multi-process parts run on the shared 2-rank worlds (gloo and MPI).
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

import polydist as pd
from polydist.collectives import recorder
from polydist.collectives.recorder import RECORDER, Recorder, as_dict

pytestmark = pytest.mark.timeout(120)


def _here() -> int:
    """The line number of the caller (where the next collective is called, one line below)."""
    return sys._getframe(1).f_lineno + 1


def _calls():
    rank, peer = pd.get_rank(), 1 - pd.get_rank()
    first = RECORDER.count
    lines = {}
    x = torch.ones(4, 2)
    lines["all_reduce"] = _here()
    pd.all_reduce(x, op="max")
    lines["all_gather"] = _here()
    pd.all_gather(f"rank {rank}")
    lines["barrier"] = _here()
    pd.barrier()
    lines["reduce"] = _here()
    pd.reduce(torch.arange(3), dst=1)
    work = pd.all_reduce(torch.ones(8, dtype=torch.float64), async_op=True)
    pending = as_dict(RECORDER.records()[0][-1])["state"]
    work.wait()
    lines["send"] = _here()
    if rank == 0:
        pd.send(torch.zeros(5, dtype=torch.int32), dst=peer)
    else:
        pd.recv(torch.zeros(5, dtype=torch.int32), src=peer)
    records, _ = RECORDER.records()
    return [as_dict(r) for r in records if r[recorder.ID] >= first], lines, pending


@pytest.mark.p2p
def test_each_call_is_recorded_with_its_caller_and_arguments(world2):
    for rank, (entries, lines, pending) in enumerate(world2.run(_calls)):
        names = [e["collective"] for e in entries]
        assert names == ["all_reduce", "all_gather", "barrier", "reduce", "all_reduce", "send" if rank == 0 else "recv"]
        seqs = [e["seq"] for e in entries[:5]]
        assert seqs == list(range(seqs[0], seqs[0] + 5)) and entries[5]["seq"] is None
        ar, ag, bar, red, async_ar, p2p = entries
        assert (ar["op"], ar["dtypes"], ar["shapes"], ar["bytes"], ar["value"]) == ("MAX", ["float32"], [[4, 2]], 32, False)
        assert (ag["value"], ag["dtypes"], ag["bytes"]) == (True, [], 0)
        assert (bar["value"], bar["shapes"]) == (False, [])
        assert (red["root"], red["op"], red["dtypes"]) == (1, "SUM", ["int64"])
        assert async_ar["async"] and pending == "started" and async_ar["state"] == "completed"
        assert (p2p["root"], p2p["dtypes"], p2p["shapes"]) == (1 - rank, ["int32"], [[5]])
        for e in entries:
            assert e["group"] == [0, 1] and e["state"] == "completed" and e["end"] >= e["start"]
            assert e["file"] == __file__ and e["function"] == "_calls"
        for e in (ar, ag, bar, red):
            assert e["line"] == lines[e["collective"]]
        assert p2p["line"] in (lines["send"] + 1, lines["send"] + 3)


def _off():
    before = RECORDER.count
    pd.set_trace(False)
    try:
        pd.all_reduce(torch.ones(2))
        pd.send(torch.ones(1), dst=1) if pd.get_rank() == 0 else pd.recv(torch.ones(1), src=0)
    finally:
        pd.set_trace(True)
    during = RECORDER.count
    pd.all_reduce(torch.ones(2))
    return during - before, RECORDER.count - during


@pytest.mark.p2p
def test_set_trace_off_records_nothing(world2):
    assert world2.run(_off) == [(0, 1), (0, 1)]


def _mismatch():
    with pd.set_debug(True):
        try:
            pd.all_reduce(torch.ones(4 if pd.get_rank() == 0 else 2))
        except pd.CollectiveMismatchError:
            pass
    return as_dict(RECORDER.records()[0][-1])


def test_a_failed_call_is_recorded_as_failed_with_its_error(world2):
    for entry in world2.run(_mismatch):
        assert entry["collective"] == "all_reduce" and entry["state"] == "failed"
        assert entry["error"].startswith("CollectiveMismatchError: ranks of group [0, 1] called different collectives")


def _dump(folder):
    pd.all_reduce(torch.ones(3))
    path = pd.dump_trace(folder)
    with open(path) as f:
        return path, json.load(f)


def test_dump_on_request(world2, tmp_path):
    for rank, (path, dump) in enumerate(world2.run(_dump, str(tmp_path))):
        assert path == os.path.join(str(tmp_path), f"rank{rank}.json")
        assert (dump["format"], dump["version"], dump["rank"], dump["world_size"]) == ("polydist-trace", 1, rank, 2)
        assert dump["reason"] == "request" and dump["error"] is None and dump["enabled"]
        last = dump["entries"][-1]
        assert (last["collective"], last["shapes"], last["function"]) == ("all_reduce", [[3]], "_dump")
        [main] = [s for s in dump["stacks"] if s["main"]]
        assert main["frames"][-1]["function"] == "_dump"  # the caller, not the dump's own frames
        assert not any(s["thread"] == "polydist-trace-signals" for s in dump["stacks"])


class _Group:
    ranks = (0, 1, 2)


def test_ring_keeps_the_last_entries_and_counts_the_dropped():
    ring = Recorder(True, 3)
    for i in range(5):
        ring.end(ring.start(_Group(), "barrier", i + 1, None, None, (), False))
    records, dropped = ring.records()
    assert dropped == 2 and [r[recorder.ID] for r in records] == [2, 3, 4]
    assert [as_dict(r)["seq"] for r in records] == [3, 4, 5]


def test_fail_keeps_the_first_outcome():
    ring = Recorder(True, 4)
    record = ring.start(_Group(), "all_reduce", 1, "SUM", None, torch.ones(2), False)
    ring.fail(record, RuntimeError("Timed out waiting 5000ms"))
    ring.fail(record, ValueError("later"))
    entry = as_dict(record)
    assert entry["state"] == "failed" and entry["error"] == "RuntimeError: Timed out waiting 5000ms"


def test_bad_buffer_size_falls_back_to_the_default(monkeypatch, capsys):
    monkeypatch.setenv("POLYDIST_TRACE_BUFFER", "0")
    ring = recorder._from_env()
    assert ring.size == 2000 and ring.on
    assert "POLYDIST_TRACE_BUFFER" in capsys.readouterr().err
    monkeypatch.setenv("POLYDIST_TRACE_BUFFER", "7")
    monkeypatch.setenv("POLYDIST_TRACE", "0")
    ring = recorder._from_env()
    assert (ring.size, ring.on) == (7, False)


def test_sigusr1_is_an_exit_notice_only_under_mpichs_hydra(monkeypatch, tmp_path):
    """Under `polydist run --backend mpi`, MPICH's Hydra sends SIGUSR1 to the survivors when a rank exits, which
    must not be taken for a dump request once a rank finished; Intel MPI's Hydra sends none (measured), so
    there a SIGUSR1 always asks for a dump. polydist.launch.mpiexec marks the job folder when notices come."""
    from polydist.trace import dump

    monkeypatch.setenv("POLYDIST_FAILURE_DIR", str(tmp_path))
    (tmp_path / "rank2.done").touch()  # a rank finished its script
    assert not dump._hydra_notice()  # no marker: Intel MPI, Open MPI
    (tmp_path / dump.EXIT_NOTICES).touch()
    assert dump._hydra_notice()  # MPICH's Hydra: a notice, not a request
    (tmp_path / "dumps-requested").touch()
    assert not dump._hydra_notice()  # polydist asked for the dumps itself


def test_the_line_is_found_from_the_instruction_when_a_record_is_read():
    """Records keep the caller's instruction offset (f_lasti) and as_dict finds its line: f_lineno would scan the
    code's line table on every call, which costs tens of microseconds near the end of a long function."""
    body = "".join(f"    x{i} = {i}\n" for i in range(2000))
    source = f"def long(ring, tag):\n{body}    return _pipeline(ring, tag), _line()\n"

    def pipeline(ring: Recorder, tag: _Group) -> list:  # Recorder.start's caller is three frames up, as in
        return (lambda: ring.start(tag, "barrier", 1, None, None, (), False))()  # public function -> run -> start

    namespace = {"_line": lambda: sys._getframe(1).f_lineno, "_pipeline": pipeline}
    exec(compile(source, "<long>", "exec"), namespace)  # noqa: S102 - the test's own source
    ring = Recorder(True, 4)
    record, line = namespace["long"](ring, _Group())
    entry = as_dict(record)
    assert (entry["file"], entry["function"], entry["line"]) == ("<long>", "long", line) and line == 2002

    frame = sys._getframe(0)
    assert recorder.line_of(frame.f_code, frame.f_lasti) == frame.f_lineno
    assert recorder.line_of(frame.f_code, -1) == frame.f_code.co_firstlineno  # a frame not started yet


def test_the_callers_library_test_is_learnt_once_per_code_object():
    """The walk to a group operation's caller classifies each code object once, keyed by its id (hashing a code
    object hashes its constants every time); the codes are held, so an id is never reused while it is a key."""
    recorder._IN_LIBRARIES.clear()
    recorder._HELD.clear()
    mine = test_the_callers_library_test_is_learnt_once_per_code_object.__code__
    assert recorder._in_libraries(recorder.as_dict.__code__) is True
    assert recorder._in_libraries(torch.nn.Module.__call__.__code__) is True
    assert recorder._in_libraries(mine) is False
    assert recorder._IN_LIBRARIES[id(mine)] is False and mine in recorder._HELD
