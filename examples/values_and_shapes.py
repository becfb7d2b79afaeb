"""Python values and tensors of different shapes per rank through polydist's collectives.

Numbers, strings, dicts and tensors whose shapes differ from rank to rank go
through all_gather, broadcast, gather, scatter and all_to_all; no sizes are
passed and nothing is pickled. Checks its own results and exits 1 on a wrong
one. Any world size n >= 2::

    polydist run --nproc-per-node 2 examples/values_and_shapes.py
"""

import sys

import torch

import polydist as pd


def same(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def check(label, got, want):
    ok = same(got, want)
    shown = f"Tensor{list(got.shape)} {got.tolist()}" if isinstance(got, torch.Tensor) else repr(got)
    print(f"rank {pd.get_rank()}: {label} -> {shown}" + ("" if ok else f"   <-- WRONG, expected {want!r}"), flush=True)
    return 0 if ok else 1


def main() -> int:
    pd.initialize()
    rank, n = pd.get_rank(), pd.get_world_size()
    if n < 2:
        print("values_and_shapes.py needs at least 2 ranks: polydist run --nproc-per-node 2 "
              "examples/values_and_shapes.py", file=sys.stderr)
        return 2
    wrong = 0

    # Numbers: ints stay exact ints of any size, floats are float64.
    big = 2**70 + rank
    wrong += check(f"all_reduce(2**70 + {rank})", pd.all_reduce(big), n * 2**70 + n * (n - 1) // 2)
    wrong += check(f"all_gather({0.1 * rank!r})", pd.all_gather(0.1 * rank), [0.1 * i for i in range(n)])
    wrong += check("all_reduce(rank, op='MAX')", pd.all_reduce(rank, op="MAX"), n - 1)

    # Strings: any Unicode, exact; non-src ranks pass None.
    msg = pd.broadcast("naïve café, 東京 ✓" if rank == 0 else None, src=0)
    wrong += check("broadcast('naïve café, 東京 ✓' on rank 0, None elsewhere, src=0)", msg, "naïve café, 東京 ✓")

    # Dicts/objects (nested containers, tuples, tensors inside) gathered to one rank.
    mine = {"rank": rank, "host": "node-a", "shape": (rank + 1, 2), "loss": [0.5 / (rank + 1)]}
    got = pd.gather(mine, dst=n - 1)
    want = [{"rank": i, "host": "node-a", "shape": (i + 1, 2), "loss": [0.5 / (i + 1)]} for i in range(n)]
    wrong += check(f"gather(dict, dst={n - 1})", got, want if rank == n - 1 else None)

    # Tensors of different shapes per rank: rank r contributes r + 1 rows.
    rows = torch.full((rank + 1, 2), rank, dtype=torch.int32)
    got = pd.all_gather(rows)                                   # concatenated along dim 0
    wrong += check(f"all_gather(full(({rank + 1}, 2), {rank})).shape", tuple(got.shape), (n * (n + 1) // 2, 2))
    got = pd.all_gather(torch.arange(rank + 1.0), concat=False)  # the per-rank list
    wrong += check(f"all_gather(arange({rank + 1}.), concat=False)", got, [torch.arange(i + 1.0) for i in range(n)])
    got = pd.gather(torch.ones(rank + 1, dtype=torch.int64), dst=0)
    wrong += check(f"gather(ones({rank + 1}), dst=0)", got, torch.ones(n * (n + 1) // 2, dtype=torch.int64)
                   if rank == 0 else None)

    # broadcast: a tensor of src's shape to ranks that have no buffer (safe_mode=True).
    x = torch.arange(6.0).reshape(2, 3) if rank == 0 else None
    wrong += check("broadcast(arange(6.).reshape(2, 3) / None, src=0, safe_mode=True)",
                   pd.broadcast(x, src=0, safe_mode=True), torch.arange(6.0).reshape(2, 3))

    # scatter: one item per rank from src, tensors of different shapes or values.
    parts = [torch.arange(i + 1) for i in range(n)] if rank == 0 else None
    wrong += check("scatter([arange(1), ..., arange(n)], src=0)", pd.scatter(parts, src=0), torch.arange(rank + 1))
    jobs = [{"shard": i, "files": [f"part-{i}.bin"]} for i in range(n)] if rank == 0 else None
    wrong += check("scatter([dict per rank], src=0)", pd.scatter(jobs, src=0),
                   {"shard": rank, "files": [f"part-{rank}.bin"]})

    # all_to_all: item i goes to rank i; shapes differ per destination.
    sent = [torch.full((i + 1,), rank) for i in range(n)]
    wrong += check("all_to_all([full((i + 1,), rank) for i])", pd.all_to_all(sent),
                   [torch.full((rank + 1,), j) for j in range(n)])
    wrong += check("all_to_all([f'{rank}->{i}' for i])", pd.all_to_all([f"{rank}->{i}" for i in range(n)]),
                   [f"{j}->{rank}" for j in range(n)])

    # A type the safe codec does not take raises TypeError on EVERY rank (no hang);
    # allow_pickle=True opts in, on sender and receiver (it can run code on decode).
    class Point:
        def __init__(self, x):
            self.x = x

    try:
        pd.all_gather(Point(rank) if rank == 0 else rank)
        wrong += check("all_gather(Point) raises", "no error", "TypeError")
    except TypeError as exc:
        print(f"rank {rank}: all_gather(Point(0) on rank 0) -> TypeError: {str(exc)[:70]}...", flush=True)

    wrong = pd.all_reduce(wrong)
    if rank == 0:
        print(f"values and shapes: {'all results as expected' if not wrong else f'{wrong} WRONG'} on {n} ranks",
              flush=True)
    pd.barrier()
    pd.finalize()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
