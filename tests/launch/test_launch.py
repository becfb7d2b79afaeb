"""Launching: spawn, Parallel, and the polydist run CLI (success, rank prefixes, failing ranks)."""

import subprocess
import sys
import textwrap

import pytest
import torch

import polydist as pd

pytestmark = pytest.mark.timeout(180)


def _spawned(local_rank, scale, offset=0):
    t = torch.tensor([float(pd.get_rank() + 1)])
    pd.all_reduce(t)
    return local_rank, pd.get_rank(), pd.get_world_size(), pd.backend(), t.item() * scale + offset


def test_spawn_runs_fn_on_every_rank_and_returns_results():
    out = pd.spawn("gloo", _spawned, args=(10,), kwargs_dict={"offset": 1}, nproc_per_node=3)
    assert out == [(r, r, 3, "gloo", 61.0) for r in range(3)]
    assert not pd.is_initialized()  # the parent process stays out of the job


def _fail_on_rank_1(local_rank):
    if pd.get_rank() == 1:
        raise KeyError("rank one is broken")
    pd.barrier()  # the others wait here until the launcher stops them


def test_spawn_failure_names_rank_and_traceback():
    with pytest.raises(pd.WorkerFailedError) as info:
        pd.spawn("gloo", _fail_on_rank_1, nproc_per_node=2)
    assert info.value.root_rank == 1
    text = str(info.value)
    assert text.startswith("rank 1 (local rank 1, pid ") and "failed first, with exit code 1" in text
    assert "KeyError: 'rank one is broken'" in text and "_fail_on_rank_1" in text


def test_parallel_spawns_and_joins():
    with pd.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        out = parallel.run(_spawned, 2, offset=5)
    assert out == [(0, 0, 2, "gloo", 11.0), (1, 1, 2, "gloo", 11.0)]


def test_parallel_without_nproc_runs_here_serially():
    with pd.Parallel() as parallel:
        out = parallel.run(lambda local_rank, x: (local_rank, pd.get_world_size(), x), "v")
    assert out == (0, 1, "v")


def test_spawn_rejects_bad_sizes():
    with pytest.raises(ValueError, match="nproc_per_node should positive, but given 0: nproc_per_node must be a positive int"):
        pd.spawn("gloo", _spawned, nproc_per_node=0)
    with pytest.raises(ValueError, match="master_addr and master_port"):
        pd.spawn("gloo", _spawned, nnodes=2, node_rank=0)


# ------------------------------------------------------------ the CLI

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import polydist as pd

    pd.initialize()
    r = pd.get_rank()
    t = torch.tensor([r + 1.0])
    pd.all_reduce(t)
    print(f"sum={t.item():g} world={pd.get_world_size()} local={pd.get_local_rank()} backend={pd.backend()} "
          f"args={sys.argv[1:]} main={__name__}")
    if "--fail" in sys.argv and r == int(sys.argv[-1]):
        raise ValueError(f"deliberate failure on rank {r}")
    pd.barrier()
    pd.finalize()
    """
)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    return str(path)


def _run(args, env, timeout=120):
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)


def test_cli_run_prefixes_output_with_rank(script, cli_env):
    out = _run(["polydist", "run", "--nproc-per-node", "3", "--backend", "gloo", script, "a", "--b"], cli_env)
    assert out.returncode == 0, out.stderr
    lines = sorted(line for line in out.stdout.splitlines() if "sum=" in line)
    assert lines == [
        f"[rank{r}]: sum=6 world=3 local={r} backend=gloo args=['a', '--b'] main=__main__" for r in range(3)
    ]


def test_cli_failing_rank_ends_job_with_its_traceback(script, cli_env):
    out = _run([sys.executable, "-m", "polydist", "run", "--nproc-per-node", "3", script, "--fail", "2"], cli_env)
    assert out.returncode == 1
    assert "rank 2 (local rank 2, pid " in out.stderr and "failed first, with exit code 1" in out.stderr
    assert "ValueError: deliberate failure on rank 2" in out.stderr
    assert "job.py" in out.stderr


def test_two_jobs_at_once_never_collide(script, cli_env):
    cmd = ["polydist", "run", "--nproc-per-node", "2", script]
    jobs = [subprocess.Popen(cmd, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for job in jobs:
        stdout, stderr = job.communicate(timeout=150)
        assert job.returncode == 0, stderr
        assert stdout.count("sum=3 world=2") == 2


def test_cli_errors_and_info(script, cli_env, tmp_path):
    missing = _run(["polydist", "run", str(tmp_path / "nope.py")], cli_env)
    assert missing.returncode == 2 and "no such script" in missing.stderr
    hostfile = _run(["polydist", "run", "--hostfile", str(tmp_path / "hosts"), "--nproc-per-node", "2", script], cli_env)
    assert hostfile.returncode == 2 and "--hostfile is for --fault-tolerant --backend mpi" in hostfile.stderr
    info = _run(["polydist", "info"], cli_env)
    assert info.returncode == 0 and "world_size" in info.stdout and "launcher" in info.stdout and "serial" in info.stdout


def test_user_environment_reaches_workers_untouched(script, cli_env, tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os, polydist as pd\npd.initialize()\nprint('VAL', os.environ.get('MY_VAR'))\npd.finalize()\n")
    out = _run(["polydist", "run", "--nproc-per-node", "2", str(probe)], {**cli_env, "MY_VAR": "x y"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("VAL x y") == 2


def test_parallel_rejects_at_construction_as_idist():
    """ignite's own test_parallel_wrong_inputs (v0.5.5), plus an absent horovod, all before any process starts."""
    cases = [
        (dict(backend="abc"), r"Unknown backend 'abc'. Available backends:"),
        (dict(backend="xla-tpu"), r"Unknown backend 'xla-tpu'.*Backend should be one of"),  # without torch_xla
        (dict(nnodes=2), r"If backend is None, argument 'nnodes' should be also None"),
        (dict(backend="gloo", nproc_per_node=-1), r"Argument nproc_per_node should positive"),
        (dict(backend="gloo", nproc_per_node=1, nnodes=-1), r"Argument nnodes should positive"),
        (dict(backend="gloo", nproc_per_node=1, nnodes=2), r"If number of nodes larger than one"),
        (dict(backend="gloo", nproc_per_node=1, nnodes=2, node_rank=2), r"Argument node_rank should be between 0 and"),
        (dict(backend="gloo", nproc_per_node=1, nnodes=2, node_rank=1), r"arguments master_addr and master_port"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            pd.Parallel(**kwargs)
    with pytest.raises(ValueError, match="Backend should be one of"):  # ignite's test_xla_distrib_spawn_no_xla_support
        pd.spawn("xla-tpu", _spawned, nproc_per_node=2)
    if not pd.has_hvd_support:
        with pytest.raises(ValueError, match="Unknown backend 'horovod'"):
            pd.spawn("horovod", _spawned, nproc_per_node=2)
