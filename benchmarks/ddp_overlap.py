"""DDP's step time on gloo and on MPI, side by side: how much gradient communication stays exposed.

Two ranks train the same communication-heavy MLP (``--layers`` x
Linear(``--width``, ``--width``) with ReLU; 4.2 M parameters, 16 MiB of
float32 gradients by default) with batch ``--batch`` under
DistributedDataParallel. For each backend the job measures, on both ranks at
once, median milliseconds of:

* ``ddp``: a training step (forward, backward with DDP's bucketed
  all-reduces, SGD step);
* ``bare``: the same step on the model without DDP (both ranks computing at
  once, so the cores are as busy as under DDP);
* ``compute``: the DDP step with communication taken out (a comm hook that
  returns the bucket unreduced), then an 8-byte all-reduce: everything DDP
  does but move gradients, its bucket copies included, with the ranks in step
  as training keeps them (free-running ranks, ``unsynced``, drift apart and
  hide their jitter; synchronizing costs the slower rank's time each step);
* ``allreduce``: one ``torch.distributed.all_reduce`` of all the gradient
  bytes in one tensor (what the communication costs when nothing overlaps it);
* ``exposed = ddp - compute``: gradient communication the backward pass did
  not hide (``ddp - bare`` also counts DDP's bucket copies and the ranks'
  synchronization).

``--idle-ms T`` adds T ms to each layer's backward during which the rank's
thread sleeps with the GIL released, as it would while an accelerator
computes: the core is free for communication, which this machine (2 cores,
2 ranks, one busy compute thread each) otherwise does not have.

gloo runs under ``polydist run``, MPI (polydist's mpi4py backend, torch's
``"mpi"`` on this stock wheel) under the mpich wheel's ``mpiexec``, alternating
``--repeats`` times; the table gives the median over repeats.

    python benchmarks/ddp_overlap.py [--repeats 3] [--json benchmarks/results/ddp_overlap.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time

from _common import launch_job

HERE = os.path.abspath(__file__)


def _median_ms(fn, steps: int, warmup: int, barrier) -> float:
    for _ in range(warmup):
        fn()
    barrier()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import polydist as pd

    torch.set_num_threads(args.threads)
    if args.backend == "mpi":
        dist.init_process_group("mpi")  # torch's own call; on this stock wheel polydist provides the backend
    else:
        pd.initialize(args.backend)
    torch.manual_seed(0)

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        layers = []
        for _ in range(args.layers):
            layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers)

    class Idle(torch.autograd.Function):
        """Identity; its backward leaves the core idle for --idle-ms (as while an accelerator computes)."""

        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, grad):
            time.sleep(args.idle_ms / 1e3)
            return grad

    if args.idle_ms:
        base = model

        def model() -> torch.nn.Module:
            net = base()
            net.forward = lambda t: functools.reduce(lambda h, layer: Idle.apply(layer(h)), net, t)
            return net

    x = torch.randn(args.batch, args.width)
    y = torch.randn(args.batch, args.width)

    def stepper(net: torch.nn.Module):
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)

        def step() -> None:
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()

        return step

    def no_communication(state, bucket):
        done = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    barrier = dist.barrier
    bare = model()
    bare_ms = _median_ms(stepper(bare), args.steps, args.warmup, barrier)
    silent = DDP(model(), bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=args.bucket_view)
    silent.register_comm_hook(None, no_communication)
    unsynced = _median_ms(stepper(silent), args.steps, args.warmup, barrier)
    token, silent_step = torch.zeros(2), stepper(silent)
    compute = _median_ms(lambda: (silent_step(), dist.all_reduce(token)), args.steps, args.warmup, barrier)
    ddp_model = DDP(model(), bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=args.bucket_view)
    ddp = _median_ms(stepper(ddp_model), args.steps, args.warmup, barrier)
    nbytes = sum(p.numel() * p.element_size() for p in bare.parameters())
    flat = torch.zeros(nbytes // 4)
    allreduce = _median_ms(lambda: dist.all_reduce(flat), args.steps, args.warmup, barrier)
    with torch.no_grad():
        same = pd.all_gather(float(sum(p.sum() for p in ddp_model.parameters())))
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({
            "backend": dist.get_backend(), "world_size": dist.get_world_size(), "grad_bytes": nbytes,
            "params": nbytes // 4, "ddp_ms": ddp, "bare_ms": bare_ms, "unsynced_ms": unsynced, "compute_ms": compute, "allreduce_ms": allreduce,
            "exposed_ms": ddp - compute, "replicas_equal": len(set(same)) == 1,
        }), flush=True)
    dist.destroy_process_group()


def _launch(backend: str, args: argparse.Namespace) -> dict:
    own = [HERE, "--worker", "--backend", backend] + [
        f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("width", "layers", "batch", "steps", "warmup", "threads", "bucket_mb", "idle_ms")
    ] + (["--bucket-view"] if args.bucket_view else [])
    return launch_job(backend, 2, own)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="gloo", help=argparse.SUPPRESS)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=35, help="timed steps per measurement (median)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb (PyTorch's default 25)")
    p.add_argument("--bucket-view", action="store_true", help="DDP gradient_as_bucket_view=True (no gradient copies)")
    p.add_argument("--idle-ms", type=float, default=0.0, help="idle (GIL-free) ms per layer in backward")
    p.add_argument("--repeats", type=int, default=3, help="alternating gloo/MPI jobs per backend")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    runs: dict = {"gloo": [], "mpi": []}
    for _ in range(args.repeats):
        for backend in runs:
            runs[backend].append(_launch(backend, args))
    keys = ("ddp_ms", "bare_ms", "unsynced_ms", "compute_ms", "allreduce_ms", "exposed_ms")
    rows = {b: {k: statistics.median(r[k] for r in rs) for k in keys} for b, rs in runs.items()}
    first = runs["gloo"][0]
    print(f"DDP over {first['params'] / 1e6:.1f} M parameters ({first['grad_bytes'] / 2**20:.0f} MiB of gradients), "
          f"batch {args.batch}, 2 ranks, {args.threads} thread(s) each, bucket_cap_mb {args.bucket_mb}"
          f"{', gradient_as_bucket_view' if args.bucket_view else ''}"
          f"{f', {args.idle_ms} ms idle per layer in backward' if args.idle_ms else ''}; "
          f"median of {args.steps} steps, median over {args.repeats} jobs")
    print(f"{'backend':<8} {'ddp step':>9} {'bare':>9} {'unsynced':>9} {'compute':>9} {'exposed':>9} {'all_reduce':>11}  (ms)")
    for b, row in rows.items():
        print(f"{b:<8} {row['ddp_ms']:>9.1f} {row['bare_ms']:>9.1f} {row['unsynced_ms']:>9.1f} {row['compute_ms']:>9.1f} "
              f"{row['exposed_ms']:>9.1f} {row['allreduce_ms']:>11.1f}")
    ratio = rows["mpi"]["ddp_ms"] / rows["gloo"]["ddp_ms"]
    hidden = rows["mpi"]["exposed_ms"] / rows["mpi"]["allreduce_ms"]
    print(f"MPI step / gloo step = {ratio:.2f} (target <= 0.6); MPI exposed / standalone all_reduce = {hidden:.2f} (target < 1)")
    assert all(r["replicas_equal"] for rs in runs.values() for r in rs), "DDP replicas differ"
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "median": rows, "mpi_over_gloo": ratio,
                       "mpi_exposed_over_allreduce": hidden, "date": time.strftime("%Y-%m-%d")}, f, indent=1)


if __name__ == "__main__":
    main()
