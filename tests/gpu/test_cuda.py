"""CUDA: nccl at world size 1, gloo with CUDA tensors on 2 ranks, ``device()`` when serial.

Every test runs its ranks as fresh ``python -c`` subprocesses (one per rank),
each printing one JSON line of results that the test then checks; a failing
check shows every rank's exit status, stdout and stderr. Both gloo ranks share
one GPU (gloo allows it; nccl does not, so nccl runs at world size 1 only).

What gloo itself can do with CUDA tensors was read off PyTorch 2.11 on an H100:
broadcast, all_reduce, reduce, all_gather(_into_tensor), gather, scatter,
reduce_scatter_tensor and all_to_all_single accept CUDA tensors; ``send`` of a
CUDA tensor aborts the sending process (gloo's TCP transport hands the device
pointer to ``writev``: "Bad address"), as the PyTorch docs' Backends table says
(send/recv: gloo GPU ✘). The tests assert what polydist's docstrings promise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

from conftest import ROOT

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.timeout(300),
]

# (with no GPU at all, the module's skip gives the reason)
needs_nccl = pytest.mark.skipif(
    torch.cuda.is_available() and not dist.is_nccl_available(), reason="this PyTorch has no nccl"
)

SRC = os.path.join(ROOT, "src")
RUN_TIMEOUT_S = 240.0  # one script, start to end; pytest's timeout (300 s) stays the backstop
RESULT = "PD_TEST_RESULT "
TEXT = "héllo wörld ✓ 日本語 🚀"

# Variables through which a launcher (torchrun, Slurm, MPI, polydist run) would speak to the scripts.
_LAUNCHER_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                  "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"}  # fmt: skip
_LAUNCHER_PREFIXES = (
    "POLYDIST_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "MV2_", "I_MPI_", "HOROVOD_", "PET_", "MPI_LOCAL",
)  # fmt: skip


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS and not k.startswith(_LAUNCHER_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


# Every script starts with this: imports, and how it reports.
PRELUDE = f"""
import json, os, sys
import torch
import torch.distributed as dist
from torch import nn
import polydist as pd

TEXT = {TEXT!r}


def show(t, expected=None):
    '''A tensor as JSON: device, dtype, shape, its values when few, whether it equals ``expected``.'''
    if not isinstance(t, torch.Tensor):
        return {{"type": type(t).__name__, "repr": repr(t)[:300]}}
    out = {{"device": str(t.device), "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}}
    if t.numel() <= 64:
        out["values"] = t.tolist()
    if expected is not None:
        out["equal"] = bool(t.shape == expected.shape and torch.equal(t.detach().cpu(), expected.cpu()))
    return out


def report(results):
    print({RESULT!r} + json.dumps(results), flush=True)
"""

# 2-rank gloo scripts: both ranks compute on cuda:0 (CUDA), the group is gloo.
GLOO = """
RANK, SIZE = int(os.environ["PD_TEST_RANK"]), int(os.environ["PD_TEST_SIZE"])
CUDA = torch.device("cuda", 0)
torch.cuda.set_device(CUDA)
pd.initialize("gloo", init_method="file://" + os.environ["PD_TEST_STORE"], rank=RANK, world_size=SIZE, timeout=60)
INFO = {"backend": pd.backend(), "rank": pd.get_rank(), "size": pd.get_world_size(), "device": str(pd.device())}
r = RANK
"""

# world-size-1 nccl scripts: initialize("nccl") in a plain process (no launcher: a HashStore group of one).
NCCL = """
pd.initialize("nccl")
D = pd.device()
INFO = {"backend": pd.backend(), "rank": pd.get_rank(), "size": pd.get_world_size(), "device": str(D),
        "initialized": pd.is_initialized(), "current": torch.cuda.current_device()}
"""


@dataclass
class Outcome:
    """What every rank reported, and the log to show when a check fails."""

    results: list
    log: str

    def __getitem__(self, rank: int) -> dict:
        return self.results[rank]

    def expect(self, condition: bool, what: str) -> None:
        assert condition, f"{what}\n{self.log}"

    def tensor(self, rank: int, key: str, **want) -> None:
        """Rank ``rank``'s ``show()`` of ``key`` has every field of ``want`` (device, dtype, shape, values, equal)."""
        got = self.results[rank][key]
        if not isinstance(got, dict) or "device" not in got:
            raise AssertionError(f"rank {rank} {key}: expected a tensor, got {got!r}\n{self.log}")
        bad = {k: {"got": got.get(k), "want": v} for k, v in want.items() if got.get(k) != v}
        assert not bad, f"rank {rank} {key}: {bad} (all of it: {got})\n{self.log}"


def _tail(text: str, limit: int = 12000) -> str:
    return text if len(text) <= limit else f"[... {len(text) - limit} characters cut ...]\n" + text[-limit:]


def run_ranks(script: str, size: int, tmp_path, timeout: float = RUN_TIMEOUT_S) -> Outcome:
    """Run ``PRELUDE + script`` as ``size`` processes (ranks); return each one's reported results.

    Raises AssertionError, with every rank's exit status, stdout and stderr, when
    a rank fails, reports nothing, or the ranks are not done within ``timeout``.
    """
    code = textwrap.dedent(PRELUDE) + textwrap.dedent(script)
    store = str(tmp_path / "store")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=dict(_env(), PD_TEST_RANK=str(rank), PD_TEST_SIZE=str(size), PD_TEST_STORE=store),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(size)
    ]
    deadline = time.monotonic() + timeout
    streams: list = [None] * size
    killed = set()
    try:
        for rank, proc in enumerate(procs):
            streams[rank] = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for rank, proc in enumerate(procs):
            if streams[rank] is None:  # still running at the deadline (or the test was interrupted)
                if proc.poll() is None:
                    proc.kill()
                    killed.add(rank)
                streams[rank] = proc.communicate()
    results, parts = [], []
    for rank, (proc, (out, err)) in enumerate(zip(procs, streams)):
        lines = [line[len(RESULT):] for line in out.splitlines() if line.startswith(RESULT)]
        results.append(json.loads(lines[-1]) if lines else None)
        status = "still running at the timeout: killed" if rank in killed else f"exit status {proc.returncode}"
        parts.append(f"===== rank {rank}: {status}\n--- stdout\n{_tail(out)}\n--- stderr\n{_tail(err)}")
    log = "\n".join(parts)
    if killed:
        raise AssertionError(f"rank(s) {sorted(killed)} did not finish within {timeout:.0f} s\n{log}")
    failed = [rank for rank, proc in enumerate(procs) if proc.returncode != 0 or results[rank] is None]
    if failed:
        raise AssertionError(f"rank(s) {failed} failed or reported nothing\n{log}")
    return Outcome(results, log)


def run_one(script: str, tmp_path, timeout: float = RUN_TIMEOUT_S) -> Outcome:
    return run_ranks(script, 1, tmp_path, timeout)


# ============================================================ serial: device() with CUDA visible


SERIAL = """
out = {"count": torch.cuda.device_count(), "current": torch.cuda.current_device()}
out["device"] = str(pd.device())
out["backend"], out["initialized"] = pd.backend(), pd.is_initialized()
pd.initialize()  # no launcher, nothing asked for: stays serial
out["after_initialize"] = [pd.is_initialized(), str(pd.device())]
t = torch.ones(2, device=pd.device())
out["all_reduce_is_input"] = pd.all_reduce(t) is t
model = pd.auto_model(nn.Linear(4, 2))
out["model"] = [type(model).__name__, str(next(model.parameters()).device)]
if out["count"] > 1:  # the current device, not device 0
    torch.cuda.set_device(out["count"] - 1)
    out["after_set_device"] = [torch.cuda.current_device(), str(pd.device())]
report(out)
"""


def test_serial_device_is_the_current_cuda_device(tmp_path):
    run = run_one(SERIAL, tmp_path)
    out = run[0]
    cuda = f"cuda:{out['current']}"
    run.expect(out["device"] == cuda, f"serial device() is {out['device']}, expected {cuda}")
    run.expect(out["backend"] is None and out["initialized"] is False, "a group exists before initialize")
    run.expect(out["after_initialize"] == [False, cuda], f"initialize() without a launcher: {out['after_initialize']}")
    run.expect(out["all_reduce_is_input"], "a serial all_reduce of a CUDA tensor did not return it")
    run.expect(out["model"] == ["Linear", cuda], f"serial auto_model: {out['model']}")
    if out["count"] > 1:
        current, shown = out["after_set_device"]
        run.expect(shown == f"cuda:{current}", f"after set_device({current}): device() is {shown}")


# ============================================================ nccl, world size 1


NCCL_TENSORS = NCCL + """
out = {"info": INFO}
t = torch.tensor([1.0, 2.0], device=D)
got = pd.all_reduce(t)
out["all_reduce"], out["all_reduce_same"] = show(got), got is t
t = torch.tensor([3.0, 5.0], device=D)
got = pd.all_reduce(t, op="AVG")
out["all_reduce_avg"], out["all_reduce_avg_same"] = show(got), got is t
m = torch.arange(6.0, device=D).reshape(2, 3)
nc, ints, half = m.t(), torch.tensor([4, 10], device=D), torch.tensor([0.5, 1.5], device=D, dtype=torch.float16)
tensors = [nc, ints, half]
got = pd.all_reduce(tensors)  # coalesced: one call per dtype, written back in place
out["coalesced_same"] = got is tensors
out["coalesced"] = [show(x) for x in tensors]
out["all_reduce_max"] = show(pd.all_reduce(torch.tensor([7, -1], device=D), op="MAX"))
out["all_reduce_async"] = show(pd.all_reduce(torch.ones(2, device=D), async_op=True).wait())
t = torch.tensor([2.0, 4.0], device=D)
got = pd.reduce(t, dst=0)
out["reduce"], out["reduce_same"] = show(got), got is t
out["reduce_avg"] = show(pd.reduce(torch.tensor([6.0], device=D), dst=0, op="AVG"))
t = torch.arange(5.0, device=D)
got = pd.reduce_scatter(t)
out["reduce_scatter"], out["reduce_scatter_new"] = show(got), got is not t
out["reduce_scatter_avg"] = show(pd.reduce_scatter(torch.arange(4.0, device=D).reshape(2, 2), op="AVG"))
out["barrier"] = [pd.barrier(), pd.barrier(async_op=True).wait()]
model = pd.auto_model(nn.Linear(4, 2))
y = model(torch.ones(3, 4, device=D))
out["model"] = [type(model).__name__, str(next(model.parameters()).device), str(y.device), list(y.shape)]
pd.finalize()
out["after_finalize"] = [pd.is_initialized(), dist.is_initialized(), pd.backend()]
report(out)
"""


@needs_nccl
def test_nccl_world_of_one_reductions_barrier_auto_model_finalize(tmp_path):
    run = run_one(NCCL_TENSORS, tmp_path)
    out = run[0]
    info = out["info"]
    run.expect(info["backend"] == "nccl", f"backend() is {info['backend']!r}")
    run.expect(info["device"] == "cuda:0" == f"cuda:{info['current']}", f"device() is {info['device']}")
    run.expect((info["rank"], info["size"], info["initialized"]) == (0, 1, True), f"queries: {info}")
    run.tensor(0, "all_reduce", device="cuda:0", dtype="float32", values=[1.0, 2.0])
    run.tensor(0, "all_reduce_avg", device="cuda:0", values=[3.0, 5.0])
    run.expect(out["all_reduce_same"] and out["all_reduce_avg_same"], "all_reduce did not work in place")
    run.expect(out["coalesced_same"], "all_reduce of a list did not return the list")
    nc, ints, half = out["coalesced"]
    want = {"device": "cuda:0", "dtype": "float32", "shape": [3, 2], "values": [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]}
    run.expect(nc == want, f"non-contiguous member: {nc}")
    run.expect(ints["device"] == "cuda:0" and ints["values"] == [4, 10], f"{ints}")
    run.expect(half["device"] == "cuda:0" and half["dtype"] == "float16" and half["values"] == [0.5, 1.5], f"{half}")
    run.tensor(0, "all_reduce_max", device="cuda:0", dtype="int64", values=[7, -1])
    run.tensor(0, "all_reduce_async", device="cuda:0", values=[1.0, 1.0])
    run.tensor(0, "reduce", device="cuda:0", values=[2.0, 4.0])
    run.expect(out["reduce_same"], "reduce on dst did not work in place")
    run.tensor(0, "reduce_avg", device="cuda:0", values=[6.0])
    run.tensor(0, "reduce_scatter", device="cuda:0", dtype="float32", values=[0.0, 1.0, 2.0, 3.0, 4.0])
    run.expect(out["reduce_scatter_new"], "reduce_scatter returned its input, not a new tensor")
    run.tensor(0, "reduce_scatter_avg", device="cuda:0", shape=[2, 2], values=[[0.0, 1.0], [2.0, 3.0]])
    run.expect(out["barrier"] == [None, None], f"barrier: {out['barrier']}")
    # world size 1: on the device, not wrapped in DistributedDataParallel
    run.expect(out["model"] == ["Linear", "cuda:0", "cuda:0", [3, 2]], f"auto_model: {out['model']}")
    run.expect(out["after_finalize"] == [False, False, None], f"after finalize: {out['after_finalize']}")


NCCL_MOVING = NCCL + """
out = {"info": INFO}
t = torch.arange(4.0, device=D)
got = pd.broadcast(t, src=0)
out["broadcast"], out["broadcast_same"] = show(got), got is t
i16 = torch.tensor([-300, 7], dtype=torch.int16, device=D)  # not a gloo dtype: travels as bytes elsewhere
out["broadcast_int16"] = show(pd.broadcast(i16, src=0))
t = torch.arange(6, device=D).reshape(2, 3)
got = pd.broadcast(t, src=0, safe_mode=True)
out["broadcast_safe"], out["broadcast_safe_same"] = show(got), got is t
t = torch.arange(4.0, device=D)
out["broadcast_async_same"] = pd.broadcast(t, src=0, async_op=True).wait() is t
small = torch.tensor([1, 2], device=D)
big = torch.arange(3000, dtype=torch.float32, device=D)  # 12 KB: more than a frame slot, so a data round
out["all_gather_small"] = show(pd.all_gather(small))
out["all_gather_0dim"] = show(pd.all_gather(torch.tensor(5.0, device=D)))
out["all_gather_big"] = show(pd.all_gather(big), big)
listed = pd.all_gather(big, concat=False)
out["all_gather_list"] = [len(listed), show(listed[0], big)]
out["all_gather_async"] = show(pd.all_gather(big, async_op=True).wait(), big)
out["gather_small"] = show(pd.gather(small, dst=0))
out["gather_big"] = show(pd.gather(big, dst=0), big)
items = [big]
out["scatter_big_is_item"] = pd.scatter(items, src=0) is big  # on src: the item itself
out["scatter_small_is_item"] = pd.scatter([small], src=0) is small
got = pd.all_to_all([big])
out["all_to_all_big"] = [len(got), show(got[0], big), got[0] is not big]
i16 = torch.arange(-600, 600, dtype=torch.int16, device=D)
out["all_to_all_int16"] = show(pd.all_to_all([i16])[0], i16)
out["all_to_all_small"] = show(pd.all_to_all([small])[0])
pd.finalize()
report(out)
"""


@needs_nccl
def test_nccl_world_of_one_data_moving_collectives(tmp_path):
    run = run_one(NCCL_MOVING, tmp_path)
    out = run[0]
    run.expect(out["info"]["backend"] == "nccl" and out["info"]["device"] == "cuda:0", f"{out['info']}")
    run.tensor(0, "broadcast", device="cuda:0", values=[0.0, 1.0, 2.0, 3.0])
    run.expect(out["broadcast_same"] and out["broadcast_safe_same"], "broadcast on src did not return its tensor")
    run.tensor(0, "broadcast_int16", device="cuda:0", dtype="int16", values=[-300, 7])
    run.tensor(0, "broadcast_safe", device="cuda:0", dtype="int64", values=[[0, 1, 2], [3, 4, 5]])
    run.expect(out["broadcast_async_same"], "async broadcast did not return its tensor")
    run.tensor(0, "all_gather_small", device="cuda:0", dtype="int64", values=[1, 2])
    run.tensor(0, "all_gather_0dim", device="cuda:0", shape=[1], values=[5.0])
    run.tensor(0, "all_gather_big", device="cuda:0", shape=[3000], equal=True)
    n, first = out["all_gather_list"]
    run.expect(n == 1 and first["device"] == "cuda:0" and first["equal"], f"concat=False: {out['all_gather_list']}")
    run.tensor(0, "all_gather_async", device="cuda:0", equal=True)
    run.tensor(0, "gather_small", device="cuda:0", values=[1, 2])
    run.tensor(0, "gather_big", device="cuda:0", shape=[3000], equal=True)
    run.expect(out["scatter_big_is_item"] and out["scatter_small_is_item"], "scatter on src: not its own item")
    n, got, new = out["all_to_all_big"]
    run.expect(n == 1 and new and got["device"] == "cuda:0" and got["equal"], f"all_to_all: {out['all_to_all_big']}")
    run.tensor(0, "all_to_all_int16", device="cuda:0", dtype="int16", shape=[1200], equal=True)
    run.tensor(0, "all_to_all_small", device="cuda:0", values=[1, 2])


NCCL_VALUES = NCCL + """
out = {"info": INFO}
total = pd.all_reduce(2**70)
out["all_reduce_int"] = [type(total).__name__, str(total)]
avg = pd.all_reduce(3, op="AVG")
out["all_reduce_avg"] = [type(avg).__name__, avg]
out["reduce_int"] = str(pd.reduce(2**65 + 1, dst=0))
out["all_gather_text"] = pd.all_gather(TEXT) == [TEXT]
out["all_gather_long_text"] = pd.all_gather(TEXT * 500) == [TEXT * 500]  # > one slot: a second round
out["broadcast_text"] = pd.broadcast(TEXT, src=0) == TEXT
got = pd.all_gather({"w": torch.arange(3), "k": (1, 2)})  # a CPU tensor inside a value
out["all_gather_value"] = [len(got), show(got[0]["w"]), type(got[0]["k"]).__name__]
got = pd.all_to_all([{"w": torch.ones(2, dtype=torch.float64)}])
out["all_to_all_value"] = show(got[0]["w"])
out["gather_value"] = pd.gather({"s": TEXT}, dst=0) == [{"s": TEXT}]
out["scatter_value"] = pd.scatter([TEXT], src=0) == TEXT
pd.finalize()
report(out)
"""


@needs_nccl
def test_nccl_world_of_one_values(tmp_path):
    run = run_one(NCCL_VALUES, tmp_path)
    out = run[0]
    run.expect(out["info"]["backend"] == "nccl", f"{out['info']}")
    run.expect(out["all_reduce_int"] == ["int", str(2**70)], f"all_reduce(2**70): {out['all_reduce_int']}")
    run.expect(out["all_reduce_avg"] == ["float", 3.0], f"all_reduce(3, AVG): {out['all_reduce_avg']}")
    run.expect(out["reduce_int"] == str(2**65 + 1), f"reduce: {out['reduce_int']}")
    for key in ("all_gather_text", "all_gather_long_text", "broadcast_text", "gather_value", "scatter_value"):
        run.expect(out[key] is True, f"{key}: the value did not come back exact")
    n, w, k = out["all_gather_value"]
    # tensors inside values are decoded on this rank's device()
    run.expect(n == 1 and k == "tuple", f"all_gather(value): {out['all_gather_value']}")
    run.expect(w == {"device": "cuda:0", "dtype": "int64", "shape": [3], "values": [0, 1, 2]}, f"tensor in value: {w}")
    run.tensor(0, "all_to_all_value", device="cuda:0", dtype="float64", values=[1.0, 1.0])


NCCL_BROADCAST_VALUE = NCCL + """
sent = {"w": torch.arange(3), "name": TEXT}  # a dict holding a CPU tensor
got = pd.broadcast(sent, src=0)
out = {"info": INFO, "w": show(got["w"]), "name": got["name"] == TEXT, "same": got is sent}
pd.finalize()
report(out)
"""


@needs_nccl
def test_nccl_broadcast_of_a_value_returns_it_on_src(tmp_path):
    """broadcast's docstring: a value comes back "on ``src``, the value itself (as idist)".

    At world size 1 the only rank is ``src``: its dict, CPU tensor inside, is returned as it is.
    """
    run = run_one(NCCL_BROADCAST_VALUE, tmp_path)
    run.expect(run[0]["name"] is True and run[0]["same"] is True, "src did not get its own value back")
    run.tensor(0, "w", device="cpu", dtype="int64", values=[0, 1, 2])


# ============================================================ gloo with CUDA tensors, 2 ranks on one GPU


def _gloo_info(run: Outcome) -> None:
    for rank in range(2):
        info = run[rank]["info"]
        # gloo computes on the CPU, GPU visible or not (device()'s docstring)
        run.expect(info == {"backend": "gloo", "rank": rank, "size": 2, "device": "cpu"}, f"rank {rank}: {info}")


GLOO_REDUCTIONS = GLOO + """
out = {"info": INFO}
t = torch.tensor([1.0, 2.0], device=CUDA) + 10 * r
got = pd.all_reduce(t)
out["all_reduce"], out["all_reduce_same"] = show(got), got is t
t = torch.full((3,), float(r + 1), device=CUDA)
got = pd.all_reduce(t, op="AVG")
out["all_reduce_avg"], out["all_reduce_avg_same"] = show(got), got is t
m = torch.arange(6.0, device=CUDA).reshape(2, 3) * (r + 1)
tensors = [m.t(), torch.tensor([r, 10], device=CUDA), torch.tensor([0.5], device=CUDA)]
out["coalesced_same"] = pd.all_reduce(tensors) is tensors
out["coalesced"] = [show(x) for x in tensors]
out["all_reduce_max"] = show(pd.all_reduce(torch.tensor([r, -r], device=CUDA), op="MAX"))
out["all_reduce_async"] = show(pd.all_reduce(torch.ones(2, device=CUDA), async_op=True).wait())
t = torch.tensor([1.0, 2.0], device=CUDA) * (r + 1)
got = pd.reduce(t, dst=1)
out["reduce"], out["reduce_same"] = show(got), got is t
out["reduce_avg"] = show(pd.reduce(torch.full((2,), float(r + 1), device=CUDA), dst=0, op="AVG"))
t = torch.arange(4.0, device=CUDA) * (r + 1)
out["reduce_scatter"] = show(pd.reduce_scatter(t))
out["reduce_scatter_input"] = show(t)
out["reduce_scatter_uneven"] = show(pd.reduce_scatter(torch.arange(10.0, device=CUDA).reshape(5, 2) * (r + 1)))
out["reduce_scatter_avg"] = show(pd.reduce_scatter(torch.arange(4.0, device=CUDA) * (r + 1), op="AVG"))
total = pd.all_reduce(2**70 + r)
out["all_reduce_int"] = [type(total).__name__, str(total)]
out["reduce_int"] = pd.reduce(r + 1, dst=0)
out["barrier"] = [pd.barrier(), pd.barrier(async_op=True).wait()]
pd.finalize()
report(out)
"""


def test_gloo_cuda_reductions(tmp_path):
    run = run_ranks(GLOO_REDUCTIONS, 2, tmp_path)
    _gloo_info(run)
    for rank in range(2):
        o = run[rank]
        run.tensor(rank, "all_reduce", device="cuda:0", dtype="float32", values=[12.0, 14.0])
        run.tensor(rank, "all_reduce_avg", device="cuda:0", values=[1.5, 1.5, 1.5])
        run.expect(o["all_reduce_same"] and o["all_reduce_avg_same"], f"rank {rank}: all_reduce not in place")
        run.expect(o["coalesced_same"], f"rank {rank}: all_reduce of a list did not return the list")
        nc, ints, f32 = o["coalesced"]
        run.expect(nc["device"] == "cuda:0" and nc["values"] == [[0.0, 9.0], [3.0, 12.0], [6.0, 15.0]], f"{nc}")
        run.expect(ints["device"] == "cuda:0" and ints["values"] == [1, 20], f"{ints}")
        run.expect(f32["device"] == "cuda:0" and f32["values"] == [1.0], f"{f32}")
        run.tensor(rank, "all_reduce_max", device="cuda:0", values=[1, 0])
        run.tensor(rank, "all_reduce_async", device="cuda:0", values=[2.0, 2.0])
        run.expect(o["reduce_same"], f"rank {rank}: reduce did not return its tensor")
        # a new tensor, chunk i of the sum on rank i, on the input's device; the input untouched
        run.tensor(rank, "reduce_scatter", device="cuda:0", values=[[0.0, 3.0], [6.0, 9.0]][rank])
        run.tensor(rank, "reduce_scatter_input", device="cuda:0", values=[x * (rank + 1) for x in [0.0, 1.0, 2.0, 3.0]])
        uneven = [[[0.0, 3.0], [6.0, 9.0], [12.0, 15.0]], [[18.0, 21.0], [24.0, 27.0]]][rank]  # rows split 3 + 2
        run.tensor(rank, "reduce_scatter_uneven", device="cuda:0", values=uneven)
        run.tensor(rank, "reduce_scatter_avg", device="cuda:0", values=[[0.0, 1.5], [3.0, 4.5]][rank])
        run.expect(o["all_reduce_int"] == ["int", str(2**71 + 1)], f"rank {rank}: {o['all_reduce_int']}")
        run.expect(o["barrier"] == [None, None], f"rank {rank}: barrier {o['barrier']}")
    run.tensor(1, "reduce", device="cuda:0", values=[3.0, 6.0])  # dst: the sum, in place
    run.tensor(0, "reduce", device="cuda:0", values=[1.0, 2.0])  # elsewhere: untouched (gloo would write partial sums)
    run.tensor(0, "reduce_avg", device="cuda:0", values=[1.5, 1.5])
    run.tensor(1, "reduce_avg", device="cuda:0", values=[2.0, 2.0])
    run.expect([run[0]["reduce_int"], run[1]["reduce_int"]] == [3, 2], "reduce of numbers")


GLOO_BROADCAST = GLOO + """
out = {"info": INFO}
t = torch.arange(4.0, device=CUDA) + 100 * r
got = pd.broadcast(t, src=1)
out["broadcast"], out["broadcast_same"] = show(got), got is t
i16 = torch.tensor([r - 300, 7], dtype=torch.int16, device=CUDA)  # a dtype gloo cannot carry: sent as bytes
out["broadcast_int16"] = show(pd.broadcast(i16, src=0))
big = torch.arange(5000, dtype=torch.float32, device=CUDA) * (r + 1)
out["broadcast_big"] = show(pd.broadcast(big, src=0), torch.arange(5000, dtype=torch.float32))
t = torch.arange(6, device=CUDA).reshape(2, 3)
got = pd.broadcast(t if r == 0 else None, src=0, safe_mode=True)
out["safe_none"], out["safe_none_same"] = show(got), got is t
mine = torch.ones(3, device=CUDA) if r == 0 else torch.zeros(3, device=CUDA)  # same shape and dtype everywhere
got = pd.broadcast(mine, src=0, safe_mode=True)
out["safe_match"], out["safe_match_same"] = show(got), got is mine
other = torch.zeros(7, device=CUDA)
got = pd.broadcast(torch.ones(2, device=CUDA) if r == 0 else other, src=0, safe_mode=True)
out["safe_other_shape"], out["safe_other_shape_new"] = show(got), got is not other
t = torch.full((2,), float(r), device=CUDA)
out["broadcast_async"] = show(pd.broadcast(t, src=1, async_op=True).wait())
got = pd.broadcast({"name": TEXT, "big": 2**70, "w": torch.arange(3, device=CUDA) * 2} if r == 0 else None, src=0)
out["value"] = [got["name"] == TEXT, str(got["big"]), show(got["w"])]
pd.finalize()
report(out)
"""


def test_gloo_cuda_broadcast(tmp_path):
    run = run_ranks(GLOO_BROADCAST, 2, tmp_path)
    _gloo_info(run)
    for rank in range(2):
        o = run[rank]
        run.tensor(rank, "broadcast", device="cuda:0", values=[100.0, 101.0, 102.0, 103.0])
        run.expect(o["broadcast_same"], f"rank {rank}: broadcast not in place")
        run.tensor(rank, "broadcast_int16", device="cuda:0", dtype="int16", values=[-300, 7])
        run.tensor(rank, "broadcast_big", device="cuda:0", equal=True)
        run.tensor(rank, "safe_match", device="cuda:0", values=[1.0, 1.0, 1.0])
        run.expect(o["safe_match_same"], f"rank {rank}: safe_mode with a matching tensor did not fill it in place")
        run.tensor(rank, "broadcast_async", device="cuda:0", values=[1.0, 1.0])
    run.tensor(0, "safe_none", device="cuda:0", values=[[0, 1, 2], [3, 4, 5]])
    run.expect(run[0]["safe_none_same"], "src's safe_mode broadcast did not return its tensor")
    # safe_mode elsewhere: "a new tensor is then returned, on the backend's device" (CPU for gloo)
    run.tensor(1, "safe_none", device="cpu", dtype="int64", values=[[0, 1, 2], [3, 4, 5]])
    run.tensor(1, "safe_other_shape", device="cpu", dtype="float32", values=[1.0, 1.0])
    run.expect(run[1]["safe_other_shape_new"], "a tensor of another shape was returned, not a new one")
    # a value: decoded on the receiver, tensors inside on its device() (CPU for gloo)
    name, big, w = run[1]["value"]
    run.expect(name is True and big == str(2**70), f"rank 1 value: {run[1]['value']}")
    want = {"device": "cpu", "dtype": "int64", "shape": [3], "values": [0, 2, 4]}
    run.expect(w == want, f"rank 1 tensor in value: {w}")


GLOO_ALL_GATHER = GLOO + """
out = {"info": INFO}
out["small"] = show(pd.all_gather(torch.tensor([r, r + 10], device=CUDA)))  # rides in the metadata round
out["small_2d_uneven"] = show(pd.all_gather(torch.full((r + 1, 2), r, device=CUDA)))
big = torch.full((2000,), float(r), device=CUDA)  # 8 KB per rank: a data round
out["big"] = show(pd.all_gather(big), torch.cat([torch.zeros(2000), torch.ones(2000)]))
mine = lambda q: torch.arange((q + 1) * 1000, dtype=torch.float32) + q * 0.5
uneven = pd.all_gather(mine(r).to(CUDA))  # 4 KB and 8 KB: each rank's piece broadcast into place
out["big_uneven"] = show(uneven, torch.cat([mine(0), mine(1)]))
listed = pd.all_gather(mine(r).to(CUDA).reshape(-1, 10 * (r + 1)), concat=False)  # shapes (100, 10), (100, 20)
out["list"] = [show(x, mine(q).reshape(-1, 10 * (q + 1))) for q, x in enumerate(listed)]
i16 = torch.arange(3000, dtype=torch.int16, device=CUDA) - 1500 * r
out["int16"] = show(pd.all_gather(i16), torch.cat([torch.arange(3000, dtype=torch.int16) - 1500 * q for q in range(2)]))
out["async"] = show(pd.all_gather(big, async_op=True).wait(), torch.cat([torch.zeros(2000), torch.ones(2000)]))
out["text"] = pd.all_gather(f"{TEXT} {r}") == [f"{TEXT} 0", f"{TEXT} 1"]
got = pd.all_gather({"w": torch.full((2,), r, device=CUDA)})
out["value"] = [show(v["w"]) for v in got]
pd.finalize()
report(out)
"""


def test_gloo_cuda_all_gather(tmp_path):
    run = run_ranks(GLOO_ALL_GATHER, 2, tmp_path)
    _gloo_info(run)
    for rank in range(2):
        o = run[rank]
        # "A new tensor (concat) or list of tensors, on tensor's device"
        run.tensor(rank, "small", device="cuda:0", dtype="int64", values=[0, 10, 1, 11])
        run.tensor(rank, "small_2d_uneven", device="cuda:0", values=[[0, 0], [1, 1], [1, 1]])
        run.tensor(rank, "big", device="cuda:0", shape=[4000], equal=True)
        run.tensor(rank, "big_uneven", device="cuda:0", shape=[3000], equal=True)
        first, second = o["list"]
        run.expect(first["device"] == second["device"] == "cuda:0", f"rank {rank}: concat=False devices {o['list']}")
        run.expect(first["shape"] == [100, 10] and second["shape"] == [100, 20], f"rank {rank}: shapes {o['list']}")
        run.expect(first["equal"] and second["equal"], f"rank {rank}: concat=False values differ")
        run.tensor(rank, "int16", device="cuda:0", dtype="int16", shape=[6000], equal=True)
        run.tensor(rank, "async", device="cuda:0", equal=True)
        run.expect(o["text"] is True, f"rank {rank}: texts did not come back exact")
        # tensors inside values: on this rank's device() (CPU for gloo)
        run.expect([v["device"] for v in o["value"]] == ["cpu", "cpu"], f"rank {rank}: {o['value']}")
        run.expect([v["values"] for v in o["value"]] == [[0, 0], [1, 1]], f"rank {rank}: {o['value']}")


GLOO_GATHER = GLOO + """
out = {"info": INFO}
out["small"] = show(pd.gather(torch.tensor([r + 1.0], device=CUDA), dst=1))
big = torch.full((3000,), float(r + 1), device=CUDA)
out["big"] = show(pd.gather(big, dst=1), torch.cat([torch.ones(3000), torch.full((3000,), 2.0)]))
mine = lambda q: torch.arange((q + 1) * 1500, dtype=torch.float32) * (q + 1)
out["big_uneven"] = show(pd.gather(mine(r).to(CUDA), dst=1), torch.cat([mine(0), mine(1)]))
got = pd.gather(mine(r).to(CUDA), dst=1, concat=False)
out["list"] = None if got is None else [show(x, mine(q)) for q, x in enumerate(got)]
both = torch.cat([torch.ones(3000), torch.full((3000,), 2.0)])
out["async"] = show(pd.gather(big, dst=0, async_op=True).wait(), both)
got = pd.gather({"s": TEXT, "w": torch.full((2,), r, device=CUDA)}, dst=0)
out["value"] = None if got is None else [[v["s"] == TEXT, show(v["w"])] for v in got]
pd.finalize()
report(out)
"""


def test_gloo_cuda_gather(tmp_path):
    run = run_ranks(GLOO_GATHER, 2, tmp_path)
    _gloo_info(run)
    # dst: what all_gather returns there (on the input's device); elsewhere None
    run.tensor(1, "small", device="cuda:0", values=[1.0, 2.0])
    run.tensor(1, "big", device="cuda:0", shape=[6000], equal=True)
    run.tensor(1, "big_uneven", device="cuda:0", shape=[4500], equal=True)
    listed = run[1]["list"]
    run.expect(listed is not None and len(listed) == 2, f"gather(concat=False): {listed}")
    run.expect([x["device"] for x in listed] == ["cuda:0", "cuda:0"] and all(x["equal"] for x in listed), f"{listed}")
    run.tensor(0, "async", device="cuda:0", shape=[6000], equal=True)
    for key in ("small", "big", "big_uneven", "list"):
        none = run[0][key] is None or run[0][key] == {"type": "NoneType", "repr": "None"}
        run.expect(none, f"rank 0 (not dst) {key}: {run[0][key]}")
    run.expect(run[1]["async"] == {"type": "NoneType", "repr": "None"}, f"rank 1 async: {run[1]['async']}")
    run.expect(run[1]["value"] is None, f"rank 1 value: {run[1]['value']}")
    value = run[0]["value"]
    run.expect(value is not None and [ok for ok, _ in value] == [True, True], f"rank 0 value: {value}")
    run.expect([(w["device"], w["values"]) for _, w in value] == [("cpu", [0, 0]), ("cpu", [1, 1])], f"{value}")


GLOO_SCATTER_SMALL = GLOO + """
out = {"info": INFO}
xs = [torch.tensor([1.0, 2.0], device=CUDA), torch.tensor([3.0, 4.0, 5.0], device=CUDA)] if r == 0 else None
got = pd.scatter(xs, src=0)  # small: the elements ride in the metadata round
out["tensor"], out["is_item"] = show(got), r == 0 and got is xs[0]
got = pd.scatter(["a", {"b": torch.ones(2, device=CUDA), "t": TEXT}] if r == 0 else None, src=0)
out["value"] = got if r == 0 else [got["t"] == TEXT, show(got["b"])]
pd.finalize()
report(out)
"""


def test_gloo_cuda_scatter_small_tensors(tmp_path):
    run = run_ranks(GLOO_SCATTER_SMALL, 2, tmp_path)
    _gloo_info(run)
    run.tensor(0, "tensor", device="cuda:0", values=[1.0, 2.0])
    run.expect(run[0]["is_item"] is True, "scatter on src did not return its own item")
    # elsewhere: "a new tensor on the backend's device (CPU for gloo)"
    run.tensor(1, "tensor", device="cpu", dtype="float32", values=[3.0, 4.0, 5.0])
    run.expect(run[0]["value"] == "a", f"rank 0 value: {run[0]['value']}")
    ok, b = run[1]["value"]
    run.expect(ok is True and (b["device"], b["values"]) == ("cpu", [1.0, 1.0]), f"rank 1 value: {run[1]['value']}")


GLOO_SCATTER_BIG = GLOO + """
out = {"info": INFO}
xs = [torch.full((1000,), 1.0, device=CUDA), torch.full((1500,), 2.0, device=CUDA)] if r == 0 else None
got = pd.scatter(xs, src=0)  # 4 KB and 6 KB: too big for the metadata round, so a data round (dist.scatter)
out["tensor"], out["is_item"] = show(got, torch.full((1000 + 500 * r,), float(r + 1))), r == 0 and got is xs[0]
xs = [torch.arange(2000, dtype=torch.int16, device=CUDA) * (i + 1) for i in range(2)] if r == 0 else None
out["int16"] = show(pd.scatter(xs, src=0), torch.arange(2000, dtype=torch.int16) * (r + 1))
pd.finalize()
report(out)
"""


def test_gloo_cuda_scatter_large_tensors(tmp_path):
    run = run_ranks(GLOO_SCATTER_BIG, 2, tmp_path)
    _gloo_info(run)
    run.tensor(0, "tensor", device="cuda:0", shape=[1000], equal=True)
    run.expect(run[0]["is_item"] is True, "scatter on src did not return its own item")
    run.tensor(1, "tensor", device="cpu", dtype="float32", shape=[1500], equal=True)
    run.tensor(0, "int16", device="cuda:0", dtype="int16", equal=True)
    run.tensor(1, "int16", device="cpu", dtype="int16", shape=[2000], equal=True)


GLOO_ALL_TO_ALL = GLOO + """
out = {"info": INFO}
got = pd.all_to_all([torch.tensor([10 * r + i], device=CUDA) for i in range(2)])  # small: in the metadata round
out["small"] = [show(x) for x in got]
piece = lambda src, dst: torch.full((500 * (dst + 1) + src,), float(10 * src + dst))  # what src sends to dst
got = pd.all_to_all([piece(r, i).to(CUDA) for i in range(2)])  # 2-4 KB each: a data round, uneven sizes
out["big"] = [show(x, piece(q, r)) for q, x in enumerate(got)]
chunks = list((torch.arange(4000, dtype=torch.int16, device=CUDA) + 4000 * r).chunk(2))
got = pd.all_to_all(chunks)
out["chunks"] = [show(x, (torch.arange(4000, dtype=torch.int16) + 4000 * q).chunk(2)[r]) for q, x in enumerate(got)]
# tensors and values mixed: rank 0 sends [tensor, value], rank 1 [value, tensor]
mixed = [torch.full((600,), float(r), device=CUDA), {"from": r, "w": torch.full((2,), r, device=CUDA)}]
got = pd.all_to_all(mixed if r == 0 else mixed[::-1])
out["mixed"] = [show(x, torch.full((600,), float(q))) if isinstance(x, torch.Tensor) else [x["from"], show(x["w"])]
                for q, x in enumerate(got)]
out["text"] = pd.all_to_all([f"{r}->{i} {TEXT}" for i in range(2)])
pd.finalize()
report(out)
"""


def test_gloo_cuda_all_to_all(tmp_path):
    run = run_ranks(GLOO_ALL_TO_ALL, 2, tmp_path)
    _gloo_info(run)
    for rank in range(2):
        o = run[rank]
        # "Tensors are new, on the backend's device (CPU for gloo), dtype and shape as sent"
        small = [(x["device"], x["values"]) for x in o["small"]]
        run.expect(small == [("cpu", [rank]), ("cpu", [10 + rank])], f"rank {rank} small: {o['small']}")
        for src, x in enumerate(o["big"]):
            shape = [500 * (rank + 1) + src]
            run.expect(x["device"] == "cpu" and x["shape"] == shape and x["equal"], f"rank {rank} from {src}: {x}")
        for src, x in enumerate(o["chunks"]):
            run.expect(x["device"] == "cpu" and x["dtype"] == "int16" and x["equal"], f"rank {rank}, from {src}: {x}")
        run.expect(o["text"] == [f"0->{rank} {TEXT}", f"1->{rank} {TEXT}"], f"rank {rank} text: {o['text']}")
    # rank 0 sent [tensor, value], rank 1 [value, tensor]: each rank gets its own tensor and the other's value
    for rank in range(2):
        got = run[rank]["mixed"]
        tensor, (sender, w) = got[rank], got[1 - rank]
        run.expect((tensor["device"], tensor["shape"], tensor["equal"]) == ("cpu", [600], True), f"rank {rank}: {got}")
        run.expect((sender, w["device"], w["values"]) == (1 - rank, "cpu", [1 - rank] * 2), f"rank {rank}: {got}")


GLOO_P2P_VALUES = GLOO + """
out = {"info": INFO}
long_text = TEXT * 300  # more than one slot: the frame's body follows
if r == 0:
    pd.send({"step": 3, "w": torch.arange(3, device=CUDA), "big": 2**70}, dst=1)
    pd.send(long_text, dst=1)
    pd.isend((1, TEXT), dst=1, tag=5).wait()
else:
    got = pd.recv(None, src=0)
    out["value"] = [got["step"], str(got["big"]), show(got["w"])]
    out["long"] = pd.recv(None, src=0) == long_text
    out["async"] = list(pd.irecv(None, src=0, tag=5).wait()) == [1, TEXT]
pd.finalize()
report(out)
"""


def test_gloo_cuda_send_recv_values(tmp_path):
    run = run_ranks(GLOO_P2P_VALUES, 2, tmp_path)
    _gloo_info(run)
    step, big, w = run[1]["value"]
    run.expect(step == 3 and big == str(2**70), f"rank 1 value: {run[1]['value']}")
    # "tensors inside on this rank's device()": CPU for gloo
    run.expect(w == {"device": "cpu", "dtype": "int64", "shape": [3], "values": [0, 1, 2]}, f"rank 1 tensor: {w}")
    run.expect(run[1]["long"] is True and run[1]["async"] is True, f"rank 1: {run[1]}")


GLOO_P2P_TENSORS = GLOO + """
out = {"info": INFO}
if r == 0:
    pd.send(torch.arange(4.0, device=CUDA), dst=1)
else:
    t = torch.zeros(4, device=CUDA)
    got = pd.recv(t, src=0)
    out["recv"], out["recv_same"] = show(got), got is t
pd.finalize()
report(out)
"""


def test_gloo_cuda_send_recv_tensors(tmp_path):
    # gloo itself cannot send CUDA memory (its TCP transport hands the device pointer to writev and the
    # sender aborts; PyTorch docs, "Backends": no GPU point-to-point on gloo): polydist goes via the CPU.
    run = run_ranks(GLOO_P2P_TENSORS, 2, tmp_path, timeout=120)
    _gloo_info(run)
    run.tensor(1, "recv", device="cuda:0", values=[0.0, 1.0, 2.0, 3.0])
    run.expect(run[1]["recv_same"], "recv did not fill its tensor in place")


GLOO_AUTO_MODEL = GLOO + """
import copy
from torch.nn.parallel import DistributedDataParallel

out = {"info": INFO}
torch.manual_seed(100 + r)  # different initial weights on each rank: DDP must make them equal
model = pd.auto_model(nn.Linear(4, 2))
out["model"] = [type(model).__name__, str(next(model.parameters()).device)]
flat = lambda m: torch.cat([p.detach().reshape(-1).cpu() for p in m.parameters()])
start = flat(model)
starts = pd.all_gather(start, concat=False)
out["same_start"] = bool(torch.equal(starts[0], starts[1]))
x = torch.randn(8, 4, generator=torch.Generator().manual_seed(r)).to(pd.device())  # each rank its own batch
reference = copy.deepcopy(model.module)  # the same weights, no DDP: this rank's own gradient
model(x).pow(2).mean().backward()
reference(x).pow(2).mean().backward()
mean = pd.all_reduce([p.grad.detach().clone() for p in reference.parameters()], op="AVG")
out["grad_is_mean"] = all(torch.allclose(p.grad, g, atol=1e-6) for p, g in zip(model.parameters(), mean))
pairs = list(zip(model.parameters(), reference.parameters()))
out["grad_differs_from_local"] = any(not torch.allclose(p.grad, q.grad) for p, q in pairs)
torch.optim.SGD(model.parameters(), lr=0.1).step()
after = flat(model)
afters = pd.all_gather(after, concat=False)
out["same_after"] = bool(torch.equal(afters[0], afters[1]))
out["changed"] = not torch.equal(after, start)
pd.finalize()
report(out)
"""


def test_gloo_auto_model_wraps_in_ddp_and_keeps_replicas_identical(tmp_path):
    run = run_ranks(GLOO_AUTO_MODEL, 2, tmp_path)
    _gloo_info(run)
    for rank in range(2):
        o = run[rank]
        # on device() (the CPU for gloo, GPU or not), wrapped in DistributedDataParallel
        run.expect(o["model"] == ["DistributedDataParallel", "cpu"], f"rank {rank}: auto_model gave {o['model']}")
        run.expect(o["same_start"], f"rank {rank}: replicas differ after wrapping (DDP broadcasts rank 0's weights)")
        run.expect(o["grad_is_mean"], f"rank {rank}: the gradient is not the mean of the ranks' gradients")
        run.expect(o["grad_differs_from_local"], f"rank {rank}: the gradient is this rank's own (no averaging?)")
        run.expect(o["same_after"] and o["changed"], f"rank {rank}: after one step: {o}")
