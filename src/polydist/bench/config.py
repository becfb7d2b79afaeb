"""The ``polydist bench`` command line: its options, their checks, and the :class:`BenchConfig` they make.

Its one job is to turn arguments into a checked, picklable :class:`BenchConfig`
before anything is launched or initialized (``ValueError`` naming the first
bad value), and back into arguments for the ranks that mpiexec starts
(:func:`child_argv`). What the options mean is told in :mod:`polydist.bench.cli`.
"""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .. import context
from ..backends import registry
from ..launch import mpiexec
from ..ops import check_op_dtype, resolve_op
from ..units import parse_size, size_range

__all__ = [
    "COLLECTIVES", "REDUCING", "ROOTED", "by_mpiexec", "BenchConfig", "add_parser", "parser", "config_from_args",
    "child_argv", "default_backend",
]  # fmt: skip

COLLECTIVES = (
    "all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter", "all_to_all", "gather", "scatter", "send_recv",
)  # fmt: skip
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
_APIS = ("polydist", "torch")


@dataclass(frozen=True)
class BenchConfig:
    """A checked ``polydist bench`` command line; picklable, as it travels to the spawned ranks.

    ``sizes`` are the requested byte sizes (a point's size may be rounded
    down, see :mod:`polydist.bench.calls`); ``op`` is a canonical op name ("SUM");
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


def parser() -> argparse.ArgumentParser:
    """The ``polydist bench`` parser on its own, for ``python -m polydist.bench``."""
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


def by_mpiexec(name: str) -> bool:
    """Whether backend ``name``'s ranks are started by mpiexec (MPI makes its own ranks)."""
    return registry.get(name).lifecycle.needs_launcher == "mpiexec"


def default_backend() -> str:
    """The backend measured when ``--backend`` names none: the one ``polydist.initialize()`` without one asks for."""
    return registry.requested_name()


def _backends(text: Optional[str], launch: bool) -> tuple:
    names = [b.lower() for b in _split(text)]
    if not launch:
        if len(names) > 1:
            raise ValueError(f"inside a job only the job's backend can be measured, got --backend {text}")
        return tuple(names)
    available = context.available_backends()
    for name in names:
        if name not in available and not by_mpiexec(name):
            raise ValueError(f"unknown or unavailable backend {name!r}; here: {', '.join(available)}, or mpi (mpiexec)")
        if by_mpiexec(name):
            try:
                mpiexec.find()
            except FileNotFoundError as exc:
                raise ValueError(f"backend {name!r} is started with mpiexec: {exc}") from None
    return tuple(names) or (default_backend(),)


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
    if any(n in REDUCING for n in names):
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

