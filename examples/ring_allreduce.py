"""PyTorch's ring all-reduce, chunked as its exercise asks, on polydist.isend / polydist.recv.

PyTorch's *Writing Distributed Applications* tutorial builds a ring
all-reduce from point-to-point calls and leaves one difference to DeepSpeech's
as an exercise: "their implementation divide[s] the gradient tensor into
chunks, so as to optimally utilize the communication bandwidth". This is that
version, the bandwidth-optimal ring (Patarasuk & Yuan):

* The tensor is viewed flat and split into ``world_size`` chunks as
  ``torch.tensor_split`` does, so any element count works (when it does not
  divide, the first chunks are one element longer; chunks may be empty).
* Reduce-scatter, ``n - 1`` steps: at step ``s`` rank ``r`` sends chunk
  ``(r - s) % n`` to its right neighbour with ``isend`` and receives chunk
  ``(r - s - 1) % n`` from its left neighbour with ``recv`` into a
  preallocated buffer, then adds it into its own copy of that chunk. Rank
  ``r`` ends holding the complete sum of chunk ``(r + 1) % n``.
* All-gather, ``n - 1`` steps: at step ``s`` rank ``r`` sends chunk
  ``(r + 1 - s) % n`` (complete) to the right and receives chunk
  ``(r - s) % n`` from the left, straight into place.

Each rank sends and receives ``2 (n - 1) / n`` times the tensor's size, the
minimum for an all-reduce, which is why bus bandwidth (nccl-tests) is defined
as ``busbw = size / time * 2 (n - 1) / n`` for all_reduce: for a
bandwidth-bound ring it is the bandwidth each link achieves.

The script first checks the ring against ``polydist.all_reduce`` on random
float32 data, over sizes that do and do not divide by the world size and a
2-d tensor (``allclose``; exit status 1 on a mismatch), then times both with
the shared harness :mod:`polydist.bench.timing` (barrier before each timed block,
slowest rank's time, median over repeats) and prints on rank 0 a table of
time, algbw and busbw (GB/s = 1e9 bytes/s) for each size.

    polydist run --nproc-per-node 4 --backend gloo examples/ring_allreduce.py
    polydist run --nproc-per-node 3 examples/ring_allreduce.py --sizes 64KiB,1MiB --iters 5
    polydist run --nproc-per-node 4 examples/ring_allreduce.py --check-only
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

import torch

import polydist as pdist
from polydist.bench.records import Record, format_table
from polydist.bench.timing import measure_many
from polydist.units import format_size, parse_size

RING, ALL_REDUCE = "ring (isend/recv)", "polydist.all_reduce"


def ring_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over all ranks, in place, with the chunked ring; return ``x``.

    ``x``: a contiguous tensor of any shape, same shape and dtype on every
    rank, on a device the backend sends from. Uses ``world_size`` chunks of
    ``x`` viewed flat and one extra buffer of one chunk.
    """
    if not x.is_contiguous():
        raise ValueError("ring_all_reduce works in place and needs a contiguous tensor")
    n, r = pdist.get_world_size(), pdist.get_rank()
    if n == 1:
        return x
    chunks = torch.tensor_split(x.view(-1), n)  # views of x
    right, left = (r + 1) % n, (r - 1) % n
    incoming = torch.empty(chunks[0].numel(), dtype=x.dtype, device=x.device)  # the largest chunk

    def exchange(send_idx: int, recv_into: torch.Tensor) -> None:
        """Send chunk ``send_idx`` to the right while receiving the left neighbour's chunk into ``recv_into``."""
        # Every rank computes the same chunk sizes, so an empty chunk is skipped on both sides.
        req = pdist.isend(chunks[send_idx], dst=right) if chunks[send_idx].numel() else None
        if recv_into.numel():
            pdist.recv(recv_into, src=left)
        if req is not None:
            req.wait()

    # Reduce-scatter: after n - 1 steps rank r holds the full sum of chunk (r + 1) % n.
    for s in range(n - 1):
        recv_idx = (r - s - 1) % n
        buf = incoming[: chunks[recv_idx].numel()]
        exchange((r - s) % n, buf)
        chunks[recv_idx].add_(buf)
    # All-gather: pass the complete chunks around the ring, received straight into place.
    for s in range(n - 1):
        exchange((r + 1 - s) % n, chunks[(r - s) % n])
    return x


# ------------------------------------------------------------ check


def check(sizes: Sequence[int]) -> bool:
    """Ring vs ``polydist.all_reduce`` on random float32 data; the same verdict on every rank."""
    n, r = pdist.get_world_size(), pdist.get_rank()
    device = pdist.device()
    shapes = [(count,) for count in sorted({1, max(1, n - 1), n + 1, 1001, *(s // 4 for s in sizes)})] + [(3, 7)]
    gen = torch.Generator().manual_seed(1234 + r)  # different data on every rank
    bad = []
    for shape in shapes:
        x = torch.randn(shape, generator=gen).to(device)
        ring = ring_all_reduce(x.clone())
        ref = pdist.all_reduce(x.clone())
        # The two sum in different orders: equal up to float32 rounding.
        if not torch.allclose(ring, ref, rtol=1e-5, atol=1e-5 * n):
            bad.append(f"{list(shape)}: max |ring - all_reduce| = {(ring - ref).abs().max().item():.3g}")
    everyone = pdist.all_gather(bad)  # list per rank
    ok = not any(everyone)
    if r == 0:
        cases = ", ".join("x".join(map(str, s)) for s in shapes)
        if ok:
            print(f"ring all-reduce matches all_reduce on {n} ranks (float32 element counts: {cases})", flush=True)
        else:
            for rank, lines in enumerate(everyone):
                for line in lines:
                    print(f"MISMATCH on rank {rank}, shape {line}", flush=True)
    return ok


# ------------------------------------------------------------ timing


def bench(sizes: Sequence[int], iters: Optional[int], warmup: int, repeats: int) -> list[Record]:
    """Time the ring and ``polydist.all_reduce`` on float32 zeros of each size (bytes), interleaved."""
    device = pdist.device()
    records = []
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        a = torch.zeros(count, dtype=torch.float32, device=device)
        b = torch.zeros(count, dtype=torch.float32, device=device)
        timings = measure_many(
            {RING: lambda a=a: ring_all_reduce(a), ALL_REDUCE: lambda b=b: pdist.all_reduce(b)},
            iters=iters,
            warmup=warmup,
            repeats=repeats,
        )
        for impl, timing in timings.items():
            records.append(Record.from_timing("all_reduce", impl, timing, size=count * 4, dtype="float32", count=count))
    return records


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="4KiB,256KiB,4MiB,16MiB",
                        help="float32 tensor sizes in bytes, comma-separated (B, KiB, MiB, GiB); default %(default)s")
    parser.add_argument("--iters", type=int, default=5,
                        help="calls per timed block (default %(default)s; 0: enough for ~50 ms per block)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls before timing (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="timed blocks, the median is reported (default %(default)s)")
    parser.add_argument("--check-only", action="store_true", help="check the ring against all_reduce, no timing")
    parser.add_argument("--backend", default=None, help="if the launcher did not set one (default: gloo on CPU)")
    args = parser.parse_args(argv)
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError as exc:
        parser.error(str(exc))
    if args.iters < 0 or args.repeats < 1 or args.warmup < 0:
        parser.error("need --iters >= 0, --repeats >= 1, --warmup >= 0")

    pdist.initialize(args.backend)
    n, rank = pdist.get_world_size(), pdist.get_rank()
    if rank == 0:
        print(f"ring all-reduce: world size {n}, backend {pdist.backend() or 'none (serial)'}, "
              f"device {pdist.device()}", flush=True)
    ok = check(sizes)
    if ok and not args.check_only:
        records = bench(sizes, args.iters or None, args.warmup, args.repeats)
        if rank == 0:
            shown = ", ".join(format_size(s) for s in sizes)
            print(f"\nall_reduce of float32 tensors ({shown}); time: median over {args.repeats} blocks of the "
                  f"slowest rank's mean per call; busbw = size/time * 2(n-1)/n; GB/s = 1e9 B/s", flush=True)
            print(format_table(records, reference=ALL_REDUCE), flush=True)
    pdist.barrier()  # no rank exits before rank 0 has printed
    pdist.finalize()
    return 0 if ok else 1  # every rank reached the same verdict


if __name__ == "__main__":
    sys.exit(main())
