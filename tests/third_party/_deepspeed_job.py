"""DeepSpeed on polydist: ``python _deepspeed_job.py MODE OUT_DIR`` on every rank (see test_engines.py).

MODE:

- "gloo": under torchrun, ``deepspeed.init_distributed("gloo")`` makes the group
  and polydist adopts it.
- "mpi": under mpiexec, ``deepspeed.init_distributed("mpi")`` on polydist's
  stand-in for torch's MPI backend (stock wheels have none).
- "polydist": under torchrun, ``polydist.initialize("gloo")`` makes the group
  and ``deepspeed.initialize`` builds its engine on it.

Then, in each mode, a few ZeRO stage 1 steps of SGD on CPU, and this rank's
report to ``OUT_DIR/rank<r>.json``: the rank and world size DeepSpeed,
torch.distributed and polydist report, sums computed across ranks, and
whether the engine trained as one data-parallel job (the parameters equal on
every rank and to a one-process run on the global batch).
"""

import json
import os
import sys

import torch
import torch.distributed as dist

import polydist

import deepspeed  # noqa: E402 - after polydist: torch's "mpi" name is the stand-in's by then
import deepspeed.comm.torch as ds_torch_comm
from deepspeed import comm

# DeepSpeed's CPU accelerator compiles a shared-memory all-reduce for inference at init_distributed
# (about 3 minutes on 2 cores, once per machine); training never uses it, and without it every
# collective goes through torch.distributed, which is what is tested here.
ds_torch_comm.build_shm_op = lambda: None

mode, out_dir = sys.argv[1], sys.argv[2]
STEPS, MICRO, LR = 3, 2, 0.1


def make_engine():
    """A ZeRO stage 1 engine of SGD on a small linear model, and a copy of the model for the reference."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 1},
        "gradient_clipping": 0.0,  # DeepSpeed 0.19 clips at 1.0 unless told; the one-process reference does not
        "zero_allow_untested_optimizer": True,  # torch's SGD: DeepSpeed tests its own optimizers only
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
                                           config=config)
    return engine, reference


if mode == "polydist":
    polydist.initialize("gloo")
    engine, reference = make_engine()  # deepspeed.initialize joins the group polydist made
else:
    deepspeed.init_distributed(dist_backend=mode)  # DeepSpeed makes the group; polydist adopts it
    engine, reference = make_engine()
seen = {
    "deepspeed": [comm.get_rank(), comm.get_world_size()],
    "torch": [dist.get_rank(), dist.get_world_size(), dist.get_backend()],
    "polydist": [polydist.get_rank(), polydist.get_world_size(), polydist.backend()],
}
rank, world = comm.get_rank(), comm.get_world_size()
total = torch.tensor([float(rank + 1)])
comm.all_reduce(total)  # DeepSpeed's collective
seen["deepspeed_sum"] = total.item()
seen["polydist_sum"] = polydist.all_reduce(rank + 1)


def batch(step):
    """The global batch of a step (the same on every rank); rank r trains on rows [r * MICRO, (r + 1) * MICRO)."""
    g = torch.Generator().manual_seed(step)
    return torch.randn(MICRO * world, 4, generator=g), torch.randn(MICRO * world, 2, generator=g)


ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
for step in range(STEPS):
    x, y = batch(step)
    mine = slice(rank * MICRO, (rank + 1) * MICRO)
    loss = torch.nn.functional.mse_loss(engine(x[mine]), y[mine])
    engine.backward(loss)
    engine.step()
    ref_opt.zero_grad()
    torch.nn.functional.mse_loss(reference(x), y).backward()  # one process, the global batch
    ref_opt.step()
params = torch.cat([p.detach().reshape(-1) for p in engine.module.parameters()])
want = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
every = polydist.all_gather(params.reshape(1, -1))
seen["engine"] = [engine.global_rank, engine.world_size, engine.dp_world_size, engine.zero_optimization_stage()]
seen["replicas_equal"] = all(torch.equal(every[0], row) for row in every)
seen["max_diff_vs_one_process"] = (params - want).abs().max().item()
seen["steps"] = engine.global_steps
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(seen, f)
polydist.finalize()
if dist.is_initialized():
    dist.destroy_process_group()
