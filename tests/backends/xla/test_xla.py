"""The xla-tpu backend (torch_xla): its entry everywhere, the backend itself where torch_xla is installed.

``make test-xla`` runs this file in the venv with torch 2.9.0 + torch-xla 2.9.0 and
``PJRT_DEVICE=CPU``: one process, world size 1 (PJRT's CPU client cannot run several,
torch_xla #9089), so what is checked is every call's path through torch_xla's
collectives and idist's semantics, not traffic between ranks. In the main venv (no
torch_xla) only the first section runs: the entry, and the errors before anything starts.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.distributed as dist

import polydist as pd
from polydist.backends import registry

pytestmark = pytest.mark.timeout(300)

HAS_XLA = importlib.util.find_spec("torch_xla") is not None
needs_xla = pytest.mark.skipif(not HAS_XLA, reason="torch_xla is not installed (make test-xla makes a venv with it)")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


# ------------------------------------------------------------ the entry (every venv)


def test_the_entry_declares_idists_xla_semantics():
    for name in ("xla-tpu", "xla"):  # idist's two spellings
        e = registry.get(name)
        life = e.lifecycle
        assert (e.model_name, e.point_to_point, life.init_url, e.native_avg) == ("xla-dist", False, "xla-tpu://", False)
        assert life.training_at_every_size and life.starts_processes
        assert "pin_memory" in life.pin_memory_refused
    with pytest.raises(NotImplementedError, match=r"group \[0, 1\].*no subgroups"):
        raise registry.get("xla-tpu").no_subgroups([0, 1])


@pytest.mark.skipif(HAS_XLA, reason="torch_xla is installed")
@pytest.mark.parametrize("name", ["xla-tpu", "XLA"])
def test_without_torch_xla_the_backend_is_refused_before_anything_starts(name):
    with pytest.raises(ValueError, match=r"torch_xla is not installed.*Backend should be one of"):
        registry.resolve(name)
    with pytest.raises(ValueError, match="torch_xla is not installed"):
        pd.spawn(name, print, nproc_per_node=2)
    assert "xla-tpu" not in pd.available_backends()


# ------------------------------------------------------------ the backend (PJRT_DEVICE=CPU, world size 1)


@pytest.fixture(scope="module")
def xla():
    """An xla-tpu world of one in this process, for the module (finalized at its end)."""
    if not HAS_XLA:
        pytest.skip("torch_xla is not installed (make test-xla makes a venv with it)")
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    pd.initialize("xla-tpu")
    yield pd.device()
    pd.finalize()


def test_queries(xla):
    assert (pd.backend(), pd.model_name(), pd.get_rank(), pd.get_world_size()) == ("xla-tpu", "xla-dist", 0, 1)
    assert (pd.get_local_rank(), pd.get_nproc_per_node(), pd.get_nnodes(), pd.get_node_rank()) == (0, 1, 1, 0)
    assert xla.type == "xla" and pd.device() == xla
    assert type(dist.group.WORLD).__name__ == "XlaProcessGroup"
    pd.initialize("xla")  # idist's other name: the same group
    with pytest.raises(ValueError, match="already exists"):
        pd.initialize("gloo")


@pytest.mark.parametrize("op, want", [("SUM", [1.5, -2.0]), ("AVG", [1.5, -2.0]), ("MIN", [1.5, -2.0]),
                                      ("PRODUCT", [1.5, -2.0]), ("max", [1.5, -2.0])])
def test_all_reduce_of_tensors_on_the_xla_device_and_on_the_cpu(xla, op, want):
    for dev in (xla, "cpu"):
        t = torch.tensor([1.5, -2.0], device=dev)
        assert pd.all_reduce(t, op) is t and t.device == torch.device(dev) and t.cpu().tolist() == want


def test_bitwise_and_bool_reductions_are_exact(xla):
    assert pd.all_reduce(torch.tensor([5, 3], device=xla), "XOR").cpu().tolist() == [5, 3]
    assert pd.all_reduce(torch.tensor([True, False], device=xla), "AND").cpu().tolist() == [True, False]
    with pytest.raises(TypeError):
        pd.all_reduce(torch.tensor([1.0], device=xla), "XOR")  # undefined on floats, raised before sending


def test_python_values_keep_type_and_precision(xla):
    assert pd.all_reduce(2**53 + 1) == 2**53 + 1 and pd.all_reduce(True, "AND") is True
    assert pd.broadcast(16777217) == 16777217  # idist sends numbers through float32: 16777216.0
    assert pd.broadcast("ünïcödé ✓") == "ünïcödé ✓"
    assert pd.all_gather({"a": (1, b"x", None)}) == [{"a": (1, b"x", None)}]  # idist: NotImplementedError on XLA
    assert pd.gather([1, 2]) == [[1, 2]] and pd.scatter(["mine"]) == "mine" and pd.all_to_all([{1}]) == [{1}]


def test_tensor_collectives_of_any_shape(xla):
    x = torch.arange(6.0, device=xla).reshape(2, 3)
    assert pd.all_gather(x).cpu().tolist() == x.cpu().tolist()
    assert [t.cpu().tolist() for t in pd.all_gather(x, concat=False)] == [x.cpu().tolist()]
    assert pd.broadcast(x).cpu().tolist() == x.cpu().tolist()
    assert pd.gather(x).device.type == "xla"
    assert pd.reduce(x.clone(), op="MAX").cpu().tolist() == x.cpu().tolist()
    assert pd.reduce_scatter(torch.ones(4, device=xla)).cpu().tolist() == [1.0] * 4
    assert pd.scatter([torch.ones(2, 2)]).tolist() == [[1.0, 1.0]] * 2
    assert pd.all_reduce(x.clone(), async_op=True).wait().cpu().tolist() == x.cpu().tolist()
    pd.barrier()


def test_the_torch_distributed_api_on_its_group(xla):
    x = torch.arange(4.0, device=xla)
    out = torch.empty(4, device=xla)
    dist.all_gather_into_tensor(out, x)
    assert out.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    dist.broadcast(x, 0)
    got = torch.empty(4, device=xla)
    dist.all_to_all_single(got, x)
    dist.reduce_scatter_tensor(out, x)
    assert got.cpu().tolist() == out.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(NotImplementedError, match="no point-to-point"):
        dist.group.WORLD.send([x], 0, 0)


def test_coalesced_gathers_and_reduce_scatters_on_the_xla_device(xla):
    """torch's coalescing manager on the XLA group: one operation each, outputs on the XLA device filled."""
    ins = [torch.arange(3.0, device=xla), torch.arange(2, dtype=torch.int64, device=xla)]
    outs = [torch.empty(3, device=xla), torch.empty(2, dtype=torch.int64, device=xla)]
    with dist._coalescing_manager():
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    assert [o.cpu().tolist() for o in outs] == [[0.0, 1.0, 2.0], [0, 1]]
    rs = [torch.empty(2, device=xla), torch.empty(3, device=xla)]
    with dist._coalescing_manager():
        dist.reduce_scatter_tensor(rs[0], torch.ones(2, device=xla))
        dist.reduce_scatter_tensor(rs[1], torch.arange(3.0, device=xla))
    assert [o.cpu().tolist() for o in rs] == [[1.0, 1.0], [0.0, 1.0, 2.0]]


def test_an_async_handle_keeps_its_own_result(xla):
    """Blocking calls share one completed handle (torch.distributed drops it); an async call's is its own."""
    a, b = torch.ones(2, device=xla), torch.zeros(3, device=xla)
    wa, wb = dist.all_reduce(a, async_op=True), dist.all_reduce(b, async_op=True)
    assert wa is not wb and wa.get_future().value()[0] is a and wb.result()[0] is b


def test_auto_model_optim_and_dataloader_as_idist(xla):
    model = pd.auto_model(torch.nn.Linear(3, 1))
    assert type(model) is torch.nn.Linear and all(p.device.type == "xla" for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapped = pd.auto_optim(opt)
    assert isinstance(wrapped, torch.optim.SGD) and wrapped.wrapped_optimizer is opt  # idist's wrapper: TypeError
    before = model.weight.detach().cpu().clone()
    model(torch.ones(2, 3, device=xla)).sum().backward()
    wrapped.step()  # xm.optimizer_step
    assert torch.allclose(model.weight.detach().cpu(), before - 0.1 * 2)
    wrapped.param_groups[0]["lr"] = 0.5
    assert opt.param_groups[0]["lr"] == 0.5  # one optimizer seen two ways
    with pytest.warns(UserWarning, match="Found incompatible options: xla support and pin_memory"):
        loader = pd.auto_dataloader(list(range(4)), pin_memory=True, batch_size=2)
    assert type(loader) is torch.utils.data.DataLoader and not loader.pin_memory
    from torch_xla.distributed.parallel_loader import MpDeviceLoader

    wrapped_loader = registry.get("xla-tpu").lifecycle.wrap_loader(loader, 2)  # what a world of 2 returns
    assert isinstance(wrapped_loader, MpDeviceLoader) and wrapped_loader.sampler is loader.sampler


def test_spawn_runs_through_torch_xla(xla):
    pd.finalize()
    try:
        assert pd.spawn("xla-tpu", _config, nproc_per_node=1) == [("xla-tpu", 0, 1, "xla")]
        with pytest.raises(ValueError, match="nnodes=2"):
            pd.spawn("xla-tpu", _config, nproc_per_node=1, nnodes=2, node_rank=0, master_addr="h", master_port=1)
        with pytest.raises(ValueError, match="max_restarts"):
            pd.spawn("xla-tpu", _config, max_restarts=1)
    finally:
        pd.initialize("xla-tpu")


def _config(local_rank):
    return pd.backend(), local_rank, pd.get_world_size(), pd.device().type


def test_a_program_using_an_xla_device_is_an_xla_world(xla):
    pd.finalize()  # the runtime keeps running: idist would see an XLA world, and so does polydist
    assert (pd.backend(), pd.model_name(), pd.device().type) == ("xla-tpu", "xla-dist", "xla")


def test_under_torchrun_an_xla_process_raises_instead_of_running_alone(xla):
    env = dict(os.environ, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29999", TORCHELASTIC_RUN_ID="x", PJRT_DEVICE="CPU")
    code = "import polydist as pd; pd.initialize('xla-tpu')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode != 0
    assert "WorldMismatchError" in out.stderr and "torchrun announced WORLD_SIZE=2" in out.stderr, out.stderr[-2000:]
    assert "xmp.spawn" in out.stderr
