"""``polydist bench``: arguments, report, plot, and real 2-rank runs (spawned, inside a job, under mpiexec)."""

import argparse
import importlib
import os
import subprocess
import sys

import pytest
import torch.distributed as dist

from polydist.bench import cli as bench
from polydist.bench import report as bench_report
from polydist.bench.records import Record, read_json
from polydist.units import KiB, MiB, busbw_factor, size_range
from conftest import ROOT

QUICK = ["-n", "2", "-w", "1", "--repeats", "2"]  # smoke timing: proves the path, the numbers mean nothing


def _config(*argv, launch=True):
    return bench.config_from_args(bench._parser().parse_args(list(argv)), launch=launch)


def _check_busbw(records):
    for r in records:
        assert r.error is None and r.time_s > 0, r
        assert r.busbw_GBps == pytest.approx(r.algbw_GBps * busbw_factor(r.collective, r.world_size)), r


# ------------------------------------------------------------ arguments


def test_defaults_follow_nccl_tests():
    cfg = _config()
    assert cfg.collectives == ("all_reduce",) and cfg.apis == ("polydist",)
    assert (cfg.iters, cfg.warmup, cfg.repeats, cfg.dtype, cfg.op, cfg.root) == (20, 5, 5, "float32", "SUM", 0)
    assert cfg.sizes == tuple(8 << k for k in range(24)) and cfg.sizes[-1] == 64 * MiB
    assert len(cfg.backends) == 1 and cfg.nproc == 2 and cfg.launch


def test_sizes_factor_step_and_list():
    assert _config("-b", "8", "-e", "64", "-f", "4").sizes == (8, 32)
    assert _config("-b", "1K", "-e", "4K", "-i", "1K").sizes == (KiB, 2 * KiB, 3 * KiB, 4 * KiB)
    assert _config("--sizes", "16MiB,8,4KiB,8").sizes == (8, 4 * KiB, 16 * MiB)
    assert size_range(10, 35, step=10) == [10, 20, 30]
    assert _config("--collective", "all").collectives == bench.COLLECTIVES
    assert _config("-d", "half", "-o", "max", "--api", "polydist,torch").dtype == "float16"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--collective", "all_reduce,allreduce"], "unknown collective 'allreduce'"),
        (["-b", "64", "-e", "8"], "-b 64 is larger than -e 8"),
        (["-b", "1.5K"], "'1.5K'"),
        (["-e", "8 bytes"], "'8 bytes'"),
        (["-b", "8", "-e", "64", "-f", "1"], "factor=1"),
        (["--sizes", "8", "-b", "8"], "--sizes or -b"),
        (["--nproc", "0"], "--nproc must be at least 1, got 0"),
        (["-n", "0"], "-n/--iters must be at least 1"),
        (["--backend", "gloo,tcp"], "backend 'tcp'"),
        (["-d", "float31"], "dtype 'float31'"),
        (["-o", "mean?"], "'mean?'"),
        (["-o", "and"], "AND"),  # on float32
        (["-r", "2"], "-r/--root 2 is not a rank of --nproc 2"),
        (["--api", "ignite"], "--api 'ignite'"),
    ],
)
def test_bad_arguments_fail_before_launching(argv, message, capsys):
    assert bench.run(bench._parser().parse_args(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("polydist bench: ") and message in err


def test_mutually_exclusive_steps_and_several_backends_in_a_job():
    with pytest.raises(SystemExit):
        bench._parser().parse_args(["-f", "2", "-i", "8"])
    with pytest.raises(ValueError, match="only the job's backend"):
        _config("--backend", "gloo,mpi", launch=False)


def test_subparser_and_mpi_child_argv_round_trip(tmp_path):
    parser = argparse.ArgumentParser(prog="polydist")
    sub = parser.add_subparsers(dest="command")
    bench.add_parser(sub)
    ns = parser.parse_args(["bench", "--collective", "all_reduce,broadcast", "-b", "8", "-e", "1K", "-r", "1",
                            "-d", "bfloat16", "-o", "max", "--api", "torch", "-n", "3", "--backend", "gloo,mpi"])
    cfg = bench.config_from_args(ns)
    assert ns.command == "bench" and cfg.backends == ("gloo", "mpi")
    argv = bench.child_argv(cfg, "mpi", str(tmp_path / "r.json"))
    assert argv[:3] == ["-m", "polydist.bench", "--no-launch"]
    child = _config(*argv[2:], launch=False)
    same = ("collectives", "sizes", "iters", "warmup", "repeats", "dtype", "op", "root", "apis")
    assert all(getattr(child, k) == getattr(cfg, k) for k in same)
    assert child.backends == ("mpi",) and child.json == str(tmp_path / "r.json") and child.quiet


def test_missing_mpiexec_is_named_before_launching(monkeypatch, capsys):
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert bench.run(bench._parser().parse_args(["--backend", "gloo,mpi"])) == 2
    assert "mpiexec" in capsys.readouterr().err


# ------------------------------------------------------------ report and plot (no ranks)


def _records():
    out = []
    for impl, scale in (("gloo", 2.0), ("mpi", 1.0)):
        for size in (8, 4 * KiB, MiB):
            for collective in ("all_reduce", "all_gather"):
                t = scale * (20e-6 + size / 1e9)
                algbw = size / t / 1e9
                out.append(Record(collective, impl, "mpi4py" if impl == "mpi" else impl, 2, size, "float32", t,
                                  algbw, algbw * busbw_factor(collective, 2), count=size // 4, iters=2, repeats=1))
    return out


def test_report_table_units_and_ceiling():
    records = _records()
    ceiling = bench_report.memory_ceiling([8, 4 * KiB, MiB], "float32", warmup=1, repeats=2, target_s=0.002)
    bench_report.add_fractions(records, ceiling)
    assert [c.collective for c in ceiling] == [bench_report.CEILING] * 3 and all(c.algbw_GBps > 0 for c in ceiling)
    top = {c.size: c.algbw_GBps for c in ceiling}
    for r in records:
        assert r.extras["busbw_of_ceiling"] == pytest.approx(r.busbw_GBps / top[r.size])
    text = bench_report.format_report(records, ceiling, {"iters": 2, "warmup": 1, "repeats": 2})
    lines = text.splitlines()
    assert lines[0] == "# polydist bench: 2 ranks; gloo, mpi (mpi4py)"
    assert "gloo" in lines[2] and "mpi" in lines[2] and "time / time of gloo" in lines[2]
    row = lines[4].split()
    assert row[:4] == ["all_reduce", "8", "2", "float32"] and row[-1] == "0.50"  # mpi twice as fast as gloo
    assert "all_reduce 2(n-1)/n = 1, all_gather (n-1)/n = 0.5" in text and "GB/s (1e9 B/s)" in text
    head = lines.index(next(x for x in lines if x.startswith("collective  size(B)  add(us)")))
    assert lines[head].split()[-2:] == ["gloo", "mpi"] and len(lines) == head + 1 + 6


def test_plot_png(tmp_path):
    pytest.importorskip("matplotlib")
    records = _records()
    ceiling = bench_report.memory_ceiling([8, MiB], warmup=1, repeats=1, target_s=0.001)
    path = tmp_path / "sub" / "bench.png"
    bench_report.plot(records, ceiling, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_backends_launched_in_turn_are_merged_side_by_side(monkeypatch, tmp_path, capsys):
    fake = _records()

    def spawn(backend, fn, args, nproc_per_node):
        assert fn is bench._spawned and args[1] == backend and nproc_per_node == 2
        return [({"backend": backend}, [r for r in fake if r.implementation == "gloo"]), None]

    def mpiexec_run(cfg, backend):
        if backend == "mpi4py":
            raise bench.WorkerFailedError("rank 1 failed first", {1: (1, "boom")}, 1)
        return {"backend": "mpi4py"}, [r for r in fake if r.implementation == "mpi"]

    monkeypatch.setattr(bench, "spawn", spawn)
    monkeypatch.setattr(bench, "_run_mpiexec", mpiexec_run)
    out = tmp_path / "r.json"
    argv = ["--backend", "gloo,mpi,mpi4py", "--collective", "all_reduce,all_gather", "--json", str(out)]
    assert bench.run(bench._parser().parse_args(argv)) == 1  # mpi4py failed; the others are still reported
    captured = capsys.readouterr()
    assert "time / time of gloo" in captured.out and "backend mpi4py failed: rank 1 failed first" in captured.err
    meta, records = read_json(out)
    assert meta["backend"] == "gloo,mpi,mpi4py" and set(meta["runs"]) == {"gloo", "mpi"}
    assert len(records) == len(fake) and meta["iters"] == 20 and meta["time_over_ranks"] == "max"


# ------------------------------------------------------------ real runs on 2 ranks


@pytest.mark.timeout(120)
def test_two_gloo_ranks_spawned(tmp_path, capsys):
    out = tmp_path / "r.json"
    plot = ["--plot", str(tmp_path / "r.png")] if importlib.util.find_spec("matplotlib") else []
    argv = ["--backend", "gloo", "--nproc", "2", "--collective", "all_reduce,all_gather", "-b", "8", "-e", "64",
            *QUICK, "--ceiling", "--json", str(out), *plot]
    assert bench.run(bench._parser().parse_args(argv)) == 0
    assert "# memory ceiling" in capsys.readouterr().out
    meta, records = read_json(out)
    ceiling = [r for r in records if r.collective == bench_report.CEILING]
    records = [r for r in records if r.collective != bench_report.CEILING]
    assert meta["launcher"] == "polydist bench" and meta["world_size"] == 2 and set(meta["runs"]) == {"gloo"}
    assert [(r.collective, r.size) for r in records] == [(c, s) for c in ("all_reduce", "all_gather")
                                                         for s in (8, 16, 32, 64)]  # fmt: skip
    assert all(r.world_size == 2 and r.backend == "gloo" and r.iters == 2 and r.repeats == 2 for r in records)
    _check_busbw(records)
    assert [c.size for c in ceiling] == [8, 16, 32, 64] and all("busbw_of_ceiling" in r.extras for r in records)
    if plot:
        assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(120)
def test_inside_a_polydist_run_job_every_collective_both_apis(cli_env, tmp_path):
    out = tmp_path / "job.json"
    cmd = [sys.executable, "-m", "polydist", "run", "--nproc-per-node", "2", "--backend", "gloo", "-m",
           "polydist.bench", "--collective", "all", "--sizes", "8,1KiB", "--api", "polydist,torch", *QUICK,
           "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("# polydist bench: 2 ranks; gloo/polydist, gloo/torch") == 1  # rank 0 only
    meta, records = read_json(out)
    assert meta["launcher"] == "run" and meta["backend"] == "gloo" and "runs" not in meta  # measured, not launched
    assert {(r.collective, r.implementation, r.size) for r in records} == {
        (c, f"gloo/{api}", s) for c in bench.COLLECTIVES for api in ("polydist", "torch") for s in (8, KiB)
    }
    assert all(r.world_size == 2 and r.extras["api"] in r.implementation for r in records)
    _check_busbw(records)


def _mpi_backend_missing():
    if dist.is_mpi_available() or "mpi4py" in dist.Backend.backend_list:  # polydist registers mpi4py on import
        return None
    return "no MPI backend: this torch lacks MPI and polydist's mpi4py backend is not registered"


@pytest.mark.timeout(120)
def test_mpi_ranks_under_mpiexec(tmp_path, capsys):
    missing = _mpi_backend_missing()
    if missing:
        pytest.skip(missing)
    out = tmp_path / "r.json"
    argv = ["--backend", "mpi", "--sizes", "8,4KiB", *QUICK, "--ceiling", "--json", str(out)]
    assert bench.run(bench._parser().parse_args(argv)) == 0
    assert "# polydist bench: 2 ranks; mpi (mpi4py)" in capsys.readouterr().out or dist.is_mpi_available()
    meta, records = read_json(out)
    child = meta["runs"]["mpi"]
    assert child["world_size"] == 2 and child["launcher"] == "mpi"
    assert child["versions"]["mpi4py"] and child["versions"]["mpi_library"]
    records = [r for r in records if r.collective != bench_report.CEILING]
    assert [(r.implementation, r.size) for r in records] == [("mpi", 8), ("mpi", 4 * KiB)]
    _check_busbw(records)
    assert all(r.world_size == 2 and "busbw_of_ceiling" in r.extras for r in records)
