"""FSDP2 and tensor parallel on any backend: the same program on gloo, MPI (stock wheels) or nccl.

Checks its own results against an unsharded model and exits 1 on a wrong one. Any world size n >= 2::

    polydist run --nproc-per-node 2 examples/sharded_training.py
    polydist run --backend mpi --nproc-per-node 2 examples/sharded_training.py
"""

import copy
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import polydist as pd


def check(label, ok):
    print(f"rank {pd.get_rank()}: {label} -> {ok}" + ("" if ok else "   <-- WRONG"), flush=True)
    return 0 if ok else 1


def mlp(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))


def fsdp(rank: int, n: int, folder: str) -> int:
    """FSDP2 through auto_model, 3 SGD steps against an unsharded copy; a sharded checkpoint and its resume."""
    reference = mlp(seed=0)
    model = pd.auto_model(mlp(seed=rank), use_fsdp=True)  # rank 0's weights everywhere, each rank a shard
    wrong = check("auto_model(use_fsdp=True): parameters are DTensor shards", all(isinstance(p, DTensor) for p in model.parameters()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(4 * n, 8, generator=torch.Generator().manual_seed(step))  # the global batch
        model(x[4 * rank : 4 * rank + 4]).pow(2).mean().backward()  # this rank's quarter...
        reference(x).pow(2).mean().backward()  # ...whose gradients FSDP2 averages into the global mean
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad()
    gap = max((p.full_tensor() - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
    wrong += check("FSDP2 after 3 steps == the unsharded model", gap < 1e-5)

    # Checkpointer saves a sharded model through torch.distributed.checkpoint (each rank its shards)
    ckpt = pd.Checkpointer(f"{folder}/fsdp.pt", model=model, optimizer=opt)
    ckpt.save(3)
    fresh = pd.auto_model(mlp(seed=7), use_fsdp=True)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1)
    resumed = pd.Checkpointer(f"{folder}/fsdp.pt", model=fresh, optimizer=fresh_opt).resume()
    same = all(torch.equal(a.full_tensor(), b.full_tensor()) for a, b in zip(fresh.parameters(), model.parameters()))
    return wrong + check(f"Checkpointer resume of the sharded model: epoch {resumed}, same weights", resumed == 3 and same)


def tensor_parallel(rank: int, n: int) -> int:
    """Megatron-style MLP: first Linear split by columns, second by rows; one all-reduce in forward."""
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("tp",))
    reference = mlp(seed=0)
    model = parallelize_module(copy.deepcopy(reference), mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(42))  # the same input on every rank
    out, want = model(x), reference(x)
    wrong = check(f"tensor parallel: this rank holds {model[0].weight.to_local().shape[0]} of 32 hidden units",
                  model[0].weight.to_local().shape[0] == 32 // n)
    return wrong + check("tensor parallel output == the unsharded model's", torch.allclose(out, want, atol=1e-6))


def main() -> int:
    pd.initialize()
    rank, n = pd.get_rank(), pd.get_world_size()
    if n < 2:
        print("needs at least 2 ranks: polydist run --nproc-per-node 2 examples/sharded_training.py", file=sys.stderr)
        return 2
    folder = pd.broadcast(tempfile.mkdtemp(prefix="polydist-sharded-") if rank == 0 else None, src=0)
    wrong = fsdp(rank, n, folder) + tensor_parallel(rank, n)
    wrong = pd.all_reduce(wrong)  # also: every rank is done with the checkpoint folder
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
        print(f"sharded training on {dist.get_backend()}: " + (f"{wrong} WRONG results" if wrong else f"all results as expected on {n} ranks"))
    pd.finalize()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
