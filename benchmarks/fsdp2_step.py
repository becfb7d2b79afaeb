"""An FSDP2 training step on 2 and 4 ranks, gloo vs MPI, with the all-gather and reduce-scatter busbw (issue 27, item 5).

The model: ``--layers`` Linear(``--width``, ``--width``) layers (default 4 x
1024: 16.0 MiB of float32 parameters), each wrapped with ``fully_shard``
and the root too, as FSDP2's documentation does; a step is forward,
backward (FSDP2's reduce-scatter of the gradients) and SGD, on a batch of
``--batch`` rows per rank; the median over ``--steps`` steps after
``--warmup``. Jobs alternate gloo / MPI (``mpiexec``; backend ``mpi``, the
mpi4py group on this stock wheel), for each world size in ``--ranks``.

Bandwidths: polydist's comms profile (``comms_profile``) sees the calls
made through polydist's collectives, and on the process groups polydist
implements (``mpi`` here) every operation, whoever called it: FSDP2's own
all-gathers and reduce-scatters, which go straight to the process group,
show as rows there (the script prints them); on gloo they are in torch's
flight recorder only. The busbw figures compared are of the same messages FSDP2 sends —
one layer's parameters all-gathered from shards, one layer's gradients
reduce-scattered with AVG — replayed through ``polydist.all_gather`` and
``polydist.reduce_scatter`` inside the profile::

    .venv/bin/python benchmarks/fsdp2_step.py --jobs 2 --json benchmarks/results/fsdp2_step.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _common import emit, job_parser, launch_job, save_json

HERE = os.path.abspath(__file__)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import polydist

    polydist.initialize(args.backend)
    torch.set_num_threads(1)
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(args.width, args.width) for _ in range(args.layers)))
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    mesh = init_device_mesh("cpu", (n,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(r))

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    for _ in range(args.warmup):
        step()
    times = []
    with polydist.comms_profile(show=False) as fsdp_prof:
        for _ in range(args.steps):
            dist.barrier()
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    layer_numel = args.width * args.width + args.width
    shard = torch.randn(-(-layer_numel // n))
    grads = torch.randn(shard.numel() * n)
    for _ in range(args.warmup):
        polydist.all_gather(shard), polydist.reduce_scatter(grads.clone(), op="AVG")
    with polydist.comms_profile(show=False) as prof:
        for _ in range(args.steps):
            polydist.all_gather(shard)
            polydist.reduce_scatter(grads.clone(), op="AVG")
    busbw = {row["collective"]: row["busbw_GBps"] for row in prof.as_dict()["rows"]}
    emit({"ranks": n, "param_MiB": param_bytes / 2**20, "step_ms": 1e3 * statistics.median(times),
          "fsdp_profile_rows": sorted(f"{row['collective']} {row['busbw_GBps'] or 0:.2f} GB/s" for row in fsdp_prof.as_dict()["rows"]),
          "message_MiB": shard.numel() * n * 4 / 2**20,
          "all_gather_busbw_GBps": busbw.get("all_gather"), "reduce_scatter_busbw_GBps": busbw.get("reduce_scatter")})
    polydist.finalize()


def main() -> None:
    p = job_parser(__doc__.split("\n")[0], jobs=2)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--ranks", default="2,4", help="world sizes, comma-separated")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    own = [f"--{k}={getattr(args, k)}" for k in ("width", "layers", "batch", "steps", "warmup")]
    runs: dict = {}
    for _ in range(args.jobs):
        for n in (int(k) for k in args.ranks.split(",")):
            for backend in ("gloo", "mpi"):
                runs.setdefault(f"{backend}/{n}", []).append(launch_job(backend, n, [HERE, "--worker", "--backend", backend, *own]))
    keys = ("step_ms", "all_gather_busbw_GBps", "reduce_scatter_busbw_GBps")
    rows = {k: {f: statistics.median(r[f] for r in rs) for f in keys} for k, rs in runs.items()}
    first = next(iter(runs.values()))[0]
    print(f"FSDP2 step, {args.layers} x Linear({args.width}) = {first['param_MiB']:.1f} MiB of parameters, batch {args.batch} "
          f"per rank; median of {args.steps} steps, median over {args.jobs} jobs; busbw of FSDP2's messages "
          f"({first['message_MiB']:.1f} MiB per layer) via polydist's comms profile")
    print(f"{'backend/ranks':<14} {'step (ms)':>10} {'all_gather busbw':>17} {'reduce_scatter busbw':>21}  (GB/s)")
    for k, row in rows.items():
        print(f"{k:<14} {row['step_ms']:>10.1f} {row['all_gather_busbw_GBps']:>17.2f} {row['reduce_scatter_busbw_GBps']:>21.2f}")
    print("comms profile rows of FSDP2's own calls (torch.distributed, past polydist's pipeline; the Python groups "
          "record them, gloo's are in torch's flight recorder only), busbw:")
    for k, rs in runs.items():
        print(f"  {k:<12} {rs[0]['fsdp_profile_rows'] or 'none'}")
    save_json(args, runs, rows)


if __name__ == "__main__":
    main()
