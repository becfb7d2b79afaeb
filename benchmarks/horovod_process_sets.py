"""What Horovod's dynamic process sets cost (issue 31, item 2): 8-byte all_reduce latency on 3 ranks.

Three modes, each its own ``horovodrun`` job (whether process sets are dynamic
is fixed at ``hvd.init``):

* ``none``: ``hvd.init()``, all_reduce on the global set (polydist's horovod backend today);
* ``dynamic``: ``hvd.init(process_sets="dynamic")`` (what ``HOROVOD_DYNAMIC_PROCESS_SETS=1``, which
  ignite sets on import, does), all_reduce still on the global set;
* ``on-set``: dynamic, a set ``[0, 1]`` added by every rank (``hvd.add_process_set`` is collective over
  the whole job), all_reduce on it by ranks 0 and 1 while rank 2 waits at the end.

Raw ``horovod.torch`` (no polydist): this measures Horovod itself. Usage (load: see the README)::

    for m in none dynamic on-set; do
        .venv/bin/horovodrun -np 3 --gloo .venv/bin/python benchmarks/horovod_process_sets.py --mode $m
    done | tee benchmarks/results/horovod_process_sets.txt
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("none", "dynamic", "on-set"), required=True)
    p.add_argument("--iters", type=int, default=200, help="all_reduces per timed block")
    p.add_argument("--repeats", type=int, default=5, help="timed blocks; the median is reported")
    args = p.parse_args()

    import horovod.torch as hvd

    hvd.init(process_sets="dynamic" if args.mode != "none" else None)
    kwargs = {}
    members = range(hvd.size())
    if args.mode == "on-set":
        members = range(2)
        kwargs["process_set"] = hvd.add_process_set(list(members))
    t = torch.zeros(2, dtype=torch.float32)  # 8 bytes
    blocks = []
    if hvd.rank() in members:
        for i in range(3):
            hvd.allreduce_(t, name=f"warm.{i}", **kwargs)
        for r in range(args.repeats):
            start = time.perf_counter()
            for i in range(args.iters):
                hvd.allreduce_(t, name=f"timed.{r}.{i}", **kwargs)
            blocks.append((time.perf_counter() - start) / args.iters)
    hvd.barrier()
    if hvd.rank() == 0:
        med = statistics.median(blocks) * 1e3
        print(f"mode={args.mode:8s} ranks={len(members)}/{hvd.size()} 8 B all_reduce: median {med:.3f} ms "
              f"(blocks {', '.join(f'{b * 1e3:.3f}' for b in blocks)} ms; {args.iters} calls each)", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
