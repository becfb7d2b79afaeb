"""``polydist trace --chrome``: every rank's calls of hand-written dumps (:mod:`_dumps`) on one timeline."""

from __future__ import annotations

import json

import pytest
from _dumps import T, USER, call, dump, run_cli, skipped_dumps, write

from polydist.trace import analyze, chrome


def test_chrome_trace_puts_every_rank_on_one_timeline(tmp_path, capsys):
    skipped = write(tmp_path, *skipped_dumps())
    out_path = tmp_path / "timeline.json"
    code, _, err = run_cli(capsys, skipped, "--chrome", str(out_path))
    assert code == 1
    assert err == f"polydist trace: wrote 23 events to {out_path} (open it in ui.perfetto.dev or chrome://tracing)\n"
    trace = json.loads(out_path.read_text())  # strict JSON: no NaN
    assert trace["displayTimeUnit"] == "ms" and trace["otherData"]["t0"] == T
    events = trace["traceEvents"]
    assert all({"ph", "pid", "tid", "name"} <= set(e) for e in events) and all(e["pid"] > 0 for e in events)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {r + 1: f"rank {r} (node1)" for r in range(4)}  # pid 0 is the idle process to Perfetto
    threads = {(e["pid"], e["tid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert threads == {(r + 1, (r + 1) * 10000 + 1, "group [0,1,2,3]") for r in range(4)}
    for rank, count in ((0, 5), (1, 5), (2, 4), (3, 5)):
        mine = [e for e in events if e["pid"] == rank + 1 and e["ph"] != "M"]
        assert [e["ts"] for e in mine] == sorted(e["ts"] for e in mine)  # in time order
        assert sum(e["ph"] == "X" for e in mine) == count and sum(e["ph"] == "i" for e in mine) == 1
    calls = [e for e in events if e["ph"] == "X"]
    assert min(e["ts"] for e in calls) == 0.0 and all(e["dur"] >= 0 for e in calls)
    first = next(e for e in calls if e["pid"] == 1)
    assert (first["name"], first["ts"], first["dur"], first["cat"]) == ("all_reduce #1", 0.0, 500000.0, "collective")
    assert first["args"]["site"] == f"{USER}:88" and first["args"]["op"] == "SUM" and "cname" not in first
    assert first["args"]["shapes"] == [[4]] and first["args"]["dtypes"] == ["float32"] and first["args"]["bytes"] == 16
    open_calls = [e for e in calls if e["args"]["state"] == "started"]
    assert [(e["pid"], e["name"], e["cname"]) for e in open_calls] == [(p, "all_reduce #5", "bad") for p in (1, 2, 4)]
    assert all(e["ts"] == 10e6 and e["dur"] == pytest.approx(12.3e6) for e in open_calls)  # ends at the dump
    moments = {e["args"]["rank"]: e for e in events if e["ph"] == "i"}
    assert (moments[2]["name"], moments[2]["s"], moments[2]["pid"]) == ("dump (signal)", "p", 3)
    assert moments[2]["ts"] == pytest.approx(6.7e6)


def test_chrome_trace_lanes_for_overlapping_calls_and_colours_for_failed_ones(tmp_path):
    pair = (0, 1)
    entries = [call(0, "all_reduce", pair, 1, 0.0, 3.0, op="SUM", is_async=True),
               call(1, "all_reduce", pair, 2, 1.0, 2.0, op="SUM"),  # overlaps #1: a second lane
               call(2, "send", pair, None, 4.0, 5.0, root=1),
               call(3, "barrier", pair, 3, 6.0, 7.0, state="failed", error="RuntimeError: x")]  # fmt: skip
    trace = chrome.chrome_trace(analyze.load(write(tmp_path, dump(0, 2, entries, 8.0))))
    threads = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {10001: "group [0,1]", 10002: "group [0,1] (2)"}
    lanes = {e["name"]: (e["tid"], e.get("cname"), e["cat"]) for e in trace["traceEvents"] if e["ph"] == "X"}
    assert lanes == {
        "all_reduce #1": (10001, None, "collective"), "all_reduce #2": (10002, None, "collective"),
        "send to rank 1": (10001, None, "p2p"), "barrier #3": (10001, "terrible", "collective"),
    }  # fmt: skip


def test_chrome_trace_shows_torchs_own_operations_once(tmp_path):
    """A program's own torch.distributed calls (DDP's all-reduces) are on the timeline from torch's recorder; the
    operation a polydist call made shows once, as the polydist call."""
    from _dumps import T as T0

    def op(i, seq, at):
        return {"record_id": i, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
                "p2p_seq_id": 0, "is_p2p": False, "profiling_name": "gloo:all_reduce", "input_sizes": [[4]],
                "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"], "state": "completed",
                "retired": True, "timeout_ms": 30000, "time_created_ns": int((T0 + at) * 1e9),
                "time_discovered_started_ns": None, "time_discovered_completed_ns": int((T0 + at + 0.1) * 1e9),
                "recorder": "_dump_fr_trace", "frames": []}  # fmt: skip

    mine = [call(0, "all_reduce", (0, 1), 1, 2.0, 3.0, op="SUM")]  # polydist's: made torch's op #3 at 2.5
    d = dump(0, 2, mine, 8.0)
    d["torch"] = {"buffer": 2000, "groups": {"0": [0, 1]}, "entries": [op(0, 1, 0.0), op(1, 2, 1.0), op(2, 3, 2.5)]}
    trace = chrome.chrome_trace(analyze.load(write(tmp_path, d)))
    calls = sorted((e["ts"], e["name"], e["args"]["source"]) for e in trace["traceEvents"] if e["ph"] == "X")
    assert [(name, source) for _, name, source in calls] == [
        ("gloo:all_reduce #1", "torch"), ("gloo:all_reduce #2", "torch"), ("all_reduce #1", "polydist")]
