"""What torch's own flight recorder costs on gloo: an 8-byte all_reduce and a DDP step, with it off and on.

polydist's launchers (``polydist run``, ``spawn``) set ``TORCH_FR_BUFFER_SIZE=2000`` unless the user set
it, so that polydist's dumps hold gloo's and nccl's operations, whoever calls them (torch 2.13's own
default is 2000 too; older versions' is 0: off). This measures the recorder's cost with plain
``torch.distributed`` calls on gloo ranks (2; ``--ranks``): jobs alternate ``TORCH_FR_BUFFER_SIZE=0`` / ``=2000``
(interleaved rounds, so that the shared machine's load falls on both alike); in each job, the median
of ``--blocks`` blocks of ``--calls`` 8-byte all_reduces (per call) and its best block (the least disturbed by other work), and the median DDP step
(forward, backward with DDP's gradient all_reduce, SGD) of a 2 x Linear(``--width``) model over
``--steps`` steps::

    .venv/bin/python benchmarks/torch_fr_cost.py --jobs 6 --json benchmarks/results/torch_fr_cost.json
    .venv/bin/python benchmarks/torch_fr_cost.py --jobs 6 --ranks 1 --json benchmarks/results/torch_fr_cost_1rank.json

With ``--ranks 1`` the all_reduce has no peer to wait for: what remains is torch's dispatch, gloo's
work hand-off and the recorder's own entry, so that its cost shows above the noise of a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import time

from _common import job_parser, launch_job, save_json

HERE = os.path.abspath(__file__)
SETTINGS = ("0", "2000")


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    x = torch.ones(1, dtype=torch.float64)  # 8 bytes
    for _ in range(args.calls):
        dist.all_reduce(x)
    per_call = []
    for _ in range(args.blocks):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            dist.all_reduce(x)
        per_call.append((time.perf_counter() - t0) / args.calls)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.Linear(args.width, args.width)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = torch.randn(32, args.width)
    steps = []
    for i in range(args.steps + 3):
        dist.barrier()
        t0 = time.perf_counter()
        model(batch).square().mean().backward()
        opt.step()
        opt.zero_grad()
        if i >= 3:  # after DDP's first steps (bucket rebuild)
            steps.append(time.perf_counter() - t0)
    recorded = len(pickle.loads(torch._C._distributed_c10d._dump_fr_trace())["entries"])
    if dist.get_rank() == 0:  # launch_job's RESULT line; plain torch.distributed, so not _common.emit
        print("RESULT " + json.dumps({"buffer": os.environ.get("TORCH_FR_BUFFER_SIZE"), "recorded": recorded,
                                      "all_reduce_us": 1e6 * statistics.median(per_call),
                                      "all_reduce_best_us": 1e6 * min(per_call),
                                      "ddp_step_ms": 1e3 * statistics.median(steps)}), flush=True)  # fmt: skip
    dist.destroy_process_group()


def main() -> None:
    p = job_parser(__doc__.split("\n")[0], jobs=5)
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--ranks", type=int, default=2, help="ranks per job (1: the recorder's own cost, without a peer's noise)")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    own = [f"--{k}={getattr(args, k)}" for k in ("calls", "blocks", "steps", "width")]
    runs: dict = {}
    for _ in range(args.jobs):
        for size in SETTINGS:
            env = {**os.environ, "TORCH_FR_BUFFER_SIZE": size}
            runs.setdefault(size, []).append(launch_job("gloo", args.ranks, [HERE, "--worker", *own], env=env))
    keys = ("all_reduce_us", "all_reduce_best_us", "ddp_step_ms")
    rows = {size: {k: statistics.median(r[k] for r in rs) for k in keys} for size, rs in runs.items()}
    print(f"torch's flight recorder on gloo, {args.ranks} ranks: medians over {args.jobs} interleaved jobs per setting "
          f"(each: median of {args.blocks} blocks of {args.calls} calls; median of {args.steps} DDP steps)")
    print(f"{'TORCH_FR_BUFFER_SIZE':<21} {'8-byte all_reduce (us)':>23} {'best block (us)':>16} {'DDP step (ms)':>14} "
          f"{'entries kept':>13}")  # fmt: skip
    for size, row in rows.items():
        kept = runs[size][0]["recorded"]
        print(f"{size:<21} {row['all_reduce_us']:>23.1f} {row['all_reduce_best_us']:>16.1f} {row['ddp_step_ms']:>14.2f} "
              f"{kept:>13}")  # fmt: skip
    for k in keys:
        spread = {s: (min(r[k] for r in rs), max(r[k] for r in rs)) for s, rs in runs.items()}
        print(f"{k}: on - off = {rows['2000'][k] - rows['0'][k]:+.2f}; per-job range off {spread['0'][0]:.2f}-"
              f"{spread['0'][1]:.2f}, on {spread['2000'][0]:.2f}-{spread['2000'][1]:.2f}")
    save_json(args, runs, rows)


if __name__ == "__main__":
    main()
