"""Hangs in programs that never call polydist's collectives (DDP, FSDP2 on gloo): torch's own flight recorder
in polydist's dumps, and ``polydist trace`` naming the stalled rank and the collective from it.

The real jobs run ``tests/trace/_gloo_hang.py`` on 2 ranks under ``polydist run --timeout 5``; the
others check, on hand-written dumps, what the reader makes of torch's records, hostile ones included.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from _dumps import IN_WAIT, T, USER, dump, stack, write
from conftest import ROOT
from polydist import _torch
from polydist.trace import dump as trace_dump
from polydist.trace.analyze import diagnose, load

JOB = os.path.join(ROOT, "tests", "trace", "_gloo_hang.py")
STALL_LINE = next(n for n, text in enumerate(open(JOB), 1) if "# STALL" in text)


def _job(mode: str, tmp_path, cli_env) -> tuple:
    trace_dir = tmp_path / "trace"
    env = {k: v for k, v in cli_env.items() if not k.startswith(("POLYDIST_", "TORCH_FR"))}
    job = subprocess.run(["polydist", "run", "--nproc-per-node", "2", "--timeout", "5", "--trace-dir", str(trace_dir),
                          JOB, mode], env=env, capture_output=True, text=True, timeout=150)  # fmt: skip
    found = subprocess.run([sys.executable, "-m", "polydist", "trace", str(trace_dir), "--json"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    return job, json.loads(found.stdout)


def _check_stalled_rank_named(job, found, collective: str) -> None:
    assert job.returncode != 0, job.stdout + job.stderr
    assert "Timed out" in job.stdout + job.stderr  # torch's gloo timeout ended it, not the test's
    [stuck] = found["stuck"]
    assert stuck["collective"] == collective and stuck["group"] == [0, 1], found["text"]
    [waiter] = stuck["waiting"]
    assert waiter["rank"] == 0 and waiter["call"]["source"] == "torch" and waiter["call"]["state"] == "failed"
    assert waiter["call"]["seq"] > 1
    [other] = stuck["others"]
    assert other["rank"] == 1 and other["relation"] == "never called", found["text"]
    assert other["site"]["line"] == STALL_LINE and other["site"]["function"] == "forward", found["text"]
    text = "\n".join(found["text"])
    assert f"{collective} #{waiter['call']['seq']} on [0,1]: rank 0 waited" in text and "rank 1 never called it" in text


@pytest.mark.heavy  # each real job takes 20-50 s on the shared 2 cores; make test has the hand-written dumps
@pytest.mark.timeout(200)
def test_ddp_step_with_a_rank_stalled_in_forward_names_it_from_torchs_records(tmp_path, cli_env):
    job, found = _job("ddp", tmp_path, cli_env)
    _check_stalled_rank_named(job, found, "gloo:all_reduce")
    # The same dumps in torch's format (torch's own records), read by torch's own analyser.
    out = tmp_path / "fr"
    exported = subprocess.run([sys.executable, "-m", "polydist", "trace", str(tmp_path / "trace"), "--fr-trace",
                               str(out)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert exported.returncode == 1 and sorted(os.listdir(out)) == ["rank_0", "rank_1"], exported.stderr  # 1: a hang
    analysed = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(out)],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    said = analysed.stdout + analysed.stderr
    stuck = found["stuck"][0]["waiting"][0]["call"]["seq"]
    assert f"Not all ranks joining collective, sequence number: {stuck}" in said, said[-3000:]
    assert "missing ranks: {1}" in said and "collective: gloo:all_reduce" in said, said[-3000:]


@pytest.mark.heavy
@pytest.mark.timeout(200)
def test_fsdp2_step_with_a_rank_stalled_in_forward_names_it_from_torchs_records(tmp_path, cli_env):
    job, found = _job("fsdp2", tmp_path, cli_env)
    _check_stalled_rank_named(job, found, "gloo:all_gather")


# ---------------------------------------------------------------- hand-written dumps


def _entry(i, seq, name="gloo:all_reduce", *, group="0", retired=True, at=0.0, line=40):
    return {"record_id": i, "pg_id": 0, "process_group": [group, "default_pg" if group == "0" else "undefined"],
            "collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": False, "profiling_name": name,
            "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"],
            "state": "scheduled", "retired": retired, "timeout_ms": 5000, "time_created_ns": int((T + at) * 1e9),
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "recorder": "_dump_fr_trace",
            "frames": [{"name": "all_reduce", "filename": "/venv/lib/python3.11/site-packages/torch/x.py", "line": 1},
                       {"name": "main", "filename": USER, "line": line}]}  # fmt: skip


def _with_torch(d, entries, groups=None, buffer=2000):
    d["torch"] = {"buffer": buffer, "groups": groups if groups is not None else {"0": [0, 1, 2]}, "entries": entries}
    return d


def _hang(tmp_path):
    """3 ranks: 0 and 2 time out in all_reduce #3 on the world; rank 1 stopped after #2, in user code."""
    error = "RuntimeError: Timed out waiting 5000ms for recv operation to complete"
    done = [_entry(0, 1, at=0), _entry(1, 2, at=1)]
    dumps = [_with_torch(dump(r, 3, [], 9, reason="exception", error=error), done + [_entry(2, 3, at=2)])
             for r in (0, 2)]  # fmt: skip
    dumps.append(_with_torch(dump(1, 3, [], 9.5, reason="terminate", stacks=[IN_WAIT]), copy.deepcopy(done)))
    return write(tmp_path, *dumps)


def test_torchs_records_name_the_ranks_that_waited_and_the_one_that_never_arrived(tmp_path):
    found = diagnose(load(_hang(tmp_path)))
    [stuck] = found.stuck
    assert (stuck.group, stuck.seq) == ((0, 1, 2), 3)
    assert [w.rank for w in stuck.waiting] == [0, 2] and all(w.call.timed_out for w in stuck.waiting)
    assert [w.seconds for w in stuck.waiting] == [5.0, 5.0]  # its timeout_ms, not the time to the dump
    [other] = stuck.others
    assert (other.rank, other.relation, other.kind, other.site.line) == (1, "never called", "user code", 95)
    assert "gloo:all_reduce #3 on [0,1,2]: ranks 0,2 waited 5.0 s and timed out at train.py:40; rank 1 never " \
           "called it — it is running user code at train.py:95" in found.text()  # fmt: skip


def test_a_dump_during_a_hang_shows_the_ranks_still_waiting(tmp_path):
    """A SIGUSR1 dump: the operation has not returned (retired false): waiting, even where no rank is behind."""
    dumps = [_with_torch(dump(r, 2, [], 30, reason="signal"), [_entry(0, 1), _entry(1, 2, retired=False, at=10)],
                         groups={"0": [0, 1]}) for r in (0, 1)]  # fmt: skip
    found = diagnose(load(write(tmp_path, *dumps)))
    [stuck] = found.stuck
    assert stuck.seq == 2 and [(w.rank, w.seconds) for w in stuck.waiting] == [(0, 20.0), (1, 20.0)]


def test_a_subgroup_is_named_by_its_global_ranks_and_unknown_groups_are_left_out(tmp_path):
    groups = {"0": [0, 1, 2], "5": [2, 0]}
    entries = [_entry(0, 1, group="5", retired=False), _entry(1, 1, group="9", retired=False)]
    dumps = [_with_torch(dump(r, 3, [], 9, reason="signal"), copy.deepcopy(entries), groups) for r in (0, 2)]
    dumps.append(_with_torch(dump(1, 3, [], 9, reason="signal"), []))
    found = diagnose(load(write(tmp_path, *dumps)))
    [stuck] = found.stuck
    assert stuck.group == (2, 0) and [w.rank for w in stuck.waiting] == [2, 0]


def test_polydists_own_stuck_call_is_not_said_twice(tmp_path):
    """polydist's calls on gloo are in both recorders: polydist's finding stands for both."""
    from _dumps import call

    mine = [call(0, "all_reduce", (0, 1), 7, 1.0)]
    dumps = [_with_torch(dump(r, 2, mine if r == 0 else [], 9, reason="signal", stacks=[IN_WAIT]),
                         [_entry(0, 1), _entry(1, 2, retired=False, at=1.5)] if r == 0 else [_entry(0, 1)],
                         groups={"0": [0, 1]}) for r in (0, 1)]  # fmt: skip
    found = diagnose(load(write(tmp_path, *dumps)))
    assert [(s.seq, s.waiting[0].call.source) for s in found.stuck] == [(7, "polydist")]


def test_the_header_says_when_torchs_recorder_was_off(tmp_path):
    d = _with_torch(dump(0, 1, [], 1, reason="signal", stacks=[stack((USER, 3, "main"))]), [], {"0": [0]}, buffer=0)
    assert "TORCH_FR_BUFFER_SIZE=0" in diagnose(load(write(tmp_path, d))).text()


BAD = [
    ("torch", "not an object"),
    ("torch.buffer", -1),
    ("torch.groups", {"0": [0, 7]}),  # a rank outside the world
    ("torch.groups", {"0": [0, 0]}),
    ("torch.groups", {"0": "0,1"}),
    ("torch.entries", "x"),
    ("entry.record_id", "1"),
    ("entry.collective_seq_id", -3),
    ("entry.process_group", []),
    ("entry.process_group", [0]),
    ("entry.profiling_name", "x" * 10_000),
    ("entry.profiling_name", None),
    ("entry.input_sizes", [[4], [2]]),  # two sizes, one dtype
    ("entry.input_sizes", [["4"]]),
    ("entry.output_sizes", [[4], [2]]),  # two sizes, one dtype
    ("entry.output_sizes", [[-1.5]]),
    ("entry.retired", "yes"),
    ("entry.timeout_ms", float("inf")),
    ("entry.time_created_ns", 1.5),
    ("entry.frames", [{"filename": 3}]),
    ("entry.frames", ["main"]),
]


@pytest.mark.parametrize("where, bad", BAD, ids=[f"{w}={str(b)[:12]}" for w, b in BAD])
def test_a_hostile_torch_record_makes_the_dump_unreadable_not_the_command_crash(tmp_path, where, bad):
    d = _with_torch(dump(0, 2, [], 1, reason="signal"), [_entry(0, 1)], groups={"0": [0, 1]})
    if where == "torch":
        d["torch"] = bad
    elif where.startswith("torch."):
        d["torch"][where.split(".")[1]] = bad
    else:
        d["torch"]["entries"][0][where.split(".")[1]] = bad
    with open(tmp_path / "rank0.json", "w") as f:
        json.dump(d, f)  # inf as JSON's Infinity: the reader refuses it too
    dumps = load(str(tmp_path))
    assert not dumps.ranks and [p.rank for p in dumps.problems] == [0]
    assert "torch" in dumps.problems[0].message or "JSON" in dumps.problems[0].message, dumps.problems[0].message
    diagnose(dumps).text()


# Both dump tests write this process's own dump: they run in a fresh interpreter, so that what earlier tests left
# in the pytest process (its recorder's records, torch's groups) is not in the dump they read.
_OWN_DUMP = r"""
import json, sys, torch, torch.distributed as dist
from polydist import _torch
from polydist.trace import dump as trace_dump
from polydist.trace.analyze import load
folder, mode = sys.argv[1], sys.argv[2]
if mode == "no-recorder":
    _torch.fr_available = lambda: False
    path = trace_dump.dump_trace(folder)
else:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        dist.all_reduce(torch.ones(2))  # the line the dump must name
        path = trace_dump.dump_trace(folder)
    finally:
        dist.destroy_process_group()
with open(path) as f:
    raw_torch = json.load(f)["torch"]
dumps = load(folder)
print(json.dumps({"raw_torch": raw_torch, "problems": [p.message for p in dumps.problems],
                  "ranks": {r: {"torch_on": d.torch_on,
                                "calls": [[c.collective, list(c.group), c.file, c.line] for c in d.torch_calls]}
                            for r, d in dumps.ranks.items()}}))
"""


def _own_dump(tmp_path, mode: str) -> dict:
    script = tmp_path / "own_dump.py"
    script.write_text(_OWN_DUMP)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "dumps"), mode], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), str(script)


@pytest.mark.timeout(150)
def test_a_torch_without_a_flight_recorder_writes_dumps_without_torchs_records(tmp_path):
    """torch < 2.7 has no gloo recorder: the dump says null, and is read as before."""
    out, _ = _own_dump(tmp_path, "no-recorder")
    assert out["raw_torch"] is None and out["problems"] == [], out
    assert out["ranks"]["0"]["torch_on"] is None, out


@pytest.mark.timeout(150)
def test_a_dump_carries_this_processs_own_torch_records(tmp_path):
    """A world of one on gloo: its all_reduce is in torch's recorder and so in the dump (torch 2.13 records by default)."""
    if not _torch.fr_available():
        pytest.skip("this torch has no flight recorder")
    out, script = _own_dump(tmp_path, "gloo")
    assert out["problems"] == [], out
    [dumped] = out["ranks"].values()
    assert dumped["torch_on"], out
    collective, group, file, _ = dumped["calls"][-1]
    assert collective == "gloo:all_reduce" and group == [0] and file == script, out


def test_nccl_records_with_their_own_states_and_completion_times_are_read(tmp_path):
    """NCCL's recorder (CUDA builds) says started/completed and when each kernel completed."""
    def nccl(i, seq, state, at, done=None):
        e = _entry(i, seq, "nccl:all_reduce", retired=state == "completed", at=at)
        e.update(state=state, recorder="_dump_nccl_trace",
                 time_discovered_completed_ns=int((T + done) * 1e9) if done is not None else None)
        return e

    error = "RuntimeError: Watchdog caught collective operation timeout"
    dumps = [_with_torch(dump(0, 2, [], 20, reason="signal", error=error), [nccl(0, 1, "completed", 0, 0.25),
                                                                          nccl(1, 2, "started", 1)],
                         groups={"0": [0, 1]}),
             _with_torch(dump(1, 2, [], 20, reason="terminate", stacks=[IN_WAIT]), [nccl(0, 1, "completed", 0, 0.5)],
                         groups={"0": [0, 1]})]  # fmt: skip
    found = diagnose(load(write(tmp_path, *dumps)))
    [stuck] = found.stuck
    assert stuck.seq == 2 and [(w.rank, w.call.state) for w in stuck.waiting] == [(0, "started")]
    assert found.dumps[1].torch_calls[0].end == T + 0.5
    assert "nccl:all_reduce #2 on [0,1]: rank 0 waiting since 19.0 s" in found.text()
