"""The horovod backend for real: ranks started by ``horovodrun --gloo`` (``make horovod`` builds Horovod).

The collective suite runs on horovod worlds too (``make test-horovod``: the world tests with
``POLYDIST_TEST_BACKENDS=horovod``); this file holds what only Horovod has: its launcher's
environment, DDP and the plain torch.distributed API on its process group, the operations
Horovod lacks, idist's horovod semantics, the main job, a failing rank, spawn and adoption.
Every test skips, with the reason, where Horovod is not installed.
"""

from __future__ import annotations

import functools
import operator
import os
import re
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import polydist as pd
from _world import horovodrun
from polydist import rendezvous
from polydist.launch import environment
from polydist.ops import check_op_dtype

pytestmark = [
    pytest.mark.skipif(not pd.has_hvd_support or not horovodrun(), reason="Horovod is not installed (make horovod)"),
    pytest.mark.timeout(300),
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.path.dirname(sys.executable)


@pytest.fixture
def hvd3(world_pool):
    return world_pool.get(3, "horovod")


@pytest.fixture
def importable(monkeypatch):
    """horovod.run's processes unpickle this file's functions by module name: give them its folder."""
    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH")])))


# ------------------------------------------------------------ horovodrun's environment, the group


def _environment():
    import horovod.torch as hvd

    info = environment.detect()
    return (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size,
            hvd.rank(), hvd.size(), hvd.local_rank(), pd.get_local_rank(), pd.get_nproc_per_node(),
            pd.backend(), pd.model_name(), repr(dist.group.WORLD))  # fmt: skip


def test_environment_detected_under_horovodrun(hvd3):
    for rank, got in enumerate(hvd3.run(_environment)):
        launcher, r, size, local, local_size, h_rank, h_size, h_local, pd_local, nproc, backend, model, group = got
        assert (launcher, r, size, local, local_size) == ("horovod", rank, 3, rank, 3)
        assert (h_rank, h_size, h_local) == (rank, 3, rank)
        assert (pd_local, nproc, backend, model) == (rank, 3, "horovod", "horovod-dist")
        assert group.startswith("<HorovodProcessGroup rank=")


# ------------------------------------------------------------ every dtype and op, against a reference


_PY_OPS = {"SUM": operator.add, "PRODUCT": operator.mul, "MIN": torch.minimum, "MAX": torch.maximum,
           "AND": operator.and_, "OR": operator.or_, "XOR": operator.xor}  # fmt: skip
_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
           torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]  # fmt: skip


def _input(rank: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor([True, rank == 0, rank != 1, False])
    values = torch.tensor([rank + 1, 3 - rank, 2 * rank - 1, 7], dtype=torch.float64)
    if dtype.is_complex:
        return torch.complex(values, -values).to(dtype)
    return (values.abs() if dtype == torch.uint8 else values).to(dtype)


def _every_reduction():
    rank = pd.get_rank()
    out = {}
    for dtype in _DTYPES:
        for name in [*_PY_OPS, "AVG"]:
            try:
                check_op_dtype(name, dtype)
            except TypeError:
                continue
            t = _input(rank, dtype)
            pd.all_reduce(t, op=name)
            out[str(dtype), name] = t
    return out


def _expected(dtype: torch.dtype, name: str, size: int) -> torch.Tensor:
    rows = [_input(r, dtype) for r in range(size)]
    if name == "AVG":
        return (functools.reduce(operator.add, [r.to(torch.complex128 if dtype.is_complex else torch.float64) for r in rows]) / size).to(dtype)
    if dtype == torch.bool and name in ("SUM", "PRODUCT"):  # torch's bool semantics: any / all
        return functools.reduce(operator.or_ if name == "SUM" else operator.and_, rows)
    wide = torch.float64 if dtype.is_floating_point else torch.complex128 if dtype.is_complex else torch.int64
    return functools.reduce(_PY_OPS[name], [r.to(wide) if dtype != torch.bool else r for r in rows]).to(dtype)


def test_every_dtype_and_op_reduces_like_the_reference(hvd3):
    results = hvd3.run(_every_reduction)
    assert len(results[0]) >= 50  # the table really ran
    for key, got in results[0].items():
        dtype, name = next(d for d in _DTYPES if str(d) == key[0]), key[1]
        expected = _expected(dtype, name, 3)
        assert got.dtype == dtype, key
        tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
        assert torch.allclose(got.to(torch.complex128 if dtype.is_complex else torch.float64),
                              expected.to(torch.complex128 if dtype.is_complex else torch.float64), rtol=tol, atol=tol), (key, got, expected)  # fmt: skip
        for other in results[1:]:
            assert torch.equal(other[key], got), key  # every rank holds the same result


# ------------------------------------------------------------ torch.distributed and DDP on the horovod group


def _torch_api():
    rank, size = dist.get_rank(), dist.get_world_size()
    out = {}
    chunks = [torch.empty(2) for _ in range(size)]
    dist.all_gather(chunks, torch.full((2,), float(rank)))
    out["all_gather"] = [c.tolist() for c in chunks]
    # uneven all_to_all_single: rank r sends r + 1 rows to everyone
    received = torch.empty(sum(r + 1 for r in range(size)), dtype=torch.int64)
    dist.all_to_all_single(received, torch.full(((rank + 1) * size,), rank, dtype=torch.int64),
                           output_split_sizes=[r + 1 for r in range(size)], input_split_sizes=[rank + 1] * size)  # fmt: skip
    out["all_to_all_single"] = received.tolist()
    mine = torch.empty(2)
    dist.reduce_scatter_tensor(mine, torch.arange(2.0 * size) * (rank + 1))
    out["reduce_scatter"] = mine.tolist()
    gathered = [torch.empty(1) for _ in range(size)] if rank == 1 else None
    dist.gather(torch.tensor([10.0 * rank]), gathered, dst=1)
    out["gather"] = [g.tolist() for g in gathered] if gathered else None
    got = torch.empty(1, dtype=torch.bfloat16)
    dist.scatter(got, [torch.tensor([r + 0.5], dtype=torch.bfloat16) for r in range(size)] if rank == 2 else None, src=2)
    out["scatter"] = got.item()
    objects = [{"from": "ränk 0", "n": 16777217}] if rank == 0 else [None]
    dist.broadcast_object_list(objects, src=0)
    out["object"] = objects[0]
    work = dist.all_reduce(torch.ones(3), async_op=True)
    out["future"] = work.get_future().wait()[0].tolist()
    dist.barrier()
    return out


def test_torch_distributed_api_runs_on_horovod(hvd3):
    for rank, got in enumerate(hvd3.run(_torch_api)):
        assert got["all_gather"] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
        assert got["all_to_all_single"] == [0] + [1] * 2 + [2] * 3
        assert got["reduce_scatter"] == [6.0 * (2 * rank), 6.0 * (2 * rank + 1)]
        assert got["gather"] == ([[0.0], [10.0], [20.0]] if rank == 1 else None)
        assert got["scatter"] == rank + 0.5
        assert got["object"] == {"from": "ränk 0", "n": 16777217}
        assert got["future"] == [3.0, 3.0, 3.0]


def _ddp_steps():
    rank, size = pd.get_rank(), pd.get_world_size()
    torch.manual_seed(rank)  # different initial weights: DDP broadcasts rank 0's
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    reference.load_state_dict(model.module.state_dict())
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.5), torch.optim.SGD(reference.parameters(), lr=0.5)
    data = torch.Generator().manual_seed(7)
    for _ in range(3):
        x, y = torch.randn(6, 4, generator=data), torch.randint(0, 2, (6,), generator=data)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[rank::size]), y[rank::size]).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        ref_opt.step()
    flat = lambda m: torch.cat([p.detach().reshape(-1) for p in m.parameters()])  # noqa: E731
    return flat(model.module), flat(reference)


def test_ddp_trains_on_the_horovod_group(hvd3):
    results = hvd3.run(_ddp_steps)
    for replica, reference in results:
        assert torch.equal(replica, results[0][0])  # bit-identical replicas
        assert torch.allclose(replica, reference, atol=1e-5)  # DDP over Horovod = full-batch SGD


# ------------------------------------------------------------ what Horovod lacks: a clear error on every rank


def _new_group_without_dynamic_sets():
    """pd.new_group as in a Horovod started without HOROVOD_DYNAMIC_PROCESS_SETS (the test worlds start with it)."""
    os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "0"
    try:
        return pd.new_group([0, 1])
    finally:
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"


def _lacking():
    errors = {}
    for what, call in (
        ("send", lambda: pd.send(torch.ones(1), dst=(pd.get_rank() + 1) % 3)),
        ("torch recv", lambda: dist.recv(torch.ones(1), src=(pd.get_rank() + 1) % 3)),
        ("new_group", _new_group_without_dynamic_sets),
    ):
        try:
            call()
            errors[what] = None
        except NotImplementedError as exc:
            errors[what] = str(exc)
    return errors


def test_point_to_point_and_subgroups_raise_on_every_rank(hvd3):
    for errors in hvd3.run(_lacking):
        assert re.search(r"^send: the horovod backend has no point-to-point", errors["send"])
        assert "recv: the horovod backend has no point-to-point" in errors["torch recv"]
        assert "group [0, 1]: the horovod backend has no subgroups" in errors["new_group"]  # rank 2 (no member) too
    assert hvd3.run(pd.all_reduce, 1) == [3, 3, 3]  # the world goes on


# ------------------------------------------------------------ subgroups: Horovod process sets


def _subgroups():
    r = pd.get_rank()
    pair = pd.new_group([2, 0])  # every rank calls: Horovod's process sets are added by the whole job
    out = {"non_member": pair == pd.NON_GROUP_MEMBER, "again": pd.new_group([0, 2]) is pair}
    if r != 1:
        x = torch.tensor([float(r + 1)])
        pd.all_reduce(x, group=pair)
        b = torch.tensor([r], dtype=torch.int16)
        dist.broadcast(b, src=2, group=pair)  # a global rank, as torch.distributed takes it
        out.update(sum=x.item(), broadcast=b.item(),
                   all_gather=pd.all_gather(torch.tensor([r]), group=[0, 2]).tolist(),
                   reduce=pd.reduce(torch.tensor([r + 1]), dst=2, group=pair).tolist(),
                   scatter=pd.scatter([torch.tensor([10]), torch.tensor([12])] if r == 2 else None, src=2, group=pair).tolist(),
                   objects=pd.all_gather({"rank": r}, group=pair))
        dist.barrier(group=pair)
    mixed = pd.new_group([0, 2] if r != 1 else [1])  # 0 and 2 reuse their set while 1 makes one: they still meet
    out["mixed"] = (mixed is pair) if r != 1 else pd.all_reduce(torch.tensor([5]), group=mixed).item()
    mine = pd.new_group([0, 1] if r < 2 else [2])  # each rank its own new group at once: the sets are agreed first
    out["own"] = pd.all_reduce(torch.tensor([1]), group=mine).item()
    out["world"] = pd.all_reduce(torch.tensor([1])).item()
    return out


def test_subgroups_are_process_sets_every_rank_registers(hvd3):
    a, b, c = hvd3.run(_subgroups)
    assert b == {"non_member": True, "again": True, "mixed": 5, "own": 2, "world": 3}  # rank 1: NON_GROUP_MEMBER
    for r, got in ((0, a), (2, c)):
        assert got["again"] and got["mixed"] and not got["non_member"] and got["sum"] == 4.0 and got["broadcast"] == 2
        assert got["all_gather"] == [0, 2] and got["objects"] == [{"rank": 0}, {"rank": 2}]
        assert got["reduce"] == ([4] if r == 2 else [1]) and got["scatter"] == [10 if r == 0 else 12]
        assert got["own"] == (2 if r == 0 else 1) and got["world"] == 3


# ------------------------------------------------------------ idist's horovod semantics


def _idist_training():
    rank = pd.get_rank()
    torch.manual_seed(rank)
    model = pd.auto_model(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.9)
    opt = pd.auto_optim(opt)
    for _ in range(2):
        opt.zero_grad()
        model(torch.full((2, 3), float(rank))).sum().backward()
        opt.step()
    import horovod.torch as hvd

    return type(model).__name__, isinstance(opt, hvd.DistributedOptimizer.__class__) or "Distributed" in type(opt).__mro__[0].__module__ + type(opt).__name__, \
        opt.param_groups[0]["lr"], torch.cat([p.detach().reshape(-1) for p in model.parameters()])  # fmt: skip


def test_auto_model_broadcasts_and_auto_optim_wraps_as_idist(hvd3):
    results = hvd3.run(_idist_training)
    for kind, _, lr, params in results:
        assert kind == "Linear"  # not wrapped in DDP: idist's horovod path
        assert lr == pytest.approx(0.1)  # rank 0's optimizer state on every rank
        assert torch.equal(params, results[0][3])  # same start, averaged gradients: identical replicas


# ------------------------------------------------------------ processes: the main job, a failing rank, spawn, adoption


def _horovodrun(n: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([horovodrun(), "-np", str(n), "-H", f"localhost:{n}", "--gloo", sys.executable, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _accuracy(output: str) -> float:
    found = re.findall(r"final test accuracy: ([0-9.]+)", output)
    assert found, output[-3000:]
    return float(found[-1])


@pytest.mark.timeout(600)
def test_main_job_on_horovod_reaches_the_accuracy_of_gloo():
    gloo = subprocess.run([os.path.join(BIN, "polydist"), "run", "--nproc-per-node", "2", "examples/train_digits.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert gloo.returncode == 0, gloo.stderr[-3000:]
    for extra in ([], ["--ddp"]):  # polydist's collectives; idist's auto_model/auto_optim (hvd.DistributedOptimizer)
        job = _horovodrun(2, "examples/train_digits.py", "--backend", "horovod", *extra)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert "world size 2, backend horovod" in job.stdout
        assert _accuracy(job.stdout) == _accuracy(gloo.stdout) >= 0.95
        assert "parameters identical on all 2 ranks" in job.stdout


FAILING = """
import polydist as pd, torch
pd.initialize("horovod")
pd.all_reduce(torch.ones(1))
if pd.get_rank() == 1:
    raise ValueError("rank 1 fails here")
pd.all_reduce(torch.ones(1))  # rank 0 waits for a rank that is gone
print("not reached")
"""


def test_a_failing_rank_ends_the_job(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(FAILING)
    start = time.monotonic()
    job = _horovodrun(2, str(script), timeout=120)
    assert job.returncode != 0
    assert "ValueError: rank 1 fails here" in job.stderr
    assert "not reached" not in job.stdout
    assert time.monotonic() - start < 60


STALLED = """
import time
import torch, torch.distributed as dist
import polydist as pd
pd.initialize("horovod", timeout=5)
t = torch.ones(2)
dist.all_reduce(t)  # #1: every rank, through torch.distributed on polydist's horovod group
if pd.get_rank() == 1:
    time.sleep(90)  # busy elsewhere: never joins #2
dist.all_reduce(t)  # rank 0 waits here, until its watchdog ends the job
print("not reached", flush=True)
"""


@pytest.mark.timeout(200)
def test_the_watchdog_ends_a_torch_level_all_reduce_a_rank_never_joins(tmp_path):
    """Under real horovodrun: the group's timeout (5 s) bounds an operation polydist's API never saw."""
    script = tmp_path / "stalled.py"
    script.write_text(STALLED)
    start = time.monotonic()
    job = _horovodrun(2, str(script), timeout=150)
    elapsed, out = time.monotonic() - start, job.stdout + job.stderr
    assert job.returncode != 0 and "not reached" not in out, out[-3000:]
    assert "all_reduce #2" in out and "ranks [1] did not arrive" in out, out[-3000:]
    assert elapsed < 60, (elapsed, out[-3000:])  # the timeout, the grace and horovodrun's end; not rank 1's 90 s


def _rank_and_sum(local_rank, x):
    return local_rank, pd.get_rank(), pd.model_name(), pd.all_reduce(x + pd.get_rank())


def _raises(local_rank):
    if pd.get_rank() == 1:
        raise RuntimeError("boom on rank 1")
    pd.barrier()


def test_spawn_and_parallel_start_horovod_processes(importable):
    assert pd.spawn("horovod", _rank_and_sum, args=(10,), nproc_per_node=2) == [
        (0, 0, "horovod-dist", 21), (1, 1, "horovod-dist", 21)]  # fmt: skip
    with pd.Parallel(backend="horovod", nproc_per_node=2) as parallel:
        assert parallel.run(_rank_and_sum, 1) == [(0, 0, "horovod-dist", 3), (1, 1, "horovod-dist", 3)]
    with pytest.raises(pd.WorkerFailedError, match="Horovod process failed"):
        pd.spawn("horovod", _raises, nproc_per_node=2)
    with pytest.raises(ValueError, match="horovodrun -H"):
        pd.spawn("horovod", _raises, nproc_per_node=2, nnodes=2, node_rank=0, master_addr="127.0.0.1", master_port=1)


def _ignite_config(local_rank):
    """ignite's own ``_test_distrib_config`` (v0.5.5, shipped in tests/third_party/ignite) on polydist, then what it saw."""
    import ignite_swap  # noqa: F401 - its test files' ``import ignite.distributed as idist`` is polydist
    from tests.ignite.distributed.utils import _test_distrib_config

    _test_distrib_config(local_rank, "horovod", 4, "cpu")  # as ignite calls it
    return local_rank, pd.get_rank(), pd.get_world_size(), pd.get_local_rank(), pd.backend(), pd.model_name()


def test_ignites_config_function_on_4_spawned_horovod_processes(importable, monkeypatch):
    """ignite's test_hvd_distrib_single_node_spawn: a function that does not communicate, on 4 processes.

    It hung: rank 0 served the rendezvous store without waiting for the others to connect, finished
    its function and took the store with it while a slow rank was still connecting (backends/store.py).
    """
    pytest.importorskip("ignite", reason="pytorch-ignite is not installed")
    third_party = os.path.join(ROOT, "tests", "third_party")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([third_party, os.environ["PYTHONPATH"]]))
    got = pd.spawn("horovod", _ignite_config, nproc_per_node=4)
    assert got == [(r, r, 4, r, "horovod", "horovod-dist") for r in range(4)]


def _adopted():
    import horovod.torch as hvd

    hvd.init()  # the program starts Horovod itself, as code written for ignite.distributed does
    got = (pd.get_world_size(), pd.get_rank(), pd.model_name(), pd.backend(), pd.all_reduce(1), pd.all_gather("é"))
    pd.finalize()
    return (*got, hvd.is_initialized(), pd.model_name())


def test_a_horovod_started_by_the_program_is_adopted(importable):
    from horovod import run

    results = run(_adopted, num_proc=2, use_gloo=True)
    for rank, got in enumerate(results):
        assert got == (2, rank, "horovod-dist", "horovod", 2, ["é", "é"], True, "horovod-dist")


SERIAL = """
import polydist as pd, torch, horovod.torch as hvd
pd.initialize("horovod")
print(pd.get_world_size(), pd.backend(), pd.model_name(), pd.all_reduce(torch.ones(2)).tolist(), hvd.is_initialized())
pd.finalize()
print(hvd.is_initialized(), pd.model_name())
"""


def test_initialize_horovod_in_plain_python_is_a_world_of_one():
    out = subprocess.run([sys.executable, "-c", SERIAL], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:2] == ["1 horovod horovod-dist [1.0, 1.0] True", "False serial"]


def test_ranks_another_launcher_started_are_refused_before_horovod_starts():
    info = environment.detect({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})  # fmt: skip
    assert info.launcher != "horovod" and info.is_distributed
    with pytest.raises(ValueError, match=r"needs its ranks started by horovodrun .* rank 1 of 2"):
        rendezvous.group_kwargs("horovod", None, None, None, None, {}, info)
