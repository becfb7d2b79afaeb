"""Cost of the flight recorder: all_reduce with the recorder off, on, and raw torch.distributed.

The recorder (:mod:`polydist.collectives.recorder`, on by default) records every
collective in a ring buffer: the caller's frame, two clock reads, the dtype and
shape, a list stored. This times ``polydist.all_reduce`` of float32 tensors with
``polydist.set_trace(False)`` ("trace off") and ``set_trace(True)`` ("trace
on", the default), interleaved, with raw ``torch.distributed.all_reduce`` as a
reference (on MPI: the mpi4py process group through torch's dispatch). The
switch is flipped around every call in both cases alike. "trace off again" is
the first case run a second time: the ratio of the two says how large the
noise is. Budget (issue 14): at most 1 µs per call on an 8 B MPI all_reduce;
unmeasurable on gloo.

A second table times the recorder's own step alone (record, then complete;
no communication) in this process, which the collective timings' noise hides.

    polydist run --nproc-per-node 2 --backend mpi  benchmarks/trace_cost.py [--json PATH]
    polydist run --nproc-per-node 2 --backend gloo benchmarks/trace_cost.py --sizes 8,1MiB [--json PATH]
"""

from __future__ import annotations

import os
import time
from typing import Callable

import _common
import torch
import torch.distributed as dist

import polydist as pd
from polydist.bench.records import Record
from polydist.bench.timing import measure_many
from polydist.collectives.recorder import RECORDER
from polydist.groups import resolve


def _with_trace(enabled: bool, x: torch.Tensor) -> Callable[[], None]:
    def fn() -> None:
        pd.set_trace(enabled)
        pd.all_reduce(x)
        pd.set_trace(True)

    return fn


def _raw(x: torch.Tensor) -> Callable[[], None]:
    def fn() -> None:
        pd.set_trace(True)  # the same switch flips as the polydist cases
        dist.all_reduce(x)
        pd.set_trace(True)

    return fn


def _step_alone(x: torch.Tensor, n: int) -> float:
    """µs per record + complete of the recorder's step, without a collective (best of 5)."""
    from polydist.context import world

    res = resolve(world(), None)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            RECORDER.end(RECORDER.start(res, "all_reduce", 1, "SUM", None, x, False))
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main() -> None:
    p = _common.parser(__doc__.split("\n")[0], sizes="8,1MiB", quick_sizes="8")
    args = p.parse_args()
    _common.setup(args)
    device = pd.device()
    records = []
    for size in _common.sizes(args):
        x = torch.ones(max(1, size // 4), device=device)
        fns = {
            "trace off": _with_trace(False, x),
            "trace on": _with_trace(True, x),
            "trace off again": _with_trace(False, x),  # the same as the first: how far apart noise puts them
            "torch": _raw(x),
        }
        for label, t in measure_many(fns, **_common.timing(args)).items():
            records.append(Record.from_timing("all_reduce", label, t, size=x.nbytes, dtype="float32", count=x.numel()))
    _common.report(records, args, title="flight recorder: cost per all_reduce call", reference="trace off")
    alone = _step_alone(torch.ones(2, device=device), n=10_000 if args.quick else 200_000)
    if pd.get_rank() == 0:
        line = f"the recorder's step alone (record + complete, no collective): {alone:.2f} µs per call"
        print(f"\n{line}", flush=True)
        if args.json:  # beside the table in the markdown report
            with open(os.path.splitext(args.json)[0] + ".md", "a") as f:
                f.write(f"\n{line}\n")
    _common.finish()


if __name__ == "__main__":
    main()
