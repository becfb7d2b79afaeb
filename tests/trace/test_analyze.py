"""``polydist trace``: the analysis of hand-written dumps (no processes), in words and as JSON, and the command.

Each scenario writes the ``rank<R>.json`` files a real job would leave
(format: :mod:`polydist.trace`; helpers in :mod:`_dumps`) and checks the exact
sentences and fields the analysis gives. The Chrome export: test_chrome.py;
the Flight Recorder export: test_fr_export.py; any valid dumps: test_any_dumps.py.
"""

from __future__ import annotations

import json
import os

import pytest
from _dumps import IN_WAIT, LIB, RAISED, T, USER, WORLD, call, dump, history, run_cli, skipped_dumps, stack, write

from polydist.trace import analyze, reader, words


def lines(directory):
    return analyze.diagnose(analyze.load(directory)).text().splitlines()


@pytest.fixture
def skipped(tmp_path):
    return write(tmp_path, *skipped_dumps())


def test_a_rank_that_skipped_a_collective_is_named_with_the_line_it_is_at(skipped):
    text = lines(skipped)
    assert text[0] == f"polydist trace {skipped}: dumps from 4 of 4 ranks"
    assert text[1] == "rank 0 (node1, pid 100): timeout"
    assert text[3] == "rank 2 (node1, pid 102): signal"
    assert (
        "all_reduce #5 on [0,1,2,3]: ranks 0,1,3 waiting since 12.3 s at train.py:88; rank 2 never called it — "
        "it is running user code at train.py:95 (in function main), last collective: all_reduce #4 completed "
        "3.2 s before the dump"
    ) in text
    assert not any(t.startswith("first disagreement") for t in text)  # #1..#4 agree


def test_the_findings_are_structured(skipped):
    found = analyze.diagnose(analyze.load(skipped))
    (stuck,) = found.stuck
    assert (stuck.group, stuck.seq) == (WORLD, 5)
    assert [w.rank for w in stuck.waiting] == [0, 1, 3]
    assert [round(w.seconds, 3) for w in stuck.waiting] == [12.3, 12.3, 12.3]
    (other,) = stuck.others
    assert (other.rank, other.relation, other.kind) == (2, "never called", "user code")
    assert other.site == reader.Site(USER, 95, "main") and (other.last.collective, other.last.seq) == ("all_reduce", 4)
    assert found.missing == [] and found.problems == [] and not found.healthy


def test_the_example_of_the_issue(tmp_path):
    """Rank 2 waits in barrier #40 that the others completed (a rank whose barrier was lost, say)."""
    done = [call(0, "barrier", WORLD, 40, 0.0, 0.1, dtypes=[], shapes=[])]
    ranks = [dump(r, 4, done + [call(1, "all_reduce", WORLD, 41, 0.2, op="SUM")], 12.5) for r in (0, 1, 3)]
    ranks.append(dump(2, 4, [call(0, "barrier", WORLD, 40, 0.0, line=95, dtypes=[], shapes=[])], 12.5))
    assert lines(write(tmp_path, *ranks))[-1] == (
        "all_reduce #41 on [0,1,2,3]: ranks 0,1,3 waiting since 12.3 s at train.py:88; "
        "rank 2 never called it — it is in barrier #40 at train.py:95"
    )


def test_a_rank_stuck_in_another_collective_is_named_in_it(tmp_path):
    sub = (2, 3)
    ranks = [dump(r, 4, [call(0, "all_reduce", WORLD, 41, 0.0, op="SUM")], 12.3) for r in (0, 1)]
    ranks.append(dump(2, 4, [call(0, "barrier", sub, 40, 0.5, line=95, dtypes=[], shapes=[])], 12.0))
    ranks.append(dump(3, 4, [call(0, "barrier", sub, 40, 0.2, 0.3, dtypes=[], shapes=[]),
                             call(1, "all_reduce", WORLD, 41, 0.4, op="SUM")], 12.2))  # fmt: skip
    text = lines(write(tmp_path, *ranks))
    assert text[-2:] == [
        "all_reduce #41 on [0,1,2,3]: ranks 0,1,3 waiting since 12.3 s at train.py:88; "
        "rank 2 never called it — it is in barrier #40 on [2,3] at train.py:95",
        "barrier #40 on [2,3]: rank 2 waiting since 11.5 s at train.py:95; rank 3 completed it — "
        "it is in all_reduce #41 on [0,1,2,3] at train.py:88",
    ]


def test_ranks_that_call_collectives_in_different_orders(tmp_path):
    pair = (0, 1)
    same = history(pair, 6, file="/w/a.py", line=5)
    r0 = same + [call(6, "all_reduce", pair, 7, 7.0, op="SUM", file="/w/a.py", line=10)]
    r1 = same + [call(6, "broadcast", pair, 7, 7.1, root=0, file="/w/a.py", line=12)]
    directory = write(tmp_path, dump(0, 2, r0, 9.0), dump(1, 2, r1, 9.1))
    text = lines(directory)
    assert text[-2:] == [
        "call #7 on [0,1]: rank 0 waiting in all_reduce since 2.0 s at a.py:10; "
        "rank 1 waiting in broadcast since 2.0 s at a.py:12",
        "first disagreement on group [0,1]: call #7: rank 0 called all_reduce(float32[4], op=SUM) at a.py:10; "
        "rank 1 called broadcast(float32[4], src=0) at a.py:12",
    ]
    (d,) = analyze.diagnose(analyze.load(directory)).disagreements
    assert (d.group, d.seq, d.calls[1].collective) == (pair, 7, "broadcast")


def test_a_shape_disagreement_is_found_only_where_shapes_must_agree_and_every_buffer_holds_the_call(tmp_path):
    pair = (0, 1)
    r0 = [call(0, "all_gather", pair, 3, 0, 1, shapes=[[4]]), call(1, "all_reduce", pair, 4, 2, 3, op="SUM"),
          call(2, "all_reduce", pair, 5, 4, 5, op="SUM", shapes=[[4, 2]])]  # fmt: skip
    r1 = [call(0, "barrier", pair, 2, 0, 1),  # rank 0's ring buffer dropped #1 and #2: not compared
          call(1, "all_gather", pair, 3, 0, 1, shapes=[[8]]),  # all_gather's inputs may differ in size
          call(2, "all_reduce", pair, 4, 2, 3, op="SUM"), call(3, "all_reduce", pair, 5, 4, 5, op="SUM", shapes=[[8]])]
    text = lines(write(tmp_path, dump(0, 2, r0, 6, dropped=2), dump(1, 2, r1, 6)))
    assert text[-1] == (
        "first disagreement on group [0,1]: call #5: rank 0 called all_reduce(float32[4, 2], op=SUM) at train.py:88; "
        "rank 1 called all_reduce(float32[8], op=SUM) at train.py:88"
    )
    assert text[1].endswith("; 2 older calls were dropped from its ring buffer")


def test_a_rank_in_a_python_loop_shows_its_loop_line(tmp_path):
    loop = stack(("/w/loop.py", 30, "<module>"), ("/w/loop.py", 12, "spin"),
                 ("/venv/lib/python3.12/site-packages/numpy/core/fromnumeric.py", 86, "sum"))  # fmt: skip
    r0 = dump(0, 2, history((0, 1), 3, collective="barrier") + [call(3, "barrier", (0, 1), 4, 5.0)], 8.0)
    r1 = dump(1, 2, history((0, 1), 3, collective="barrier"), 5.7, reason="signal", stacks=[loop])
    text = lines(write(tmp_path, r0, r1))
    assert text[-1] == (
        "barrier #4 on [0,1]: rank 0 waiting since 3.0 s at train.py:88; rank 1 never called it — it is running "
        "user code at loop.py:12 (in function spin), last collective: barrier #3 completed 3.2 s before the dump"
    )


GLOO_LOST = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:44763. This is typically caused by a remote worker crashing. Check the logs of the remote worker "
    "before reporting an error. GLHF! \U0001f3d6\ufe0f"
)
# Its main thread at dump time: the worker's exception handler.
HANDLER = stack(("/venv/lib/python3.12/site-packages/polydist/launch/worker.py", 39, "main"),
                ("/usr/lib/python3.12/contextlib.py", 158, "__exit__"),
                ("/venv/lib/python3.12/site-packages/polydist/launch/elastic.py", 304, "worker_errors"))  # fmt: skip


def _raised(rank1_frames, others):
    """Rank 1 raised after barrier #4; ranks 0 and 2 are in all_reduce #5 (``others``: their entry's state)."""
    trio = (0, 1, 2)
    done = history(trio, 3, file="/w/job.py", line=50) + [call(3, "barrier", trio, 4, 3.0, 3.1, file="/w/job.py",
                                                                 line=51, dtypes=[], shapes=[])]  # fmt: skip
    error = GLOO_LOST if others == "failed" else None
    end = 5.2 if others == "failed" else None
    stuck = [call(4, "all_reduce", trio, 5, 4.1, end, op="SUM", state=others, error=error, file="/w/job.py",
                  line=69)]  # fmt: skip
    reason = "terminate" if others == "failed" else "signal"
    ranks = [dump(r, 3, done + stuck, 5.3, reason=reason, error=error, error_frames=[] if error else None)
             for r in (0, 2)]  # fmt: skip
    ranks.append(dump(1, 3, done, 4.1, reason="exception", error="RuntimeError: rank 1 gives up", stacks=[HANDLER],
                      error_frames=rank1_frames))  # fmt: skip
    return ranks


def test_a_rank_that_raised_is_shown_where_it_raised_not_in_its_exception_handler(tmp_path):
    """gloo: the others' all_reduce fails when rank 1's process ends; their long error is shortened."""
    text = lines(write(tmp_path, *_raised(RAISED, "failed")))
    assert text[1:] == [
        "rank 0 (node1, pid 100): terminate — RuntimeError: Connection closed by peer [127.0.0.1]:44763",
        "rank 1 (node1, pid 101): exception — RuntimeError: rank 1 gives up at job.py:68",
        "rank 2 (node1, pid 102): terminate — RuntimeError: Connection closed by peer [127.0.0.1]:44763",
        "all_reduce #5 on [0,1,2]: ranks 0,2 failed after 1.1 s at job.py:69 (RuntimeError: Connection closed by "
        "peer [127.0.0.1]:44763); rank 1 never called it — it raised RuntimeError: rank 1 gives up at job.py:68, "
        "last collective: barrier #4 completed 1.0 s before the dump",
    ]
    found = analyze.diagnose(analyze.load(str(tmp_path)))
    (other,) = found.stuck[0].others
    assert (other.rank, other.relation, other.kind, other.error) == (1, "never called", "raised",
                                                                      "RuntimeError: rank 1 gives up")  # fmt: skip
    assert other.site == reader.Site("/w/job.py", 68, "main")


def test_a_rank_that_raised_under_mpi_while_the_others_wait(tmp_path):
    text = lines(write(tmp_path, *_raised(RAISED, "started")))
    assert text[-1] == (
        "all_reduce #5 on [0,1,2]: ranks 0,2 waiting since 1.2 s at job.py:69; rank 1 never called it — it raised "
        "RuntimeError: rank 1 gives up at job.py:68, last collective: barrier #4 completed 1.0 s before the dump"
    )


def test_where_an_error_was_raised_without_user_frames_or_a_traceback(tmp_path):
    """Raised inside a library: its innermost frame. A dump of an older writer (no error_frames): no place."""
    write(tmp_path, *_raised(RAISED[:3], "started"))
    text = lines(str(tmp_path))
    assert text[2] == "rank 1 (node1, pid 101): exception — RuntimeError: rank 1 gives up at <frozen runpy>:291"
    write(tmp_path, *_raised(None, "started"))
    text = lines(str(tmp_path))
    assert text[2] == "rank 1 (node1, pid 101): exception — RuntimeError: rank 1 gives up"
    assert text[-1].endswith("; rank 1 never called it — it raised RuntimeError: rank 1 gives up, last collective: "
                             "barrier #4 completed 1.0 s before the dump")  # fmt: skip


def test_json_keeps_the_full_error_and_where_it_was_raised(tmp_path, capsys):
    code, out, err = run_cli(capsys, write(tmp_path, *_raised(RAISED, "failed")), "--json")
    data = json.loads(out)
    assert code == 1 and err == ""
    assert data["ranks"][0]["error"] == GLOO_LOST and data["ranks"][0]["raised_at"] is None
    assert data["ranks"][1]["raised_at"] == {"file": "/w/job.py", "line": 68, "function": "main"}
    assert data["ranks"][1]["traceback"] == "Traceback (most recent call last):\n  ...\nRuntimeError: rank 1 gives up"
    assert data["ranks"][1]["location"]["file"].endswith("elastic.py")  # the handler, as dumped
    (other,) = data["stuck"][0]["others"]
    assert (other["kind"], other["error"], other["site"]["line"]) == ("raised", "RuntimeError: rank 1 gives up", 68)
    assert data["stuck"][0]["waiting"][0]["call"]["error"] == GLOO_LOST


@pytest.mark.parametrize("error, shown", [
    (GLOO_LOST, "RuntimeError: Connection closed by peer [127.0.0.1]:44763"),
    ("RuntimeError: Connection closed by peer [10.0.0.2]:4242\nmore detail",
     "RuntimeError: Connection closed by peer [10.0.0.2]:4242"),
    ("ValueError: shape [4] vs [8] at x.py:3", "ValueError: shape [4] vs [8] at x.py:3"),  # no leading prefix
    ("DistBackendError: [Rank 0] Watchdog caught collective operation timeout. Last enqueued: 5",
     "DistBackendError: [Rank 0] Watchdog caught collective operation timeout"),
    ("torch.distributed.DistError: v1.2 is too old. Upgrade it.", "torch.distributed.DistError: v1.2 is too old"),
    ("no type here. Two sentences.", "no type here"),
    ("RuntimeError: " + "x" * 200, "RuntimeError: " + "x" * 105 + "…"),  # no word's end in the second half
    ("CollectiveTimeoutError: all_reduce #5 on group [0, 1, 2] timed out after 5 s on rank 0: every rank of the "
     "group was waiting in it (a lost connection, or ranks that disagree on the calls: POLYDIST_DEBUG=1 compares them)",
     "CollectiveTimeoutError: all_reduce #5 on group [0, 1, 2] timed out after 5 s on rank 0: every rank of the group "
     "was…"),
    ("", ""), (None, ""),
])  # fmt: skip
def test_error_messages_are_shortened_to_their_first_sentence(error, shown):
    assert words.brief(error) == shown and len(shown) <= 120


def test_a_killed_rank_without_a_dump_is_named(tmp_path):
    trio = (0, 1, 2)
    lost = "RuntimeError: Connection closed by peer [10.0.0.2]:4242\nmore detail"
    r0 = dump(0, 3, history(trio, 1) + [call(1, "all_reduce", trio, 2, 2.0, 7.0, op="SUM", state="failed",
                                             error="CollectiveTimeoutError: all_reduce #2 ... timed out")], 7.1)
    r1 = dump(1, 3, history(trio, 1) + [call(1, "all_reduce", trio, 2, 2.0, 2.5, op="SUM", state="failed",
                                             error=lost)], 2.6, reason="exception", error=lost)  # fmt: skip
    directory = write(tmp_path, r0, r1)
    text = lines(directory)
    assert "rank 1 (node1, pid 101): exception — RuntimeError: Connection closed by peer [10.0.0.2]:4242" in text
    assert "no dump from rank 2 (it died before it could write one, or was killed by SIGKILL)" in text
    assert text[-1] == (
        "all_reduce #2 on [0,1,2]: rank 0 waited 5.0 s and timed out at train.py:88; rank 1 failed after 0.5 s "
        "at train.py:88 (RuntimeError: Connection closed by peer [10.0.0.2]:4242); no dump from rank 2"
    )
    assert analyze.diagnose(analyze.load(directory)).missing == [2]


def test_malformed_files_are_named_and_the_others_are_analysed(tmp_path, capsys):
    good = dump(0, 8, [call(0, "all_reduce", tuple(range(8)), 1, 0.0, op="SUM")], 3.0)
    write(tmp_path, good)
    text = json.dumps(good)
    bad = {
        "rank1.json": text[: len(text) // 2],  # truncated
        "rank2.json": "[]",
        "rank3.json": json.dumps({**good, "rank": 3, "format": "torch-fr"}),
        "rank4.json": json.dumps({**good, "rank": 4, "version": 2}),
        "rank5.json": json.dumps({**good, "rank": 5, "entries": [{**good["entries"][0], "state": "bogus"}]}),
        "rank6.json": text.replace('"rank": 0', '"rank": 6').replace(str(T + 3.0), "NaN"),
        "rank7.json": text,  # rank 0's dump under rank 7's name
        "rank1.json.tmp": "ignored", ".dump-x": "ignored",
    }
    for name, data in bad.items():
        with open(tmp_path / name, "w") as f:
            f.write(data)
    (tmp_path / "rank8.json").write_bytes(b"\xff\xfe\x00garbage")
    dumps = analyze.load(str(tmp_path))
    assert sorted(dumps.ranks) == [0]
    messages = {p.file: p.message for p in dumps.problems}
    assert messages["rank1.json"].startswith("is not valid JSON, truncated? (")
    assert messages["rank2.json"] == 'is not a polydist trace dump (no "format": "polydist-trace")'
    assert messages["rank3.json"] == 'is not a polydist trace dump (no "format": "polydist-trace")'
    assert messages["rank4.json"] == "is format version 2; this polydist reads version 1"
    assert messages["rank5.json"] == "entries[0].state is 'bogus', not started, completed or failed"
    assert messages["rank6.json"] == "holds NaN, which is not JSON"
    assert messages["rank7.json"] == "holds the dump of rank 0, not of rank 7"
    assert messages["rank8.json"] == "is not UTF-8 text (byte 0)"
    code, out, err = run_cli(capsys, str(tmp_path))
    assert code == 1 and err == "" and "Traceback" not in out
    assert "rank5.json: entries[0].state is 'bogus', not started, completed or failed" in out.splitlines()
    assert out.splitlines()[-1] == (
        "all_reduce #1 on [0,1,2,3,4,5,6,7]: rank 0 waiting since 3.0 s at train.py:88; "
        "the dump of ranks 1,2,3,4,5,6,7 could not be read"
    )


def test_a_fifo_or_a_wrong_field_type_is_a_problem_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "rank0.json")
    write(tmp_path, {**dump(1, 2, [], 1.0), "time": "yesterday"})
    messages = [p.text() for p in analyze.load(str(tmp_path)).problems]
    assert messages == ["rank0.json: is not a regular file", "rank1.json: the dump.time is not num: 'yesterday'"]


def test_with_the_recorder_off_the_stacks_say_where_ranks_are(tmp_path):
    loop = stack(("/w/loop.py", 12, "spin"))
    pair = (0, 1)
    r0 = dump(0, 2, [], 4.0, reason="signal", enabled=False, stacks=[loop])
    r1 = dump(1, 2, [call(0, "all_reduce", pair, 3, 1.0, op="SUM")], 4.0)
    text = lines(write(tmp_path, r0, r1))
    assert text[1] == ("rank 0 (node1, pid 100): signal; the recorder was off (POLYDIST_TRACE=0), so the analysis "
                       "has its stacks only: its main thread is at loop.py:12 (in function spin)")  # fmt: skip
    assert text[-1] == ("all_reduce #3 on [0,1]: rank 1 waiting since 3.0 s at train.py:88; rank 0 had the recorder "
                        "off — it is running user code at loop.py:12 (in function spin)")  # fmt: skip
    write(tmp_path, dump(1, 2, history(pair, 3), 4.0))
    assert lines(str(tmp_path))[-1] == "no recorded call is waiting; rank 0 had the recorder off (see the stacks above)"


def test_a_healthy_job_says_so_and_exits_0(tmp_path, capsys):
    pair = (0, 1)
    write(tmp_path, *(dump(r, 2, history(pair, 5), 6.0, reason="request", stacks=[IN_WAIT]) for r in pair))
    found = analyze.diagnose(analyze.load(str(tmp_path)))
    assert found.healthy and found.stuck == [] and found.disagreements == []
    code, out, err = run_cli(capsys, str(tmp_path))
    assert code == 0 and err == ""
    assert out.splitlines()[-1] == "no rank is waiting in a collective; last collective on every group completed"


def test_a_stuck_point_to_point_call_names_its_peer(tmp_path):
    world = (0, 1, 2)
    r0 = dump(0, 3, history(world, 1) + [call(1, "send", world, None, 4.0, root=1, file="/w/x.py", line=5)], 7.0)
    r1 = dump(1, 3, history(world, 1) + [call(1, "recv", world, None, 4.5, root=2, file="/w/x.py", line=9)], 7.0)
    r2 = dump(2, 3, history(world, 1), 7.0, reason="signal", stacks=[stack(("/w/x.py", 30, "main"))])
    text = lines(write(tmp_path, r0, r1, r2))
    assert text[-2:] == [
        "rank 0: send to rank 1 at x.py:5, waiting since 3.0 s; rank 1 is in recv from rank 2 at x.py:9",
        "rank 1: recv from rank 2 at x.py:9, waiting since 2.5 s; rank 2 is running user code at x.py:30 "
        "(in function main), last collective: all_reduce #1 completed 6.5 s before the dump",
    ]


def test_files_with_the_same_name_are_told_apart(tmp_path):
    pair = (0, 1)
    r0 = dump(0, 2, [call(0, "all_reduce", pair, 1, 0.0, op="SUM", file="/a/train.py")], 1.0)
    r1 = dump(1, 2, [call(0, "all_reduce", pair, 1, 0.0, op="SUM", file="/b/train.py")], 1.0)
    assert lines(write(tmp_path, r0, r1))[-1] == (
        "all_reduce #1 on [0,1]: rank 0 waiting since 1.0 s at a/train.py:88; "
        "rank 1 waiting since 1.0 s at b/train.py:88"
    )


def test_library_frames_are_told_from_user_code():
    assert reader.is_library(LIB) and reader.is_library("/usr/lib/python3.12/threading.py")
    assert reader.is_library("/work/main/src/polydist/collectives/reduce.py") and reader.is_library("<frozen runpy>")
    assert not reader.is_library("/home/u/train.py") and not reader.is_library("<stdin>")


def test_json_output(skipped, capsys):
    code, out, err = run_cli(capsys, skipped, "--json")
    data = json.loads(out)
    assert code == 1 and err == ""
    assert data["healthy"] is False and data["world_size"] == 4 and data["missing"] == []
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 2, 3]
    assert data["ranks"][2]["location"] == {"file": USER, "line": 95, "function": "main"}
    (stuck,) = data["stuck"]
    assert (stuck["collective"], stuck["seq"], stuck["group"]) == ("all_reduce", 5, [0, 1, 2, 3])
    assert [(w["rank"], w["call"]["state"], w["call"]["file"]) for w in stuck["waiting"]] == [
        (0, "started", USER), (1, "started", USER), (3, "started", USER)]  # fmt: skip
    assert stuck["others"][0]["relation"] == "never called" and stuck["others"][0]["site"]["line"] == 95
    assert data["text"] == lines(skipped)


def test_the_command_refuses_what_it_cannot_analyse(tmp_path, capsys):
    code, out, err = run_cli(capsys, str(tmp_path / "nowhere"))
    assert code == 2 and out == ""
    assert err == f"polydist trace: cannot read {tmp_path / 'nowhere'}: No such file or directory\n"
    code, out, err = run_cli(capsys, str(tmp_path))
    assert code == 2 and err == f"polydist trace: no dump (rank<R>.json) in {tmp_path}\n"


def test_what_a_watcher_knows_of_a_rank_without_a_dump_is_said_of_it(tmp_path):
    """A launcher (or a peer on its host) that saw how a rank with no dump ended says so: frozen, or killed by a
    signal; the ranks it knows nothing of read as before, a fate given for a rank that dumped is not shown."""
    quad = (0, 1, 2, 3)
    r0 = dump(0, 4, history(quad, 1) + [call(0, "all_reduce", quad, 2, 2.0, op="SUM")], 7.0)
    fates = {1: "frozen: stopped (process state T) for 3.1 s, pid 4242", 3: "killed by SIGKILL, pid 4343",
             0: "killed by SIGTERM, pid 4141"}  # fmt: skip
    found = analyze.diagnose(analyze.load(write(tmp_path, r0)), fates)
    assert found.headline() == (
        "all_reduce #2 on [0,1,2,3]: rank 0 waiting since 5.0 s at train.py:88; no dump from rank 2; "
        "no dump from rank 1 (frozen: stopped (process state T) for 3.1 s, pid 4242); "
        "no dump from rank 3 (killed by SIGKILL, pid 4343)"
    )
    text = found.text().splitlines()
    assert "no dump from rank 2 (it died before it could write one, or was killed by SIGKILL)" in text
    assert "no dump from rank 1 (frozen: stopped (process state T) for 3.1 s, pid 4242)" in text
    assert found.as_dict()["fates"] == {1: fates[1], 3: fates[3]}


def test_long_rank_lists_are_abridged_to_runs(tmp_path):
    world = tuple(range(16))
    write(tmp_path, *(dump(r, 16, [call(0, "all_reduce", world, 1, 0.0, op="SUM")], 2.0) for r in range(15) if r != 7))
    text = lines(str(tmp_path))
    assert "no dump from ranks 7,15 (they died before they could write one, or were killed by SIGKILL)" in text
    assert text[-1] == (
        "all_reduce #1 on [0-15]: ranks 0-6,8-14 waiting since 2.0 s at train.py:88; no dump from ranks 7,15"
    )


def test_a_rank_that_finished_its_program_is_named_so_not_as_lost(tmp_path):
    """A rank that ended its program normally (polydist run's worker left rank<R>.finished) while the others
    waited for it: it "had finished its program", not "no dump" (it died)."""
    pair = (0, 1)
    r0 = dump(0, 2, history(pair, 2) + [call(2, "all_reduce", pair, 3, 2.0, 2.1, op="SUM", state="failed",
                                             error="RuntimeError: Connection closed by peer [127.0.0.1]:4242")], 2.2)
    directory = write(tmp_path, r0)
    (tmp_path / "rank1.finished").write_text("")
    text = lines(directory)
    assert "rank 1 finished its program (exit code 0) and wrote no dump" in text
    assert not any(line.startswith("no dump from") for line in text), text
    assert text[-1].endswith("; rank 1 never called it — it had finished its program (exit code 0)"), text[-1]
    found = analyze.diagnose(analyze.load(directory))
    assert found.missing == [] and found.finished == [1] and found.as_dict()["finished"] == [1]
    assert found.headline() == text[-1]
