"""One training job timed step by step, for benchmarks/ft_overhead.py: the same program under plain DDP and under
``polydist run --fault-tolerant`` (auto_model/auto_optim adapt to either).

    polydist run --nproc-per-node 2 benchmarks/_ft_step.py --width 512 --steps 200
    polydist run --fault-tolerant --nproc-per-node 2 benchmarks/_ft_step.py --width 512 --steps 200

An MLP of four square layers of ``--width`` on a batch of 64 (its width sets
the step's compute), SGD with momentum. After ``--warmup`` steps, each step's
phases are timed on rank 0 (of replica group 0): ``zero_grad`` (under
--fault-tolerant: the step's quorum starts), ``forward``, ``backward`` (the
gradient all-reduce: DDP's, or torchft's through polydist's hook, which also
waits for the quorum), ``step`` (under --fault-tolerant: the commit vote, then
the optimizer). Prints one JSON line ``STEPS {...}`` with each phase's median
and the whole step's, in milliseconds.
"""

import argparse
import json
import statistics
import time

import torch

import polydist as pdist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    args = p.parse_args()
    pdist.initialize()
    ft = pdist.fault_tolerance()
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = pdist.auto_model(torch.nn.Sequential(*layers))
    optimizer = pdist.auto_optim(torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9))
    x, y = torch.randn(64, args.width), torch.randn(64, args.width)
    phases: dict = {name: [] for name in ("zero_grad", "forward", "backward", "step", "total")}
    lead = pdist.get_rank() == 0 and (ft is None or ft.replica_group == 0)
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        optimizer.zero_grad()
        t1 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        optimizer.step()
        t4 = time.perf_counter()
        if i >= args.warmup:
            for name, (a, b) in zip(phases, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t0, t4))):
                phases[name].append(b - a)
    if lead:
        print("STEPS " + json.dumps({k: round(statistics.median(v) * 1e3, 3) for k, v in phases.items()}), flush=True)
    pdist.finalize()


if __name__ == "__main__":
    main()
