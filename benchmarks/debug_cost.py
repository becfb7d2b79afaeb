"""Cost of debug mode: each collective with and without the cross-rank fingerprint check.

Debug mode (``POLYDIST_DEBUG=1`` / ``polydist.set_debug(True)``) all-gathers
a fingerprint of every call (sequence number, collective, op, root, dtypes,
shapes) over the call's group before running it, so that ranks that disagree
raise ``CollectiveMismatchError`` instead of hanging. This measures what that
costs per call: all_reduce, broadcast and all_gather of float32 tensors,
"debug off" (the default) vs "debug on", on the same tensors.

    polydist run --nproc-per-node 2 --backend gloo benchmarks/debug_cost.py \\
        [--json benchmarks/results/debug_cost.json]
"""

from __future__ import annotations

from typing import Callable

import _common
import torch

import polydist as pd
from polydist.bench.records import Record
from polydist.bench.timing import measure_many


def _with_debug(enabled: bool, call: Callable[[torch.Tensor], object], x: torch.Tensor) -> Callable[[], None]:
    """One ``call(x)`` with debug mode ``enabled`` (set identically on every rank), then off again."""

    def fn() -> None:
        pd.set_debug(enabled)
        try:
            call(x)
        finally:
            pd.set_debug(False)

    return fn


def main() -> None:
    p = _common.parser(__doc__.split("\n")[0], sizes="8,4KiB,1MiB", quick_sizes="8,4KiB")
    args = p.parse_args()
    _common.setup(args)
    device = pd.device()
    calls = {
        "all_reduce": lambda x: pd.all_reduce(x),
        "broadcast": lambda x: pd.broadcast(x, src=0),
        "all_gather": lambda x: pd.all_gather(x),
    }
    records = []
    for name, call in calls.items():
        for size in _common.sizes(args):
            x = torch.ones(max(1, size // 4), device=device)
            fns = {"debug off": _with_debug(False, call, x), "debug on": _with_debug(True, call, x)}
            for label, t in measure_many(fns, **_common.timing(args)).items():
                records.append(Record.from_timing(name, label, t, size=x.nbytes, dtype="float32", count=x.numel()))
    _common.report(records, args, title="debug mode: cost per collective call", reference="debug off")
    _common.finish()


if __name__ == "__main__":
    main()
