"""DeepSpeed and Ray Train run on polydist: each engine's own view of the world, values computed across ranks.

- DeepSpeed 0.19 (``_deepspeed_job.py``): ``deepspeed.init_distributed("gloo")``
  under torchrun and ``deepspeed.init_distributed("mpi")`` under mpiexec (the
  stock wheel's "mpi" is polydist's stand-in), each group adopted by polydist;
  and ``deepspeed.initialize`` on the group ``polydist.initialize("gloo")``
  made. In each, three ZeRO stage 1 steps of SGD on CPU train to the same
  parameters as one process on the global batch.
- Ray Train 2.60 (``_ray_job.py``): a ``TorchTrainer`` of 2 CPU workers, whose
  gloo group polydist adopts; collectives, the main job
  (examples/train_digits.py, 5 epochs), Ray's group still usable after
  ``polydist.finalize()``, and no process of the job left after ``ray.shutdown()``.

Accelerate (under torchrun: tests/launch/test_announced_world.py; under mpiexec:
test_accelerate_mpi.py) and Lightning Fabric (test_fabric_mpi.py) have their
own files. The commands below are those of docs/howto/engines.md.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _mpi_train import job_env
from _world import LAUNCHER_VARIABLES, mpiexec
from conftest import _mpi_missing

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.engines  # make test-engines; make test leaves them out (about 2 minutes on 2 cores)


def _launch(cmd: list, env: dict, out: Path, ranks: int, timeout: float = 150) -> list:
    """Run ``cmd`` in a session of its own; each rank's report from ``out``.

    The session is killed as a whole past ``timeout``; once ``cmd`` has exited, no process of it may be left.
    """
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"{cmd} did not finish within {timeout:.0f} s:\n{output[-4000:]}") from None
    assert proc.returncode == 0, f"{cmd} exited with {proc.returncode}:\n{output[-6000:]}"
    deadline = time.monotonic() + 10
    while _session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _session_processes(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not left, f"{cmd} left processes behind:\n" + "\n".join(left)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def _session_processes(sid: int) -> list:
    """The processes still in session ``sid`` (Ray's raylet, GCS server and workers run in the driver's)."""
    out = subprocess.run(["ps", "-eo", "pid=,sid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.split()[1:2] == [str(sid)]]


@pytest.fixture
def fresh_env(cli_env) -> dict:
    """cli_env without any launcher's variables inherited from wherever pytest runs."""
    return {k: v for k, v in cli_env.items() if not k.startswith(LAUNCHER_VARIABLES)}


def _torchrun(script: str, *args: str) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(HERE / script), *args]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", ["gloo", "mpi", "polydist"])
def test_deepspeed(mode, cli_env, fresh_env, tmp_path):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install deepspeed==0.19.8)")
    if mode == "mpi":
        if _mpi_missing():
            pytest.skip(_mpi_missing())
        cmd = [mpiexec(), "-n", "2", sys.executable, str(HERE / "_deepspeed_job.py"), mode, str(tmp_path)]
        env = job_env(cli_env)
    else:
        cmd, env = _torchrun("_deepspeed_job.py", mode, str(tmp_path)), dict(fresh_env)
    env["DS_ACCELERATOR"] = "cpu"
    backend = "mpi" if mode == "mpi" else "gloo"
    for rank, seen in enumerate(_launch(cmd, env, tmp_path, 2)):
        assert seen["deepspeed"] == [rank, 2]  # DeepSpeed's own comm.get_rank(), get_world_size()
        assert seen["torch"] == [rank, 2, backend] and seen["polydist"] == [rank, 2, backend]
        assert seen["deepspeed_sum"] == 3.0 and seen["polydist_sum"] == 3  # 1 + 2, through each API
        assert seen["engine"] == [rank, 2, 2, 1]  # global rank, world size, data-parallel size, ZeRO stage
        assert seen["steps"] == 3 and seen["replicas_equal"]
        assert seen["max_diff_vs_one_process"] < 1e-6  # one data-parallel job, not two serial ones


@pytest.mark.timeout(300)
def test_ray_train_torch_trainer(fresh_env, tmp_path):
    pytest.importorskip("ray.train.torch", reason="Ray Train is not installed (pip install 'ray[train]==2.60.0')")
    pytest.importorskip("sklearn")
    env = dict(fresh_env, RAY_USAGE_STATS_ENABLED="0")
    reports = _launch([sys.executable, str(HERE / "_ray_job.py"), str(tmp_path)], env, tmp_path, 2, timeout=240)
    driver = json.loads((tmp_path / "driver.json").read_text())
    assert driver == {"error": None, "ray_initialized": False}
    for rank, seen in enumerate(reports):
        assert seen["ray"] == [rank, 2, rank]  # Ray's world rank, world size, local rank
        assert seen["torch"] == [rank, 2, "gloo"] and seen["polydist"] == [rank, 2, rank, "gloo"]
        assert seen["sum"] == 3 and seen["gathered"] == [0, 10] and seen["broadcast"] == "from rank 0"
        assert seen["main_exit"] == 0  # train_digits.py: parameters identical on every rank
        assert seen["ray_group_after_finalize"] == 2.0  # polydist.finalize() left Ray's group alone
    output = reports[0]["main_output"]
    assert "world size 2, backend gloo" in output and "parameters identical on all 2 ranks" in output
    accuracy = float(output.split("final test accuracy: ")[1].split()[0])
    assert accuracy > 0.9, output
