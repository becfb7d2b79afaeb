"""Asynchronous work with polydist: isend/irecv, async_op=True, and Work.wait() returning the result.

Checks its own results and exits 1 on a wrong one. Any world size n >= 2::

    polydist run --nproc-per-node 2 examples/async_work.py
"""

import sys

import torch

import polydist as pd


def check(label, got, want):
    if isinstance(want, torch.Tensor):
        ok = isinstance(got, torch.Tensor) and torch.equal(got, want)
    else:
        ok = got == want
    print(f"rank {pd.get_rank()}: {label} -> {got}" + ("" if ok else f"   <-- WRONG, expected {want}"), flush=True)
    return 0 if ok else 1


def main() -> int:
    pd.initialize()
    rank, n = pd.get_rank(), pd.get_world_size()
    if n < 2:
        print("async_work.py needs at least 2 ranks: polydist run --nproc-per-node 2 examples/async_work.py",
              file=sys.stderr)
        return 2
    wrong = 0
    right, left = (rank + 1) % n, (rank - 1) % n

    # 1. Non-blocking point-to-point around a ring. isend/irecv return a Work at
    #    once; don't touch the buffers before wait(). irecv's wait() returns the
    #    filled tensor, isend's returns None.
    outgoing = torch.full((3,), float(rank))
    incoming = torch.empty(3)
    send_work = pd.isend(outgoing, dst=right)
    recv_work = pd.irecv(incoming, src=left)
    got = recv_work.wait()
    wrong += check(f"irecv(empty(3), src={left}).wait()", got, torch.full((3,), float(left)))
    wrong += check("  ... is the tensor passed to irecv", got is incoming, True)
    wrong += check(f"isend(full((3,), {rank}), dst={right}).wait()", send_work.wait(), None)

    # 2. A Python value through irecv(None, src): wait() returns the decoded value.
    send_work = pd.isend({"from": rank, "step": 7}, dst=right)
    got = pd.irecv(None, src=left).wait()
    send_work.wait()
    wrong += check(f"irecv(None, src={left}).wait()", got, {"from": left, "step": 7})

    # 3. async_op=True on a collective: start it, compute, then wait(). The
    #    result of wait() is what the blocking call returns.
    grad = torch.full((4,), float(rank + 1))
    work = pd.all_reduce(grad, op="SUM", async_op=True)
    local = torch.arange(1000).square().sum()              # overlapped computation (int64)
    total = work.wait()
    wrong += check("all_reduce(full((4,), rank + 1), async_op=True).wait()", total,
                   torch.full((4,), n * (n + 1) / 2))
    wrong += check("  ... is the input tensor (in place)", total is grad, True)
    wrong += check("  local work done meanwhile", local.item(), 332833500)

    # 4. Several collectives in flight at once; wait in any order, wait() twice
    #    returns the same result; is_completed() polls without blocking.
    w_gather = pd.all_gather(torch.arange(rank + 1), concat=False, async_op=True)   # uneven shapes
    w_bcast = pd.broadcast(torch.tensor([42]) if rank == 0 else torch.zeros(1, dtype=torch.int64), src=0,
                           async_op=True)
    w_rs = pd.reduce_scatter(torch.ones(2 * n), async_op=True)
    wrong += check("reduce_scatter(ones(2n), async_op=True).wait()", w_rs.wait(), torch.full((2,), float(n)))
    wrong += check("broadcast(tensor([42]), src=0, async_op=True).wait()", w_bcast.wait(), torch.tensor([42]))
    gathered = w_gather.wait()
    wrong += check("all_gather(arange(rank + 1), concat=False, async_op=True).wait()",
                   [t.tolist() for t in gathered], [list(range(i + 1)) for i in range(n)])
    wrong += check("  wait() again returns the same object", w_gather.wait() is gathered, True)
    wrong += check("  is_completed() after wait()", w_gather.is_completed(), True)

    # 5. barrier(async_op=True): wait() returns None once every rank arrived.
    wrong += check("barrier(async_op=True).wait()", pd.barrier(async_op=True).wait(), None)

    wrong = pd.all_reduce(wrong)
    if rank == 0:
        print(f"async work: {'all results as expected' if not wrong else f'{wrong} WRONG'} on {n} ranks", flush=True)
    pd.barrier()
    pd.finalize()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
