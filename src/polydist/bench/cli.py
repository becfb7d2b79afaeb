"""``polydist bench``: collective benchmarks in the style of NVIDIA nccl-tests, backends side by side.

    polydist bench --backend gloo,mpi --collective all_reduce -b 8 -e 64M -f 2 --nproc 2 --ceiling --json r.json

What one point is. For a collective, a backend and a size: ``-w`` untimed
calls, then ``--repeats`` blocks of ``-n`` back-to-back calls on tensors made
once (zeros of ``-d``, on ``polydist.device()``). A block's time per call is
the **maximum over ranks** (the collective is as slow as its slowest rank;
nccl-tests averages over ranks by default) and the point's time is the
**median over blocks** (:func:`polydist.bench.timing.measure_many`).
``--api polydist`` (default) times ``polydist.<collective>``; ``--api torch``
the raw ``torch.distributed`` call giving the same result on the same group,
writing into outputs made once as nccl-tests does (polydist's gathers return
new tensors, so the difference includes that allocation); ``--api
polydist,torch`` times both, interleaved, to show polydist's overhead.

Units and definitions (nccl-tests ``doc/PERFORMANCE.md``): size S in
**bytes**, the largest buffer of the operation (the gathered output of
all_gather and gather, the full input of reduce_scatter and scatter, the whole
send buffer of all_to_all, the tensor otherwise; rounded down to whole
elements, and to a multiple of the rank count where it is split); count = S /
element size; time in **µs** per call; ``algbw = S / time`` and ``busbw =
algbw × factor`` in **GB/s = 1e9 B/s**, factor (n ranks) ``2(n-1)/n`` for
all_reduce, ``(n-1)/n`` for all_gather, reduce_scatter, all_to_all, gather and
scatter, 1 for broadcast, reduce and send_recv
(:data:`polydist.units.BUSBW_FACTORS`). send_recv is nccl-tests'
sendrecv: every rank sends S bytes to the next rank and receives S from the
previous one, at once.

Memory ceiling (``--ceiling``): per size S, the time t of ``numpy.add(a, b,
out=c)`` on three arrays of S bytes each (dtype ``-d``, float32 where NumPy
has no such dtype), in one process: the launcher's after its ranks have
exited, or inside a job rank 0's after the collectives. It is timed like a
point (iteration count chosen for ~10 ms blocks) and reported in the algbw
sense, ``ceiling = S / t`` GB/s (the add moves 3S bytes; the JSON keeps
``traffic_GBps = 3S / t``). An all_reduce of S bytes on one node has at
least that addition to do, so ``busbw / ceiling`` (the second table; also
``busbw_of_ceiling`` and ``algbw_of_ceiling`` in each record's extras) tells
how close a backend comes to this machine's memory bandwidth. It is a
reference, not a strict bound: ranks on several cores can share the work. At
small S the ceiling measures NumPy's call overhead, not memory.

Launching. Inside a job (``polydist run``, torchrun, mpiexec, srun: whatever
:func:`polydist.launch.environment.detect` recognises; or an existing process group;
or ``--no-launch``) the current ranks measure the job's backend and rank 0
prints and writes. Otherwise the command starts ``--nproc`` ranks for each
backend in turn: ``mpi`` (and ``mpi4py``) as ``mpiexec -n N python -m
polydist.bench --no-launch ... --json TMP`` (:func:`polydist.launch.mpiexec.run`),
whose JSON is read back; any other backend with :func:`polydist.spawn`.
Backends run one after the other, so unlike ``--api`` candidates they cannot
be interleaved: a drift of the machine between their runs shows as a
difference between them. The results are merged into one table, one JSON
file and one plot.

This module runs the command: it measures on the current ranks
(:func:`measure_here`), launches ranks for each backend, and reports; the
command line is parsed and checked in :mod:`polydist.bench.config`, the timed
calls are made in :mod:`polydist.bench.calls`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from .. import context
from ..backends import registry
from ..launch.environment import detect
from ..errors import WorkerFailedError
from ..launch import mpiexec, spawn
from .calls import make_calls
from .config import COLLECTIVES, REDUCING, ROOTED, BenchConfig, add_parser, by_mpiexec, child_argv
from .config import config_from_args, default_backend
from .config import parser as _parser  # the name main and the tests parse with
from .records import Record, read_json, run_metadata, write_json
from .report import CEILING, add_fractions, format_report, memory_ceiling, plot
from .timing import measure_many
from ..units import format_size

__all__ = [
    "COLLECTIVES", "CEILING", "BenchConfig", "add_parser", "config_from_args", "run", "main",
    "measure_here", "memory_ceiling", "format_report", "plot", "child_argv",
]  # fmt: skip


# ---------------------------------------------------------------- measuring on the current ranks


def _say(text: str, cfg: BenchConfig) -> None:
    """Progress, on stderr, from rank 0 (or the launcher) only."""
    if not cfg.quiet and (not dist.is_initialized() or dist.get_rank() == 0):
        print(f"polydist bench: {text}", file=sys.stderr, flush=True)


def backend_versions(name: Optional[str]) -> dict:
    """Versions of what carries ``name``'s traffic: NCCL; mpi4py, the MPI wheel and the MPI library (when loaded)."""
    entry = registry.get(name)
    return entry.lifecycle.versions() if entry.device_visible() else {}


def measure_here(cfg: BenchConfig, label: str) -> tuple:
    """Measure every (collective, size) of ``cfg`` on the ranks of the current process group; every rank calls it.

    ``label`` names the backend in the table (with "/api" appended when
    several APIs are timed). Returns ``(meta, records)``, the same on every
    rank. A point that raised is recorded with its error (``Record.error``).
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    if cfg.root >= n:
        raise ValueError(f"-r/--root {cfg.root} is not a rank of this {n}-rank job")
    labels = {api: label if len(cfg.apis) == 1 and api == "polydist" else f"{label}/{api}" for api in cfg.apis}
    records = []
    for name in cfg.collectives:
        if name == "send_recv" and n < 2:
            _say("send_recv needs 2 ranks or more; skipped", cfg)
            continue
        _say(f"{label}: {name} on {n} ranks, {format_size(cfg.sizes[0])} to {format_size(cfg.sizes[-1])}", cfg)
        extras = {"op": cfg.op} if name in REDUCING else {"root": cfg.root} if name in ROOTED else {}
        for nbytes in cfg.sizes:
            size, calls = make_calls(name, nbytes, cfg, rank, n, context.device())
            timings = measure_many({api: calls[api] for api in cfg.apis}, iters=cfg.iters, warmup=cfg.warmup,
                                   repeats=cfg.repeats, catch=True)  # fmt: skip
            count = size // torch.empty((), dtype=getattr(torch, cfg.dtype)).element_size()
            for api, t in timings.items():
                records.append(Record.from_timing(name, labels[api], t, size=size, dtype=cfg.dtype, count=count,
                                                  api=api, **extras))  # fmt: skip
    meta = run_metadata(**cfg.settings(), versions=backend_versions(label))
    meta["launcher"] = meta["launcher"] or detect().launcher  # e.g. "mpi" under mpiexec, which run_metadata misses
    return meta, records


def _spawned(local_rank: int, cfg: BenchConfig, backend: str) -> Optional[tuple]:
    """Body of each rank :func:`polydist.spawn` starts: rank 0 hands the results back."""
    meta, records = measure_here(cfg, backend)
    return (meta, records) if dist.get_rank() == 0 else None


# ---------------------------------------------------------------- launching


def _run_mpiexec(cfg: BenchConfig, backend: str) -> tuple:
    """Measure ``backend`` on ranks that mpiexec starts; returns the child's ``(meta, records)``."""
    with tempfile.TemporaryDirectory(prefix="polydist-bench-") as tmp:
        path = os.path.join(tmp, f"{backend}.json")
        argv = [sys.executable, *child_argv(cfg, backend, path)]
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.nproc)))  # as polydist.spawn does
        _say(f"{backend}: mpiexec -n {cfg.nproc} {shlex.join(argv)}", cfg)
        mpiexec.run(argv, cfg.nproc, env=env)
        if not os.path.exists(path):
            raise RuntimeError(f"the {backend} ranks exited without writing their results to {path}")
        return read_json(path)


def _launch_all(cfg: BenchConfig) -> int:
    """Start ranks for each backend in turn, then report all of them together."""
    runs, records, failed = {}, [], []
    for backend in cfg.backends:
        try:
            if by_mpiexec(backend):
                meta, got = _run_mpiexec(cfg, backend)
            else:
                meta, got = spawn(backend, _spawned, args=(cfg, backend), nproc_per_node=cfg.nproc)[0]
        except (WorkerFailedError, RuntimeError, OSError) as exc:
            failed.append(f"backend {backend} failed: {exc}")
            continue
        runs[backend] = meta
        records += got
    meta = run_metadata(**cfg.settings(), launcher="polydist bench", backend=",".join(cfg.backends),
                        world_size=cfg.nproc, nproc_per_node=cfg.nproc, runs=runs)  # fmt: skip
    code = _report(cfg, records, meta) if records else 1
    for line in failed:
        print(f"polydist bench: {line}", file=sys.stderr, flush=True)
    return max(code, 1 if failed else 0)


def _run_in_job(cfg: BenchConfig) -> int:
    """Measure on the ranks of the current job; rank 0 reports."""
    owned = not context.is_initialized()
    requested = cfg.backends[0] if cfg.backends else None
    try:
        context.initialize(requested)
        if not context.is_initialized():  # plain python with --no-launch: a 1-rank group, for the raw calls too
            context.initialize(default_backend())
    except ValueError as exc:
        print(f"polydist bench: cannot join the job: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        meta, records = measure_here(cfg, requested or str(context.backend()))
        failed = 1 if not records or any(r.error for r in records) else 0  # the same on every rank
        return _report(cfg, records, meta) if dist.get_rank() == 0 else failed
    except ValueError as exc:  # an argument only the job's size can refute (the root), on every rank alike
        print(f"polydist bench: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        if owned:
            context.finalize()


def _report(cfg: BenchConfig, records: list, meta: dict) -> int:
    """Ceiling, table, JSON, plot; returns 1 when a point failed or none was measured, else 0."""
    if not records:
        print("polydist bench: nothing was measured", file=sys.stderr, flush=True)
        return 1
    ceiling = []
    if cfg.ceiling:
        _say("memory ceiling (numpy.add)", cfg)
        ceiling = memory_ceiling(sorted({r.size for r in records}), cfg.dtype, warmup=cfg.warmup, repeats=cfg.repeats)
        add_fractions(records, ceiling)
    if not cfg.quiet:
        print(format_report(records, ceiling, meta), flush=True)
    if cfg.json:
        write_json([*records, *ceiling], cfg.json, meta)
    if cfg.plot:
        n = max(r.world_size for r in records)
        plot(records, ceiling, cfg.plot, title=f"polydist bench, {n} ranks, {cfg.dtype}")
    return 1 if any(r.error for r in records) else 0


# ---------------------------------------------------------------- entry points


def run(ns: argparse.Namespace) -> int:
    """Run ``polydist bench`` from its parsed arguments (see :func:`add_parser`); returns the exit code.

    0: every point measured; 1: a backend or a point failed (what was
    measured is still reported); 2: bad arguments, reported before anything
    is launched.
    """
    try:
        in_job = ns.no_launch or (dist.is_available() and dist.is_initialized()) or detect().is_distributed
        cfg = config_from_args(ns, launch=not in_job)
    except ValueError as exc:
        print(f"polydist bench: {exc}", file=sys.stderr, flush=True)
        return 2
    return _launch_all(cfg) if cfg.launch else _run_in_job(cfg)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m polydist.bench [ARGS]`` (see ``bench/__main__.py``): the same as ``polydist bench [ARGS]``."""
    return run(_parser().parse_args(argv))

