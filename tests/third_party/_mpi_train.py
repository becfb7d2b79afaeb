"""What the Lightning Fabric and Accelerate jobs share: the training set-up, the per-rank report, the mpiexec runner.

Rank side (imported by ``_fabric_train.py`` and ``_accelerate_train.py``, which
``mpiexec`` runs by path, so this folder is on their import path): the first
512 images of scikit-learn's bundled digits, a small MLP with a fixed
initialization, and :func:`report`, which writes what the rank saw and its
final parameters to ``OUT/rank<r>.pt``.

pytest side: :func:`run_job` starts ``mpiexec -n 2 python SCRIPT BACKEND OUT``
and returns the two reports, :class:`Jobs` runs each backend's job once per
test module; :func:`check_job` and :func:`assert_same_training` are the checks
both test files make.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
WORLD = 2
BATCH = 32  # per rank
EPOCHS = 4
LR = 0.2
MOMENTUM = 0.9


# ------------------------------------------------------------------ in the ranks


def digits(n: int = 512) -> torch.utils.data.TensorDataset:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return torch.utils.data.TensorDataset(
        torch.as_tensor(x[:n] / 16.0, dtype=torch.float32), torch.as_tensor(y[:n], dtype=torch.int64)
    )


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def group_class() -> str:
    """The class that carries the default group's CPU collectives: polydist's Python group (the ProcessGroup itself,
    or behind torch's ProcessGroup through polydist's compiled Backend), or torch's C++ backend."""
    pg = dist.group.WORLD
    if "polydist" in sys.modules:  # the gloo reference runs stock, without polydist
        from polydist.backends.dispatch import behind

        group = behind(pg)
        if group is not None:
            return _qualname(type(group))
    if type(pg) is not dist.ProcessGroup:  # a registered Python ProcessGroup is the group itself
        return _qualname(type(pg))
    return _qualname(type(pg._get_backend(torch.device("cpu"))))


def report(out_dir: str, model: torch.nn.Module, losses: list, probes: Optional[dict] = None, **client) -> None:
    """Write this rank's view of the job: torch.distributed's, the client's (``client``), and the trained model.

    ``probes``: outcomes of client features tried after training ("ok" or the error).
    """
    torch.save(
        {
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "backend": dist.get_backend(),
            "group_class": group_class(),
            "losses": losses,
            "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
            "client": client,
            "probes": probes or {},
        },
        os.path.join(out_dir, f"rank{dist.get_rank()}.pt"),
    )


def close(destroy: Callable[[], None] = dist.destroy_process_group) -> None:
    """Leave the job as polydist's exit hook does (polydist/_at_exit.py), also for the stock gloo references.

    DDP's reducer, often cyclic garbage by then, is freed before the group is
    destroyed, and gloo's workers get a moment to finish: stock torch with gloo
    otherwise aborts now and then at interpreter exit ("terminate called without
    an active exception"). Call it after deleting the script's model and optimizer.
    """
    gc.collect()
    destroy()
    time.sleep(0.1)


# ------------------------------------------------------------------ in pytest


def job_env(cli_env: dict, **extra: str) -> dict:
    """The environment of a fresh mpiexec job (tests/backends/mpi4py/test_mpi.py's), plus ``extra``."""
    from backends.mpi4py.test_mpi import _mpi_env

    return dict(_mpi_env(cli_env), **extra)


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run_job(script: str, backend: str, out_dir: Path, env: dict, timeout: float = 90) -> list:
    """``mpiexec -n 2 python SCRIPT BACKEND OUT_DIR`` with ``env``; the reports of rank 0 and rank 1.

    The job runs in its own session, killed as a whole when it outlives ``timeout``.
    """
    from _world import mpiexec

    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(env, OMP_NUM_THREADS="1")  # one thread per rank: the same float summation order on every backend
    command = [mpiexec(), "-n", str(WORLD), sys.executable, str(HERE / script), backend, str(out_dir)]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"{script} {backend} did not finish within {timeout:.0f} s:\n{output[-4000:]}") from None
    assert proc.returncode == 0, f"{script} {backend} exited with {proc.returncode}:\n{output[-6000:]}"
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD)]


class Jobs:
    """Each backend's job of one script, run once on first use (a test module's fixture); a failure is kept too."""

    def __init__(self, script: str, base_dir: Path, env_for: Callable[[str], dict]) -> None:
        self.script, self.base_dir, self.env_for = script, base_dir, env_for
        self._done: dict = {}

    def __call__(self, backend: str) -> list:
        if backend not in self._done:
            try:
                self._done[backend] = run_job(self.script, backend, self.base_dir / backend, self.env_for(backend))
            except AssertionError as exc:
                self._done[backend] = exc
        result = self._done[backend]
        if isinstance(result, AssertionError):
            raise result
        return result


def expected_group_class(backend: str) -> str:
    """gloo: torch's ProcessGroupGloo; "mpi4py" and "mpi" on a stock wheel: polydist's MPIProcessGroup."""
    if backend == "gloo":
        return _qualname(dist.ProcessGroupGloo)
    from polydist.backends.mpi4py import MPIProcessGroup

    return _qualname(MPIProcessGroup)


def check_job(reports: list, backend: str) -> None:
    """Two ranks on ``backend`` (torch.distributed's name and the class behind it), replicas identical, loss down."""
    for rank, rep in enumerate(reports):
        assert (rep["rank"], rep["world_size"]) == (rank, WORLD)
        assert rep["backend"] == backend
        assert rep["group_class"] == expected_group_class(backend)
    first, second = reports
    assert torch.equal(first["params"], second["params"])  # DDP kept the replicas in step
    assert first["losses"] == second["losses"]  # the client's cross-rank mean loss, the same on both ranks
    steps = len(first["losses"])
    assert steps == EPOCHS * 512 // (BATCH * WORLD)
    assert sum(first["losses"][-steps // EPOCHS :]) / (steps // EPOCHS) < 0.5 * first["losses"][0]  # it learned


def assert_same_training(reports: list, reference: list) -> None:
    """The same losses and final parameters as the gloo reference, to float32 rounding."""
    got, want = reports[0], reference[0]
    assert torch.allclose(got["params"], want["params"], rtol=1e-5, atol=1e-6), (
        f"max |difference| {(got['params'] - want['params']).abs().max().item():.3g}"
    )
    assert torch.allclose(torch.tensor(got["losses"]), torch.tensor(want["losses"]), rtol=1e-5, atol=1e-6)
