"""How long a 2-D DeviceMesh takes to create on 4 ranks, gloo vs MPI (issue 27, item 3).

``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))`` creates one
process group per row and per column. torch 2.13 creates them with
``dist.split_group`` (one call per mesh dimension, ``ncclCommSplit`` style)
only when an accelerator is available and the default group is bound to it
(``device_mesh.py``, ``_init_one_process_group``); a CPU backend always takes
the ``new_group`` path, every rank calling ``new_group`` once per sub-mesh.
This script measures that path: the median time of a mesh creation (the
groups of each repeat are new ones), and of the first collective on each
dimension's group. gloo and MPI jobs alternate, ``--jobs`` of each::

    .venv/bin/python benchmarks/mesh_creation.py --jobs 3 --json benchmarks/results/mesh_creation.json
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

    import polydist

    polydist.initialize(args.backend)
    create, first = [], []
    for _ in range(args.repeats):
        dist.barrier()
        t0 = time.perf_counter()
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        t1 = time.perf_counter()
        for dim in ("dp", "tp"):
            dist.all_reduce(torch.ones(1), group=mesh[dim].get_group())
        create.append(t1 - t0)
        first.append(time.perf_counter() - t1)
    emit({"create_ms": 1e3 * statistics.median(create), "first_collectives_ms": 1e3 * statistics.median(first),
          "groups": len(dist.distributed_c10d._world.pg_map)})
    polydist.finalize()


def main() -> None:
    p = job_parser(__doc__.split("\n")[0], jobs=3)
    p.add_argument("--repeats", type=int, default=5, help="meshes created per job (median)")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    runs: dict = {"gloo": [], "mpi": []}
    for _ in range(args.jobs):
        for backend in runs:
            runs[backend].append(launch_job(backend, 4, [HERE, "--worker", "--backend", backend, f"--repeats={args.repeats}"]))
    print(f"2-D DeviceMesh (2 x 2) on 4 ranks: median over {args.repeats} meshes per job, median over {args.jobs} jobs")
    print(f"{'backend':<8} {'create':>10} {'first all_reduce per dim':>26}  (ms)")
    rows = {b: {k: statistics.median(r[k] for r in rs) for k in ("create_ms", "first_collectives_ms")} for b, rs in runs.items()}
    for b, row in rows.items():
        print(f"{b:<8} {row['create_ms']:>10.1f} {row['first_collectives_ms']:>26.1f}")
    save_json(args, runs, rows)


if __name__ == "__main__":
    main()
