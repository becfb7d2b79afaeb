"""Training helpers (auto_model, auto_optim, auto_dataloader, DistributedProxySampler) and one_rank_only/first.

Functions named ``_on_*`` run on every rank of a persistent world (tests/_world.py).
"""

import os
import time
import warnings

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, TensorDataset

import polydist as pd
from polydist import helpers, training
from polydist.helpers import one_rank_first, one_rank_only
from polydist.training import DistributedProxySampler, auto_dataloader, auto_model, auto_optim

pytestmark = pytest.mark.timeout(120)


def _recording(fn, *args, **kwargs):
    """(fn's result, the messages of the warnings it issued)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kwargs)
    return out, [str(w.message) for w in caught]


def _flat(module: nn.Module) -> list:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).tolist()


def _numbers(loader) -> list:
    """The sample values of a loader over TensorDataset(arange(n)), in order."""
    return [int(v) for (batch,) in loader for v in batch]


# ------------------------------------------------------------ auto_model


def _on_ddp_steps():
    rank = pd.get_rank()
    torch.manual_seed(rank)  # different initial weights: DDP must broadcast rank 0's
    model = auto_model(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)))
    inner = model.module if isinstance(model, DistributedDataParallel) else model  # horovod: not wrapped, as in idist
    reference = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    reference.load_state_dict(inner.state_dict())
    opt = auto_optim(torch.optim.SGD(model.parameters(), lr=0.5))  # horovod: DistributedOptimizer averages
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    data = torch.Generator().manual_seed(7)
    for _ in range(3):
        x, y = torch.randn(8, 4, generator=data), torch.randint(0, 2, (8,), generator=data)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[rank::2]), y[rank::2]).backward()  # mean over this rank's 4
        opt.step()
        ref_opt.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()  # mean over the global 8
        ref_opt.step()
    return isinstance(model, DistributedDataParallel), _flat(inner), _flat(reference)


def test_auto_model_ddp_replicas_identical_and_equal_to_global_batch(world2):
    results = world2.run(_on_ddp_steps)
    assert all(wrapped == (world2.how != "horovod") for wrapped, _, _ in results)
    assert results[0][1] == results[1][1]  # bit-identical replicas
    assert results[0][1] == pytest.approx(results[0][2], abs=1e-6)  # DDP = full-batch SGD


class _FakeDDP(nn.Module):
    """Records what auto_model wraps: torch's DDP itself refuses SyncBatchNorm on cpu modules."""

    def __init__(self, module, **kwargs):
        super().__init__()
        self.module = module


def _on_sync_bn(pretend_gpu):
    saved = training._sync_bn_supported, training.DistributedDataParallel
    if pretend_gpu:  # the conversion is device-independent; torch's SyncBatchNorm only trains on GPUs
        training._sync_bn_supported, training.DistributedDataParallel = (lambda dev: True), _FakeDDP
    try:
        model, messages = _recording(auto_model, nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), sync_bn=True)
    finally:
        training._sync_bn_supported, training.DistributedDataParallel = saved
    if not pretend_gpu:
        model(torch.randn(6, 4)).sum().backward()  # training works with the kept BatchNorm
    return [type(m).__name__ for m in model.module], messages


def test_auto_model_sync_bn(world2):
    if world2.how == "horovod":
        pytest.skip("auto_model does not wrap on horovod (idist's semantics), so sync_bn has nothing to convert for")
    converted = world2.run(_on_sync_bn, True)  # converted before wrapping
    assert all(kinds == ["Linear", "SyncBatchNorm"] and not msgs for kinds, msgs in converted)
    kept = world2.run(_on_sync_bn, False)
    assert all(kinds == ["Linear", "BatchNorm1d"] for kinds, _ in kept)
    assert all(any("SyncBatchNorm cannot train on cpu" in m for m in msgs) for _, msgs in kept)


def test_auto_model_serial_unwrapped_on_device():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    assert auto_model(model, sync_bn=True, find_unused_parameters=True) is model
    assert isinstance(model[1], nn.BatchNorm1d) and next(model.parameters()).device == pd.device()
    with pytest.raises(TypeError, match="Module"):
        auto_model("not a model")


# ------------------------------------------------------------ auto_optim


def _on_optim_sync():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (pd.get_rank() + 1), momentum=0.9)
    if pd.get_rank() == 0:  # only rank 0 has momentum state, e.g. a checkpoint restored there
        model(torch.ones(2, 3)).sum().backward()
        opt.step()
    got, messages = _recording(auto_optim, opt, backward_passes_per_step=2)
    momentum = [got.state[p]["momentum_buffer"].tolist() for p in model.parameters()]
    horovod = getattr(got, "backward_passes_per_step", None)  # Horovod's DistributedOptimizer keeps the option
    return got is opt, got.param_groups[0]["lr"], momentum, messages, horovod


def test_auto_optim_broadcasts_rank0_state_in_place(world2):
    results = world2.run(_on_optim_sync)
    assert [lr for _, lr, *_ in results] == [0.1, 0.1]
    assert results[0][2] == results[1][2]
    if world2.how == "horovod":  # idist's semantics there: hvd.DistributedOptimizer(opt, **kwargs), state taken over
        assert all(not same and not msgs and passes == 2 for same, _, _, msgs, passes in results)
    else:
        assert all(same for same, *_ in results)
        assert all(any("backward_passes_per_step" in m for m in msgs) for _, _, _, msgs, _ in results)


def test_auto_optim_serial_unchanged():
    opt = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.3)
    assert auto_optim(opt) is opt and opt.param_groups[0]["lr"] == 0.3 and not opt.state
    with pytest.raises(TypeError, match="Optimizer"):
        auto_optim(object())


# ------------------------------------------------------------ auto_dataloader


def _on_loader_settings(batch_size):
    ds = TensorDataset(torch.arange(30))
    loader, messages = _recording(auto_dataloader, ds, batch_size=batch_size, num_workers=4, shuffle=True)
    return (loader.batch_size, loader.num_workers, loader.persistent_workers, loader.pin_memory,
            type(loader.sampler).__name__, pd.get_nproc_per_node(), messages)


def test_auto_dataloader_splits_global_batch_and_workers(world3):
    for batch_size, warned in ((63, False), (64, True)):
        for per_rank, workers, persistent, pinned, sampler, nproc, msgs in world3.run(_on_loader_settings, batch_size):
            assert per_rank == 21 and workers == (-(-4 // nproc) if 4 >= nproc else 4) and persistent and not pinned
            assert sampler == "_EpochSampler"
            assert bool(msgs) == warned
            if warned:
                assert "batch_size 64 is not divisible by the world size 3" in msgs[0]
                assert "global batch of 63" in msgs[0]


def _on_eval_loader():
    loader = auto_dataloader(TensorDataset(torch.arange(10)), batch_size=6, shuffle=False)  # evaluation
    return _numbers(loader), _numbers(loader), len(loader)


def test_auto_dataloader_eval_unshuffled_covers_dataset(world3):
    results = world3.run(_on_eval_loader)
    # 10 samples over 3 ranks: padded to 12 by wrapping (0 and 1 twice), rank r takes r, r+3, ...
    expected = [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    assert [first for first, _, _ in results] == expected
    assert [second for _, second, _ in results] == expected  # same order every epoch
    assert {v for first, _, _ in results for v in first} == set(range(10))
    assert all(n == 2 for _, _, n in results)  # 4 samples, 2 per batch


def _on_epochs(seed):
    loader = auto_dataloader(TensorDataset(torch.arange(20)), batch_size=4, shuffle=True, seed=seed)
    passes = [_numbers(loader) for _ in range(3)]  # no set_epoch: epochs 0, 1, 2
    loader.sampler.set_epoch(7)  # pins the next pass (resume); numbering continues from there
    passes += [_numbers(loader), _numbers(loader)]
    return passes


def test_auto_dataloader_epoch_advances_by_itself(world2):
    seed = 5
    results = world2.run(_on_epochs, seed)
    for i, epoch in enumerate([0, 1, 2, 7, 8]):
        perm = torch.randperm(20, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        assert [results[rank][i] for rank in range(2)] == [perm[0::2], perm[1::2]]  # disjoint, same order
    orders = [results[0][i] for i in range(5)]
    assert len({tuple(o) for o in orders}) == 5  # a different order each epoch


def test_auto_dataloader_serial_plain_or_seeded():
    ds = TensorDataset(torch.arange(12))
    loader = auto_dataloader(ds, batch_size=5, pin_memory=True)
    assert type(loader) is DataLoader and loader.batch_size == 5 and not loader.pin_memory
    # With a seed the order is a function of (seed, epoch) also serially, workers included
    # (a loader with workers iterates its sampler twice when it starts: the epoch must still be 0).
    seeded = auto_dataloader(ds, batch_size=5, shuffle=True, seed=3, num_workers=1)
    first, second = _numbers(seeded), _numbers(seeded)
    for order, epoch in ((first, 0), (second, 1)):
        assert order == torch.randperm(12, generator=torch.Generator().manual_seed(3 + epoch)).tolist()


def _on_user_sampler():
    ds = TensorDataset(torch.arange(9))
    loader = auto_dataloader(ds, batch_size=2, sampler=RandomSampler(ds))
    passes = [_numbers(loader), _numbers(loader)]
    before = torch.get_rng_state()  # (the DataLoader itself draws its workers' base seed from it)
    list(loader.sampler)
    return type(loader.sampler).__name__, passes, torch.equal(before, torch.get_rng_state())


def test_auto_dataloader_wraps_user_sampler(world2):
    results = world2.run(_on_user_sampler)
    assert all(name == "DistributedProxySampler" and untouched for name, _, untouched in results)
    for epoch in range(2):
        a, b = results[0][1][epoch], results[1][1][epoch]
        assert len(a) == len(b) == 5 and set(a) | set(b) == set(range(9))  # 9 padded to 10
    assert results[0][1][0] != results[0][1][1]


# ------------------------------------------------------------ DistributedProxySampler


def test_proxy_sampler_deterministic_without_touching_global_rng():
    base = RandomSampler(range(10))  # draws from torch's global RNG
    torch.manual_seed(123)
    state = torch.get_rng_state()
    parts = {}
    for epoch in (0, 1):
        for rank in range(3):
            s = DistributedProxySampler(base, num_replicas=3, rank=rank)
            s.set_epoch(epoch)
            parts[epoch, rank] = list(s)
            assert list(s) == parts[epoch, rank]  # same epoch, same indices
    assert torch.equal(torch.get_rng_state(), state)  # idist's version reseeds it with the epoch
    for epoch in (0, 1):
        assert [len(parts[epoch, r]) for r in range(3)] == [4, 4, 4]
        assert {i for r in range(3) for i in parts[epoch, r]} == set(range(10))
    assert parts[0, 0] != parts[1, 0]


def test_proxy_sampler_errors():
    with pytest.raises(ValueError, match="rank 3"):
        DistributedProxySampler(range(5), num_replicas=3, rank=3)
    with pytest.raises(ValueError, match="num_replicas"):
        DistributedProxySampler(range(5), num_replicas=0, rank=0)
    with pytest.raises(TypeError, match="DistributedSampler"):
        DistributedProxySampler(DistributedSampler(range(5), num_replicas=2, rank=0))
    with pytest.raises(TypeError, match="__len__"):
        DistributedProxySampler(iter(range(5)), num_replicas=2, rank=0)
    serial = DistributedProxySampler(range(5))  # world size 1, rank 0
    assert list(serial) == [0, 1, 2, 3, 4]


# ------------------------------------------------------------ one_rank_first


def _on_first(tmp, first):
    me = pd.get_rank()
    marker = os.path.join(tmp, f"ready-{first}")
    with one_rank_first(rank=first):
        if me == first:
            time.sleep(0.3)  # the others would see no file if they did not wait
            with open(marker, "w") as f:
                f.write("done")
            return "first"
        return os.path.exists(marker)


def test_one_rank_first_global(world3, tmp_path):
    assert world3.run(_on_first, str(tmp_path), 1) == [True, "first", True]


def _on_first_local(tmp, local_rank):
    # A fake two-node layout: node 0 runs global ranks 0 and 1, node 1 runs rank 2 alone.
    node, local = [(0, 0), (0, 1), (1, 0)][pd.get_rank()]
    saved = helpers.get_node_rank, helpers.get_local_rank
    helpers.get_node_rank, helpers.get_local_rank = (lambda: node), (lambda: local)
    try:
        with one_rank_first(rank=local_rank, local=True):
            if local == local_rank:
                time.sleep(0.3)
                open(os.path.join(tmp, f"node{node}"), "w").close()
                return "first"
            return os.path.exists(os.path.join(tmp, f"node{node}"))
    except ValueError as exc:
        return str(exc)
    finally:
        helpers.get_node_rank, helpers.get_local_rank = saved


def test_one_rank_first_local_per_node(world3, tmp_path):
    assert world3.run(_on_first_local, str(tmp_path), 0) == ["first", True, "first"]
    # Node 1 has no local rank 1: every rank says so (none waits for a first rank that does not exist).
    errors = world3.run(_on_first_local, str(tmp_path), 1)
    assert all("local rank 1 does not exist on node(s) [1]" in e for e in errors)


def _on_first_raises():
    try:
        with one_rank_first(rank=0):
            if pd.get_rank() == 0:
                raise RuntimeError("download failed")
            return "entered after rank 0"
    except RuntimeError:
        return "raised"


def test_one_rank_first_error_releases_the_others(world3):
    assert world3.run(_on_first_raises, timeout=30) == ["raised", "entered after rank 0", "entered after rank 0"]


def _on_bad_rank(kind):
    try:
        if kind == "first":
            with one_rank_first(rank=3):
                pass
        else:
            one_rank_only(rank=5)(lambda: None)()
    except ValueError as exc:
        return str(exc)


def test_bad_ranks_raise_everywhere(world3):
    assert all("rank 3 is out of range for the world size 3" in e for e in world3.run(_on_bad_rank, "first"))
    assert all("rank 5 is out of range for the world size 3" in e for e in world3.run(_on_bad_rank, "only"))


# ------------------------------------------------------------ one_rank_only


def _on_only(tmp):
    marker = os.path.join(tmp, "written")

    @one_rank_only(rank=1, with_barrier=True)
    def write():
        time.sleep(0.3)
        open(marker, "w").close()
        return f"ran on {pd.get_rank()}"

    return write(), os.path.exists(marker)


def test_one_rank_only_result_and_barrier(world3, tmp_path):
    assert world3.run(_on_only, str(tmp_path)) == [(None, True), ("ran on 1", True), (None, True)]


def test_rank_helpers_serial():
    assert one_rank_only()(lambda x: x + 1)(1) == 2
    assert one_rank_only(with_barrier=True)(lambda: "ok")() == "ok"
    with pytest.raises(ValueError, match="rank 1 is out of range for the world size 1"):
        one_rank_only(rank=1)(lambda: None)()
    with pytest.raises(ValueError, match="rank -1"):
        one_rank_only(rank=-1)
    with pytest.raises(TypeError, match="'0'"):
        one_rank_only(rank="0")
    ran = []
    with one_rank_first():
        ran.append(1)
    with one_rank_first(local=True):
        ran.append(2)
    assert ran == [1, 2]
    with pytest.raises(ValueError, match="rank 2"):
        with one_rank_first(rank=2):
            pass


# ------------------------------------------------------------ auto_dataloader as idist (issue 12)


def _on_idist_defaults():
    ds = TensorDataset(torch.arange(42))
    shuffled = _numbers(auto_dataloader(ds, batch_size=3))  # no shuffle given: shuffled, as idist
    ordered = _numbers(auto_dataloader(ds, batch_size=3, shuffle=False))
    _, wrong = _recording(auto_dataloader, ds, sampler=DistributedSampler(ds, num_replicas=5, rank=4))
    mine = DistributedSampler(ds, num_replicas=pd.get_world_size(), rank=pd.get_rank())
    _, right = _recording(auto_dataloader, ds, sampler=mine)
    workers = auto_dataloader(ds, batch_size=3, num_workers=2).num_workers  # 2 < nproc_per_node 3: kept
    return shuffled, ordered, wrong, right, workers


def test_auto_dataloader_follows_idist_defaults(world3):
    for rank, (shuffled, ordered, wrong, right, workers) in enumerate(world3.run(_on_idist_defaults)):
        assert ordered == list(range(rank, 42, 3)) and shuffled != ordered
        assert sorted(shuffled) == sorted(set(shuffled)) and len(shuffled) == len(ordered)
        assert any(f"Found distributed sampler with rank=4, but process rank is {rank}" in m for m in wrong), wrong
        assert any("Found distributed sampler with num_replicas=5, but world size is 3" in m for m in wrong), wrong
        assert not [m for m in right if "Found distributed sampler" in m]
        assert workers == 2
