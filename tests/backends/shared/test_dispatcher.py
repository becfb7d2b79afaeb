"""torch's own tools see polydist's traffic (issue 52): a torch-level call on the MPI group takes torch's
dispatcher ops (``torch.ops.c10d.*``), as on gloo.

``CommDebugMode`` (torch.distributed.tensor.debug), which counts the c10d ops the dispatcher sees, must count the
same on the MPI world as on gloo's; FSDP2 gradient accumulation is counted as PyTorch's own test counts it
(TestFullyShardGradientAccumulation, test/distributed/_composable/fsdp/test_fully_shard_training.py: a
reduce-scatter per FSDP group on the microbatch that syncs, none on the others). Where the compiled Backend is not
built (or ``POLYDIST_DISPATCH=0``), the MPI group stands beside the dispatcher and the MPI cases are skipped.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.timeout(150)


def _skip_without_dispatcher(backend_kind: str) -> None:
    from polydist.backends import dispatch

    if backend_kind == "mpi" and not dispatch.dispatched():
        pytest.skip("polydist.backends._dispatch is not built (or POLYDIST_DISPATCH=0): the MPI group is its own "
                    "ProcessGroup, past torch's dispatcher")


def _counted_collectives():
    from torch.distributed.tensor.debug import CommDebugMode

    r, n = dist.get_rank(), dist.get_world_size()
    with CommDebugMode() as mode:
        t = torch.full((2,), r + 1.0)
        dist.all_reduce(t)
        gathered = torch.empty(2 * n)
        dist.all_gather_into_tensor(gathered, torch.full((2,), float(r)))
        scattered = torch.empty(1)
        dist.reduce_scatter_tensor(scattered, torch.ones(n))
        swapped = torch.empty(n)
        dist.all_to_all_single(swapped, torch.full((n,), float(r)))
        b = torch.tensor([float(r)])
        dist.broadcast(b, 0)
        dist.barrier()
        work = dist.all_reduce(torch.ones(1), async_op=True)  # an async call: counted alike, waited for after
    work.wait()
    counts = {str(op): count for op, count in mode.get_comm_counts().items()}
    return counts, [t.tolist(), gathered.tolist(), scattered.tolist(), swapped.tolist(), b.tolist()]


# What CommDebugMode counts on gloo (torch 2.13) for _counted_collectives: barrier is not among the ops it counts.
GLOO_COUNTS = {"c10d.allreduce_": 2, "c10d._allgather_base_": 1, "c10d._reduce_scatter_base_": 1,
               "c10d.alltoall_base_": 1, "c10d.broadcast_": 1}  # fmt: skip


def test_comm_debug_mode_counts_as_on_gloo(world2, backend_kind):
    _skip_without_dispatcher(backend_kind)
    for r, (counts, values) in enumerate(world2.run(_counted_collectives)):
        assert counts == GLOO_COUNTS, backend_kind
        assert values == [[3.0, 3.0], [0.0, 0.0, 1.0, 1.0], [2.0], [0.0, 1.0], [0.0]]


def _gradient_accumulation():
    """FSDP2 over 2 layers, 2 microbatches, gradients synced on the last only: the reduce-scatters counted."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.debug import CommDebugMode

    r = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    reference = [p.detach().clone() for p in model.parameters()]
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    inputs = [torch.randn(3, 4, generator=torch.Generator().manual_seed(10 * r + m)) for m in range(2)]
    scatters = []
    for m, x in enumerate(inputs):
        last = m == len(inputs) - 1
        model.set_requires_gradient_sync(last)
        with CommDebugMode() as mode:
            model(x).sum().backward()
        scatters.append(mode.get_comm_counts()[torch.ops.c10d._reduce_scatter_base_])
    grads = [p.grad.full_tensor() for p in model.parameters()]
    return scatters, grads, inputs, reference


def test_fsdp2_gradient_accumulation_counts_its_reduce_scatters(world2, backend_kind):
    _skip_without_dispatcher(backend_kind)
    results = world2.run(_gradient_accumulation)
    whole = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with torch.no_grad():
        for p, value in zip(whole.parameters(), results[0][3]):
            p.copy_(value)
    for _, _, inputs, _ in results:  # every rank's microbatches, averaged over the 2 ranks as FSDP2 reduces
        for x in inputs:
            (whole(x).sum() / 2).backward()
    for scatters, grads, _, _ in results:
        assert scatters == [0, 2], backend_kind  # one reduce-scatter per layer, on the microbatch that syncs
        for g, p in zip(grads, whole.parameters()):
            assert torch.allclose(g, p.grad, atol=1e-5)
