"""torch's records on gloo, settled across a rank's dumps (polydist.trace.settle, .history): a SIGKILLed or frozen
peer leaves the other rank's failed operation named, with its sequence number and place, and a later dump never
erases what an earlier one showed. Hand-written dumps, as gloo's recorder writes them: an operation that returned is
"retired", completed or failed alike, with no completion time; a signal's dump has no frames.
"""

from __future__ import annotations

import json

import pytest

from _dumps import IN_WAIT, T, USER, dump, frames, stack, write
from polydist import _torch
from polydist.trace import history, torch_records
from polydist.trace import dump as trace_dump
from polydist.trace.analyze import diagnose, load

RESET = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
         "[127.0.0.1]:61646: Connection reset by peer. This is typically caused by a remote worker hanging")  # fmt: skip
# The traceback of gloo's error in the user's all_reduce at train.py:20, outermost first.
IN_ALL_REDUCE = frames(("/venv/lib/python3.11/site-packages/polydist/launch/worker.py", 48, "main"),
                       (USER, 20, "<module>"),
                       ("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 3252,
                        "all_reduce"))
# rank 0's main thread while it waits in that all_reduce (a signal's dump), and once it raised (in the handler).
WAITING = stack(("/venv/lib/python3.11/site-packages/polydist/launch/worker.py", 141, "_run"), (USER, 20, "<module>"),
                ("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 3252, "all_reduce"))
HANDLING = stack(("/venv/lib/python3.11/site-packages/polydist/launch/worker.py", 46, "main"),
                 ("/venv/lib/python3.11/site-packages/polydist/launch/process_setup.py", 123, "worker_errors"))


def _op(i, seq, *, at, retired=True, framed=False):
    """torch's entry of gloo:all_reduce #seq on the world, created at T+at (as the dump keeps it)."""
    return {"record_id": i, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
            "p2p_seq_id": 0, "is_p2p": False, "profiling_name": "gloo:all_reduce", "input_sizes": [[4]],
            "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"], "state": "scheduled",
            "retired": retired, "timeout_ms": 30000, "time_created_ns": int((T + at) * 1e9),
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "recorder": "_dump_fr_trace",
            "frames": [{"name": "<module>", "filename": USER, "line": 20}] if framed else []}  # fmt: skip


def _ops(n, last_retired=True):
    """all_reduce #1..#n, one a second from t=0; the last one retired or not."""
    return [_op(k, k + 1, at=k, retired=last_retired or k < n - 1) for k in range(n)]


def _rank0(at, ops, *, reason, error=None, stacks=(), error_frames=None, earlier=()):
    d = dump(0, 2, [], at, reason=reason, error=error, stacks=stacks, error_frames=error_frames)
    d["torch"] = {"buffer": 2000, "groups": {"0": [0, 1]}, "entries": ops}
    d["earlier"] = list(earlier)
    return d


def _earlier(reason, at, *, error=None, stack_=None, waiting=()):
    return {"reason": reason, "time": T + at, "error": error, "stack": (stack_ or HANDLING)["frames"],
            "torch_waiting": [[op["record_id"], op["time_created_ns"]] for op in waiting]}


def _finding(tmp_path, *dumps):
    found = diagnose(load(write(tmp_path, *dumps)))
    lines = found.text().splitlines()
    return found, next((t for t in lines if t.startswith("gloo:")), lines[-1])


def test_a_killed_peer_the_other_rank_failed_in_its_last_operation_where_it_raised(tmp_path):
    """SIGKILL: rank 1 wrote nothing; rank 0 lost it in #6, raised gloo's error, then the launcher's SIGTERM dumped
    it again (no frames). Its last operation reads retired like the completed ones."""
    ops = _ops(6)
    d = _rank0(6.5, ops, reason="terminate", error=RESET, stacks=[HANDLING], error_frames=IN_ALL_REDUCE,
               earlier=[_earlier("exception", 5.2, error=RESET)])  # fmt: skip
    found, line = _finding(tmp_path, d)
    assert found.missing == [1]
    [stuck] = found.stuck
    [waiter] = stuck.waiting
    assert (stuck.seq, waiter.rank, waiter.call.state, waiter.call.line) == (6, 0, "failed", 20)
    assert waiter.seconds == pytest.approx(0.2)  # to the first dump with the error, not to the SIGTERM's
    assert line == ("gloo:all_reduce #6 on [0,1]: rank 0 failed after 0.2 s at train.py:20 (RuntimeError: Read error "
                    "[127.0.0.1]:61646: Connection reset by peer); no dump from rank 1")  # fmt: skip
    assert "rank 0 (node1, pid 100): exception, then terminate — RuntimeError: Read error" in found.text()


def test_a_timeout_on_a_frozen_peer_reads_timed_out_at_its_timeout(tmp_path):
    timeout = "RuntimeError: [/__w/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out " \
              "waiting 30000ms for recv operation to complete"  # fmt: skip
    d = _rank0(40, _ops(6), reason="exception", error=timeout, stacks=[HANDLING], error_frames=IN_ALL_REDUCE)
    found, line = _finding(tmp_path, d)
    assert line == "gloo:all_reduce #6 on [0,1]: rank 0 waited 30.0 s and timed out at train.py:20; no dump from rank 1"


def test_a_signal_dump_that_showed_the_wait_is_not_erased_by_the_later_dumps(tmp_path):
    """A frozen peer: the launcher's SIGUSR1 showed rank 0 waiting in #6; the peer killed, rank 0 raised and was
    stopped. The last dump keeps the first one's record (earlier), and the wait reads from there."""
    waiting = _ops(6, last_retired=False)
    d = _rank0(18, _ops(6), reason="terminate", error=RESET, stacks=[HANDLING], error_frames=IN_ALL_REDUCE,
               earlier=[_earlier("signal", 15.0, stack_=WAITING, waiting=waiting[-1:]),
                        _earlier("exception", 15.3, error=RESET)])  # fmt: skip
    found, line = _finding(tmp_path, d)
    assert line.startswith("gloo:all_reduce #6 on [0,1]: rank 0 failed after 10.3 s at train.py:20 (RuntimeError: ")
    assert line.endswith("; no dump from rank 1")
    assert found.dumps[0].reasons == ("signal", "exception", "terminate")
    assert found.as_dict()["ranks"][0]["reasons"] == ["signal", "exception", "terminate"]


def test_an_operation_seen_waiting_stays_waiting_until_a_record_shows_it_completed(tmp_path):
    """Without an error, a later retirement is no proof of completion (gloo's recorder retires failures too);
    an operation the rank started after the earlier dump is."""
    shown = _earlier("signal", 12, stack_=WAITING, waiting=_ops(6, last_retired=False)[-1:])
    stopped = _rank0(14, _ops(6), reason="terminate", stacks=[IN_WAIT], earlier=[shown])
    found, line = _finding(tmp_path, stopped)
    assert line == "gloo:all_reduce #6 on [0,1]: rank 0 waiting since 9.0 s at train.py:20; no dump from rank 1"
    went_on = _rank0(14, _ops(6) + [_op(6, 7, at=13)], reason="terminate", stacks=[IN_WAIT], earlier=[shown])
    found, _ = _finding(tmp_path, went_on)
    assert not [s for s in found.stuck if s.seq == 6]
    assert found.dumps[0].torch_calls[5].state == "completed"


def test_a_waiting_operation_without_frames_is_placed_at_the_main_threads_user_code(tmp_path):
    """A SIGUSR1 dump has no frames for torch's operations: the main thread waits in the call, its user frame says
    where; the other rank's stack says where it is instead."""
    rank0 = _rank0(30, _ops(6, last_retired=False), reason="signal", stacks=[WAITING])
    rank1 = dump(1, 2, [], 30, reason="signal", stacks=[stack((USER, 17, "<module>"))])
    rank1["torch"] = {"buffer": 2000, "groups": {"0": [0, 1]}, "entries": _ops(5)}
    _, line = _finding(tmp_path, rank0, rank1)
    assert line == ("gloo:all_reduce #6 on [0,1]: rank 0 waiting since 25.0 s at train.py:20; rank 1 never called "
                    "it — it is running user code at train.py:17 (in function <module>), last collective: "
                    "gloo:all_reduce #5 completed")  # fmt: skip


def test_the_programs_own_error_fails_no_operation(tmp_path):
    """An error that is not the backend's (raised in the program after its last collective) says nothing of it."""
    error_frames = frames((USER, 30, "<module>"))
    d = _rank0(9, _ops(6), reason="exception", error="ValueError: bad batch", error_frames=error_frames)
    found, _ = _finding(tmp_path, d)
    assert found.stuck == [] and all(c.state == "completed" for c in found.dumps[0].torch_calls)


@pytest.mark.parametrize("bad", ["x", [{"reason": "signal"}], [{"reason": "signal", "time": 1, "torch_waiting": [[1]]}],
                                 [{"reason": "signal", "time": 1, "stack": ["f"]}], [{}] * 65])
def test_a_hostile_earlier_makes_the_dump_unreadable(tmp_path, bad):
    d = _rank0(9, _ops(2), reason="signal")
    d["earlier"] = bad
    dumps = load(write(tmp_path, d))
    assert not dumps.ranks and "earlier" in dumps.problems[0].message, dumps.problems


# ---------------------------------------------------------------- the writer


def _data(reason, at, ops, error=None, main=WAITING):
    return {"reason": reason, "time": T + at, "error": error, "stacks": [main],
            "torch": {"buffer": 2000, "groups": {"0": [0, 1]}, "entries": ops}}


def test_a_later_dump_carries_what_the_earlier_ones_of_the_process_showed(tmp_path):
    target = str(tmp_path / "rank0.json")
    first = _data("exception", 1, [_op(0, 1, at=0, framed=True), _op(1, 2, at=0.5, retired=False, framed=True)])
    history.keep(target, first)
    second = _data("terminate", 2, [_op(0, 1, at=0), _op(1, 2, at=0.5)], error=RESET, main=HANDLING)
    history.keep(target, second)
    assert first["earlier"] == []
    [earlier] = second["earlier"]
    assert (earlier["reason"], earlier["time"], earlier["error"]) == ("exception", T + 1, None)
    assert earlier["stack"] == WAITING["frames"] and earlier["torch_waiting"] == [[1, int((T + 0.5) * 1e9)]]
    assert all(e["frames"] == [{"name": "<module>", "filename": USER, "line": 20}]
               for e in second["torch"]["entries"])  # symbolized by the first dump, kept  # fmt: skip
    for k in range(history.KEEP + 3):
        history.keep(target, _data("signal", 3 + k, []))
    assert len(history._earlier[next(key for key in history._earlier if key[1] == target)]) == history.KEEP
    other = _data("signal", 9, [])
    history.keep(str(tmp_path / "elsewhere.json"), other)
    assert other["earlier"] == []  # each file its own history


def test_dumps_of_this_process_are_read_with_their_history(tmp_path, monkeypatch):
    from polydist.collectives.recorder import RECORDER

    # an empty ring: calls of the earlier tests' worlds in this process would not be groups of this serial one
    monkeypatch.setattr(RECORDER, "slots", [None] * RECORDER.size)
    monkeypatch.setattr(RECORDER, "count", 0)
    trace_dump.dump_trace(str(tmp_path), reason="signal")
    path = trace_dump.dump_trace(str(tmp_path), reason="terminate")
    with open(path) as f:
        raw = json.load(f)
    assert [e["reason"] for e in raw["earlier"]][-1] == "signal"
    dumps = load(str(tmp_path))
    assert not dumps.problems and list(dumps.ranks.values())[0].reasons[-2:] == ("signal", "terminate")


def test_an_error_dump_waits_for_torch_to_mark_a_just_returned_operation(monkeypatch):
    """gloo's recorder marks an operation returned a few ms after its wait() returned."""
    states = iter([False, False, True])
    monkeypatch.setattr(_torch, "fr_available", lambda: True)
    state = {"retired": False}

    def fr_dumps(stacks=True):
        if not stacks:
            state["retired"] = next(states, True)
        return [{"recorder": "_dump_fr_trace", "entries": [{**_op(0, 1, at=0), "retired": state["retired"]}]}]

    monkeypatch.setattr(_torch, "fr_dumps", fr_dumps)
    monkeypatch.setattr(_torch, "group_ranks_by_name", lambda: {"0": [0]})
    assert torch_records.torch_records(stacks=True)["entries"][0]["retired"] is True
    state["retired"], states = False, iter([False] * 1000)
    assert torch_records.torch_records(stacks=False)["entries"][0]["retired"] is False  # a signal's: no wait
