"""A first two-rank job: a tensor summed over the ranks, a string from every rank, a string from rank 0.

Run it from the repository root (``polydist`` is in ``.venv/bin``)::

    polydist run --nproc-per-node 2 examples/hello.py

Under plain ``python examples/hello.py`` it runs as a world of one rank.
"""

import torch

import polydist as pdist

pdist.initialize()  # gloo on CPU, nccl with GPUs; serial under plain python
rank, world = pdist.get_rank(), pdist.get_world_size()
t = torch.arange(2) + 1 + 2 * rank  # rank 0: [1, 2], rank 1: [3, 4]
pdist.all_reduce(t)  # in place, summed over the ranks: [4, 6] on 2 ranks
names = pdist.all_gather(f"rank {rank}")  # a list of str, one per rank
msg = pdist.broadcast("héllo, wörld" if rank == 0 else None, src=0)  # any Unicode
print(f"rank {rank} of {world}: all_reduce -> {t.tolist()}, "
      f"all_gather -> {names}, broadcast -> {msg}")
pdist.finalize()
