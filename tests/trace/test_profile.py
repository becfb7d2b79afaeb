"""The comms profile (issue 14, item 4): aggregation on synthetic calls, then real worlds on gloo and MPI.

Each ``_xxx`` function runs on every rank of a shared world (see tests/_world.py)
and returns what the test checks in the parent.
"""

import contextlib
import io
import json
import os
import subprocess
import time

import pytest
import torch

import polydist as pd
from _world import mpi_job_env
from conftest import _mpi_missing
from polydist.units import busbw_factor
from polydist.collectives.recorder import RECORDER
from polydist.trace import profile
from polydist.trace.profile import _pack
from polydist.trace.profile_stats import bucket as _bucket, format_profile, summarize

needs_mpi = pytest.mark.skipif(bool(_mpi_missing()), reason=_mpi_missing() or "-")


# ---------------------------------------------------------------- synthetic rows, no processes


def _entry(collective, group, seq, nbytes, start, end, state="completed", value=False):
    """A flight-recorder entry (the fields of recorder.as_dict that the profile reads)."""
    return {"collective": collective, "group": group, "seq": seq, "bytes": nbytes, "start": start, "end": end,
            "state": state, "value": value}  # fmt: skip


def _synthetic():
    """Three ranks; rank 2's host clock reads 10 s ahead (its offset)."""
    g, pair = [0, 1, 2], [0, 1]

    def at(rank, t):  # rank's clock reading at true time t
        return t + 10.0 * (rank == 2)

    arrivals = [{0: 0.0, 1: 0.3, 2: 0.1}, {0: 1.0, 1: 1.0, 2: 1.5}]  # true times: rank 1 last, then rank 2
    per_rank = {r: [] for r in g}
    for r in g:
        for seq, arrive in enumerate(arrivals, 1):  # all_reduce of 3000 B (bucket 4KiB): 10 ms once all are there
            per_rank[r].append(_entry("all_reduce", g, seq, 3000, at(r, arrive[r]), at(r, max(arrive.values()) + 0.01)))
        per_rank[r].append(_entry("all_gather", g, 3, 100 * (r + 1), at(r, 2.0), at(r, 2.002)))  # 600 B gathered
        per_rank[r].append(_entry("barrier", g, 4, 0, at(r, 3.0), at(r, 3.001)))
        per_rank[r].append(_entry("broadcast", g, 5, 0, at(r, 4.0), at(r, 4.001), value=True))
    per_rank[0].append(_entry("all_reduce", pair, 1, 8, 5.0, 5.001))  # a subgroup call...
    per_rank[1].append(_entry("all_reduce", pair, 1, 8, 5.0, 5.5, state="failed"))  # ...failed on rank 1: partial
    per_rank[0].append(_entry("send", g, None, 1024, 6.0, 6.004))
    per_rank[1].append(_entry("recv", g, None, 1024, 5.9, 6.005))
    per_rank[2].append(_entry("all_reduce", [2, 3], 1, 8, 17.0, 17.1))  # outside the profiled group: dropped
    payloads = [_pack(per_rank[r], frozenset(g)) for r in g]
    return summarize(payloads, g, [0.0, 0.0, 10.0])


def test_bucket_is_the_power_of_two_at_or_above():
    sizes = (None, 0, 1, 2, 3, 4, 5, 1000, 1024, 1025)
    assert [_bucket(s) for s in sizes] == [None, 0, 1, 2, 4, 4, 8, 1024, 1024, 2048]


def test_summarize_synthetic_calls():
    summary = _synthetic()
    rows = {(r["collective"], r["ranks"], r["size"]): r for r in summary["rows"]}
    ar = rows[("all_reduce", 3, 4096)]
    assert ar["calls"] == 2 and ar["bytes"] == 6000 and ar["partial"] == 0
    assert ar["spread_median_s"] == pytest.approx((0.3 + 0.5) / 2) and ar["spread_s"] == pytest.approx(0.8)
    assert ar["median_s"] == pytest.approx(0.01) and ar["time_s"] == pytest.approx(0.02)  # latest end - latest arrival
    assert ar["last"] == [[1, 1], [2, 1]]
    assert ar["algbw_GBps"] == pytest.approx(3000 / 0.01 / 1e9)
    assert ar["busbw_GBps"] / ar["algbw_GBps"] == pytest.approx(busbw_factor("all_reduce", 3))
    gathered = rows[("all_gather", 3, 1024)]  # 100 + 200 + 300 bytes: the gathered buffer
    assert gathered["bytes"] == 600 and gathered["median_s"] == pytest.approx(0.002)
    assert rows[("barrier", 3, 0)]["algbw_GBps"] is None and rows[("barrier", 3, 0)]["calls"] == 1
    value = rows[("broadcast", 3, None)]
    assert value["calls"] == 1 and value["bytes"] == 0 and value["algbw_GBps"] is None
    sub = rows[("all_reduce", 2, 8)]
    assert sub["calls"] == 1 and sub["partial"] == 1 and sub["median_s"] is None and sub["spread_s"] is None
    assert rows[("send", None, 1024)]["median_s"] == pytest.approx(0.004) and rows[("recv", None, 1024)]["calls"] == 1
    assert summary["calls"] == 6 and summary["partial"] == 1 and summary["p2p_calls"] == 2
    by_rank = {s["rank"]: s for s in summary["ranks"]}
    assert by_rank[0]["wait_s"] == pytest.approx(0.3 + 0.5, abs=1e-6) and by_rank[0]["last"] == 0
    assert by_rank[1]["last"] == 1 and by_rank[2]["last"] == 1
    assert by_rank[0]["calls"] == 6 and by_rank[2]["calls"] == 5  # rank 2's call on [2, 3] is not the group's
    assert by_rank[0]["p2p_bytes"] == 1024 and by_rank[2]["p2p_calls"] == 0
    assert [r["collective"] for r in summary["rows"]][-2:] == ["recv", "send"]  # point-to-point last


def test_torchs_operation_names_have_their_collectives_bandwidth():
    """FSDP2's and DDP's calls reach the Python groups under torch's names: the same size rule and busbw factor."""
    from polydist.units import FAMILY, bandwidths

    for torch_name, family in FAMILY.items():
        assert busbw_factor(torch_name, 4) == busbw_factor(family, 4) is not None
        assert bandwidths(torch_name, 1000, 1e-6, 4) == bandwidths(family, 1000, 1e-6, 4)
    assert busbw_factor("barrier", 4) is None and busbw_factor("no_such_op", 4) is None


def test_format_profile_synthetic():
    text = format_profile(dict(_synthetic(), backend="gloo", duration_s=2.5))
    lines = text.splitlines()
    assert lines[0] == ("# polydist comms profile: ranks [0, 1, 2] (gloo), 2.50 s; "
                        "6 collective calls (1 partial), 2 point-to-point")
    row = next(line for line in lines if line.startswith("all_reduce") and "4KiB" in line).split()
    assert row[:5] == ["all_reduce", "3", "4KiB", "2", "5.9KiB"] and row[5:7] == ["20.00ms", "10.00ms"]
    assert "1x1, 2x1" in text and "partial" in lines[1]
    assert any(line.split()[:3] == ["broadcast", "3", "value"] for line in lines)
    header = lines[1]
    columns = ("calls", "bytes", "median", "algbw(GB/s)", "busbw(GB/s)", "spread(med)", "last most often")
    assert all(h in header for h in columns)
    table = [line for line in lines[1:] if line and not line.startswith("#")][:8]
    assert len({len(line) for line in table}) == 1  # aligned: every cell right-justified to its column


def test_sessions_do_nothing_when_off(monkeypatch):
    monkeypatch.delenv("POLYDIST_PROFILE_COMMS", raising=False)
    monkeypatch.setattr(profile, "comms_profile", lambda *a, **k: pytest.fail("start_session entered a profile"))
    keep, on = RECORDER.keep, RECORDER.on
    profile.start_session()
    assert profile._session is None and RECORDER.keep is keep and RECORDER.on is on
    profile.end_session()  # never started: nothing
    profile.end_session()
    assert profile._session is None


def test_end_session_does_not_communicate_when_the_process_fails(monkeypatch):
    closed = []

    class Fake:
        def _close(self, communicate):
            closed.append(communicate)

    monkeypatch.setattr(profile, "_session", Fake())
    monkeypatch.setattr("sys.last_value", ValueError("the script failed"), raising=False)
    profile.end_session()
    profile.end_session()  # idempotent
    assert closed == [False] and profile._session is None


def test_a_profile_outside_a_world_is_empty_and_restores_the_recorder():
    keep, on = RECORDER.keep, RECORDER.on
    with pd.comms_profile(show=False) as prof:
        assert RECORDER.on and isinstance(RECORDER.keep, list)
    assert RECORDER.keep is keep and RECORDER.on is on
    assert prof.as_dict()["rows"] == [] and prof.per_rank[0]["calls"] == 0
    with pytest.raises(KeyError):  # the block's exception goes on; the profile has no summary
        with pd.comms_profile(show=False) as failed:
            raise KeyError("x")
    assert RECORDER.keep is keep and RECORDER.on is on
    with pytest.raises(RuntimeError, match="without an exception"):
        failed.as_dict()


def test_a_profile_is_entered_once():
    keep = RECORDER.keep
    prof = pd.comms_profile(show=False)
    with prof:
        with pytest.raises(RuntimeError, match="^this comms profile is already open$"):
            prof.__enter__()
    assert RECORDER.keep is keep and prof.as_dict()["rows"] == []


# ---------------------------------------------------------------- real worlds


def _mixed_calls():
    """5 all_reduce of 4 KiB, 3 uneven all_gathers, 2 broadcast values, 1 barrier; the recorder off outside."""
    rank, was = pd.get_rank(), RECORDER.on
    RECORDER.on = False  # the profile turns it on and restores it
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        with pd.comms_profile() as prof:
            for _ in range(5):
                pd.all_reduce(torch.ones(1024))
            for _ in range(3):
                pd.all_gather(torch.ones(100 * (rank + 1)))  # 400, 800, 1200 B: 2400 B gathered (3 ranks)
            for _ in range(2):
                pd.broadcast({"step": 1} if rank == 0 else None, src=0)
            pd.barrier()
    restored = (RECORDER.on, RECORDER.keep)
    RECORDER.on = was
    return prof.as_dict(), prof.table(), out.getvalue(), restored


@pytest.mark.timeout(120)
def test_counts_bytes_and_factors(world3):
    results = world3.run(_mixed_calls)
    summary, table, printed, _ = results[0]
    assert all(r[0] == summary for r in results)  # the same summary on every rank
    assert json.loads(json.dumps(summary)) == summary  # plain data: loggable as it is
    assert all(r[3] == (False, None) for r in results)  # the recorder as it was
    rows = {(r["collective"], r["size"]): r for r in summary["rows"]}
    assert set(rows) == {("all_reduce", 4096), ("all_gather", 4096), ("broadcast", None), ("barrier", 0)}
    ar = rows[("all_reduce", 4096)]
    assert ar["calls"] == 5 and ar["bytes"] == 5 * 4096 and ar["partial"] == 0 and ar["ranks"] == 3
    assert ar["busbw_GBps"] / ar["algbw_GBps"] == pytest.approx(2 * 2 / 3)
    ag = rows[("all_gather", 4096)]
    assert ag["calls"] == 3 and ag["bytes"] == 3 * 2400
    assert ag["busbw_GBps"] / ag["algbw_GBps"] == pytest.approx(2 / 3)
    assert rows[("broadcast", None)]["calls"] == 2 and rows[("barrier", 0)]["calls"] == 1
    assert summary["calls"] == 11 and summary["p2p_calls"] == 0
    assert [s["calls"] for s in summary["ranks"]] == [11, 11, 11]
    assert [s["bytes"] for s in summary["ranks"]] == [5 * 4096 + 3 * 400 * (r + 1) for r in range(3)]
    assert summary["backend"] in ("gloo", "mpi4py", "mpi", "horovod") and summary["group"] == [0, 1, 2]
    assert printed == table + "\n" and all(r[2] == "" for r in results[1:])  # shown on rank 0 only
    assert any(line.split()[:4] == ["all_reduce", "3", "4KiB", "5"] for line in table.splitlines())


def _late_rank_1():
    with pd.comms_profile(show=False) as prof:
        for _ in range(3):
            if pd.get_rank() == 1:
                time.sleep(0.2)
            pd.all_reduce(torch.ones(8))
    return prof.as_dict()


@pytest.mark.timeout(120)
def test_a_late_rank_is_named(world3):
    summary = world3.run(_late_rank_1)[0]
    (row,) = summary["rows"]
    assert row["collective"] == "all_reduce" and row["calls"] == 3
    assert row["last"][0] == [1, 3] and row["spread_median_s"] >= 0.15 and row["spread_s"] >= 0.45
    assert row["median_s"] < 0.15  # the collective's own time, without the wait for rank 1
    by_rank = {s["rank"]: s for s in summary["ranks"]}
    assert by_rank[1]["last"] == 3 and by_rank[0]["wait_s"] >= 0.45 and by_rank[1]["wait_s"] < 0.05


def _subgroup_and_p2p():
    rank = pd.get_rank()
    with pd.comms_profile(show=False) as prof:
        pair = pd.new_group([0, 1])
        if rank in (0, 1):
            pd.all_reduce(torch.ones(16), group=pair)
            pd.all_reduce(torch.ones(16), group=[0, 1])  # the same group as a rank list
        if rank == 0:
            pd.send(torch.ones(256), dst=2)
        elif rank == 2:
            pd.recv(torch.empty(256), src=0)
        with pd.comms_profile(group=[0, 1], show=False) as inner:  # ranks 0, 1 only; a no-op on rank 2
            if rank in (0, 1):
                pd.all_reduce(7, group=[0, 1])
    return prof.as_dict(), inner.as_dict() if rank in (0, 1) else None


@pytest.mark.timeout(120)
@pytest.mark.subgroups
@pytest.mark.p2p
def test_subgroups_point_to_point_and_nesting(world3):
    results = world3.run(_subgroup_and_p2p)
    summary = results[0][0]
    rows = {(r["collective"], r["ranks"], r["size"]): r for r in summary["rows"]}
    assert rows[("all_reduce", 2, 64)]["calls"] == 2 and rows[("all_reduce", 2, 64)]["partial"] == 0
    assert rows[("all_reduce", 2, 64)]["busbw_GBps"] / rows[("all_reduce", 2, 64)]["algbw_GBps"] == pytest.approx(1.0)
    assert rows[("send", None, 1024)]["calls"] == 1 and rows[("recv", None, 1024)]["calls"] == 1
    assert rows[("send", None, 1024)]["point_to_point"] and rows[("send", None, 1024)]["algbw_GBps"] is None
    assert rows[("all_reduce", 2, None)]["calls"] == 1  # the inner profile's value all_reduce counts in the outer
    inner = results[0][1]
    assert inner == results[1][1] and results[2][1] is None
    assert inner["group"] == [0, 1] and [(r["collective"], r["calls"]) for r in inner["rows"]] == [("all_reduce", 1)]


def _session(flag):
    os.environ["POLYDIST_PROFILE_COMMS"] = flag
    try:
        profile.start_session()
        started = profile._session is not None
        pd.all_reduce(torch.ones(4))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            profile.end_session()
            profile.end_session()  # a second time: nothing
        return started, out.getvalue(), RECORDER.keep is None
    finally:
        del os.environ["POLYDIST_PROFILE_COMMS"]


@pytest.mark.timeout(120)
def test_session_prints_on_rank_0(world2):
    results = world2.run(_session, "1")
    assert [r[0] for r in results] == [True, True] and all(r[2] for r in results)
    assert results[0][1].startswith("# polydist comms profile: ranks [0, 1]") and results[1][1] == ""
    assert any(line.split()[:4] == ["all_reduce", "2", "16B", "1"] for line in results[0][1].splitlines()), results[0][1]
    off = world2.run(_session, "0")
    assert off == [(False, "", True)] * 2


# ---------------------------------------------------------------- polydist run --profile-comms

JOB = """
import sys, time, torch, polydist as pd
pd.initialize()
for _ in range(4):
    if pd.get_rank() == 1:
        time.sleep(0.2)
    pd.all_reduce(torch.ones(1000))
if sys.argv[1] == "fail" and pd.get_rank() == 1:
    raise ValueError("rank 1 fails")
pd.all_reduce(torch.ones(8))  # rank 0 waits here for the failed rank
pd.finalize()
"""


def _job(tmp_path, cli_env, how, backend="gloo"):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {k: v for k, v in mpi_job_env(cli_env).items() if not k.startswith("POLYDIST_")}  # Open MPI: as root too
    env["POLYDIST_TIMEOUT"] = "60"
    command = ["polydist", "run", "--nproc-per-node", "3", "--backend", backend, "--profile-comms", str(script), how]
    began = time.monotonic()
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=150)
    return out, time.monotonic() - began


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["gloo", pytest.param("mpi", marks=needs_mpi)])
def test_polydist_run_profile_comms_prints_on_rank_0(tmp_path, cli_env, backend):
    out, _ = _job(tmp_path, cli_env, "ok", backend)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert sum("# polydist comms profile: ranks [0, 1, 2]" in line for line in lines) == 1
    assert all(line.startswith("[rank0]: ") for line in lines if "polydist comms profile" in line)
    row = next(line for line in lines if "all_reduce" in line and "4KiB" in line).split()
    assert row[1:6] == ["all_reduce", "3", "4KiB", "4", "15.6KiB"] and row[-1] == "1x4"


@pytest.mark.timeout(180)
def test_a_failing_rank_does_not_wait_for_the_profile(tmp_path, cli_env):
    """The failing rank skips the profile's collectives at exit; otherwise it would wait its 60 s timeout."""
    out, took = _job(tmp_path, cli_env, "fail")
    assert out.returncode != 0 and "rank 1 fails" in out.stderr
    assert took < 40, f"the job took {took:.0f} s to end"
    assert "polydist comms profile" not in out.stdout


def _out_of_step():
    from polydist.context import world
    from polydist.groups import resolve

    res = resolve(world(), None)
    skew = 5 * pd.get_rank()  # as if rank 1 had once called 5 collectives fewer (an error it recovered from)
    res.seq -= skew
    try:
        with pd.comms_profile(show=False) as prof:
            pd.all_reduce(torch.ones(4))
        return prof.as_dict()
    finally:
        res.seq += skew


@pytest.mark.timeout(120)
def test_calls_match_when_the_ranks_call_numbers_are_out_of_step(world2):
    summary = world2.run(_out_of_step)[0]
    assert (summary["calls"], summary["partial"]) == (1, 0)
    [row] = summary["rows"]
    assert row["collective"] == "all_reduce" and row["median_s"] is not None
