"""The mpi4py backend (issue 4): torch.distributed's own API and DDP on stock wheels, mpi://, abort on failure.

polydist's collectives run on MPI in every collective test file (the world
fixtures are parametrized gloo/mpi); this file checks what is specific to the
backend: each ProcessGroup method through the plain ``torch.distributed`` API,
futures, non-blocking point-to-point, DDP, and jobs under ``mpiexec``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from _world import mpi_job_env, mpiexec
from conftest import ROOT, _mpi_missing

pytestmark = [pytest.mark.timeout(150), pytest.mark.skipif(bool(_mpi_missing()), reason=_mpi_missing() or "-")]


# ------------------------------------------------------------ the torch.distributed API on mpi4py


def _reductions():
    r, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for op in ("SUM", "PRODUCT", "MIN", "MAX", "AVG"):
        t = torch.tensor([r + 1.0, -(r + 2.0), 0.5 * r])
        dist.all_reduce(t, getattr(dist.ReduceOp, op))
        out[f"f32-{op}"] = t
    i = torch.tensor([r + 1, 2**40 + r], dtype=torch.int64)
    dist.all_reduce(i)
    out["i64-SUM"] = i
    b = torch.tensor([r == 0, True, False])
    dist.all_reduce(b, dist.ReduceOp.MIN)
    out["bool-MIN"] = b.clone()
    b = torch.tensor([r == 0, True, False])
    dist.all_reduce(b, dist.ReduceOp.MAX)
    out["bool-MAX"] = b
    for dtype in (torch.bfloat16, torch.float16):
        h = torch.full((4,), 1.0 + r / 3, dtype=dtype)
        dist.all_reduce(h, dist.ReduceOp.AVG)
        out[f"{dtype}-AVG"] = h
    c = torch.tensor([complex(r, 1)], dtype=torch.complex64)
    dist.all_reduce(c)
    out["c64-SUM"] = c
    x = torch.full((5,), float(r + 1))
    dist.reduce(x, dst=1)
    out["reduce"] = x  # 1+2+3 on rank 1, untouched elsewhere
    y = torch.arange(2.0 * n) * (r + 1)
    o = torch.empty(2)
    dist.reduce_scatter_single(o, y)
    out["reduce_scatter_single"] = o
    o2 = torch.empty(2)
    dist.reduce_scatter(o2, list((torch.arange(2.0 * n) * (r + 1)).chunk(n)))
    out["reduce_scatter"] = o2
    ts = [torch.full((2,), float(r)), torch.full((3,), float(r))]
    dist.all_reduce_coalesced(ts)
    out["coalesced"] = ts
    return out


@pytest.mark.mpi_smoke
def test_torch_reductions(mpi_world3):
    n = 3
    for r, out in enumerate(mpi_world3.run(_reductions)):
        vals = [torch.tensor([k + 1.0, -(k + 2.0), 0.5 * k]) for k in range(n)]
        assert torch.equal(out["f32-SUM"], sum(vals))
        assert torch.equal(out["f32-PRODUCT"], vals[0] * vals[1] * vals[2])
        assert torch.equal(out["f32-MIN"], torch.stack(vals).min(0).values)
        assert torch.equal(out["f32-MAX"], torch.stack(vals).max(0).values)
        assert torch.allclose(out["f32-AVG"], sum(vals) / n)
        assert out["i64-SUM"].tolist() == [6, 3 * 2**40 + 3]  # exact beyond float precision
        assert out["bool-MIN"].tolist() == [False, True, False]
        assert out["bool-MAX"].tolist() == [True, True, False]
        for dtype in (torch.bfloat16, torch.float16):
            # reduced in float32 and rounded once
            exact = sum(torch.tensor(1.0 + k / 3, dtype=dtype).float() for k in range(n)) / n
            assert out[f"{dtype}-AVG"].dtype == dtype
            assert torch.equal(out[f"{dtype}-AVG"], torch.full((4,), exact.item()).to(dtype))
        assert out["c64-SUM"].tolist() == [complex(3, 3)]
        assert out["reduce"].tolist() == ([6.0] * 5 if r == 1 else [float(r + 1)] * 5)
        total = torch.arange(2.0 * n) * 6
        assert torch.equal(out["reduce_scatter_single"], total[2 * r : 2 * r + 2])
        assert torch.equal(out["reduce_scatter"], total[2 * r : 2 * r + 2])
        assert out["coalesced"][0].tolist() == [3.0, 3.0] and out["coalesced"][1].tolist() == [3.0] * 3


def _movement():
    r, n = dist.get_rank(), dist.get_world_size()
    out = {}
    b = torch.arange(4, dtype=torch.bfloat16) if r == 2 else torch.zeros(4, dtype=torch.bfloat16)
    dist.broadcast(b, src=2)
    out["broadcast"] = b
    g = [torch.empty(2, dtype=torch.int16) for _ in range(n)]
    dist.all_gather(g, torch.full((2,), r, dtype=torch.int16))
    out["all_gather"] = g
    t = torch.empty(3 * n)
    dist.all_gather_single(t, torch.full((3,), float(r)))
    out["all_gather_single"] = t
    gl = [torch.empty(2) for _ in range(n)] if r == 2 else None
    dist.gather(torch.full((2,), float(r)), gl, dst=2)
    out["gather"] = gl
    s = torch.empty(2)
    dist.scatter(s, [torch.full((2,), 10.0 + k) for k in range(n)] if r == 1 else None, src=1)
    out["scatter"] = s
    # all_to_all with lists of different lengths: rank r sends k+1 items to rank k
    outs = [torch.empty(r + 1) for _ in range(n)]
    dist.all_to_all(outs, [torch.full((k + 1,), float(10 * r + k)) for k in range(n)])
    out["all_to_all"] = outs
    # all_to_all_single with uneven splits: rank r sends k+1 rows to rank k, receives r+1 rows from each
    inp = torch.cat([torch.full((k + 1, 2), float(10 * r + k)) for k in range(n)])
    res = torch.empty(n * (r + 1), 2)
    dist.all_to_all_single(res, inp, output_split_sizes=[r + 1] * n, input_split_sizes=[k + 1 for k in range(n)])
    out["all_to_all_single"] = res
    eq = torch.empty(n)
    dist.all_to_all_single(eq, torch.arange(float(n)) + 10 * r)
    out["all_to_all_single_equal"] = eq
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": r, "text": "ünï"})
    out["all_gather_object"] = objs
    lst = [{"from": r}]
    dist.broadcast_object_list(lst, src=1)
    out["broadcast_object_list"] = lst
    sub = dist.new_group([0, 2])
    if r in (0, 2):
        v = torch.tensor([float(r)])
        dist.all_reduce(v, group=sub)
        out["subgroup"] = v.item()
    dist.barrier()
    return out


@pytest.mark.mpi_smoke
def test_torch_data_movement(mpi_world3):
    n = 3
    for r, out in enumerate(mpi_world3.run(_movement)):
        assert out["broadcast"].tolist() == [0, 1, 2, 3] and out["broadcast"].dtype == torch.bfloat16
        assert [x.tolist() for x in out["all_gather"]] == [[k, k] for k in range(n)]
        assert out["all_gather_single"].tolist() == [float(k) for k in range(n) for _ in range(3)]
        assert out["gather"] is None if r != 2 else [x.tolist() for x in out["gather"]] == [[0.0] * 2, [1.0] * 2, [2.0] * 2]
        assert out["scatter"].tolist() == [10.0 + r] * 2
        assert [x.tolist() for x in out["all_to_all"]] == [[float(10 * k + r)] * (r + 1) for k in range(n)]
        expect = torch.cat([torch.full((r + 1, 2), float(10 * k + r)) for k in range(n)])
        assert torch.equal(out["all_to_all_single"], expect)
        assert out["all_to_all_single_equal"].tolist() == [float(10 * k + r) for k in range(n)]
        assert out["all_gather_object"] == [{"rank": k, "text": "ünï"} for k in range(n)]
        assert out["broadcast_object_list"] == [{"from": 1}]
        assert out.get("subgroup") == (2.0 if r in (0, 2) else None)


def _p2p():
    r, n = dist.get_rank(), dist.get_world_size()
    out = {}
    # A ring of 4 MiB messages: blocking sends would deadlock, isend cannot.
    big = torch.full((1 << 20,), float(r))
    got = torch.empty_like(big)
    w = dist.isend(big, (r + 1) % n)
    dist.recv(got, (r - 1) % n)
    w.wait()
    out["ring"] = got[0].item()
    # The future of an isend completes without wait(): rank 1 receives late.
    dist.barrier()
    if r == 0:
        fut = dist.isend(torch.full((1 << 20,), 7.0), 1).get_future()
        deadline = time.monotonic() + 20
        while not fut.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        out["future_done"] = fut.done()
    elif r == 1:
        time.sleep(0.3)
        late = torch.empty(1 << 20)
        dist.recv(late, 0)
        out["late"] = late[-1].item()
    dist.barrier()
    # recv from any source reports the sender
    if r == 2:
        anywhere = torch.empty(1)
        out["sender"] = dist.recv(anywhere)
        out["any"] = anywhere.item()
    elif r == 0:
        dist.send(torch.tensor([42.0]), 2)
    # Rank 1's ring message below would match that any-source recv as well (same tag): Open MPI delivers it first.
    dist.barrier()
    # batch_isend_irecv ring
    send, recv = torch.tensor([float(r)]), torch.empty(1)
    ops = [dist.P2POp(dist.isend, send, (r + 1) % n), dist.P2POp(dist.irecv, recv, (r - 1) % n)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    out["batch"] = recv.item()
    # async collectives: the work's future holds the tensors (DDP's comm hooks read it)
    t = torch.ones(2)
    fut = dist.all_reduce(t, async_op=True).get_future()
    out["future_value"] = fut.then(lambda f: f.value()[0] * 2).wait()
    return out


@pytest.mark.mpi_smoke
def test_p2p_nonblocking_and_futures(mpi_world3):
    n = 3
    for r, out in enumerate(mpi_world3.run(_p2p)):
        assert out["ring"] == float((r - 1) % n)
        if r == 0:
            assert out["future_done"] is True
        if r == 1:
            assert out["late"] == 7.0
        if r == 2:
            assert (out["sender"], out["any"]) == (0, 42.0)
        assert out["batch"] == float((r - 1) % n)
        assert out["future_value"].tolist() == [6.0, 6.0]


def _async_collectives():
    """async_op=True returns pending work: rank 1 arrives late, rank 0 must not wait for it in the call."""
    import threading

    r = dist.get_rank()
    out = {}
    if r == 1:
        time.sleep(0.5)
    t = torch.full((4,), float(r))
    start = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    out["call_s"] = time.monotonic() - start
    out["pending_after_call"] = not work.is_completed()
    done = threading.Event()
    work.get_future().then(lambda f: done.set())
    out["future_without_wait"] = done.wait(10)  # completed by the lane, nobody called wait()
    work.wait()
    out["value"] = t.tolist()
    # several kinds in a row, only the last waited for: the lane keeps the call order
    a, b = torch.full((3,), r + 1.0), torch.full((2,), 10.0 * r)
    gathered = [torch.empty(2) for _ in range(dist.get_world_size())]
    works = [dist.all_reduce(a, async_op=True), dist.broadcast(b, src=2, async_op=True),
             dist.all_gather(gathered, b, async_op=True), dist.all_reduce(a, op=dist.ReduceOp.MAX, async_op=True)]
    works[-1].wait()
    out["ordered"] = (a.tolist(), b.tolist(), [g.tolist() for g in gathered], all(w.is_completed() for w in works))
    # a blocking call behind queued work waits its turn
    c = torch.ones(2)
    pending = dist.all_reduce(c, async_op=True)
    dist.all_reduce(c)
    out["behind"] = (pending.is_completed(), c.tolist())
    return out


def test_async_collectives_are_pending_and_ordered(mpi_world3):
    results = mpi_world3.run(_async_collectives)
    for r, out in enumerate(results):
        assert out["value"] == [3.0] * 4
        assert out["future_without_wait"] is True
        assert out["ordered"] == ([6.0] * 3, [20.0, 20.0], [[20.0, 20.0]] * 3, True)
        assert out["behind"] == (True, [9.0, 9.0])  # (1+1+1) summed again: 3 x 3
    assert results[0]["pending_after_call"] is True and results[0]["call_s"] < 0.3  # rank 1 was 0.5 s late


def _coalesced(async_ops):
    """torch's coalesced all-gathers and reduce-scatters (``_coalescing_manager``): one operation of the group each
    (one record), outputs as the separate calls would fill them, whatever the dtypes, empty and strided ones too."""
    from polydist.collectives.recorder import RECORDER, as_dict

    r, n = dist.get_rank(), dist.get_world_size()
    ins = [torch.full((2,), float(r)), torch.arange(3, dtype=torch.int64) + 10 * r, torch.empty(0),
           torch.tensor([r % 2 == 0])]  # fmt: skip
    strided = torch.zeros(2, n).t()  # an output that is not contiguous: filled through a copy
    outs = [torch.empty(2 * n), torch.empty(3 * n, dtype=torch.int64), torch.empty(0), torch.empty(n, dtype=torch.bool)]
    first = RECORDER.count
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
        dist.all_gather_into_tensor(strided, torch.tensor([r, -r], dtype=torch.float32))
    if async_ops:
        cm.wait()
    gather_records = [as_dict(x)["collective"] for x in RECORDER.records()[0] if x[0] >= first]
    rs_in = [torch.arange(2.0 * n) * (r + 1), torch.arange(3.0 * n) + r]
    rs_out = [torch.empty(2), torch.empty(3)]
    first = RECORDER.count
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        for o, i in zip(rs_out, rs_in):
            dist.reduce_scatter_tensor(o, i)
    if async_ops:
        cm.wait()
    scatter_records = [as_dict(x)["collective"] for x in RECORDER.records()[0] if x[0] >= first]
    return {"gathered": [o.tolist() for o in outs], "strided": strided.tolist(), "scattered": [o.tolist() for o in rs_out],
            "records": (gather_records, scatter_records)}  # fmt: skip


@pytest.mark.parametrize("async_ops", [False, True])
def test_coalesced_gathers_and_reduce_scatters_are_one_operation_each(mpi_world3, async_ops):
    results = mpi_world3.run(_coalesced, async_ops)
    n = 3
    for r, out in enumerate(results):
        assert out["gathered"] == [[0.0, 0.0, 1.0, 1.0, 2.0, 2.0], [0, 1, 2, 10, 11, 12, 20, 21, 22], [], [True, False, True]]
        assert out["strided"] == [[float(k), float(-k)] for k in range(n)]
        total = torch.arange(2.0 * n) * 6, torch.arange(3.0 * n) * 3 + 3  # (1+2+3) x, and 3 x + (0+1+2)
        assert out["scattered"] == [total[0][2 * r : 2 * r + 2].tolist(), total[1][3 * r : 3 * r + 3].tolist()]
        assert out["records"] == (["all_gather_into_tensor_coalesced"], ["reduce_scatter_tensor_coalesced"])


def _profiled():
    r, n = dist.get_rank(), dist.get_world_size()
    t = torch.ones(2, 3)
    with torch.profiler.profile(record_shapes=True) as prof:
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        dist.broadcast(t, src=0)
        if r == 0:
            dist.send(torch.ones(5), dst=1)
        elif r == 1:
            dist.recv(torch.empty(5), src=0)
    events = [(e.name, e.input_shapes, e.is_async) for e in prof.events() if e.name.startswith(dist.get_backend() + ":")]
    return sorted(events)


def test_profiler_sees_every_operation(mpi_world3):
    backend = "mpi4py"
    for r, events in enumerate(mpi_world3.run(_profiled)):
        expected = [(f"{backend}:all_reduce", [[2, 3]], True)] * 2 + [(f"{backend}:broadcast", [[2, 3]], True)]
        if r in (0, 1):
            expected.append((f"{backend}:{'send' if r == 0 else 'recv'}", [[5]], True))
        assert events == sorted(expected)


def _group_names():
    sub = dist.new_group([0, 2])
    names = (dist.group.WORLD.group_name, sub.group_name if sub != dist.GroupMember.NON_GROUP_MEMBER else None)
    dist.destroy_process_group(sub)  # torch unregisters groups by name
    t = torch.ones(1)
    dist.all_reduce(t)  # the world is untouched
    return names, t.item(), dist.get_backend(dist.group.WORLD)


def test_groups_have_names_and_subgroups_can_be_destroyed(mpi_world3):
    results = mpi_world3.run(_group_names)
    assert all(name for name in results[0][0])
    assert results[1][0][1] is None and results[2][0][1] == results[0][0][1]
    assert [res[1:] for res in results] == [(3.0, "mpi4py")] * 3


def test_torch_mpi_name_on_a_stock_wheel(cli_env):
    """init_process_group("mpi") under mpiexec: rank and size from MPI, no store; the group reports "mpi"."""
    code = """
        import sys, torch, torch.distributed as dist, polydist
        dist.init_process_group("mpi")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        model(torch.randn(8, 4) * (dist.get_rank() + 1)).sum().backward()
        g = [torch.empty(4) for _ in range(dist.get_world_size())]
        dist.all_gather(g, model.module.weight.grad.reshape(-1))
        sub = dist.new_group([1])
        sys.stdout.write(f"rank {dist.get_rank()}/{dist.get_world_size()} {dist.get_backend()} "
                         f"{dist.group.WORLD.name()} same {all(torch.equal(g[0], x) for x in g)} "
                         f"member {sub != dist.GroupMember.NON_GROUP_MEMBER} {polydist.all_reduce(1)}\\n")
        dist.destroy_process_group()
    """
    lines = _rank_lines(2, code, cli_env)
    assert lines == [f"rank {r}/2 mpi mpi same True member {r == 1} 2" for r in range(2)]


def _bad_calls():
    errors = {}
    for name, call in {
        "avg_int": lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), dist.ReduceOp.AVG),
        "xor_float": lambda: dist.all_reduce(torch.ones(2), dist.ReduceOp.BXOR),
        "max_complex": lambda: dist.all_reduce(torch.ones(2, dtype=torch.complex64), dist.ReduceOp.MAX),
        "split_sizes": lambda: dist.all_to_all_single(torch.empty(3), torch.empty(3), [1, 1, 2], [1, 1, 1]),
        "gather_outputs": lambda: dist.all_gather([torch.empty(2), torch.empty(2)], torch.ones(2)),
        "coalesced_lists": lambda: dist.all_gather_coalesced([[torch.empty(2)]] * 2, [torch.ones(2)]),
        "coalesced_bytes": lambda: dist.all_gather_coalesced([[torch.empty(2)]] * 3, [torch.ones(3)]),
    }.items():
        try:
            call()
            errors[name] = None
        except (TypeError, ValueError) as exc:  # op x dtype: TypeError, as polydist's own collectives raise
            errors[name] = f"{type(exc).__name__}: {exc}"
    dist.barrier()  # nothing was sent: the group is still in step
    return errors


def test_bad_calls_raise_before_communicating(mpi_world3):
    for errors in mpi_world3.run(_bad_calls):
        assert errors["avg_int"].startswith("TypeError") and "AVG" in errors["avg_int"] and "int32" in errors["avg_int"]
        assert errors["xor_float"].startswith("TypeError") and "XOR" in errors["xor_float"]
        assert "MAX" in errors["max_complex"] and "complex" in errors["max_complex"]  # torch's own check comes first
        assert errors["split_sizes"].startswith("InvalidArgumentError") and "[1, 1, 2]" in errors["split_sizes"]
        assert errors["gather_outputs"] == (
            "InvalidArgumentError: all_gather: invalid output tensor list (expected length 3, one per group rank, got 2)")
        assert errors["coalesced_lists"] == (
            "InvalidArgumentError: all_gather_coalesced: need 3 output lists (one per rank) of 1 tensors each, got [1, 1]")
        assert errors["coalesced_bytes"] == (  # torch's rule (dtype and elements) and words, as on horovod
            "InvalidArgumentError: all_gather_coalesced: invalid output tensor at index 0 "
            "(expected torch.float32 of 3 elements as the input, got torch.float32 of 2)")


def _ddp_steps():
    import copy

    torch.manual_seed(0)  # same initial model everywhere (DDP also broadcasts it)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    reference = copy.deepcopy(model)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    n = dist.get_world_size()
    gens = [torch.Generator().manual_seed(100 + k) for k in range(n)]  # rank k's data stream

    def loss_of(net, x):
        return ((net(x) - x.sum(1, keepdim=True)) ** 2).mean()

    for _ in range(5):
        batches = [torch.randn(16, 8, generator=g) for g in gens]
        opt.zero_grad()
        loss_of(ddp, batches[dist.get_rank()]).backward()  # DDP averages gradients over ranks
        opt.step()
        ref_opt.zero_grad()  # serial reference: the gradient of the mean of every rank's loss
        (sum(loss_of(reference, x) for x in batches) / n).backward()
        ref_opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return flat, torch.cat([p.detach().reshape(-1) for p in reference.parameters()])


def test_ddp_keeps_replicas_identical(mpi_world3):
    results = mpi_world3.run(_ddp_steps)
    params = [p for p, _ in results]
    assert all(torch.equal(params[0], p) for p in params[1:])
    assert torch.allclose(params[0], results[0][1], atol=1e-5)  # and equal to averaged-gradient SGD
    assert not torch.allclose(params[0], _ddp_initial(), atol=1e-3)  # it did train


def _ddp_initial():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _cuda_call():
    try:
        dist.all_reduce(torch.ones(1, device="cuda"))
    except ValueError as exc:
        return str(exc)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor_rejected(mpi_world3):  # pragma: no cover - CI has no GPU
    assert all("CPU tensors only" in e for e in mpi_world3.run(_cuda_call))


# ------------------------------------------------------------ jobs under mpiexec


def _mpi_env(cli_env):
    env = {k: v for k, v in mpi_job_env(cli_env).items() if not k.startswith("POLYDIST_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _rank_lines(n, code, cli_env):
    """Run ``code`` on ``n`` ranks under mpiexec; its sorted output lines that start with "rank "."""
    out = _mpiexec(n, code, _mpi_env(cli_env))
    assert out.returncode == 0, out.stderr
    return sorted(line for line in out.stdout.splitlines() if line.startswith("rank "))


def _mpiexec(n, code, env, timeout=90):
    return subprocess.run(
        [mpiexec(), "-n", str(n), sys.executable, "-c", textwrap.dedent(code)],
        env=env, capture_output=True, text=True, timeout=timeout,
    )


def test_plain_mpiexec_with_ddp_on_stock_wheel(cli_env):
    """The issue's "done when": mpiexec -n 3 python -c "import polydist; polydist.initialize('mpi'); ..." with DDP."""
    code = """
        import sys, torch, torch.distributed as dist, polydist
        from polydist.backends.mpi4py import native_mpi_available
        assert not native_mpi_available() and dist.is_mpi_available()  # a stock wheel, torch's "mpi" provided
        polydist.initialize("mpi")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        model(torch.randn(8, 4) * (polydist.get_rank() + 1)).sum().backward()
        grads = polydist.all_gather(model.module.weight.grad.reshape(1, -1))
        same = all(torch.equal(grads[0], g) for g in grads)
        # one write per line: mpiexec merges the ranks' unbuffered output
        sys.stdout.write(f"rank {polydist.get_rank()}/{polydist.get_world_size()} {polydist.backend()} "
                         f"local {polydist.get_local_rank()} same {same}\\n")
        polydist.finalize()
    """
    lines = _rank_lines(3, code, cli_env)
    assert lines == [f"rank {r}/3 mpi4py local {r} same True" for r in range(3)]


def test_gloo_under_mpiexec_needs_no_master_address(cli_env):
    code = """
        import sys, polydist
        polydist.initialize("gloo")  # rendezvous through mpi://, no MASTER_ADDR/PORT
        sys.stdout.write(f"sum {polydist.all_reduce(polydist.get_rank() + 1)} {polydist.backend()}\\n")
    """
    env = _mpi_env(cli_env)
    assert "MASTER_ADDR" not in env
    out = _mpiexec(2, code, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("sum 3 gloo") == 2


@pytest.mark.mpi_smoke
def test_uncaught_exception_aborts_the_mpi_job(cli_env):
    code = """
        import time, polydist
        polydist.initialize("mpi")
        if polydist.get_rank() == 1:
            raise RuntimeError("rank one fails")
        polydist.barrier()  # would wait forever for rank 1 without the abort
    """
    start = time.monotonic()
    out = _mpiexec(3, code, _mpi_env(cli_env), timeout=60)
    assert out.returncode != 0
    assert "rank 1 raised an uncaught exception" in out.stderr and "rank one fails" in out.stderr
    assert time.monotonic() - start < 45


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(
        textwrap.dedent(
            """
            import sys, polydist
            polydist.initialize()
            print("rank", polydist.get_rank(), "of", polydist.get_world_size(), polydist.backend(), flush=True)
            total = polydist.all_reduce(polydist.get_rank() + 1)
            if sys.argv[1:] == ["raise"] and polydist.get_rank() == 1:
                raise KeyError("bad key on rank 1")
            if sys.argv[1:] == ["exit"] and polydist.get_rank() == 0:
                sys.exit(3)
            polydist.barrier()
            print("total", total, flush=True)
            """
        )
    )
    return str(path)


def _polydist_run(script, args, env):
    command = [sys.executable, "-m", "polydist", "run", "--backend", "mpi", "--nproc-per-node", "2", script, *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=90, cwd=ROOT)


@pytest.mark.mpi_smoke
def test_polydist_run_backend_mpi(script, cli_env):
    out = _polydist_run(script, [], _mpi_env(cli_env))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert sorted(line for line in lines if "of 2" in line) == [f"[rank{r}]: rank {r} of 2 mpi4py" for r in range(2)]
    assert sorted(line for line in lines if "total" in line) == ["[rank0]: total 3", "[rank1]: total 3"]


@pytest.mark.mpi_smoke
@pytest.mark.parametrize("how", ["raise", "exit"])
def test_polydist_run_backend_mpi_reports_the_failing_rank(script, cli_env, how):
    start = time.monotonic()
    out = _polydist_run(script, [how], _mpi_env(cli_env))
    assert out.returncode == 1
    if how == "raise":
        assert "rank 1 failed first" in out.stderr and "KeyError: 'bad key on rank 1'" in out.stderr
    else:
        assert "rank 0 failed first" in out.stderr and "SystemExit: 3" in out.stderr
    assert "total" not in out.stdout  # the surviving rank was stopped in its barrier
    assert time.monotonic() - start < 60


def test_mpi_without_mpi4py_names_the_fix(monkeypatch):
    from polydist.backends import registry
    from polydist.backends import mpi4py as backend

    monkeypatch.setattr(backend, "native_mpi_available", lambda: False)
    monkeypatch.setattr(backend, "register", lambda: False)
    with pytest.raises(ValueError, match="pip install mpi4py mpich"):
        registry.resolve("mpi")
    monkeypatch.undo()
    # polydist's own "mpi" is native MPI only where torch was built with it (the stand-in is for raw torch calls)
    assert registry.resolve("MPI") == ("mpi" if backend.native_mpi_available() else "mpi4py")



def test_the_stand_in_reads_the_timeout_torch_gave_its_caller():
    """torch's ``ProcessGroupMPI.create`` takes no timeout: the stand-in reads the one ``init_process_group`` got
    from its caller, torch 2.13's ``_new_process_group_helper`` (a local) or 2.14's built-in plugin creator
    ``_create_mpi_process_group`` (its options); without it the watchdog would wait torch's default 30 minutes."""
    from datetime import timedelta
    from types import SimpleNamespace

    from polydist.backends.mpi4py import _torch_timeout

    def _new_process_group_helper(timeout):
        return _torch_timeout(sys._getframe())

    def _create_mpi_process_group(opts):
        return _torch_timeout(sys._getframe())

    def some_other_caller(timeout):
        return _torch_timeout(sys._getframe())

    three = timedelta(seconds=3)
    assert _new_process_group_helper(three) == three
    assert _create_mpi_process_group(SimpleNamespace(timeout=three)) == three
    assert some_other_caller(three) is None

def test_mpi4py_not_imported_by_polydist_import(cli_env):
    """Registering the backend must not start MPI (importing mpi4py.MPI calls MPI_Init)."""
    code = "import sys, polydist; print('mpi4py.MPI' in sys.modules, 'mpi4py' in __import__('torch').distributed.Backend.backend_list)"
    out = subprocess.run([sys.executable, "-c", code], env=cli_env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "True"], out.stderr
