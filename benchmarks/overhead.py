"""Overhead of polydist's tensor collectives over raw torch.distributed, on the same backend.

For each collective and size, times the polydist call and the torch.distributed
call that produces the same result, interleaved (see polydist.bench.timing). Sizes
follow nccl-tests: the full gathered buffer for all_gather/gather, the full
input for reduce_scatter/scatter, the whole send buffer for all_to_all.
Tensors are float32 zeros on ``polydist.device()``. Where polydist returns a
new tensor (all_gather, gather, reduce_scatter, scatter, all_to_all), the raw
version allocates its output in each call too, so both produce the same thing.
send_recv is a ping-pong between ranks 0 and 1; its time is one way (half the
round trip). Target (issue 3): polydist/torch <= 1.05 at 1 MiB.

    polydist run --nproc-per-node 2 --backend gloo benchmarks/overhead.py [--json benchmarks/results/overhead.json]
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import _common
import torch
import torch.distributed as dist

import polydist as pd
from polydist.bench.records import Record
from polydist.bench.timing import measure_many


class Ctx(NamedTuple):
    rank: int
    world: int
    device: torch.device

    def floats(self, count: int) -> torch.Tensor:
        return torch.zeros(max(1, count), dtype=torch.float32, device=self.device)

    def empty(self, count: int) -> torch.Tensor:
        return torch.empty(count, dtype=torch.float32, device=self.device)


# Each case: (size in bytes, polydist fn) → (actual size in bytes, {"polydist": fn, "torch": fn}).
# ``pd_fn`` is the polydist function of the same name.


def all_reduce(nbytes: int, c: Ctx, pd_fn: Callable) -> tuple:
    x = c.floats(nbytes // 4)
    return x.nbytes, {"polydist": lambda: pd_fn(x), "torch": lambda: dist.all_reduce(x)}


def broadcast(nbytes: int, c: Ctx, pd_fn: Callable) -> tuple:
    x = c.floats(nbytes // 4)
    return x.nbytes, {"polydist": lambda: pd_fn(x, src=0), "torch": lambda: dist.broadcast(x, 0)}


def reduce(nbytes: int, c: Ctx, pd_fn: Callable) -> tuple:
    x = c.floats(nbytes // 4)
    return x.nbytes, {"polydist": lambda: pd_fn(x, dst=0), "torch": lambda: dist.reduce(x, 0)}


def all_gather(nbytes: int, c: Ctx, pd_fn: Callable) -> tuple:
    x = c.floats(nbytes // 4 // c.world)

    def raw() -> torch.Tensor:
        out = c.empty(c.world * x.numel())
        _common.all_gather_single(out, x)
        return out

    return c.world * x.nbytes, {"polydist": lambda: pd_fn(x), "torch": raw}


def gather(nbytes: int, c: Ctx, pd_fn: Callable) -> tuple:
    x = c.floats(nbytes // 4 // c.world)

    def raw() -> torch.Tensor:
        out = c.empty(c.world * x.numel()) if c.rank == 0 else None
        dist.gather(x, list(out.view(c.world, -1).unbind(0)) if out is not None else None, dst=0)
        return out

    return c.world * x.nbytes, {"polydist": lambda: pd_fn(x, dst=0), "torch": raw}


def reduce_scatter(nbytes: int, c: Ctx, pd_fn: Callable) -> tuple:
    x = c.floats(c.world * max(1, nbytes // 4 // c.world))

    def raw() -> torch.Tensor:
        out = c.empty(x.numel() // c.world)
        _common.reduce_scatter_single(out, x)
        return out

    return x.nbytes, {"polydist": lambda: pd_fn(x), "torch": raw}


def scatter(nbytes: int, c: Ctx, pd_fn: Callable) -> tuple:
    full = c.floats(c.world * max(1, nbytes // 4 // c.world))
    pieces = list(full.view(c.world, -1).unbind(0)) if c.rank == 0 else None

    def raw() -> torch.Tensor:
        out = c.empty(full.numel() // c.world)
        dist.scatter(out, pieces, src=0)
        return out

    return full.nbytes, {"polydist": lambda: pd_fn(pieces, src=0), "torch": raw}


def all_to_all(nbytes: int, c: Ctx, pd_fn: Callable) -> tuple:
    x = c.floats(c.world * max(1, nbytes // 4 // c.world))
    pieces = list(x.view(c.world, -1).unbind(0))

    def raw() -> torch.Tensor:
        out = c.empty(x.numel())
        dist.all_to_all_single(out, x)
        return out

    return x.nbytes, {"polydist": lambda: pd_fn(pieces), "torch": raw}


def _ping_pong(c: Ctx, x: torch.Tensor, send: Callable, recv: Callable) -> Callable[[], None]:
    """One round trip of ``x`` between ranks 0 and 1 (other ranks idle)."""

    def fn() -> None:
        if c.rank == 0:
            send(x, 1)
            recv(x, 1)
        elif c.rank == 1:
            recv(x, 0)
            send(x, 0)

    return fn


def send_recv(nbytes: int, c: Ctx, pd_fn: Callable) -> tuple:
    x = c.floats(nbytes // 4)
    pd_send, pd_recv = pd_fn
    return x.nbytes, {
        "polydist": _ping_pong(c, x, pd_send, pd_recv),
        "torch": _ping_pong(c, x, lambda t, peer: dist.send(t, peer), lambda t, peer: dist.recv(t, peer)),
    }


CASES = [all_reduce, broadcast, all_gather, reduce, reduce_scatter, gather, scatter, all_to_all, send_recv]


def _polydist_fns(name: str):
    if name == "send_recv":
        send, recv = _common.polydist_fn("send"), _common.polydist_fn("recv")
        return (send, recv) if send and recv else None
    return _common.polydist_fn(name)


def main() -> None:
    p = _common.parser(
        __doc__.split("\n")[0],
        sizes="8,64,512,4KiB,32KiB,256KiB,1MiB,4MiB,16MiB,64MiB",
        quick_sizes="8,64KiB",
    )
    p.add_argument("--collectives", default=",".join(c.__name__ for c in CASES), help="comma-separated subset")
    args = p.parse_args()
    _common.setup(args)
    c = Ctx(pd.get_rank(), pd.get_world_size(), pd.device())
    wanted = [s.strip() for s in args.collectives.split(",") if s.strip()]
    unknown = set(wanted) - {case.__name__ for case in CASES}
    if unknown:
        raise SystemExit(f"unknown collectives {sorted(unknown)}")
    if "send_recv" in wanted and c.world < 2:
        wanted.remove("send_recv")
    records = []
    for case in (case for case in CASES if case.__name__ in wanted):
        pd_fn = _polydist_fns(case.__name__)
        if pd_fn is None:
            continue
        _common.log(f"{case.__name__} ...")
        for nbytes in _common.sizes(args):
            size, fns = case(nbytes, c, pd_fn)
            times = measure_many(fns, **_common.timing(args))
            scale = 0.5 if case is send_recv else 1.0
            for impl, t in times.items():
                records.append(
                    Record.from_timing(case.__name__, impl, t, size=size, dtype="float32", count=size // 4, scale=scale)
                )
    _common.report(records, args, title="polydist overhead over torch.distributed", reference="torch")
    _common.finish()


if __name__ == "__main__":
    main()
