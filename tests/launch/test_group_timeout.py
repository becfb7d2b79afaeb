"""polydist run --timeout for the groups a program creates itself (torch's init_process_group, new_group)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.timeout(120)

# In a process of its own: apply() changes torch's functions for the rest of the process.
IN_PROCESS = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from polydist.launch import group_timeout

    def timeout(pg=None):
        pg = pg if pg is not None else dist.distributed_c10d._get_default_group()
        return pg._get_backend(torch.device("cpu")).options._timeout.total_seconds()

    print("applied", group_timeout.apply(), group_timeout.apply())
    explicit = sys.argv[1] == "explicit"
    kwargs = dict(timeout=timedelta(seconds=42)) if explicit else {}
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, **kwargs)
    print("default", timeout())
    print("new_group", timeout(dist.new_group([0])))
    print("explicit new_group", timeout(dist.new_group([0], timeout=timedelta(seconds=7))))
    dist.destroy_process_group()
    """
)


def _lines(cli_env, how, **env):
    out = subprocess.run([sys.executable, "-c", IN_PROCESS, how], env={**cli_env, **env}, capture_output=True,
                         text=True, timeout=90)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_the_launchers_timeout_is_the_default_of_groups_created_without_one(cli_env):
    lines = _lines(cli_env, "implicit", POLYDIST_TIMEOUT="5")
    assert lines == ["applied True True", "default 5.0", "new_group 5.0", "explicit new_group 7.0"]


def test_an_explicit_timeout_wins(cli_env):
    assert _lines(cli_env, "explicit", POLYDIST_TIMEOUT="5")[1] == "default 42.0"


def test_without_the_launchers_timeout_torchs_default_stays(cli_env):
    env = {k: v for k, v in cli_env.items() if k != "POLYDIST_TIMEOUT"}
    out = subprocess.run([sys.executable, "-c", IN_PROCESS, "implicit"], env=env, capture_output=True, text=True,
                         timeout=90)  # fmt: skip
    assert out.stdout.splitlines()[:2] == ["applied False False", "default 1800.0"], out.stderr


HANGS = textwrap.dedent(
    """
    import time, torch, torch.distributed as dist
    dist.init_process_group("gloo")  # no timeout: polydist run --timeout applies
    if dist.get_rank() == 1:
        time.sleep(300)
    dist.all_reduce(torch.ones(2))
    """
)


def test_polydist_run_timeout_ends_a_plain_torch_program_that_set_none(cli_env, tmp_path):
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    start = time.monotonic()
    out = subprocess.run(["polydist", "run", "--nproc-per-node", "2", "--timeout", "5", str(script)], env=cli_env,
                         capture_output=True, text=True, timeout=100)  # fmt: skip
    assert out.returncode != 0
    assert time.monotonic() - start < 60, "the job waited for torch's default timeout, not --timeout 5"
    assert "Timed out waiting 5000ms" in out.stderr or "timed out" in out.stderr.lower(), out.stderr[-3000:]
