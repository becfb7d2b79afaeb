"""Shapes that change on one rank at random steps: the single-round protocol of the any-shape collectives.

all_gather, gather, scatter and all_to_all move each item with its header
in a slot whose width is predicted from earlier calls
(:mod:`polydist.collectives.slots`); MPI moves exact sizes after a header
exchange. These tests change one rank's shape at random steps (a schedule
every rank draws from the same seed) and check every result exactly, on gloo
and on the mpi4py backend, in debug mode too; they check that repeated shapes
cost one ``torch.distributed`` call on gloo, that a changed shape costs one
more, and that a rank which never arrives is named by the timeout.
"""

import random

import pytest
import torch
import torch.distributed as dist

import polydist as pd
from polydist import context
from polydist.collectives import slots
from polydist.groups import resolve

pytestmark = pytest.mark.timeout(240)

SIZES = [0, 1, 7, 300, 4096, 20000, 70000]  # elements: empty, inline-sized, past the first guess, large


def _item(rank: int, step: int, n: int, dtype=torch.float32) -> torch.Tensor:
    return (torch.arange(n) % 251 + 1000 * rank + step).to(dtype)


def _changing(seed: int, steps: int, debug: bool) -> int:
    """Every collective each step, one rank's shape changed at random steps; returns the number of checks."""
    r, n = pd.get_rank(), pd.get_world_size()
    plan = random.Random(seed)  # the same draws on every rank: everyone knows every rank's shape
    shapes = [4096] * n
    checks = 0
    kept = []  # earlier results: buffers reused from call to call must never be what a result is a view of
    with pd.set_debug(debug):
        for step in range(steps):
            assert all(torch.equal(got, want) for got, want in kept), ("an earlier result changed", step)
            kept = kept[-3:]
            if plan.random() < 0.35:
                shapes[plan.randrange(n)] = plan.choice(SIZES)
            dtype = plan.choice([torch.float32, torch.int16, torch.float64])
            rows = [_item(i, step, shapes[i], dtype) for i in range(n)]
            got = pd.all_gather(rows[r])
            assert torch.equal(got, torch.cat(rows)) and got.dtype == dtype, ("all_gather", step)
            kept.append((got, torch.cat(rows)))
            got = pd.all_gather(rows[r].reshape(-1, 1), concat=False)
            assert all(torch.equal(a, b.reshape(-1, 1)) for a, b in zip(got, rows)), ("all_gather list", step)
            root = step % n
            got = pd.gather(rows[r], dst=root)
            assert (torch.equal(got, torch.cat(rows)) if r == root else got is None), ("gather", step)
            sent = [_item(i, step, shapes[(root + i) % n], dtype) for i in range(n)]
            got = pd.scatter(sent if r == root else None, src=root)
            assert torch.equal(got, sent[r]), ("scatter", step)
            kept.append((got, sent[r].clone()))
            got = pd.all_to_all([_item(10 * r + i, step, shapes[(r + i) % n], dtype) for i in range(n)])
            want = [_item(10 * j + r, step, shapes[(j + r) % n], dtype) for j in range(n)]
            assert all(torch.equal(a, b) for a, b in zip(got, want)), ("all_to_all", step)
            checks += 5
    return checks


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_shapes_changing_on_one_rank_at_random_steps(world3, debug):
    steps = 40 if not debug else 15
    assert world3.run(_changing, 7, steps, debug) == [5 * steps] * 3


def _counted_calls(steps: int) -> dict:
    """torch.distributed calls per collective: the first call, repeats, then a shape change on rank 1 only."""
    counts = {"all_gather": [], "gather": [], "scatter": [], "all_to_all": []}
    seen = []

    def counting(fn):
        def wrapper(*args, **kwargs):
            seen.append(fn.__name__)
            return fn(*args, **kwargs)

        return wrapper

    originals = {name: getattr(slots, name, None) for name in ("all_gather_single",)}
    slots.all_gather_single = counting(originals["all_gather_single"])
    patched = {name: getattr(dist, name) for name in ("scatter", "all_to_all_single", "isend", "irecv")}
    for name, fn in patched.items():
        setattr(dist, name, counting(fn))
    try:
        r = pd.get_rank()
        resolve(context.require_group(), None).predictors.clear()  # on every rank at the same point: no history
        for step in range(steps):
            n = 5000 if (step == steps - 1 and r == 1) else 1000  # the last step: rank 1 grows
            x = torch.ones(n)
            for name, call in (
                ("all_gather", lambda: pd.all_gather(x)),
                ("gather", lambda: pd.gather(x, dst=0)),
                ("scatter", lambda: pd.scatter([x] * 2 if r == 1 else None, src=1)),
                ("all_to_all", lambda: pd.all_to_all([x, x])),
            ):
                seen.clear()
                call()
                counts[name].append(len(seen))
    finally:
        slots.all_gather_single = originals["all_gather_single"]
        for name, fn in patched.items():
            setattr(dist, name, fn)
    return counts


def test_repeated_shapes_cost_one_call_and_a_change_one_more(world_pool):
    """gloo: the first call (no history: 4 KiB does not fit the first 256-byte guess) and the step where rank 1
    grows take a second round; every repeat takes one. gather is point-to-point to the root (one message per
    sender), so it counts messages: rank 1 sends one, the root receives one."""
    steps = 5
    for r, counts in enumerate(world_pool.get(2, "polydist").run(_counted_calls, steps)):
        for name in ("all_gather", "scatter", "all_to_all"):
            assert counts[name] == [2] + [1] * (steps - 2) + [2], (r, name, counts[name])
        sender_grew = [2] + [1] * (steps - 2) + [2]
        assert counts["gather"] == sender_grew, (r, counts["gather"])


def _skip_gather(local_rank):
    if pd.get_rank() == 2:
        import time

        time.sleep(60)
    else:
        pd.barrier(group=[0, 1])  # in step (see test_failures.py)
    pd.gather(torch.ones(3), dst=0)
    pd.all_gather(torch.ones(3))


def test_gather_timeout_names_the_rank_that_did_not_arrive():
    """gloo's gather runs point to point: the root's wait on rank 2 times out and is named like a collective's."""
    with pytest.raises(pd.WorkerFailedError) as info:
        with pd.Parallel(backend="gloo", nproc_per_node=3, timeout=2) as parallel:
            parallel.run(_skip_gather)
    text = str(info.value)
    assert "CollectiveTimeoutError: " in text and "on group [0, 1, 2] timed out after 2 s" in text, text
    assert "2] did not arrive" in text, text


BIG = (4 << 20) // 4 + 1000  # float32 elements: past the width from which scatter and all_to_all send headers first


def _wide_and_narrow(seed: int, steps: int) -> int:
    """scatter and all_to_all switching between slots beside headers and headers first (> 4 MiB), uneven too."""
    r, n = pd.get_rank(), pd.get_world_size()
    plan = random.Random(seed)
    checks = 0
    wide = []
    originals = slots._scatter_wide, slots._all_to_all_wide
    slots._scatter_wide = lambda *a: (wide.append("scatter"), originals[0](*a))[1]
    slots._all_to_all_wide = lambda *a: (wide.append("all_to_all"), originals[1](*a))[1]
    try:
        checks = _switching(plan, r, n, steps)
    finally:
        slots._scatter_wide, slots._all_to_all_wide = originals
    direct = resolve(context.require_group(), None).direct is not None  # MPI: headers first at every size
    return checks, direct or {"scatter", "all_to_all"} <= set(wide)


def _switching(plan: random.Random, r: int, n: int, steps: int) -> int:
    checks = 0
    for step in range(steps):
        sizes = [plan.choice([5, BIG, BIG + 16 * plan.randrange(3)]) for _ in range(n)]
        root = plan.randrange(n)
        sent = [_item(i, step, sizes[i]) for i in range(n)]
        got = pd.scatter(sent if r == root else None, src=root)
        assert torch.equal(got, sent[r]), ("scatter", step, sizes)
        mine = [_item(10 * r + i, step, sizes[(r + i) % n]) for i in range(n)]
        got = pd.all_to_all(mine)
        want = [_item(10 * j + r, step, sizes[(j + r) % n]) for j in range(n)]
        assert all(torch.equal(a, b) for a, b in zip(got, want)), ("all_to_all", step, sizes)
        checks += 2
    return checks


def test_megabyte_items_switch_to_headers_first_and_back(world3):
    assert world3.run(_wide_and_narrow, 3, 10) == [(20, True)] * 3
