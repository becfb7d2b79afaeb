"""MPI on a stock PyTorch wheel (no MPI built in), through polydist's mpi4py backend.

Part 1 is plain torch.distributed code that hard-codes ``backend="mpi"``:
after ``import polydist`` it runs under ``mpiexec`` as on a PyTorch built with
MPI (async collectives, DistributedDataParallel). Part 2 is the same world
through polydist's API, ``polydist.initialize("mpi")``. Checks its own
results and exits 1 on a wrong one. Needs ``pip install mpi4py mpich``::

    mpiexec -n 2 python examples/mpi_stock_wheel.py
"""

import sys

import torch
import torch.distributed as dist
from torch import nn

import polydist as pd  # on a wheel without MPI this also provides torch's "mpi" backend


def check(label, got, want):
    ok = torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want
    print(f"rank {dist.get_rank()}: {label} -> {got}" + ("" if ok else f"   <-- WRONG, expected {want}"), flush=True)
    return 0 if ok else 1


def torch_part() -> int:
    """Unmodified torch.distributed code: rank and world size come from MPI, no init_method."""
    dist.init_process_group("mpi")
    rank, n = dist.get_rank(), dist.get_world_size()
    wrong = check("dist.is_mpi_available(), dist.get_backend()", (dist.is_mpi_available(), dist.get_backend()),
                  (True, "mpi"))

    # Async collective: the Work completes in the background; wait() before reading.
    t = torch.full((2,), float(rank + 1))
    work = dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=True)
    work.wait()
    wrong += check("dist.all_reduce(full((2,), rank + 1), async_op=True)", t, torch.full((2,), n * (n + 1) / 2))

    # Non-blocking point-to-point around a ring.
    out, inc = torch.tensor([rank]), torch.tensor([-1])
    reqs = [dist.isend(out, dst=(rank + 1) % n), dist.irecv(inc, src=(rank - 1) % n)]
    for req in reqs:
        req.wait()
    wrong += check("dist.isend/irecv ring", inc, torch.tensor([(rank - 1) % n]))

    # DDP on the MPI group: different data per rank, gradients all-reduced in backward.
    torch.manual_seed(rank)                           # different init: DDP broadcasts rank 0's
    model = nn.parallel.DistributedDataParallel(nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 3)).square().mean().backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(everyone, flat)
    wrong += check("DDP: parameters identical on all ranks after 3 steps",
                   all(torch.equal(e, everyone[0]) for e in everyone), True)
    dist.destroy_process_group()
    return wrong


def polydist_part() -> int:
    """The same job through polydist: values, uneven shapes, Work.wait() returning the result."""
    pd.initialize("mpi")
    rank, n = pd.get_rank(), pd.get_world_size()
    wrong = check("pd.backend()", pd.backend(), "mpi4py")
    wrong += check("pd.all_reduce(rank + 1)", pd.all_reduce(rank + 1), n * (n + 1) // 2)
    wrong += check("pd.all_gather(f'rank {rank}')", pd.all_gather(f"rank {rank}"), [f"rank {i}" for i in range(n)])
    work = pd.all_gather(torch.arange(rank + 1), async_op=True)   # uneven shapes, async
    wrong += check("pd.all_gather(arange(rank + 1), async_op=True).wait()", work.wait(),
                   torch.cat([torch.arange(i + 1) for i in range(n)]))
    pd.finalize()
    return wrong


def main() -> int:
    wrong = torch_part() + polydist_part()
    if wrong:
        print(f"rank {dist.get_rank() if dist.is_initialized() else '?'}: {wrong} WRONG", flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
