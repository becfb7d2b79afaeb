"""torch's coalesced all-gather and reduce-scatter on polydist's Python groups: one operation vs one per tensor.

Inside ``torch.distributed._coalescing_manager`` (what ``_functional_collectives``' ``*_coalesced`` and
code that batches its collectives use), ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` calls on
``--tensors`` tensors reach the group as one ``allgather_into_tensor_coalesced`` /
``reduce_scatter_tensor_coalesced`` call. polydist's Python groups (``mpi``, Horovod, XLA) run it as one
operation on the wire (one buffer); before, as one operation per tensor, which the "separate calls" rows
time (the same tensors, one ``torch.distributed`` call each). ``--size`` is each tensor's size; algbw
counts all tensors' bytes. Rows interleaved, medians of ``--repeats`` blocks.

    polydist run --nproc-per-node 2 --backend mpi benchmarks/coalesced.py --json benchmarks/results/coalesced_mpi.json
"""

from __future__ import annotations

import contextlib
from typing import Callable

import _common
import torch
import torch.distributed as dist

import polydist as pd
from polydist.bench.records import Record
from polydist.bench.timing import measure_many


def _calls(call: Callable[..., object], outs: list, ins: list, coalesced: bool) -> Callable[[], None]:
    """``call(out, in)`` for each pair: inside one ``_coalescing_manager`` block, or one call each."""

    def fn() -> None:
        with dist._coalescing_manager() if coalesced else contextlib.nullcontext():
            for o, i in zip(outs, ins):
                call(o, i)

    return fn


def main() -> None:
    p = _common.parser(__doc__.split("\n")[0], sizes="8,4KiB,256KiB", quick_sizes="8")
    p.add_argument("--tensors", type=int, default=8, help="tensors per coalesced call")
    args = p.parse_args()
    _common.setup(args)
    n, k = pd.get_world_size(), args.tensors
    gather, scatter = _common.all_gather_single, _common.reduce_scatter_single
    records = []
    for size in _common.sizes(args):
        count = max(1, size // 4)
        ins = [torch.full((count,), float(pd.get_rank())) for _ in range(k)]
        gathered = [torch.empty(count * n) for _ in range(k)]
        scattered = [torch.empty(count) for _ in range(k)]
        scatter_ins = [torch.ones(count * n) for _ in range(k)]
        fns = {
            ("all_gather_into_tensor", "coalesced: one operation"): _calls(gather, gathered, ins, True),
            ("all_gather_into_tensor", "separate calls"): _calls(gather, gathered, ins, False),
            ("reduce_scatter_tensor", "coalesced: one operation"): _calls(scatter, scattered, scatter_ins, True),
            ("reduce_scatter_tensor", "separate calls"): _calls(scatter, scattered, scatter_ins, False),
        }
        timed = measure_many({" / ".join(key): fn for key, fn in fns.items()}, **_common.timing(args))
        for (collective, label), t in zip(fns, timed.values()):
            records.append(Record.from_timing(collective, label, t, size=count * 4 * k, dtype="float32",
                                              count=count * k, case=f"{k} tensors"))  # fmt: skip
    _common.report(records, args, title=f"coalesced calls of {k} tensors: one operation vs one per tensor",
                   reference="separate calls")  # fmt: skip
    _common.finish()


if __name__ == "__main__":
    main()
