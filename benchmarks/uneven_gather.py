"""all_gather of tensors whose dim 0 differs per rank, against equal shapes.

For each S (the largest per-rank buffer, bytes), rank r holds a float32 tensor
of shape (rows_r, 16) with rows_r = rows_S * (r + 1) / world_size, so the last
rank has S bytes and the others less (half of S on rank 0 of 2). Compared:

* "polydist uneven": ``polydist.all_gather(x)`` of those tensors;
* "polydist equal":  ``polydist.all_gather(x)`` with S bytes on every rank;
* "torch equal":     ``all_gather_into_tensor`` / ``all_gather_single`` of S
  bytes per rank into a new output tensor — the equal-shape floor.

``size`` follows nccl-tests for all_gather: the gathered buffer at equal
shapes, world size × S (the "case" column shows S). The uneven result's rows
are checked once. Target (issue 3): polydist uneven / torch equal <= 1.5 for
S >= 1 MiB.

    polydist run --nproc-per-node 2 --backend gloo benchmarks/uneven_gather.py \\
        [--json benchmarks/results/uneven_gather.json]
"""

from __future__ import annotations

import _common
import torch

import polydist as pd
from polydist.bench.records import Record
from polydist.bench.timing import measure_many
from polydist.units import format_size

WIDTH = 16  # float32 columns per row: 64-byte rows


def main() -> None:
    p = _common.parser(
        __doc__.split("\n")[0],
        sizes="4KiB,16KiB,64KiB,256KiB,1MiB,4MiB,16MiB,64MiB",
        quick_sizes="4KiB,1MiB",
        sizes_help="largest per-rank buffer S in bytes",
    )
    args = p.parse_args()
    _common.setup(args)
    rank, world, device = pd.get_rank(), pd.get_world_size(), pd.device()
    records = []
    for s_bytes in _common.sizes(args):
        rows_max = max(world, s_bytes // (4 * WIDTH))
        rows = [rows_max * (r + 1) // world for r in range(world)]
        uneven = torch.zeros(rows[rank], WIDTH, device=device)
        equal = torch.zeros(rows_max, WIDTH, device=device)

        def raw(equal: torch.Tensor = equal) -> torch.Tensor:
            out = torch.empty(world * equal.numel(), dtype=equal.dtype, device=device)
            _common.all_gather_single(out, equal.view(-1))
            return out

        right = _common.check("polydist uneven", pd.all_gather(uneven).shape[0], sum(rows))
        fns = {
            "polydist uneven": lambda x=uneven: pd.all_gather(x),
            "polydist equal": lambda x=equal: pd.all_gather(x),
            "torch equal": raw,
        }
        times = measure_many(fns, **_common.timing(args))
        size = world * equal.nbytes
        extras = {"polydist uneven": {"rank_bytes": [n * WIDTH * 4 for n in rows], "wrong": not right}}
        for label, t in times.items():
            records.append(
                Record.from_timing(
                    "all_gather", label, t, size=size, dtype="float32", count=size // 4,
                    case=f"S={format_size(equal.nbytes)}", **extras.get(label, {}),
                )
            )
    _common.report(records, args, title="all_gather of uneven shapes vs equal shapes", reference="torch equal")
    _common.finish()


if __name__ == "__main__":
    main()
