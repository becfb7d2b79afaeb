"""torch.distributed's newer APIs on every backend (issue 27's table): pipelining, batched P2P, functional
collectives, DDP's Join, DTensor.

Each runs on gloo (reference) and MPI worlds; results are checked against what a single process computes.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

pytestmark = pytest.mark.timeout(150)


def _pipeline():
    """Two stages of one MLP (PipelineStage + ScheduleGPipe, 2 microbatches) against the whole MLP in one process."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    r = dist.get_rank()
    torch.manual_seed(0)
    whole = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    mine = whole[:2] if r == 0 else whole[2:]
    stage = PipelineStage(mine, r, 2, torch.device("cpu"))
    # scale_grads=False: the microbatches' gradients summed, as the whole batch's summed loss gives them
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, target: (out - target).pow(2).sum(), scale_grads=False)
    x, y = torch.randn(4, 4, generator=torch.Generator().manual_seed(1)), torch.randn(4, 2, generator=torch.Generator().manual_seed(2))
    out = schedule.step(x) if r == 0 else schedule.step(target=y, losses=[])
    grads = [p.grad.clone() for p in mine.parameters()]
    for p in whole.parameters():
        p.grad = None
    expected_out = whole(x)
    (expected_out - y).pow(2).sum().backward()
    same_out = True if r == 0 else torch.allclose(out, expected_out, atol=1e-6)
    return same_out, max((g - p.grad).abs().max().item() for g, p in zip(grads, mine.parameters()))


@pytest.mark.p2p
def test_pipelining_gpipe_matches_one_process(world2):
    for same_out, grad_gap in world2.run(_pipeline):
        assert same_out and grad_gap < 1e-6


def _batched_ring():
    r, n = dist.get_rank(), dist.get_world_size()
    got = torch.empty(3)
    ops = [dist.P2POp(dist.isend, torch.full((3,), float(r)), (r + 1) % n), dist.P2POp(dist.irecv, got, (r - 1) % n)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return got


@pytest.mark.p2p
def test_batch_isend_irecv_ring(world3):
    for r, got in enumerate(world3.run(_batched_ring)):
        assert got.tolist() == [float((r - 1) % 3)] * 3


def _batched_ring_without_the_dispatchers_backend():
    """The ring on a group made as where polydist's Backend for torch's dispatcher is not built (a Python group
    then is its own Backend: torch 2.14's batch_isend_irecv asks the group's Backend whether it coalesces)."""
    import os

    from polydist import settings

    os.environ[settings.DISPATCH.name] = "0"
    try:
        group = dist.new_group([0, 1, 2])
    finally:
        del os.environ[settings.DISPATCH.name]
    r, got = dist.get_rank(), torch.empty(3)
    ops = [dist.P2POp(dist.isend, torch.full((3,), float(r)), (r + 1) % 3, group),
           dist.P2POp(dist.irecv, got, (r - 1) % 3, group)]  # fmt: skip
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    dist.destroy_process_group(group)
    return got


@pytest.mark.p2p
@pytest.mark.subgroups
def test_batch_isend_irecv_ring_on_a_group_without_the_dispatchers_backend(world3):
    for r, got in enumerate(world3.run(_batched_ring_without_the_dispatchers_backend)):
        assert got.tolist() == [float((r - 1) % 3)] * 3


def _functional():
    import torch.distributed._functional_collectives as funcol

    r, n = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    reduced = funcol.all_reduce(torch.full((2,), float(r + 1)), "sum", group).wait()
    gathered = funcol.all_gather_tensor(torch.full((2,), float(r)), 0, group).wait()
    scattered = funcol.reduce_scatter_tensor(torch.arange(2.0 * n) * (r + 1), "sum", 0, group).wait()
    compiled = torch.compile(lambda t: funcol.all_reduce(t * 2, "sum", group).wait(), backend="eager")(torch.ones(2))
    return reduced, gathered, scattered, compiled


def test_functional_collectives(world3):
    n, factor = 3, 6
    for r, (reduced, gathered, scattered, compiled) in enumerate(world3.run(_functional)):
        assert reduced.tolist() == [6.0, 6.0]
        assert gathered.tolist() == [float(k) for k in range(n) for _ in range(2)]
        assert scattered.tolist() == [factor * float(2 * r + i) for i in range(2)]
        assert compiled.tolist() == [2.0 * n] * 2


def _uneven_join():
    """DDP under Join: rank r runs 2 + r steps; the ranks that run out shadow the others' all-reduces."""
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    r = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = [p.detach().clone() for p in model.parameters()]
    with Join([model]):
        for _ in range(2 + r):
            model(torch.full((1, 2), float(r + 1))).sum().backward()
            opt.step()
            opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()], start


def test_ddp_join_with_uneven_inputs(world3):
    results = world3.run(_uneven_join)
    final, start = results[0]
    assert all(torch.equal(a, b) for other, _ in results for a, b in zip(final, other))  # replicas stay identical
    assert all(not torch.equal(a, b) for a, b in zip(final, start))


def _dtensor():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    whole = torch.arange(6.0 * n * n).reshape(3 * n, 2 * n)
    rows = distribute_tensor(whole, mesh, [Shard(0)])
    cols = rows.redistribute(mesh, [Shard(1)])  # an all-to-all
    summed = (rows * 2).redistribute(mesh, [Replicate()])  # an all-gather
    return rows.to_local(), cols.to_local(), rows.full_tensor(), summed.to_local(), whole


def test_dtensor_distribute_redistribute_full_tensor(world3):
    for r, (rows, cols, full, replicated, whole) in enumerate(world3.run(_dtensor)):
        assert torch.equal(rows, whole[3 * r : 3 * r + 3]) and torch.equal(cols, whole[:, 2 * r : 2 * r + 2])
        assert torch.equal(full, whole) and torch.equal(replicated, whole * 2)
