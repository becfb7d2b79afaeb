"""Command line, set-up and reporting shared by the benchmark scripts (timing lives in polydist.bench.timing)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

import polydist as pd
from polydist.bench.records import Record, format_table, run_metadata, write_json, write_markdown
from polydist.units import parse_size, size_range

# Raw torch.distributed, under the names of the PyTorch at hand (2.13 renamed the *_tensor forms to *_single).
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def parser(
    description: str, *, sizes: Optional[str] = None, quick_sizes: Optional[str] = None, sizes_help: str = "sizes"
) -> argparse.ArgumentParser:
    """The common options. With ``sizes`` (the script's default list, comma-separated, e.g. "8,4KiB") and
    ``quick_sizes`` (the list for ``--quick``), also the size options: ``--sizes``, ``-b -e -f``."""
    p = argparse.ArgumentParser(description=description)
    if sizes is not None:
        p.add_argument("--sizes", default=None, help=f"{sizes_help}, comma-separated (default {sizes})")
        p.add_argument("-b", "--min-bytes", default=None, help="with -e: sizes from this up (nccl-tests style)")
        p.add_argument("-e", "--max-bytes", default=None, help="with -b: sizes up to this")
        p.add_argument("-f", "--step-factor", type=int, default=2, help="with -b/-e: multiply the size by this")
        p.set_defaults(default_sizes=sizes, quick_sizes=quick_sizes or sizes)
    p.add_argument("--iters", type=int, default=None, help="calls per timed block (default: about --target-time)")
    p.add_argument("--target-time", type=float, default=0.05, help="seconds per timed block when --iters is not set")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before timing")
    p.add_argument("--repeats", type=int, default=5, help="timed blocks; the median is reported")
    p.add_argument("--quick", action="store_true", help="smoke run: few sizes, 1 warm-up, 2 short repeats")
    p.add_argument("--json", default=None, metavar="PATH", help="write results here, and a .md table beside it")
    p.add_argument("--backend", default=None, help="when polydist run sets none (default: nccl with CUDA, else gloo)")
    return p


def sizes(args: argparse.Namespace) -> list[int]:
    """Byte sizes chosen on the command line: -b/-e/-f, else --sizes, else the script's (--quick) defaults."""
    if (args.min_bytes is None) != (args.max_bytes is None):
        raise SystemExit("give both -b and -e, or neither")
    if args.min_bytes is not None:
        return size_range(args.min_bytes, args.max_bytes, args.step_factor)
    text = args.sizes or (args.quick_sizes if args.quick else args.default_sizes)
    return [parse_size(s) for s in text.split(",") if s.strip()]


def timing(args: argparse.Namespace) -> dict:
    """Keyword arguments for polydist.bench.timing.measure_many from the command line."""
    if args.quick:
        return dict(iters=args.iters, warmup=1, repeats=2, target_s=0.005, catch=True)
    return dict(iters=args.iters, warmup=args.warmup, repeats=args.repeats, target_s=args.target_time, catch=True)


def setup(args: argparse.Namespace) -> None:
    """Join the job: ``--backend``, else what ``polydist run --backend`` exported, else nccl with CUDA or gloo.

    Naming a backend makes even a plain ``python`` run a 1-rank process group, so raw torch.distributed works.
    """
    default = "nccl" if torch.cuda.is_available() else "gloo"
    pd.initialize(args.backend or os.environ.get("POLYDIST_BACKEND") or default)


def log(*parts: Any) -> None:
    """Print on rank 0 only."""
    if pd.get_rank() == 0:
        print(*parts, flush=True)


def polydist_fn(name: str) -> Optional[Callable]:
    """``polydist.<name>``, or None with a note when this polydist does not have it (yet)."""
    fn = getattr(pd, name, None)
    if fn is None:
        log(f"note: polydist.{name} does not exist here; skipping it")
    return fn


def check(label: str, got: Any, expected: Any) -> bool:
    """True when ``got == expected``; otherwise False and a printed note (for ``Record.wrong``)."""
    if got == expected:
        return True
    log(f"WRONG RESULT from {label}: got {str(got)[:120]}, expected {str(expected)[:120]}")
    return False


def report(
    records: Sequence[Record], args: argparse.Namespace, *, title: str, reference: str, notes: str = "", **meta: Any
) -> None:
    """Rank 0: print the table and failures; with ``--json``, write the JSON and a markdown table beside it."""
    if pd.get_rank() != 0:
        return
    print(f"\n# {title}\n" + format_table(records, reference=reference), flush=True)
    for r in records:
        if r.error:
            print(f"failed: {r.collective} {r.case} {r.size} B {r.implementation}: {r.error}")
    if args.json:
        settings = {k: v for k, v in timing(args).items() if k != "catch"}
        info = run_metadata(quick=args.quick, **settings, **meta)
        write_json(records, args.json, info)
        md = os.path.splitext(args.json)[0] + ".md"
        write_markdown(records, md, info, title=title, reference=reference, notes=notes)
        print(f"wrote {args.json} and {md}", flush=True)


def finish() -> None:
    """Leave the job."""
    pd.finalize()


BIN = os.path.dirname(sys.executable)


def launch_job(backend: str, nproc: int, argv: Sequence[str], timeout: float = 600, env: Optional[dict] = None) -> dict:
    """Run the script ``argv[0]`` with ``argv[1:]`` on ``nproc`` ranks (mpi: the venv's mpiexec; else
    ``polydist run --backend``) and return the JSON its rank 0 printed after ``RESULT `` (:func:`emit`);
    raises with the job's output when it failed."""
    if backend in ("mpi", "mpi4py"):
        cmd = [os.path.join(BIN, "mpiexec"), "-n", str(nproc), sys.executable, *argv]
    else:
        cmd = [os.path.join(BIN, "polydist"), "run", "--nproc-per-node", str(nproc), "--backend", backend, *argv]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    for line in out.stdout.splitlines():
        if "RESULT " in line:  # polydist run prefixes lines with [rank0]:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError(f"{backend} job failed (exit {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")


def emit(result: dict) -> None:
    """Rank 0: print ``result`` for :func:`launch_job`."""
    if pd.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)


def job_parser(description: str, jobs: int) -> argparse.ArgumentParser:
    """The options of a script that launches its own jobs (:func:`launch_job`) and is its own worker."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="gloo", help=argparse.SUPPRESS)
    p.add_argument("--jobs", type=int, default=jobs, help="alternating gloo/MPI jobs per backend")
    p.add_argument("--json", default=None, metavar="PATH", help="write the runs and medians here")
    return p


def save_json(args: argparse.Namespace, runs: dict, median: dict) -> None:
    """With ``--json``: the arguments, every job's result and the medians."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "median": median}, f, indent=1)
