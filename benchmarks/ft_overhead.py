"""The cost of ``--fault-tolerant`` without faults: the same DDP training step, plain and fault-tolerant, interleaved.

    .venv/bin/python benchmarks/ft_overhead.py --nproc 2 --widths 128,640,1280 --rounds 5 \\
        --json benchmarks/results/ft_overhead_gloo.json
    .venv/mpi/openmpi/bin/python benchmarks/ft_overhead.py --backend mpi --nproc 2 --widths 128,640,1280 \\
        --rounds 5 --json benchmarks/results/ft_overhead_mpi.json

Plain python. For each ``--widths`` (the MLP's width in benchmarks/_ft_step.py,
which sets the step's compute: on this project's 2-vCPU VM, 128, 640 and 1280
give plain steps of about 2, 17 and 55 ms) and each of ``--rounds`` rounds, it
runs the job once under ``polydist run --nproc-per-node N`` (DDP on gloo) and
once under ``polydist run --fault-tolerant --nproc-per-node N`` (N replica
groups, torchft), one after the other, and reads rank 0's medians per phase.
Reported per width: the medians over the rounds of each path's step time, their
ratio, and where the extra time goes (zero_grad: the quorum's start; forward;
backward: the all-reduce, and the quorum's end; step: the commit vote).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "benchmarks", "_ft_step.py")
PHASES = ("zero_grad", "forward", "backward", "step", "total")


def run(nproc: int, width: int, steps: int, ft: bool, backend: str = "gloo") -> Optional[dict]:
    command = [sys.executable, "-m", "polydist", "run", "--nproc-per-node", str(nproc), "--no-prefix"]
    command += ["--backend", backend] if backend != "gloo" else []
    command += (["--fault-tolerant"] if ft else []) + [JOB, "--width", str(width), "--steps", str(steps)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    if os.geteuid() == 0:  # Open MPI's mpiexec refuses root unless told twice (as tests/conftest.py tells it)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    found = [line for line in out.stdout.splitlines() if line.startswith("STEPS ")]
    if out.returncode or not found:
        print(f"    failed ({out.returncode}): {out.stderr[-600:]}", file=sys.stderr)
        return None
    return json.loads(found[-1][len("STEPS "):])


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--backend", default="gloo", help="gloo, or mpi (with the Open MPI runtime's Python: ULFM)")
    p.add_argument("--widths", default="128,640,1280")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    print(f"$ {' '.join([os.path.relpath(sys.executable, ROOT), *sys.argv])}\n")
    print(f"# backend {args.backend}, {args.nproc} ranks (replica groups), {args.steps} timed steps a job, {args.rounds} rounds, plain and "
          f"fault-tolerant interleaved; load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs", flush=True)
    results: dict = {}
    for width in widths:
        rows = results[width] = {"ddp": [], "ft": []}
        for r in range(args.rounds):
            for path in ("ddp", "ft"):
                got = run(args.nproc, width, args.steps, path == "ft", args.backend)
                if got is not None:
                    rows[path].append(got)
                    print(f"  width {width} round {r} {path:3}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()), flush=True)
    print("\n# medians over the rounds, ms (fault-tolerant / plain)")
    table = {}
    for width, rows in results.items():
        med = {path: {k: statistics.median(x[k] for x in rows[path]) for k in PHASES} for path in rows if rows[path]}
        if len(med) < 2:
            continue
        table[width] = med
        extra = ", ".join(f"{k} {med['ft'][k] - med['ddp'][k]:+.2f}" for k in PHASES[:-1])
        print(f"  width {width:5}: plain {med['ddp']['total']:.2f}, fault-tolerant {med['ft']['total']:.2f} "
              f"({med['ft']['total'] / med['ddp']['total']:.2f}x); extra by phase: {extra}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "platform": platform.platform(), "runs": results, "medians": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
