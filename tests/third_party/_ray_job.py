"""Ray Train on polydist: ``python _ray_job.py OUT_DIR`` runs a ``TorchTrainer`` of 2 CPU workers (see test_engines.py).

Ray starts the workers and makes their process group (gloo) before the
training function runs; polydist adopts it. Each worker writes what it saw
to ``OUT_DIR/rank<r>.json``: the rank and world size Ray, torch.distributed
and polydist report, collectives across ranks, the main job
(examples/train_digits.py, 5 epochs) with its output, and that Ray's group
outlives ``polydist.finalize()``. The driver then writes ``driver.json``
(the fit's error, if any) after ``ray.shutdown()``.
"""

import json
import os
import sys
import tempfile

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples")


def train(config: dict) -> None:
    import contextlib
    import io

    import ray.train
    import torch
    import torch.distributed as dist

    import polydist

    sys.path.insert(0, EXAMPLES)
    import train_digits

    context = ray.train.get_context()
    rank = context.get_world_rank()
    seen = {
        "ray": [rank, context.get_world_size(), context.get_local_rank()],
        "torch": [dist.get_rank(), dist.get_world_size(), dist.get_backend()],
        "polydist": [polydist.get_rank(), polydist.get_world_size(), polydist.get_local_rank(), polydist.backend()],
        "sum": polydist.all_reduce(rank + 1),
        "gathered": polydist.all_gather(torch.tensor([rank * 10])).tolist(),
        "broadcast": polydist.broadcast("from rank 0" if rank == 0 else None, src=0, safe_mode=True),
    }
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        seen["main_exit"] = train_digits.main(["--epochs", "5"])
    seen["main_output"] = out.getvalue()
    polydist.finalize()  # leaves Ray's group alone
    still = torch.tensor([1.0])
    dist.all_reduce(still)
    seen["ray_group_after_finalize"] = still.item()
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)


def main(out: str) -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    error = None
    try:
        with tempfile.TemporaryDirectory() as storage:
            trainer = TorchTrainer(train, train_loop_config={"out": out},
                                   scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                                   run_config=RunConfig(storage_path=storage, name="polydist"))
            result = trainer.fit()
            error = None if result.error is None else repr(result.error)
    finally:
        ray.shutdown()
    with open(os.path.join(out, "driver.json"), "w") as f:
        json.dump({"error": error, "ray_initialized": ray.is_initialized()}, f)


if __name__ == "__main__":
    main(sys.argv[1])
