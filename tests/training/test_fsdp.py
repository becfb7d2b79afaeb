"""``auto_model(model, use_fsdp=True)`` (issue 27, item 4): FSDP2 over the world, the same training as DDP.

Runs on gloo and MPI worlds (``world2``; horovod under ``make test-horovod``).
"""

import pytest
import torch
from torch import nn

import polydist as pd

pytestmark = pytest.mark.timeout(120)


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))


def _fsdp_vs_ddp():
    """Ranks start from different weights; both modes must start from rank 0's and train alike. The replicated
    path is idist's: DDP, or on horovod the unwrapped model with auto_optim's hvd.DistributedOptimizer."""
    from torch.distributed.fsdp import FSDPModule

    r, n = pd.get_rank(), pd.get_world_size()
    sharded = pd.auto_model(_net(seed=r), use_fsdp=True)  # rank r's own weights: auto_model must broadcast rank 0's
    replicated = pd.auto_model(_net(seed=r))
    start = [p.full_tensor().clone() for p in sharded.parameters()]
    same_start = all(torch.equal(a, b) for a, b in zip(start, _net(seed=0).parameters()))
    opts = [torch.optim.SGD(sharded.parameters(), lr=0.2), pd.auto_optim(torch.optim.SGD(replicated.parameters(), lr=0.2))]
    for step in range(3):
        x = torch.randn(5, 6, generator=torch.Generator().manual_seed(10 * step + r))
        for model, opt in zip((sharded, replicated), opts):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    gap = max((a.full_tensor() - b).abs().max().item() for a, b in zip(sharded.parameters(), getattr(replicated, "module", replicated).parameters()))
    moved = min((a.full_tensor() - b).abs().max().item() for a, b in zip(sharded.parameters(), start))
    shard_rows = [p.to_local().shape[0] for p in sharded.parameters()]
    return {"fsdp": isinstance(sharded, FSDPModule) and isinstance(sharded[0], FSDPModule), "same_start": same_start,
            "gap": gap, "moved": moved, "rows": shard_rows, "again": pd.auto_model(sharded, use_fsdp=True) is sharded}


def test_use_fsdp_trains_as_ddp_does(world2):
    for r, got in enumerate(world2.run(_fsdp_vs_ddp)):
        assert got["fsdp"] and got["same_start"] and got["again"]
        assert got["rows"] == ([6, 6, 2, 2] if r == 0 else [6, 6, 1, 1])  # dim 0 of each parameter split over 2 ranks
        assert got["moved"] > 1e-3 and got["gap"] < 1e-5


def _bad_calls():
    out = []
    for kwargs in ({"sync_bn": True}, {"device_ids": [0]}):
        try:
            pd.auto_model(_net(0), use_fsdp=True, **kwargs)
        except (ValueError, TypeError) as exc:
            out.append(f"{type(exc).__name__}: {exc}")
    return out


def test_use_fsdp_argument_errors_before_communicating(world2):
    for errors in world2.run(_bad_calls):
        assert errors[0].startswith("ValueError") and "sync_bn" in errors[0]
        assert errors[1].startswith("TypeError") and "device_ids" in errors[1]


def test_use_fsdp_serial_is_the_plain_model():
    model = _net(0)
    assert pd.auto_model(model, use_fsdp=True) is model


def _fsdp_over_tp_2d():
    """A 2 x 2 mesh: tensor parallel over "tp", then auto_model's FSDP2 over "dp"; 2 steps against an unsharded model."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)  # one model on every rank: tensor parallel takes each rank's slice of its own copy
    reference = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    model = parallelize_module(copy.deepcopy(reference), mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    model = pd.auto_model(model, use_fsdp=True, mesh=mesh["dp"])
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(reference.parameters(), lr=0.1)
    dp = mesh["dp"].get_local_rank()
    for step in range(2):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))  # the global batch, 2 rows per dp rank
        model(x[2 * dp : 2 * dp + 2]).pow(2).mean().backward()
        reference(x).pow(2).mean().backward()
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad()
    placements = [str(p.placements) for p in model.parameters()]
    gap = max((p.full_tensor() - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
    return gap, placements


@pytest.mark.subgroups
def test_fsdp_over_tensor_parallel_on_a_2d_mesh(world4):
    for gap, placements in world4.run(_fsdp_over_tp_2d):
        assert gap < 1e-5
        # dim 0 sharded on both mesh dimensions: dp's (strided) shard of tp's column shard, the 2-D layout
        assert placements[0].count("Shard(dim=0") == 2, placements
