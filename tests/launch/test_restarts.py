"""Restarts (issue 15): ``spawn(max_restarts=...)``, ``polydist run --max-restarts`` on MPI, ``restart_count``,
and the launcher options of elastic jobs. The main job's restart after a SIGKILL is in
tests/training/test_checkpoint.py; elastic membership across hosts in tests/launch/test_elastic.py."""

import os
import subprocess
import sys
import textwrap

import pytest

import polydist as pd
from polydist import cli
from polydist.launch import elastic
from polydist.launch.environment import restart_count
from polydist.launch.restarts import rerun

from conftest import _mpi_missing

RUN_TIMEOUT_S = 120


# ------------------------------------------------------------ restart_count


def test_restart_count_reads_the_launchers_variables():
    assert restart_count({}) == 0
    assert restart_count({"TORCHELASTIC_RESTART_COUNT": "2"}) == 2
    assert restart_count({"POLYDIST_RESTART_COUNT": "1", "TORCHELASTIC_RESTART_COUNT": "0"}) == 1  # mpi reruns
    with pytest.raises(ValueError, match=r"\$TORCHELASTIC_RESTART_COUNT='two' is not valid"):
        restart_count({"TORCHELASTIC_RESTART_COUNT": "two"})
    with pytest.raises(ValueError, match="restart count -1 is negative"):
        restart_count({"TORCHELASTIC_RESTART_COUNT": "-1"})


def test_rerun_announces_each_failure_and_raises_the_last(capsys):
    calls = []

    def failing(done):
        calls.append(done)
        raise pd.WorkerFailedError(f"rank 1 failed first, run {done}", {1: (3, "")}, 1)

    with pytest.raises(pd.WorkerFailedError) as info:
        rerun(failing, 2)
    assert calls == [0, 1, 2]
    assert str(info.value) == "after 2 restarts (all made):\nrank 1 failed first, run 2" and info.value.root_rank == 1
    err = capsys.readouterr().err
    assert "polydist: restart 1 of 2: rank 1 failed first, run 0\n" in err
    assert "polydist: restarting every worker (restart 2 of 2, 0 left)" in err

    calls.clear()
    rerun(lambda done: calls.append(done) if done else failing(done), 3)  # fails once, then succeeds
    assert calls == [0, 1]
    with pytest.raises(pd.WorkerFailedError, match="^rank 1 failed first, run 0$"):  # no restarts: as before
        rerun(failing, 0)
    calls.clear()
    with pytest.raises(ValueError, match="^max_restarts must be a non-negative int, got -1$"):
        rerun(failing, -1)
    assert calls == []  # refused before anything started


# ------------------------------------------------------------ spawn(max_restarts=...)


def _fails_until(local_rank, failures):
    """Rank 1 raises on the first ``failures`` runs; afterwards every rank reports the restart count."""
    count = pd.restart_count()
    if pd.get_rank() == 1 and count < failures:
        raise RuntimeError(f"rank 1 fails on run {count}")
    return count, pd.all_reduce(pd.get_rank() + 1)


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_spawn_restarts_every_process_and_announces_why(capfd):
    out = pd.spawn("gloo", _fails_until, args=(2,), nproc_per_node=2, max_restarts=3)
    assert out == [(2, 3), (2, 3)]  # both processes of the third run, after two restarts, in one world again
    err = capfd.readouterr().err
    assert err.count("rank 1 (local rank 1, pid ") == 2 and "failed first, with exit code 1" in err
    assert "RuntimeError: rank 1 fails on run 0" in err and "RuntimeError: rank 1 fails on run 1" in err
    assert "polydist: restart 1 of 3: " in err and "polydist: restarting every worker (restart 2 of 3, 1 left)" in err
    assert "restart 3 of 3" not in err


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_spawn_fails_once_the_restarts_are_spent(capfd):
    with pytest.raises(pd.WorkerFailedError) as info:
        pd.spawn("gloo", _fails_until, args=(5,), nproc_per_node=2, max_restarts=1)
    message = str(info.value)
    assert message.startswith("after 1 restart (all made):\nrank 1 (local rank 1, pid ")
    assert "RuntimeError: rank 1 fails on run 1" in message and info.value.root_rank == 1
    assert "polydist: restart 1 of 1: " in capfd.readouterr().err


def test_spawn_rejects_bad_max_restarts_before_starting():
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=f"max_restarts must be a non-negative int, got {bad!r}"):
            pd.spawn("gloo", _fails_until, args=(0,), nproc_per_node=2, max_restarts=bad)


# ------------------------------------------------------------ polydist run --backend mpi --max-restarts


@pytest.mark.skipif(bool(_mpi_missing()), reason=_mpi_missing() or "-")
@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_polydist_run_mpi_reruns_the_job(cli_env, tmp_path):
    script = tmp_path / "flaky.py"
    script.write_text(textwrap.dedent("""
        import sys
        import polydist as pd
        pd.initialize("mpi")
        count = pd.restart_count()
        if pd.get_rank() == 1 and count == 0:
            sys.exit(3)
        print(f"run {count}: sum {pd.all_reduce(pd.get_rank() + 1)}", flush=True)
        pd.finalize()
    """))
    cmd = ["polydist", "run", "--backend", "mpi", "--max-restarts", "2", "--nproc-per-node", "2", str(script)]
    done = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[rank0]: run 1: sum 3" in done.stdout and "[rank1]: run 1: sum 3" in done.stdout, done.stdout
    assert "run 0" not in done.stdout
    assert "polydist: restart 1 of 2: rank 1" in done.stderr and "sys.exit(3)" in done.stderr, done.stderr
    assert "restarting every worker (restart 1 of 2, 1 left)" in done.stderr


# ------------------------------------------------------------ launcher options of elastic jobs


def test_nnodes_and_rdzv_conf_parse_as_torchrun():
    parse = cli._parser().parse_args
    ns = parse(["run", "--nnodes", "1:3", "--rdzv-endpoint", "10.0.0.1:29400", "--rdzv-conf",
                "last_call_timeout=5,join_timeout=60", "--max-restarts", "2", "x.py"])
    assert ns.nnodes == (1, 3) and ns.rdzv_conf == {"last_call_timeout": "5", "join_timeout": "60"}
    assert ns.max_restarts == 2 and parse(["run", "x.py"]).nnodes == (1, 1) and parse(["run", "x.py"]).max_restarts == 0
    for bad in ("0", "3:2", "a:b", "1:"):
        with pytest.raises(SystemExit):
            parse(["run", "--nnodes", bad, "x.py"])
    with pytest.raises(SystemExit):
        parse(["run", "--rdzv-conf", "novalue", "x.py"])


def test_elastic_config_needs_an_endpoint_and_sane_sizes():
    specs = elastic.DefaultLogsSpecs()
    with pytest.raises(ValueError, match=r"needs rdzv_endpoint HOST:PORT.*got None"):
        elastic._config(2, specs, None, nnodes=3, min_nodes=1)
    with pytest.raises(ValueError, match="got 'node0'"):
        elastic._config(2, specs, None, nnodes=3, min_nodes=1, rdzv_endpoint="node0")
    with pytest.raises(ValueError, match="min_nodes 3 is larger than nnodes"):
        elastic._config(2, specs, None, nnodes=2, min_nodes=3, rdzv_endpoint="127.0.0.1:1")
    cfg = elastic._config(2, specs, None, nnodes=3, max_restarts=2, min_nodes=1, rdzv_endpoint="127.0.0.1:29400",
                          rdzv_conf={"last_call_timeout": "1"})
    assert (cfg.rdzv_backend, cfg.min_nodes, cfg.max_nodes, cfg.max_restarts) == ("c10d", 1, 3, 2)
    assert cfg.rdzv_configs["last_call_timeout"] == "1"
    assert cfg.rdzv_configs["is_host"] is True  # 127.0.0.1 is this machine's


def test_the_node_that_owns_the_endpoint_address_hosts_the_rendezvous():
    assert elastic._is_local_address("127.0.0.1") and elastic._is_local_address("localhost")
    assert not elastic._is_local_address("192.0.2.1")  # TEST-NET-1: never an address of this machine
    assert not elastic._is_local_address("no-such-host.invalid")


def test_polydist_run_refuses_negative_max_restarts_on_every_backend(cli_env, tmp_path):
    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    for backend in ("gloo", "mpi"):
        cmd = [sys.executable, "-m", "polydist", "run", "--backend", backend, "--max-restarts", "-1", str(script)]
        done = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "polydist run: max_restarts must be a non-negative int, got -1" in done.stderr, done.stderr


def test_polydist_run_mpi_refuses_elastic_options(cli_env, tmp_path):
    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    cmd = [sys.executable, "-m", "polydist", "run", "--backend", "mpi", "--nnodes", "1:2", "--rdzv-endpoint",
           "127.0.0.1:29400", str(script)]
    done = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--backend mpi starts the ranks of one node with mpiexec" in done.stderr


# ------------------------------------------------------------ torchrun --max-restarts


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_torchrun_restarts_reach_a_working_group(cli_env, tmp_path):
    """torchrun's agent shares one store with every generation of workers and torch's env:// no longer
    prefixes keys by attempt, so restarted gloo workers read their predecessors' addresses ("Connection
    refused", torch 2.13). polydist prefixes them by attempt: each restart meets cleanly."""
    script = tmp_path / "flaky.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        import polydist as pd
        pd.initialize()
        count = pd.restart_count()
        total = pd.all_reduce(torch.ones(1)).item()
        if pd.get_rank() == 1 and count < 2:
            sys.exit(3)
        pd.barrier()  # rank 0 of a failed attempt stops here
        with open(sys.argv[1] + f"/attempt{count}_rank{pd.get_rank()}_sum{total:g}", "w"):
            pass
        pd.finalize()
    """))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    (tmp_path / "out").mkdir()
    cmd = [torchrun, "--nproc-per-node", "2", "--max-restarts", "3", str(script), str(tmp_path / "out")]
    done = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S + 30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Connection refused" not in done.stderr, done.stderr
    assert sorted(os.listdir(tmp_path / "out")) == ["attempt2_rank0_sum2", "attempt2_rank1_sum2"]
