"""polydist.Checkpointer (issue 15): atomic saves, resume from the newest copy on any rank, settings checks.

Functions named ``_on_*`` run on every rank of a persistent world (tests/_world.py).
"""

import argparse
import os
import warnings

import pytest
import torch
from torch import nn

import polydist as pd
from polydist import checkpoint

pytestmark = pytest.mark.timeout(120)


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def _trained(seed: int):
    """A model and an SGD optimizer with momentum state (one step taken)."""
    model = _model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    return model, opt


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


# ------------------------------------------------------------ serial


@pytest.mark.filterwarnings("ignore:Detected call of")
def test_save_then_resume_restores_model_optimizer_rng_and_epoch(tmp_path):
    model, opt = _trained(0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    sched.step()
    path = tmp_path / "ckpt.pt"
    ckpt = pd.Checkpointer(str(path), model=model, optimizer=opt, every=2, scheduler=sched, settings={"lr": 0.1})
    assert ckpt.resume() == 0 and ckpt.resumed_from is None  # nothing saved yet: a fresh start
    assert ckpt.save(1) is False and not path.exists()  # not due: every=2
    assert ckpt.save(2) is True and path.exists()
    torch.manual_seed(123)
    assert ckpt.save(3, force=True) is True  # forced: written although not due
    expected_draw = torch.rand(3)  # the draw that follows the saved RNG state
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # the umask's permissions, as open() gives

    model2, opt2 = _trained(1)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.5)
    assert not _same(model, model2)
    ckpt2 = pd.Checkpointer(path, model=model2, optimizer=opt2, scheduler=sched2, settings={"lr": 0.1})
    torch.manual_seed(999)
    assert ckpt2.resume() == 3
    assert _same(model, model2) and sched2.state_dict()["last_epoch"] == 1
    assert torch.equal(opt2.state_dict()["state"][0]["momentum_buffer"], opt.state_dict()["state"][0]["momentum_buffer"])
    assert torch.equal(torch.rand(3), expected_draw)  # the RNG state was restored
    assert ckpt2.resumed_from == {"epoch": 3, "world_size": 1, "rank": 0}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_ddp_wrapper_is_saved_without_its_prefix(tmp_path):
    class Wrapped(torch.nn.parallel.DistributedDataParallel):
        def __init__(self, module):  # a DDP instance without a process group: only .module matters here
            nn.Module.__init__(self)
            self.module = module

    model = _model(0)
    pd.Checkpointer(str(tmp_path / "c.pt"), model=Wrapped(model)).save(1)
    saved = torch.load(tmp_path / "c.pt", weights_only=True)["model"]
    assert list(saved) == list(model.state_dict())  # "0.weight", not "module.0.weight"
    plain = _model(5)
    assert pd.Checkpointer(str(tmp_path / "c.pt"), model=plain).resume() == 1 and _same(plain, model)


def test_resume_refuses_other_settings_and_missing_objects(tmp_path):
    path = str(tmp_path / "c.pt")
    model, opt = _trained(0)
    pd.Checkpointer(path, model=model, settings={"lr": 0.05, "batch_size": 64}).save(4)
    with pytest.raises(ValueError, match=r"saved with other settings: lr 0.05 \(now 0.1\)$"):
        pd.Checkpointer(path, model=model, settings={"lr": 0.1, "batch_size": 64}).resume()
    with pytest.raises(ValueError, match="holds no optimizer"):
        pd.Checkpointer(path, model=model, optimizer=opt).resume()
    assert pd.Checkpointer(path, model=model, settings={"batch_size": 64}).resume() == 4  # a subset matches


def test_a_file_that_does_not_load_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "c.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.warns(RuntimeWarning, match=f"ignoring {path}: it does not load"):
        assert pd.Checkpointer(str(path), model=_model(0)).resume() == 0
    # A pickle of other objects than tensors and plain data is not loaded either (weights_only).
    torch.save({"epoch": 1, "model": _model(0).state_dict(), "evil": argparse.Namespace(a=1)}, path)
    with pytest.warns(RuntimeWarning, match="does not load"):
        assert pd.Checkpointer(str(path), model=_model(0)).resume() == 0


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="every must be a positive int, got 0"):
        pd.Checkpointer(str(tmp_path / "c.pt"), every=0)
    with pytest.raises(ValueError, match="path must be a file path, got ''"):
        pd.Checkpointer("")
    with pytest.raises(TypeError, match="optimizer=3 has no state_dict"):
        pd.Checkpointer(str(tmp_path / "c.pt"), optimizer=3)
    ckpt = pd.Checkpointer(str(tmp_path / "c.pt"), model=_model(0))
    for bad in (-1, 1.0, True, "2"):
        with pytest.raises(ValueError, match=f"epoch must be a non-negative int, got {bad!r}"):
            ckpt.save(bad)
    assert os.listdir(tmp_path) == []


def test_sharded_state_is_refused(tmp_path):
    class DTensor(torch.Tensor):  # stands for torch.distributed.tensor.DTensor: refused by its type's name
        pass

    class Sharded(nn.Module):
        def state_dict(self, *args, **kwargs):
            return {"w": torch.zeros(2).as_subclass(DTensor)}

    with pytest.raises(TypeError, match="model entry 'w' is a DTensor .*use torch.distributed.checkpoint"):
        pd.Checkpointer(str(tmp_path / "c.pt"), model=Sharded()).save(1)
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------ on several ranks


def _on_resume_from_newest(folder: str, epochs: dict, corrupt: int):
    """Every rank plays local rank 0 of its own node, with its own file (no shared file system)."""
    rank = pd.get_rank()
    path = os.path.join(folder, f"node{rank}.pt")
    original = checkpoint.context.get_local_rank
    checkpoint.context.get_local_rank = lambda: 0
    try:
        if rank in epochs:
            pd.Checkpointer(path, model=_model(100 + rank)).save(epochs[rank])
        if rank == corrupt:
            with open(path, "wb") as f:
                f.write(b"\x00" * 64)
        model = _model(7)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = pd.Checkpointer(path, model=model).resume()
        ckpt_from = None
        if start:
            ckpt_from = pd.Checkpointer(path, model=model)
            ckpt_from.resume()  # again: every rank loads the same state
    finally:
        checkpoint.context.get_local_rank = original
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return start, flat.tolist(), ckpt_from.resumed_from if ckpt_from else None, [str(w.message) for w in caught]


def test_resume_takes_the_newest_copy_from_whichever_rank_holds_it(world3, tmp_path):
    """Rank 2 saved last (epoch 5), rank 0 holds an older copy, rank 1's is corrupt: all load rank 2's."""
    folder = str(tmp_path)
    os.makedirs(folder, exist_ok=True)
    out = world3.run(_on_resume_from_newest, folder, {0: 3, 1: 9, 2: 5}, 1)
    expected = torch.cat([p.detach().reshape(-1) for p in _model(102).parameters()]).tolist()
    assert [start for start, *_ in out] == [5, 5, 5]
    assert all(flat == expected for _, flat, _, _ in out)
    assert all(resumed == {"epoch": 5, "world_size": 3, "rank": 2} for _, _, resumed, _ in out)
    assert any("node1.pt: it does not load" in m for m in out[1][3]) and not out[0][3]


def test_resume_on_ranks_without_any_checkpoint_starts_at_zero(world3, tmp_path):
    out = world3.run(_on_resume_from_newest, str(tmp_path / "none"), {}, -1)
    expected = torch.cat([p.detach().reshape(-1) for p in _model(7).parameters()]).tolist()
    assert [start for start, *_ in out] == [0, 0, 0] and all(flat == expected for _, flat, _, _ in out)


# ------------------------------------------------------------ sharded models (issue 27): through torch.distributed.checkpoint


def _on_sharded(path: str, epoch: int, seed: int):
    """An FSDP2 model (auto_model(use_fsdp=True)) with momentum state; save at ``epoch`` when given, else resume.
    Returns (finished epochs, the full parameters, the full momentum buffers) on every rank."""
    model = pd.auto_model(_model(seed), use_fsdp=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    ckpt = pd.Checkpointer(path, model=model, optimizer=opt, settings={"lr": 0.1})
    done = ckpt.save(epoch) and epoch if epoch else ckpt.resume()
    full = [p.full_tensor().detach() for p in model.parameters()]
    momenta = [opt.state[p]["momentum_buffer"].full_tensor() for p in model.parameters()]
    return done, full, momenta


def test_sharded_model_resumes_on_another_world_size_and_serially(world3, world2, tmp_path):
    path = str(tmp_path / "fsdp.pt")
    saved = world3.run(_on_sharded, path, 4, 1)[0]
    assert os.listdir(path + ".dcp") == ["epoch-4"] and torch.load(path, weights_only=True)["dcp"] == "epoch-4"
    for done, full, momenta in world2.run(_on_sharded, path, 0, 2):  # other weights and momenta before resuming
        assert done == 4
        assert all(torch.equal(a, b) for a, b in zip(full, saved[1]))
        assert all(torch.equal(a, b) for a, b in zip(momenta, saved[2]))
    model, opt = _trained(3)  # serial: the same state, gathered into a plain model and optimizer
    assert pd.Checkpointer(path, model=model, optimizer=opt, settings={"lr": 0.1}).resume() == 4
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), saved[1]))
    assert all(torch.equal(opt.state[p]["momentum_buffer"], m) for p, m in zip(model.parameters(), saved[2]))
