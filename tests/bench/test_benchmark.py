"""polydist.bench units, timing and records: sizes, bus-bandwidth factors, timing, tables, JSON; a 2-rank script run."""

import json
import os
import subprocess
import time

import pytest

from polydist.bench.records import Record, format_table, read_json, run_metadata, write_json, write_markdown
from polydist.bench.timing import Timing, measure, measure_many
from polydist.units import GiB, KiB, MiB, bandwidths, busbw_factor, format_size, parse_size, size_range
from conftest import ROOT


# ------------------------------------------------------------ sizes


@pytest.mark.parametrize(
    "text, expected",
    [("8", 8), ("8B", 8), ("4KiB", 4 * KiB), ("4K", 4 * KiB), ("4kb", 4 * KiB), (" 64MiB ", 64 * MiB),
     ("1GiB", GiB), ("0", 0), (1024, 1024)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "1.5KiB", "-8", "8 bytes", "KiB", "8TiB", -1])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_size_range_and_format_size():
    assert size_range("8", "64") == [8, 16, 32, 64]
    assert size_range("8B", "1MiB", 8) == [8, 64, 512, 4 * KiB, 32 * KiB, 256 * KiB]
    assert size_range(4 * KiB, "4KiB") == [4 * KiB]
    for lo, hi, factor in [(0, 8, 2), (16, 8, 2), (8, 64, 1)]:
        with pytest.raises(ValueError):
            size_range(lo, hi, factor)
    assert [format_size(n) for n in (8, 1536, 4 * KiB, 64 * MiB, GiB)] == ["8B", "1536B", "4KiB", "64MiB", "1GiB"]


# ------------------------------------------------------------ bandwidth


def test_busbw_factors_follow_nccl_tests():
    assert busbw_factor("all_reduce", 2) == 1.0 and busbw_factor("all_reduce", 4) == 1.5
    for name in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        assert busbw_factor(name, 4) == 0.75 and busbw_factor(name, 1) == 0.0
    for name in ("broadcast", "reduce", "send_recv"):
        assert busbw_factor(name, 8) == 1.0
    assert busbw_factor("barrier", 2) is None


def test_bandwidths_in_gb_per_s():
    assert bandwidths("all_reduce", 2 * 10**9, 1.0, 4) == (2.0, 3.0)
    assert bandwidths("all_gather", 10**9, 0.5, 2) == (2.0, 1.0)
    assert bandwidths("all_reduce", 8, None, 2) == (None, None)
    assert bandwidths("barrier", 0, 1e-5, 2) == (None, None)


# ------------------------------------------------------------ timing (serial: no process group)


def test_measure_counts_calls_and_reports_median():
    calls = []
    timing = measure(lambda: calls.append(1), iters=3, warmup=2, repeats=4)
    assert len(calls) == 2 + 3 * 4
    assert timing.iters == 3 and len(timing.per_repeat_s) == 4 and timing.error is None
    assert timing.min_s <= timing.median_s


def test_measure_chooses_iters_from_target_time():
    timing = measure(lambda: time.sleep(0.002), warmup=1, repeats=2, target_s=0.02)
    assert 1 <= timing.iters <= 10  # ceil(0.02 s / >= 2 ms)
    assert timing.median_s >= 0.002


def test_measure_many_interleaves_rotates_and_catches():
    order = []

    def boom():
        raise RuntimeError("nope")

    out = measure_many({"a": lambda: order.append("a"), "b": lambda: order.append("b"), "bad": boom},
                       iters=1, warmup=0, repeats=3, catch=True)
    # round 0: a, b, bad; round 1 starts with b: b, bad, a; round 2 starts with bad: bad, a, b
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert out["bad"].error == "RuntimeError: nope" and out["bad"].median_s is None
    assert out["a"].error is None
    with pytest.raises(RuntimeError, match="nope"):
        measure(boom, iters=1)


def _slow_on_rank_1():
    import polydist as pd

    delay = 0.02 if pd.get_rank() == 1 else 0.0
    timing = measure(lambda: time.sleep(delay), iters=2, warmup=1, repeats=3)
    return timing.per_repeat_s, pd.get_rank()


def test_measure_takes_max_over_ranks(world2):
    (t0, _), (t1, _) = world2.run(_slow_on_rank_1)
    assert t0 == t1 and min(t0) >= 0.02  # every rank reports the slowest rank's time


# ------------------------------------------------------------ records, tables, files


def _record(impl, time_s, size=MiB, collective="all_reduce", **kw):
    timing = Timing(per_repeat_s=(time_s,), iters=10) if time_s is not None else Timing(error="RuntimeError: x")
    return Record.from_timing(collective, impl, timing, size=size, dtype="float32", count=size // 4, **kw)


def test_record_from_timing_serial():
    r = _record("polydist", 1e-3, scale=0.5, note="x")
    assert (r.backend, r.world_size, r.time_s, r.iters, r.repeats) == (None, 1, 5e-4, 10, 1)
    assert r.algbw_GBps == pytest.approx(MiB / 5e-4 / 1e9) and r.busbw_GBps == 0.0  # 2(n-1)/n at n=1
    assert r.extras == {"note": "x"}
    failed = _record("torch", None)
    assert failed.time_s is None and failed.algbw_GBps is None and failed.error == "RuntimeError: x"


def test_format_table_side_by_side_with_ratio():
    records = [_record("polydist", 1.05e-3), _record("torch", 1e-3), _record("polydist", 2e-6, size=8),
               _record("torch", None, size=8), _record("polydist", 3e-6, size=8, collective="broadcast", wrong=True)]
    text = format_table(records, reference="torch")
    lines = text.splitlines()
    assert len(lines) == 2 + 3
    assert "polydist" in lines[0] and "torch" in lines[0] and "time / time of torch" in lines[0]
    assert lines[1].split()[:4] == ["collective", "size(B)", "count", "type"]
    row = lines[2].split()
    assert row[:4] == ["all_reduce", "1048576", "262144", "float32"] and row[4] == "1050.0" and row[-1] == "1.05"
    assert "failed" in lines[3] and lines[3].split()[-1] == "-"
    assert "(wrong)" in lines[4]
    md = format_table(records, reference="torch", markdown=True).splitlines()
    assert md[0].startswith("| collective |") and "polydist time(us)" in md[0] and md[0].endswith("polydist/torch |")
    assert len(md) == 2 + 3 and md[2].count("|") == md[0].count("|")
    with pytest.raises(ValueError, match="reference"):
        format_table(records, reference="ignite")


def test_json_round_trip_and_markdown(tmp_path):
    records = [_record("polydist", 1e-3, tag=1), _record("torch", None)]
    meta = run_metadata(extra_setting=7)
    for key in ("torch", "backend", "world_size", "hostname", "cpu_count", "command", "date"):
        assert key in meta
    path = tmp_path / "sub" / "r.json"
    write_json(records, path, meta)
    doc = json.loads(path.read_text())
    assert doc["meta"]["extra_setting"] == 7 and doc["records"][0]["time_s"] == 1e-3
    meta2, back = read_json(path)
    assert meta2 == meta and back == records
    write_markdown(records, tmp_path / "r.md", meta, title="T", notes="hello")
    text = (tmp_path / "r.md").read_text()
    assert text.startswith("# T\n") and "hello" in text and "| collective |" in text


# ------------------------------------------------------------ one real 2-rank run of a script


@pytest.mark.timeout(120)
def test_overhead_script_quick_two_ranks(cli_env, tmp_path):
    out_json = tmp_path / "overhead.json"
    script = os.path.join(ROOT, "benchmarks", "overhead.py")
    cmd = ["polydist", "run", "--nproc-per-node", "2", "--backend", "gloo", script,
           "--quick", "--sizes", "8,4KiB", "--collectives", "all_reduce,broadcast", "--json", str(out_json)]
    done = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "polydist overhead over torch.distributed" in done.stdout
    meta, records = read_json(out_json)
    assert meta["world_size"] == 2 and meta["backend"] == "gloo"
    got = {(r.collective, r.implementation, r.size) for r in records}
    assert got == {(c, i, s) for c in ("all_reduce", "broadcast") for i in ("polydist", "torch") for s in (8, 4096)}
    assert all(r.time_s > 0 and r.error is None and r.world_size == 2 for r in records)
    assert out_json.with_suffix(".md").exists()


@pytest.mark.timeout(120)
def test_trace_cost_script_quick_two_ranks(cli_env, tmp_path):
    out_json = tmp_path / "trace_cost.json"
    script = os.path.join(ROOT, "benchmarks", "trace_cost.py")
    cmd = ["polydist", "run", "--nproc-per-node", "2", "--backend", "gloo", script, "--quick", "--json", str(out_json)]
    done = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "the recorder's step alone" in done.stdout
    _, records = read_json(out_json)
    assert {(r.implementation, r.size) for r in records} == {(i, 8) for i in ("trace off", "trace on", "trace off again", "torch")}
    assert all(r.time_s > 0 and r.error is None for r in records)
