"""ignite's own library on a polydist world: an Engine with distributed metrics under ``polydist run``, gloo and MPI.

ignite's ``Accuracy`` and ``Loss`` reduce their counts through ignite's own
``ignite.distributed``, which must find the process group polydist created.
Each rank evaluates its shard of a fixed data set (``auto_dataloader``,
``shuffle=False``); the metrics must equal the serial values on the whole set.
"""

import importlib.util
import json
import subprocess

import pytest
import torch

pytest.importorskip("ignite", reason="pytorch-ignite is not installed (pip install pytorch-ignite==0.5.5)")

JOB = r"""
import json, sys, torch
import polydist as pd
from ignite.engine import Engine
from ignite.metrics import Accuracy, Loss

pd.initialize()
torch.manual_seed(0)
x, y = torch.randn(96, 5), torch.randint(0, 3, (96,))
model = torch.nn.Linear(5, 3)
torch.manual_seed(1)
with torch.no_grad():
    model.weight.copy_(torch.randn(3, 5)); model.bias.zero_()

def step(engine, batch):
    with torch.no_grad():
        xb, yb = batch
        return model(xb), yb

evaluator = Engine(step)
Accuracy().attach(evaluator, "accuracy")
Loss(torch.nn.CrossEntropyLoss()).attach(evaluator, "loss")
loader = pd.auto_dataloader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=False)
state = evaluator.run(loader)
import ignite.distributed as idist
print("METRICS", json.dumps({"world": idist.get_world_size(), "rank": pd.get_rank(), **state.metrics}), flush=True)
pd.finalize()
"""


def _serial_metrics() -> dict:
    torch.manual_seed(0)
    x, y = torch.randn(96, 5), torch.randint(0, 3, (96,))
    model = torch.nn.Linear(5, 3)
    torch.manual_seed(1)
    with torch.no_grad():
        model.weight.copy_(torch.randn(3, 5))
        model.bias.zero_()
        out = model(x)
    return {"accuracy": (out.argmax(1) == y).double().mean().item(), "loss": torch.nn.functional.cross_entropy(out, y).item()}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_ignite_engine_metrics_on_polydist(backend, tmp_path, cli_env):
    """gloo, and MPI on stock wheels (polydist's mpi4py process group, under mpiexec)."""
    if backend == "mpi" and importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed")
    script = tmp_path / "evaluate.py"
    script.write_text(JOB)
    out = subprocess.run(
        ["polydist", "run", "--backend", backend, "--nproc-per-node", "2", str(script)],
        env=cli_env, capture_output=True, text=True, timeout=240,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line.split("METRICS ", 1)[1]) for line in out.stdout.splitlines() if "METRICS " in line]
    assert len(rows) == 2, out.stdout
    expected = _serial_metrics()
    for row in rows:
        assert row["world"] == 2  # ignite saw polydist's 2-rank group, not a serial world
        assert row["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-12)
        assert row["loss"] == pytest.approx(expected["loss"], rel=1e-5)
