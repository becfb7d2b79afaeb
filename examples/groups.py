"""Process groups with polydist: new_group, rank lists as ``group=``, and non-members.

Checks its own results and exits 1 on a wrong one. Any world size n >= 2::

    polydist run --nproc-per-node 2 examples/groups.py
    polydist run --nproc-per-node 4 examples/groups.py
"""

import sys

import torch
import torch.distributed as dist

import polydist as pd


def check(label, got, want):
    ok = torch.equal(got, want) if isinstance(got, torch.Tensor) else got == want
    print(f"rank {pd.get_rank()}: {label} -> {got}" + ("" if ok else f"   <-- WRONG, expected {want}"), flush=True)
    return 0 if ok else 1


def main() -> int:
    pd.initialize()
    rank, n = pd.get_rank(), pd.get_world_size()
    if n < 2:
        print("groups.py needs at least 2 ranks: polydist run --nproc-per-node 2 examples/groups.py", file=sys.stderr)
        return 2
    wrong = 0

    # 1. new_group on EVERY rank (torch's rule). Members get a ProcessGroup,
    #    the others torch's NON_GROUP_MEMBER sentinel, without communicating.
    pair = pd.new_group([0, 1])
    member = rank in (0, 1)
    wrong += check("new_group([0, 1]) is NON_GROUP_MEMBER", pair is dist.GroupMember.NON_GROUP_MEMBER, not member)

    # 2. A collective on the group: members reduce among themselves; a
    #    non-member's call does nothing and returns its input (warned once).
    t = pd.all_reduce(torch.ones(1), group=pair)
    wrong += check("all_reduce(ones(1), group=pair)", t, torch.tensor([2.0 if member else 1.0]))
    if member:
        # new_group with the same ranks (any order) returns the cached group.
        wrong += check("new_group([1, 0]) is pair", pd.new_group([1, 0]) is pair, True)
        # Group rank vs global rank: torch.distributed's own queries work on it.
        wrong += check("dist.get_rank(pair)", dist.get_rank(pair), rank)

    # 3. A list of global ranks as group=: one cached group per list, and only
    #    its members call. Even and odd ranks reduce separately.
    members = list(range(rank % 2, n, 2))
    got = pd.all_reduce(rank, group=members)                  # a Python int: exact
    wrong += check(f"all_reduce({rank}, group={members})", got, sum(members))

    # 4. src/dst are GLOBAL ranks, also inside a group: the last member is src.
    src = members[-1]
    got = pd.broadcast(f"from global rank {src}" if rank == src else None, src=src, group=members)
    wrong += check(f"broadcast(str, src={src}, group={members})", got, f"from global rank {src}")
    got = pd.gather(rank * 10, dst=members[0], group=members)
    want = [m * 10 for m in members] if rank == members[0] else None
    wrong += check(f"gather({rank * 10}, dst={members[0]}, group={members})", got, want)

    # 5. Bad groups raise before any communication, on the calling rank only.
    for bad in ([0, n], [0, 0], "0,1"):
        try:
            pd.all_reduce(torch.ones(1), group=bad)
            wrong += check(f"all_reduce(group={bad!r}) raises", "no error", "an error")
        except (ValueError, TypeError) as exc:  # InvalidGroupError is both
            print(f"rank {rank}: all_reduce(group={bad!r}) -> {type(exc).__name__}: {exc}", flush=True)

    wrong = pd.all_reduce(wrong)  # every rank learns the total and exits alike
    if rank == 0:
        print(f"groups: {'all results as expected' if not wrong else f'{wrong} WRONG'} on {n} ranks", flush=True)
    pd.barrier()
    pd.finalize()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
