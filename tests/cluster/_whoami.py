"""One rank of a job started by Slurm (srun, sbatch, polydist run or torchrun in a step, mpiexec): prints one
``WHOAMI {json}`` line with what polydist found (rank, world size, local rank, node rank, host name, backend) and
the results of three collectives across the nodes, which the tests check on every rank:

* ``all_reduce`` of a tensor holding ``rank + 1`` (sum ``W (W + 1) / 2``);
* ``all_gather`` of a Python value (each rank's host name and Slurm node id, so every rank sees every node);
* ``all_gather_tensors_with_shapes`` of a ``(rank + 1, 3)`` tensor (an any-shape collective).

``--parallel``: the same inside ``polydist.Parallel(backend=...)`` as ignite's docs show ``idist.Parallel``.
``--big-mib N``: also an all_reduce of N MiB of float32 (traffic to see on the link).
``--fail-rank R``: rank R raises after the collectives (the failure-handling jobs). ``--sleep S``: then sleep.
"""

import argparse
import json
import os
import sys
import time

import torch

import polydist as pdist


def report(local_rank, args):
    rank, world = pdist.get_rank(), pdist.get_world_size()
    total = pdist.all_reduce(torch.tensor([float(rank + 1)])).item()
    peers = pdist.all_gather({"rank": rank, "hostname": pdist.hostname(), "slurm_nodeid": os.environ.get("SLURM_NODEID")})
    shapes = [[r + 1, 3] for r in range(world)]
    shaped = pdist.all_gather_tensors_with_shapes(torch.full((rank + 1, 3), float(rank)), shapes)
    if args.big_mib:
        big = pdist.all_reduce(torch.ones(args.big_mib * 2**18))
        assert bool((big == world).all()), f"rank {rank}: all_reduce of {args.big_mib} MiB is wrong"
    me = {
        "rank": rank, "world_size": world, "local_rank": pdist.get_local_rank(), "local_rank_arg": local_rank,
        "node_rank": pdist.get_node_rank(), "nnodes": pdist.get_nnodes(), "nproc_per_node": pdist.get_nproc_per_node(),
        "hostname": pdist.hostname(), "uname": os.uname().nodename, "backend": pdist.backend(),
        "all_reduce": total, "peers": peers, "shapes": [list(t.shape) for t in shaped],
        "shaped_ok": all(bool((t == r).all()) for r, t in enumerate(shaped)),
        "netns": os.readlink("/proc/self/ns/net"),
        "slurm": {k: os.environ.get(k) for k in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_ID")},
    }
    print("WHOAMI " + json.dumps(me), flush=True)
    if rank == args.fail_rank:
        raise RuntimeError(f"rank {rank} fails on purpose")
    time.sleep(args.sleep)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default=None)
    parser.add_argument("--parallel", action="store_true")
    parser.add_argument("--big-mib", type=int, default=0)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--sleep", type=float, default=0)
    args = parser.parse_args()
    if args.parallel:
        with pdist.Parallel(backend=args.backend) as parallel:
            parallel.run(report, args)
        return
    pdist.initialize(args.backend)
    report(pdist.get_local_rank(), args)
    pdist.finalize()


if __name__ == "__main__":
    sys.exit(main())
