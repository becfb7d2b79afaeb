"""``polydist trace --fr-trace``: the dumps in PyTorch's Flight Recorder format, read by torch's own analyser.

Each scenario writes hand-made dumps (:mod:`_dumps`), exports them
(:mod:`polydist.trace.fr_export`) and runs ``torch.distributed.flight_recorder.fr_trace``
on the files in this process, as ``python -m torch.distributed.flight_recorder.fr_trace``
would: its findings are the database it pickles with ``-o`` and the lines it logs.
"""

from __future__ import annotations

import gc
import logging
import os
import pickle

import pytest
from _dumps import T, USER, call, dump, history, run_cli, write

from polydist.trace import analyze, fr_export

fr_trace = pytest.importorskip("torch.distributed.flight_recorder.fr_trace")
fr_utils = pytest.importorskip("torch.distributed.flight_recorder.components.utils")

TRIO = (0, 1, 2)


def export(tmp_path, *dumps):
    """Write ``dumps`` as polydist's, export them; the export's folder."""
    source, out = tmp_path / "dumps", tmp_path / "fr"
    source.mkdir()
    fr_export.write_fr_trace(analyze.load(write(source, *dumps)), str(out))
    return str(out)


def analyse(directory, caplog, *flags):
    """torch's analyser on ``directory``: (its database, the lines it logged)."""
    caplog.clear()
    out = directory + ".db"
    with caplog.at_level(logging.INFO, logger="Flight Recorder"):
        try:
            fr_trace.main([directory, "-o", out, *flags])
        finally:
            gc.enable()  # its loader turns the garbage collector off and leaves it off
    with open(out, "rb") as f:
        _, db = pickle.load(f)
    return db, [r.getMessage() for r in caplog.records if r.name == "Flight Recorder" and r.levelno >= logging.INFO]


def healthy_calls(rank):
    """One of each collective on the world, an all_reduce on [0,1], a send 0 -> 1: all completed."""
    entries = history(TRIO, 2) + [
        call(2, "broadcast", TRIO, 3, 2, 2.1, root=0), call(3, "barrier", TRIO, 4, 3, 3.1, dtypes=[], shapes=[]),
        call(4, "all_gather", TRIO, 5, 4, 4.1, shapes=[[2, 3]]),
        call(5, "reduce_scatter", TRIO, 6, 5, 5.1, op="SUM", shapes=[[6, 2]]),
        call(6, "gather", TRIO, 7, 6, 6.1, root=0),
        call(7, "scatter", TRIO, 8, 7, 7.1, root=0, **({"shapes": [[4]] * 3, "dtypes": ["float32"] * 3} if rank == 0
                                                        else {"value": True, "dtypes": [], "shapes": []})),
        call(8, "all_to_all", TRIO, 9, 8, 8.1, shapes=[[1], [2, 2], [3]], dtypes=["float32"] * 3),
        call(9, "reduce", TRIO, 10, 9, 9.1, op="MAX", root=2),
        call(10, "broadcast", TRIO, 11, 10, 10.1, root=1, value=True, dtypes=[], shapes=[]),
    ]  # fmt: skip
    if rank in (0, 1):
        entries.append(call(11, "all_reduce", (0, 1), 1, 11, 11.1, op="SUM"))
        entries.append(call(12, "send" if rank == 0 else "recv", TRIO, None, 12, 12.1, root=1 - rank))
    return entries


@pytest.fixture
def healthy(tmp_path):
    return export(tmp_path, *(dump(r, 3, healthy_calls(r), 13.0, reason="request") for r in TRIO))


def test_one_file_per_rank_in_torchs_format(healthy):
    assert sorted(os.listdir(healthy)) == ["rank_0", "rank_1", "rank_2"]
    with open(os.path.join(healthy, "rank_0"), "rb") as f:
        data = pickle.load(f)
    assert sorted(data) == ["entries", "pg_config", "version"] and data["version"] == "2.10"
    assert data["pg_config"] == {
        "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"},
        "[0,1]": {"name": "[0,1]", "desc": "undefined", "ranks": "[0, 1]"},
        "p2p 0<->1": {"name": "p2p 0<->1", "desc": "undefined", "ranks": "[0, 1]"},
    }
    first, subgroup, send = data["entries"][0], data["entries"][11], data["entries"][12]
    assert first == {
        "record_id": 0, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 1, "p2p_seq_id": 0,
        "op_id": 1, "profiling_name": "gloo:all_reduce", "is_p2p": False, "input_sizes": [[4]],
        "input_dtypes": ["float32"], "output_sizes": [[4]], "output_dtypes": ["float32"], "state": "completed",
        "retired": True, "time_created_ns": int(T * 1e9), "time_discovered_started_ns": int(T * 1e9),
        "time_discovered_completed_ns": int((T + 0.5) * 1e9), "duration_ms": 500.0,
        "frames": [{"name": "main", "filename": USER, "line": 88}],
    }  # fmt: skip
    assert (subgroup["process_group"], subgroup["pg_id"], subgroup["collective_seq_id"]) == (("[0,1]", "undefined"),
                                                                                              1, 1)  # fmt: skip
    assert {k: send[k] for k in ("process_group", "pg_id", "profiling_name", "is_p2p", "collective_seq_id",
                                 "p2p_seq_id")} == {  # fmt: skip
        "process_group": ("p2p 0<->1", "undefined"), "pg_id": 2, "profiling_name": "gloo:send 0->1", "is_p2p": True,
        "collective_seq_id": 1, "p2p_seq_id": 1,
    }  # fmt: skip
    with open(os.path.join(healthy, "rank_1"), "rb") as f:
        assert pickle.load(f)["entries"][12]["profiling_name"] == "gloo:recv 1<-0"


@pytest.mark.parametrize("rank, index, sizes", [
    (0, 2, ([[4]], ["float32"], [[4]], ["float32"])),  # broadcast
    (0, 3, ([], [], [], [])),  # barrier
    (1, 4, ([[2, 3]], ["float32"], [[6, 3]], ["float32"])),  # all_gather: 3 ranks' [2, 3]
    (2, 5, ([[6, 2]], ["float32"], [[2, 2]], ["float32"])),  # reduce_scatter: this rank's chunk of dim 0
    (0, 6, ([[4]], ["float32"], [[12]], ["float32"])),  # gather: the root's result
    (1, 6, ([[4]], ["float32"], [], [])),  # gather: not the root
    (0, 7, ([[4]] * 3, ["float32"] * 3, [], [])),  # scatter: the root's list; results unknown everywhere
    (1, 7, ([[0]], ["object"], [], [])),
    (0, 8, ([[8]], ["float32"], [[8]], ["float32"])),  # all_to_all: 1 + 4 + 3 elements, flat
    (2, 10, ([[0]], ["object"], [[0]], ["object"])),  # a broadcast of Python values
])  # fmt: skip
def test_sizes_and_dtypes_per_collective(healthy, rank, index, sizes):
    with open(os.path.join(healthy, f"rank_{rank}"), "rb") as f:
        entry = pickle.load(f)["entries"][index]
    assert (entry["input_sizes"], entry["input_dtypes"], entry["output_sizes"], entry["output_dtypes"]) == sizes


def test_reduce_scatter_chunks_of_a_dim_0_that_does_not_divide(tmp_path):
    """As torch.tensor_split: 7 rows on 3 ranks are chunks of 3, 2, 2 (torch's analyser calls that a mismatch)."""
    dumps = [dump(r, 3, [call(0, "reduce_scatter", TRIO, 1, 0.0, 0.1, op="SUM", shapes=[[7, 2]])], 1.0) for r in TRIO]
    data = fr_export.fr_dumps(analyze.load(write(tmp_path, *dumps)))
    assert [data[r]["entries"][0]["output_sizes"] for r in TRIO] == [[[3, 2]], [[2, 2]], [[2, 2]]]


def test_torchs_analyser_finds_nothing_wrong_in_a_healthy_job(healthy, caplog):
    db, logged = analyse(healthy, caplog)
    assert logged == []
    names = [c.collective_name for c in db.collectives]
    assert sorted(set(names)) == sorted(f"gloo:{n}" for n in ("all_reduce", "broadcast", "barrier", "all_gather",
                                                             "reduce_scatter", "gather", "scatter", "all_to_all",
                                                             "reduce", "send 0->1"))  # fmt: skip
    assert len(names) == 13 and all(c.pass_check and c.missing_ranks is None for c in db.collectives)
    assert len(db.ncclcalls) == 3 * 11 + 2 + 2 and all(n.collective_id is not None for n in db.ncclcalls)  # all matched
    assert sorted((g.desc, g.size) for g in db.groups) == [("default_pg", 3), ("undefined", 2), ("undefined", 2)]


def test_torchs_analyser_names_the_collective_ranks_disagree_on(tmp_path, caplog):
    """Rank 1 called broadcast where ranks 0 and 2 called all_reduce #7; all wait in it."""
    odd = {1: call(6, "broadcast", TRIO, 7, 7.0, root=0, line=12)}
    dumps = [dump(r, 3, history(TRIO, 6) + [odd.get(r) or call(6, "all_reduce", TRIO, 7, 7.0, op="SUM", line=10)], 9.0)
             for r in TRIO]  # fmt: skip
    db, logged = analyse(export(tmp_path, *dumps), caplog)
    assert "Collective sequence number: 7 has errors" in logged and "collective state: started" in logged
    (bad,) = [c for c in db.collectives if not c.pass_check]
    assert (bad.collective_seq_id, bad.record_id) == (7, 6)
    theirs = {m.collective_name for m in bad.mismatch_collectives.values()}
    assert {bad.collective_name} | theirs == {"gloo:all_reduce", "gloo:broadcast"}  # which one it starts from varies
    assert all(m.type_of_mismatch.state.name == "COLLECTIVE_TYPE_MISMATCH" for m in bad.mismatch_collectives.values())
    (error,) = [line for line in logged if line.startswith("error msg: ")]
    assert "COLLECTIVE_TYPE_MISMATCH" in error and "'broadcast'" in error and "'all_reduce'" in error
    assert [c.pass_check for c in db.collectives[:6]] == [True] * 6


def test_torchs_analyser_names_a_shape_disagreement(tmp_path, caplog):
    dumps = [dump(r, 2, history((0, 1), 2) + [call(2, "all_reduce", (0, 1), 3, 3.0, op="SUM", shapes=[[4 * (r + 1)]])],
                  5.0) for r in (0, 1)]  # fmt: skip
    db, logged = analyse(export(tmp_path, *dumps), caplog)
    (bad,) = [c for c in db.collectives if not c.pass_check]
    ((_, theirs),) = bad.mismatch_collectives.items()
    assert theirs.type_of_mismatch.state.name == "SIZE_OR_SYNTAX_MISMATCH"
    assert {str(bad.input_sizes), str(theirs.input_sizes)} == {"[[4]]", "[[8]]"}


def test_torchs_analyser_names_a_rank_that_never_called_the_collective(tmp_path, caplog):
    """Rank 1 raised after #4; ranks 0 and 2 wait in (or failed in) all_reduce #5, which it never called."""
    lost = "RuntimeError: Connection closed by peer [127.0.0.1]:44763"
    waiting = [call(4, "all_reduce", TRIO, 5, 5.0, 5.5, op="SUM", state="failed", error=lost),
               call(4, "all_reduce", TRIO, 5, 5.0, op="SUM")]  # fmt: skip
    dumps = [dump(r, 3, history(TRIO, 4) + [waiting[r // 2]], 6.0) for r in (0, 2)]
    dumps.append(dump(1, 3, history(TRIO, 4), 5.2, reason="exception", error="RuntimeError: rank 1 gives up"))
    db, logged = analyse(export(tmp_path, *dumps), caplog)
    assert logged[:6] == ["Not all ranks joining collective, sequence number: 5", "internal record id: 4",
                          "group info: 0:default_pg", "collective: gloo:all_reduce", "missing ranks: {1}",
                          "input sizes: [[4]]"]  # fmt: skip
    assert "collective state: started" in logged  # the failed call too: it never completed
    # A collective that some ranks did not join is not failed by its check: it names them.
    assert [(c.collective_seq_id, c.missing_ranks, c.collective_state) for c in db.collectives] == [
        (1, None, "completed"), (2, None, "completed"), (3, None, "completed"), (4, None, "completed"),
        (5, {1}, "started")]  # fmt: skip
    assert [n.global_rank for n in db.ncclcalls if n.collective_id is None] == [0, 2]  # the calls it matched to none


def _torch_entry(i, seq, name="gloo:all_reduce", size=4, out=None):
    """One of torch's own records (its names and sizes), completed, of the world of TRIO."""
    return {"record_id": i, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
            "p2p_seq_id": 0, "is_p2p": False, "profiling_name": name, "input_sizes": [[size]], "input_dtypes": ["Float"],
            "output_sizes": [[out or size]], "output_dtypes": ["Float"], "state": "completed", "retired": True,
            "timeout_ms": 5000, "time_created_ns": int((T + i) * 1e9), "time_discovered_started_ns": None,
            "time_discovered_completed_ns": int((T + i + 0.5) * 1e9),
            "frames": [{"name": "main", "filename": USER, "line": 40 + i}]}  # fmt: skip


def test_torchs_own_records_are_exported_where_the_dumps_hold_them(tmp_path, caplog):
    """A gloo job whose traffic torch recorded (DDP's all_reduce, FSDP2's _all_gather_base): its records are the
    export, with torch's names and output sizes, and polydist's records of the same job (another numbering) are
    not mixed in; rank 1 never called all_reduce #3."""
    torchs = [_torch_entry(0, 1), _torch_entry(1, 2, "gloo:_all_gather_base", 4, 12), _torch_entry(5, 9, "gloo:new_op")]
    dumps = []
    for r in TRIO:
        d = dump(r, 3, history(TRIO, 2), 9.0)
        d["torch"] = {"buffer": 2000, "groups": {"0": list(TRIO)},
                      "entries": torchs + ([_torch_entry(2, 3)] if r != 1 else [])}  # fmt: skip
        dumps.append(d)
    out = export(tmp_path, *dumps)
    files = {}
    for r in TRIO:
        with open(os.path.join(out, f"rank_{r}"), "rb") as f:
            files[r] = pickle.load(f)
    names = [e["profiling_name"] for e in files[0]["entries"]]
    assert names == ["gloo:all_reduce", "gloo:_all_gather_base", "gloo:all_reduce"]  # a name it does not take: out
    assert [e["collective_seq_id"] for e in files[1]["entries"]] == [1, 2]
    gathered = files[2]["entries"][1]
    assert (gathered["input_sizes"], gathered["output_sizes"], gathered["output_dtypes"]) == ([[4]], [[12]], ["float32"])
    assert gathered["frames"] == [{"name": "main", "filename": USER, "line": 41}]
    assert files[0]["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
    db, logged = analyse(out, caplog)
    assert logged[:5] == ["Not all ranks joining collective, sequence number: 3", "internal record id: 2",
                          "group info: 0:default_pg", "collective: gloo:all_reduce", "missing ranks: {1}"]  # fmt: skip
    assert [(c.collective_seq_id, c.missing_ranks) for c in db.collectives] == [(1, None), (2, None), (3, {1})]


def test_a_rank_without_a_dump_needs_allow_incomplete_ranks(tmp_path, caplog):
    dumps = [dump(r, 3, history(TRIO, 2) + [call(2, "all_reduce", TRIO, 3, 3.0, op="SUM")], 6.0) for r in (0, 1)]
    out = export(tmp_path, *dumps)
    with pytest.raises(AssertionError, match=r"Missing dump files from ranks \{2\}"):
        analyse(out, caplog)
    db, logged = analyse(out, caplog, "--allow-incomplete-ranks")
    assert logged == ["We cannot decide what's wrong with this collective entry because we missed FR dumps from "
                      "ranks ({2}) so we don't have enough information. If you want to debug further use -j to "
                      "dump all raw trace"] * 3  # fmt: skip
    assert [c.collective_seq_id for c in db.collectives] == [1, 2, 3]
    assert len(db.ncclcalls) == 6 and all(n.collective_id is None for n in db.ncclcalls)  # it matched none


def test_a_send_that_its_peer_never_received(tmp_path, caplog):
    """Rank 0 sends to rank 1, which waits in all_reduce #4 with rank 2 instead."""
    r0 = dump(0, 3, history(TRIO, 3) + [call(3, "send", TRIO, None, 4.0, root=1)], 7.0)
    others = [dump(r, 3, history(TRIO, 3) + [call(3, "all_reduce", TRIO, 4, 4.0, op="SUM")], 7.0) for r in (1, 2)]
    db, logged = analyse(export(tmp_path, r0, *others), caplog)
    starts = [i for i, line in enumerate(logged) if line.startswith("Not all ranks joining collective")]
    found = {(logged[i + 3], logged[i + 4]) for i in starts}
    assert found == {("collective: gloo:all_reduce", "missing ranks: {0}"),
                     ("collective: gloo:send 0->1", "missing ranks: {1}")}  # fmt: skip
    assert "group info: p2p 0<->1" in logged
    missing = {(c.collective_name, c.collective_seq_id): c.missing_ranks for c in db.collectives if c.missing_ranks}
    assert missing == {("gloo:all_reduce", 4): {0}, ("gloo:send 0->1", 1): {1}}


def test_just_print_entries_lists_every_rank_s_calls(healthy, caplog, monkeypatch):
    # torch 2.13's -j needs the tabulate package and has no fallback: a stand-in that keeps the rows as they are.
    monkeypatch.setattr(fr_utils, "tabulate", lambda rows, headers=(): [list(headers)] + rows, raising=False)
    with pytest.raises(SystemExit) as stop:
        analyse(healthy, caplog, "-j")
    assert stop.value.code == 0
    (table,) = [r.msg for r in caplog.records if r.name == "Flight Recorder" and r.levelno == logging.INFO]
    assert len(table) == 1 + 13 and table[0] == ["Rank 0", "Rank 1", "Rank 2"]
    assert table[1] == ["all_reduce(input_sizes=[[4]], state=completed)"] * 3
    assert table[-1] == ["send(s=0 d=1, input_sizes=[[4]], state=completed)",
                         "recv(s=0 d=1, input_sizes=[[4]], state=completed)", ""]  # fmt: skip


@pytest.mark.parametrize("backend, lib", [("gloo", "gloo"), ("mpi4py", "gloo"), ("nccl", "nccl")])
def test_the_library_in_profiling_names(tmp_path, backend, lib):
    dumps = analyze.load(write(tmp_path, dump(0, 1, history((0,), 1), 1.0, backend=backend)))
    assert fr_export.fr_dumps(dumps)[0]["entries"][0]["profiling_name"] == f"{lib}:all_reduce"


def test_what_the_analyser_cannot_take_is_left_out(tmp_path):
    entries = [call(0, "send", TRIO, None, 0.0, 0.1, root=None), call(1, "recv", TRIO, None, 0.2, 0.3, root=0),
               call(2, "all_reduce", TRIO, None, 0.4, 0.5), call(3, "fancy_new_collective", TRIO, 1, 0.6, 0.7),
               call(4, "all_reduce", TRIO, 2, 0.8, 0.9, op="SUM")]  # fmt: skip
    (data,) = fr_export.fr_dumps(analyze.load(write(tmp_path, dump(0, 3, entries, 1.0)))).values()
    assert [e["record_id"] for e in data["entries"]] == [4]


def test_the_command_writes_the_files(tmp_path, capsys):
    source, out = tmp_path / "dumps", tmp_path / "fr"
    source.mkdir()
    write(source, *(dump(r, 2, history((0, 1), 2), 3.0, reason="request") for r in (0, 1)))
    code, _, err = run_cli(capsys, str(source), "--fr-trace", str(out))
    assert code == 0 and sorted(os.listdir(out)) == ["rank_0", "rank_1"]
    assert err == (f"polydist trace: wrote 2 Flight Recorder files (rank_<R>) to {out} (read them with "
                   f"python -m torch.distributed.flight_recorder.fr_trace {out})\n")  # fmt: skip
    (out / "rank_7").write_text("an earlier export's")
    (out / "notes.txt").write_text("the user's")
    (source / "rank1.json").unlink()
    code, _, err = run_cli(capsys, str(source), "--fr-trace", str(out))
    assert code == 1 and sorted(os.listdir(out)) == ["notes.txt", "rank_0"]  # rank_1 and rank_7: no dump this time
    assert err.endswith(f"fr_trace --allow-incomplete-ranks {out})\n")
    code, _, err = run_cli(capsys, str(source), "--fr-trace", str(source / "rank0.json" / "x"))
    assert code == 2 and err == f"polydist trace: cannot write {source / 'rank0.json' / 'x'}: Not a directory\n"
