"""torchrun's habits: a torchrun command line runs with ``polydist run`` in torchrun's place.

``--standalone``, ``--nproc-per-node auto|cpu|gpu``, ``--local-ranks-filter``,
``--log-dir``, ``-r/--redirects``, ``-t/--tee``, ``--no-python``,
``-m/--module``, ``--rdzv-backend``; a wrong flag shows ``polydist run``'s
usage; and a program under torchrun itself writes its dump on an uncaught
exception when ``POLYDIST_TRACE_DIR`` is set.
"""

import argparse
import glob
import json
import os
import subprocess
import sys

import pytest
import torch
from torch.distributed.elastic.multiprocessing import Std

from polydist import cli
from polydist.launch import torchrun_flags
from polydist.launch.worker_logs import Logs, logs_specs

pytestmark = pytest.mark.timeout(60)


def _parse(*argv: str) -> argparse.Namespace:
    return cli._parser().parse_args(["run", *argv])


def _usage_error(capsys, *argv: str) -> str:
    """Parse ``polydist run ARGV``, which must fail as a usage error; its stderr."""
    with pytest.raises(SystemExit) as done:
        cli.main(["run", *argv])
    assert done.value.code == 2
    return capsys.readouterr().err


# ------------------------------------------------------------ the command line (no process started)


def test_a_wrong_flag_shows_polydist_runs_usage(capsys):
    err = _usage_error(capsys, "--nproc-per-node", "2", "--bogus", "x.py")
    assert err.startswith("usage: polydist run "), err
    assert err.rstrip().endswith("polydist run: error: unrecognized arguments: --bogus")
    assert "{run,bench,trace,info}" not in err


def test_nproc_per_node_takes_torchruns_words():
    from torch.distributed.run import determine_local_world_size

    assert _parse("--nproc-per-node", "3", "x.py").nproc_per_node == 3
    assert _parse("--nproc_per_node=cpu", "x.py").nproc_per_node == determine_local_world_size("cpu")
    assert _parse("--nproc-per-node", "auto", "x.py").nproc_per_node == determine_local_world_size("auto")
    assert _parse("x.py").nproc_per_node == 1


def test_nproc_per_node_refuses_what_torchrun_refuses(capsys):
    assert "argument --nproc-per-node/--nproc_per_node: must be at least 1, got '0'" in _usage_error(
        capsys, "--nproc-per-node", "0", "x.py")
    assert "expected a number, auto, cpu, gpu or xpu; got 'many'" in _usage_error(
        capsys, "--nproc-per-node", "many", "x.py")
    if not torch.cuda.is_available():
        err = _usage_error(capsys, "--nproc-per-node", "gpu", "x.py")
        assert err.startswith("usage: polydist run ") and "gpu: Cuda is not available on this machine" in err


def test_output_flags_parse_as_torchruns():
    ns = _parse("--log-dir", "/tmp/l", "-r", "1", "-t", "0:3,1:2", "--local-ranks-filter", "0,2", "x.py")
    assert (ns.log_dir, ns.redirects, ns.tee) == ("/tmp/l", Std.OUT, {0: Std.ALL, 1: Std.ERR})
    assert ns.local_ranks_filter == frozenset({0, 2})
    ns = _parse("--log_dir=/tmp/l", "--redirects", "3", "--tee", "2", "--local_ranks_filter=1", "x.py")
    assert (ns.log_dir, ns.redirects, ns.tee, ns.local_ranks_filter) == ("/tmp/l", Std.ALL, Std.ERR, frozenset({1}))
    assert torchrun_flags.logs(_parse("x.py")) == Logs()


@pytest.mark.parametrize("argv, words", [
    (("--tee", "4"), "argument -t/--tee: expected 0 none, 1 stdout, 2 stderr, 3 both"),
    (("-r", "0:9"), "argument -r/--redirects: expected"),
    (("--local-ranks-filter", "a,b"), "expected local ranks separated by commas"),
    (("--local-ranks-filter", "-1"), "local ranks are 0 or more"),
])
def test_bad_output_flags_are_usage_errors(capsys, argv, words):
    err = _usage_error(capsys, *argv, "x.py")
    assert err.startswith("usage: polydist run ") and words in err, err


def test_program_flags_and_the_script_arguments():
    ns = _parse("--no-python", "prog", "--tee", "x")
    assert ns.no_python and ns.script == "prog" and ns.args == ["--tee", "x"]  # after SCRIPT: the program's own
    assert _parse("--no_python", "prog").no_python
    assert _parse("--module", "pkg.train").module and _parse("-m", "pkg.train").module


def test_standalone_ignores_the_rendezvous_flags_as_torchrun():
    ns = _parse("--standalone", "--rdzv-endpoint", "h:1", "--master-addr", "h", "--master-port", "2",
                "--node-rank", "0", "x.py")
    assert torchrun_flags.settle(ns) is None
    assert (ns.rdzv_endpoint, ns.master_addr, ns.master_port, ns.nnodes) == (None, None, None, (1, 1))
    refused = torchrun_flags.settle(_parse("--standalone", "--nnodes", "2", "x.py"))
    assert refused.startswith("--standalone runs one node, but --nnodes is 2")


def test_rdzv_backend_as_torchrun():
    ns = _parse("--rdzv-backend", "static", "--rdzv-endpoint", "node0:29500", "--nnodes", "2", "x.py")
    assert torchrun_flags.settle(ns) is None
    assert (ns.master_addr, ns.master_port, ns.rdzv_endpoint) == ("node0", 29500, None)
    ns = _parse("--rdzv_backend=c10d", "--rdzv_endpoint=node0:29400", "--nnodes", "1:2", "x.py")
    assert torchrun_flags.settle(ns) is None and ns.rdzv_endpoint == "node0:29400"
    assert "needs --rdzv-endpoint" in torchrun_flags.settle(_parse("--rdzv-backend", "c10d", "--nnodes", "2", "x.py"))
    etcd = torchrun_flags.settle(_parse("--rdzv-backend", "etcd", "x.py"))
    assert etcd.startswith("--rdzv-backend etcd: polydist run meets on torch's c10d rendezvous")


@pytest.mark.parametrize("argv, line", [
    (("--no-python", "-m", "x"), "--no-python and -m/--module do not go together"),
    (("--no-python", "no-such-program-here"), "--no-python: no executable program no-such-program-here"),
    (("--backend", "mpi", "--tee", "3", "{script}"), "--tee is not available with --backend mpi: mpiexec starts"),
    (("--backend", "mpi", "--no-python", "sh"), "--no-python is not available with --backend mpi"),
    (("--fault-tolerant", "--log-dir", "d", "{script}"), "--log-dir is not available with --fault-tolerant"),
    (("--fault-tolerant", "--local-ranks-filter", "0", "{script}"),
     "--local-ranks-filter is not available with --fault-tolerant"),
])
def test_refused_before_any_rank_starts(capsys, tmp_path, argv, line):
    script = tmp_path / "job.py"
    script.write_text("raise SystemExit('a rank started')\n")
    assert cli.main(["run", *(a.format(script=script) for a in argv)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith(f"polydist run: {line}") and out.err.count("\n") == 1, out.err


def test_the_console_streams_are_teed_for_the_prefix():
    """Prefixed: every stream torchrun would show is teed (torch prefixes only what it tails); else torch's own."""
    logs = Logs(redirects={0: Std.OUT}, tee={1: Std.ERR}, local_ranks_filter=frozenset({1}))
    with logs_specs(logs, 2, prefixed=True) as specs:
        assert specs._tee == {0: Std.ERR, 1: Std.ALL} and specs._redirects == {0: Std.OUT, 1: Std.NONE}
        assert specs._local_ranks_filter == {1} and os.path.isdir(specs.root_log_dir)
    assert not os.path.exists(specs.root_log_dir)  # a temporary folder: removed
    with logs_specs(logs, 2, prefixed=False) as specs:
        assert specs._tee == {0: Std.NONE, 1: Std.ERR}


def test_help_names_the_torchrun_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--standalone", "--no-python", "--log-dir", "-r SPEC, --redirects SPEC", "-t SPEC, --tee SPEC",
                 "--local-ranks-filter", "-m, --module", "--rdzv-backend", "N|auto|cpu|gpu|xpu"):
        assert flag in text, flag
    assert "MPI collectives have no timeout" not in text


# ------------------------------------------------------------ real runs: 2 ranks, a tiny program

PRINTS = """import os, sys
r = os.environ["RANK"]
print(f"out of rank {r}")
print(f"err of rank {r}", file=sys.stderr)
"""


@pytest.mark.timeout(120)
def test_standalone_tee_filter_and_log_dir(cli_env, tmp_path):
    script = tmp_path / "prints.py"
    script.write_text(PRINTS)
    logs = tmp_path / "logs"
    out = subprocess.run(["polydist", "run", "--standalone", "--nproc-per-node", "2", "--tee", "3",
                          "--local-ranks-filter", "1", "--log-dir", str(logs), str(script)],
                         env=cli_env, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[rank1]: out of rank 1"]
    assert "[rank1]: err of rank 1" in out.stderr and "of rank 0" not in out.stderr
    (run_dir,) = glob.glob(str(logs / "*"))
    assert f"polydist run: this node's logs are in {run_dir} " in out.stderr
    for rank in (0, 1):  # a filtered rank's output is still in its files
        folder = os.path.join(run_dir, "attempt_0", str(rank))
        assert open(os.path.join(folder, "stdout.log")).read() == f"out of rank {rank}\n"
        assert open(os.path.join(folder, "stderr.log")).read() == f"err of rank {rank}\n"


@pytest.mark.timeout(120)
def test_no_python_runs_a_program_and_redirects_stdout(cli_env, tmp_path):
    program = tmp_path / "prints.sh"
    program.write_text('#!/bin/sh\necho "out of rank $RANK of $WORLD_SIZE"\necho "err of rank $RANK" >&2\n')
    program.chmod(0o755)
    logs = tmp_path / "logs"
    out = subprocess.run(["polydist", "run", "--nproc_per_node=2", "--no-python", "-r", "0:1", "--log-dir",
                          str(logs), str(program)], env=cli_env, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[rank1]: out of rank 1 of 2"]  # rank 0's stdout: to its file only
    assert "[rank0]: err of rank 0" in out.stderr and "[rank1]: err of rank 1" in out.stderr
    (stdout,) = glob.glob(str(logs / "*" / "attempt_0" / "0" / "stdout.log"))
    assert open(stdout).read() == "out of rank 0 of 2\n"


FAILS = """
import polydist as pd
pd.initialize()
if pd.get_rank() == 1:
    raise ValueError("rank one is broken")
pd.barrier()
"""


@pytest.mark.timeout(120)
def test_a_program_under_torchrun_writes_its_dump_when_it_raises(cli_env, tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(FAILS)
    traces = tmp_path / "traces"
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script)], env={**cli_env, "POLYDIST_TRACE_DIR": str(traces)},
                         capture_output=True, text=True, timeout=100)
    assert out.returncode != 0
    assert "ValueError: rank one is broken" in out.stderr  # the traceback is still printed, by torch's hook
    dump = json.loads((traces / "rank1.json").read_text())
    assert dump["reason"] == "exception" and dump["error"] == "ValueError: rank one is broken"
