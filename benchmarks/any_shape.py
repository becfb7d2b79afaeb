"""Any-shape collectives against torch.distributed with the shapes given (issue 17).

polydist's all_gather, gather, scatter and all_to_all take tensors whose
shapes nobody passes; torch's fixed-shape calls need the receive shapes up
front. For each collective and size, three cases, each against the raw
torch call given the shapes (the reference, "torch"):

* ``repeat``: the same float32 shapes every call (a training loop);
* ``change``: every call a new size, drawn in [S/2, S] (16-byte steps) from a
  sequence every rank draws alike — the size polydist predicted is wrong
  about half the time too small (a second round) and otherwise too large
  (padding); torch is given each call's shape;
* ``uneven`` (all_gather only): rank r holds (r+1)/n of S; torch moves S from
  every rank (the equal-shape time of the largest piece).

Sizes follow nccl-tests (the gathered buffer for all_gather/gather, the full
input for scatter and all_to_all). Where polydist returns a new tensor the raw
call allocates its output too. Targets: polydist/torch <= 1.05 at >= 64 KiB
and <= 1.3 at 8 B with repeated shapes, <= 1.5 on a change, uneven <= 1.

    polydist run --nproc-per-node 2 --backend gloo benchmarks/any_shape.py [--json PATH]
    polydist run --nproc-per-node 2 --backend mpi benchmarks/any_shape.py [--json PATH]
"""

from __future__ import annotations

import random
from typing import Callable

import _common
import torch
import torch.distributed as dist

import polydist as pd
from polydist.bench.records import Record
from polydist.bench.timing import measure_many


class Sizes:
    """Element counts per call: fixed, or a fresh draw in [n/2, n] per call (the same sequence on every rank)."""

    def __init__(self, n: int, changing: bool) -> None:
        self.n, self.changing, self.rng = n, changing, random.Random(17)

    def next(self) -> int:
        if not self.changing or self.n < 8:
            return self.n
        return max(4, self.rng.randrange(self.n // 2, self.n + 1) // 4 * 4)  # 16-byte steps of float32


def _cases(name: str, nbytes: int, rank: int, world: int, case: str) -> tuple[int, dict[str, Callable]]:
    """(size in bytes, {"polydist": fn, "torch": fn}) for one collective, size and case."""
    per = max(1, nbytes // 4 // world)  # float32 elements each rank contributes / receives
    changing = case == "change"
    mine_pd, mine_raw = Sizes(per, changing), Sizes(per, changing)
    base = torch.zeros(per * world)
    if name == "all_gather":
        if case == "uneven":
            x = base[: per * (rank + 1) // world]
            return world * per * 4, {
                "polydist": lambda: pd.all_gather(x),
                "torch": lambda: _common.all_gather_single(torch.empty(world * per), base[:per]),
            }
        return world * per * 4, {
            "polydist": lambda: pd.all_gather(base[: mine_pd.next()]),
            "torch": lambda: _ag_raw(base[: mine_raw.next()], world),
        }
    if name == "gather":
        return world * per * 4, {
            "polydist": lambda: pd.gather(base[: mine_pd.next()], dst=0),
            "torch": lambda: _gather_raw(base[: mine_raw.next()], rank, world),
        }
    if name == "scatter":

        def pd_scatter() -> torch.Tensor:
            k = mine_pd.next()
            return pd.scatter(list(base[: k * world].view(world, k).unbind(0)) if rank == 0 else None, src=0)

        def raw_scatter() -> torch.Tensor:
            k = mine_raw.next()
            out = torch.empty(k)
            dist.scatter(out, list(base[: k * world].view(world, k).unbind(0)) if rank == 0 else None, src=0)
            return out

        return world * per * 4, {"polydist": pd_scatter, "torch": raw_scatter}

    def pd_a2a() -> list:
        k = mine_pd.next()
        return pd.all_to_all(list(base[: k * world].view(world, k).unbind(0)))

    def raw_a2a() -> torch.Tensor:
        k = mine_raw.next()
        out = torch.empty(k * world)
        dist.all_to_all_single(out, base[: k * world])
        return out

    return world * per * 4, {"polydist": pd_a2a, "torch": raw_a2a}


def _ag_raw(x: torch.Tensor, world: int) -> torch.Tensor:
    out = torch.empty(world * x.numel())
    _common.all_gather_single(out, x)
    return out


def _gather_raw(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    out = torch.empty(world * x.numel()) if rank == 0 else None
    dist.gather(x, list(out.view(world, -1).unbind(0)) if out is not None else None, dst=0)
    return out


COLLECTIVES = ["all_gather", "gather", "scatter", "all_to_all"]


def main() -> None:
    p = _common.parser(__doc__.split("\n")[0], sizes="8,64KiB,1MiB,16MiB", quick_sizes="8,64KiB")
    p.add_argument("--collectives", default=",".join(COLLECTIVES), help="comma-separated subset")
    p.add_argument("--cases", default="repeat,change,uneven", help="comma-separated subset of repeat,change,uneven")
    args = p.parse_args()
    _common.setup(args)
    rank, world = pd.get_rank(), pd.get_world_size()
    records = []
    for name in [c for c in args.collectives.split(",") if c]:
        for case in [c for c in args.cases.split(",") if c]:
            if case == "uneven" and name != "all_gather":
                continue
            _common.log(f"{name} {case} ...")
            for nbytes in _common.sizes(args):
                size, fns = _cases(name, nbytes, rank, world, case)
                times = measure_many(fns, **_common.timing(args))
                for impl, t in times.items():
                    records.append(Record.from_timing(name, impl, t, size=size, dtype="float32", count=size // 4, case=case))
    _common.report(records, args, title=f"any-shape collectives vs torch with shapes given ({pd.backend()}, {world} ranks)",
                   reference="torch")  # fmt: skip
    _common.finish()


if __name__ == "__main__":
    main()
