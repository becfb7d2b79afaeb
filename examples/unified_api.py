"""One training script, unchanged under every launcher: initialize/finalize, auto_* helpers, spawn/Parallel.

A linear model is fitted to synthetic data (y = x @ w_true + 0.5) with DDP
(``auto_model``), an optimizer whose state starts identical everywhere
(``auto_optim``) and a sharded loader (``auto_dataloader``). Each rank prints
one line; the script checks that the loss went down and that every rank holds
identical parameters, and exits 1 otherwise. Run it with any launcher, or none::

    python examples/unified_api.py                                   # serial: world size 1
    polydist run --nproc-per-node 2 examples/unified_api.py
    torchrun --nproc-per-node 2 examples/unified_api.py
    mpiexec -n 2 python examples/unified_api.py
    python examples/unified_api.py --spawn 2                         # polydist.spawn
    python examples/unified_api.py --parallel 2                      # polydist.Parallel
    python examples/unified_api.py --backend xla-tpu --spawn 1       # torch_xla (TPU; or PJRT_DEVICE=CPU)
"""

import argparse
import contextlib
import io
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

import polydist as pd


def training(local_rank: int, epochs: int) -> dict:
    """The per-rank job: called inside an initialized world (or serially)."""
    rank, world = pd.get_rank(), pd.get_world_size()
    with contextlib.redirect_stdout(io.StringIO()):
        launcher = pd.show_config()["launcher"]   # show_config() prints; keep only its dict here

    gen = torch.Generator().manual_seed(0)            # the same data set on every rank
    x = torch.randn(256, 4, generator=gen)
    y = x @ torch.tensor([1.0, -2.0, 3.0, 0.5]) + 0.5
    loader = pd.auto_dataloader(TensorDataset(x, y), batch_size=32, seed=0)  # 32 = global batch

    torch.manual_seed(rank)                           # different init per rank on purpose:
    model = pd.auto_model(nn.Linear(4, 1))            # DDP broadcasts rank 0's parameters
    optimizer = pd.auto_optim(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))

    losses = []
    for _ in range(epochs):                           # each pass over the loader is the next epoch
        total, count = 0.0, 0
        for xb, yb in loader:
            xb, yb = xb.to(pd.device()), yb.to(pd.device())
            loss = nn.functional.mse_loss(model(xb).squeeze(1), yb)
            optimizer.zero_grad()
            loss.backward()                           # DDP averages the gradients here
            optimizer.step()
            total, count = total + loss.item() * len(yb), count + len(yb)
        losses.append(pd.all_reduce(total) / pd.all_reduce(count))   # Python floats/ints: exact sums

    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = pd.all_gather(params.unsqueeze(0))     # (world, 5)
    identical = bool((everyone == everyone[0]).all())
    print(f"rank {rank}/{world} (local rank {local_rank}, launcher {launcher}, backend {pd.backend()}): "
          f"{len(loader)} batches of {loader.batch_size} per epoch, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"parameters identical on all ranks: {identical}", flush=True)
    return {"rank": rank, "ok": identical and losses[-1] < 0.1 * losses[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--spawn", type=int, metavar="N", help="start N processes here with polydist.spawn")
    parser.add_argument("--parallel", type=int, metavar="N", help="start N processes here with polydist.Parallel")
    parser.add_argument("--backend", help="the backend (spawn/Parallel: default gloo; else the launcher's default)")
    args = parser.parse_args()

    if args.spawn:
        # spawn(backend, fn, args, kwargs_dict, nproc_per_node): fn(local_rank, *args) on each process;
        # returns their results by local rank.
        results = pd.spawn(args.backend or "gloo", training, args=(args.epochs,), nproc_per_node=args.spawn)
    elif args.parallel:
        with pd.Parallel(backend=args.backend or "gloo", nproc_per_node=args.parallel) as parallel:
            results = parallel.run(training, args.epochs)
    else:
        # Whatever started this process (a launcher, or none): join its job, or stay serial.
        pd.initialize(args.backend)
        results = [training(pd.get_local_rank(), args.epochs)]
        pd.finalize()

    ok = all(r["ok"] for r in results)
    if args.spawn or args.parallel:
        print(f"{'spawn' if args.spawn else 'Parallel'} returned {results}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
