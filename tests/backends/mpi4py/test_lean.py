"""The MPI group's compiled torch-level all_reduce (``polydist.backends.mpi4py._lean``, src/.../_lean.cpp).

Built where torch's headers and a C++ compiler are found (CI's case, checked here). On a 3-rank world, each case
is reduced on the compiled path and on the Python group's (``LEAN.use(False)``): the same values, the same records
(op, dtype, shape, state, caller's line) and consecutive sequence numbers; every call that is not the common
blocking one (async, several tensors, a strided tensor, a dtype MPI lacks, the profiler on, an op undefined on the
dtype) still reaches the Python group, counted by a wrapper of ``_allreduce_python``; torch's C++ callers (the
base ``ProcessGroup.allreduce`` binding, which dispatches to the C++ override) take the same path.
"""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.distributed as dist

from conftest import _mpi_missing

# mpi_smoke: also run under Open MPI (pointer handles) and Intel MPI by test_mpi_runtimes.py
pytestmark = [pytest.mark.timeout(150), pytest.mark.mpi_smoke,
              pytest.mark.skipif(bool(_mpi_missing()), reason=_mpi_missing() or "-")]  # fmt: skip


def test_the_compiled_all_reduce_is_built_where_a_cxx_compiler_is():
    """Where a C++ compiler exists (make setup builds with torch importable), the module must be there and current:
    a missing or stale module means the build broke, and torch-level calls would take the slower Python group."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler: the Python group's all_reduce is used")
    from polydist.backends.mpi4py.process_group import LEAN, MPIProcessGroup

    assert LEAN is not None, "polydist.backends.mpi4py._lean is missing or stale: run pip install --no-build-isolation -e ."
    assert issubclass(MPIProcessGroup, LEAN.LeanGroup)
    assert MPIProcessGroup.__dict__["allreduce"] is vars(LEAN.LeanGroup)["allreduce"]


class _Counted:
    """Counts the calls that reach the Python group's allreduce (the compiled path's fallback)."""

    def __init__(self, cls):
        self.cls, self.calls, self.original = cls, 0, cls._allreduce_python

    def __enter__(self):
        def counted(group, tensors, opts=None):
            self.calls += 1
            return self.original(group, tensors, opts)

        self.cls._allreduce_python = counted
        return self

    def __exit__(self, *exc):
        self.cls._allreduce_python = self.original


_CASES = [  # (dtype, op): one per MPI datatype family and op
    (torch.float32, "SUM"), (torch.float32, "AVG"), (torch.float64, "PRODUCT"), (torch.int64, "MIN"),
    (torch.int32, "MAX"), (torch.uint8, "BAND"), (torch.int16, "BOR"), (torch.int64, "BXOR"), (torch.bool, "MAX"),
    (torch.complex64, "SUM"),
]  # fmt: skip


def _value(r: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor([r == 0, False, True])
    if dtype.is_complex:
        return torch.tensor([complex(r, 1), complex(1, r)], dtype=dtype)
    return torch.tensor([r + 1, 2 * r + 3, 7 - r], dtype=dtype)


def _both_paths():
    from polydist.backends.dispatch import behind
    from polydist.backends.mpi4py.process_group import LEAN, MPIProcessGroup
    from polydist.collectives.recorder import RECORDER, as_dict

    r, group = dist.get_rank(), dist.group.WORLD
    out = {"is_mpi_group": isinstance(behind(group), MPIProcessGroup)}  # the group, or torch's over its Backend
    for dtype, op in _CASES:
        for compiled in (False, True):  # the Python group first: it learns the plan both paths use
            LEAN.use(compiled)
            try:
                with _Counted(MPIProcessGroup) as counted:
                    t = _value(r, dtype)
                    before = RECORDER.count
                    dist.all_reduce(t, getattr(dist.ReduceOp, op))
                    record = as_dict(RECORDER.slots[(RECORDER.count - 1) % RECORDER.size])
            finally:
                LEAN.use(True)
            out[(str(dtype), op, compiled)] = {
                "value": t, "python_calls": counted.calls, "records": RECORDER.count - before,
                **{k: record[k] for k in ("collective", "seq", "op", "dtypes", "shapes", "state", "function", "async")},
            }  # fmt: skip
    return out


def test_the_compiled_path_gives_the_python_groups_values_and_records(mpi_world3):
    for r, out in enumerate(mpi_world3.run(_both_paths)):
        assert out.pop("is_mpi_group")
        for dtype, op in _CASES:
            python, compiled = out[(str(dtype), op, False)], out[(str(dtype), op, True)]
            assert python["python_calls"] == 1 and compiled["python_calls"] == 0, (dtype, op)
            values = torch.stack([_value(k, dtype) for k in range(3)])
            expected = {
                "SUM": lambda v: v.sum(0), "AVG": lambda v: v.sum(0) / 3, "PRODUCT": lambda v: v.prod(0),
                "MIN": lambda v: v.min(0).values, "MAX": lambda v: v.max(0).values,
                "BAND": lambda v: v[0] & v[1] & v[2], "BOR": lambda v: v[0] | v[1] | v[2],
                "BXOR": lambda v: v[0] ^ v[1] ^ v[2],
            }[op](values).to(dtype)  # fmt: skip
            for path in (python, compiled):
                assert torch.equal(path.pop("value"), expected), (dtype, op, path)
                assert path["records"] == 1
            assert compiled["seq"] == python["seq"] + 1
            mask = {"seq": None, "python_calls": None, "function": None}  # the Python path's caller: the counting wrapper
            assert {**compiled, **mask} == {**python, **mask}
            assert compiled["collective"] == "all_reduce" and compiled["state"] == "completed"
            assert compiled["function"] == "_both_paths"  # the caller's frame, past torch's wrapper


def _fallbacks():
    from polydist.backends.mpi4py.process_group import MPIProcessGroup

    r, group = dist.get_rank(), dist.group.WORLD
    dist.all_reduce(torch.ones(2))  # the plan of (float32, SUM) is known: what follows could take the fast path
    calls, values = {}, {}

    def run(name, fn):
        with _Counted(MPIProcessGroup) as counted:
            values[name] = fn()
        calls[name] = counted.calls

    run("fast", lambda: (lambda t: (dist.all_reduce(t), t)[1])(torch.full((3,), r + 1.0)))
    run("async", lambda: (lambda t: (dist.all_reduce(t, async_op=True).wait(), t)[1])(torch.full((3,), r + 1.0)))
    base = torch.full((6,), r + 1.0)
    run("strided", lambda: (dist.all_reduce(base[::2]), base)[1])
    pair = [torch.full((2,), r + 1.0), torch.full((2,), r + 2.0)]
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    run("two tensors", lambda: (group.allreduce(pair, opts).wait(), pair)[1])
    run("no options", lambda: (lambda t: (group.allreduce([t]).wait(), t)[1])(torch.full((2,), r + 1.0)))
    run("float16", lambda: (lambda t: (dist.all_reduce(t), t)[1])(torch.full((2,), r + 1.0, dtype=torch.float16)))

    def profiled():
        t = torch.full((2,), r + 1.0)
        with torch.autograd.profiler.profile() as prof:
            dist.all_reduce(t)
        return t, [e.name for e in prof.function_events]

    run("profiled", profiled)

    def undefined():
        try:
            dist.all_reduce(torch.ones(2), dist.ReduceOp.BAND)  # bitwise ops are undefined on floats
        except TypeError as exc:
            return str(exc)
        return None

    run("undefined op", undefined)
    # torch's C++ callers: the base class's binding dispatches to the C++ override, which takes the same path
    base_binding = torch._C._distributed_c10d.ProcessGroup.allreduce
    c = torch.full((2,), r + 1.0)
    run("C++ caller", lambda: (base_binding(group, [c], opts).wait(), c)[1])
    d = torch.full((2,), r + 1.0)
    run("C++ caller, async", lambda: (base_binding(group, [d], dist.AllreduceOptions()).wait(), d)[1])
    return calls, values


def test_every_other_call_reaches_the_python_group(mpi_world3):
    from polydist.backends import dispatch

    # under the profiler, a group with its Backend for torch's dispatcher is reached twice: by the call, then by the
    # dispatcher op's kernel (whose event the profiler records, as on gloo)
    profiled = 2 if dispatch.dispatched() else 1
    for r, (calls, values) in enumerate(mpi_world3.run(_fallbacks)):
        assert calls == {
            "fast": 0, "async": 1, "strided": 1, "two tensors": 1, "no options": 1, "float16": 1, "profiled": profiled,
            "undefined op": 1, "C++ caller": 0, "C++ caller, async": 1,
        }  # fmt: skip
        assert values["fast"].tolist() == [6.0] * 3 and values["async"].tolist() == [6.0] * 3
        assert values["strided"].tolist() == [6.0, r + 1.0] * 3
        assert [t.tolist() for t in values["two tensors"]] == [[6.0, 6.0], [9.0, 9.0]]
        assert values["no options"].tolist() == [6.0, 6.0]
        assert values["float16"].dtype == torch.float16 and values["float16"].tolist() == [6.0, 6.0]
        t, events = values["profiled"]
        assert t.tolist() == [6.0, 6.0] and any(e.endswith(":all_reduce") for e in events)  # the group's own event
        assert ("c10d::allreduce_" in events) == dispatch.dispatched()
        assert "defined on bool and integer tensors only" in values["undefined op"]
        assert values["C++ caller"].tolist() == [6.0, 6.0] and values["C++ caller, async"].tolist() == [6.0, 6.0]


def _failing_transport():
    """A group over COMM_SELF whose MPI_Allreduce is a stand-in (a ctypes function at the address the compiled path
    calls): what the watchdog sees while it runs, and what an MPI error does."""
    import ctypes

    from polydist.backends.mpi4py import _mpi
    from polydist.backends.mpi4py import process_group as pg
    from polydist.collectives.recorder import RECORDER, as_dict

    MPI = _mpi.mpi()
    group = pg.MPIProcessGroup(MPI.COMM_SELF, 0, 1, "mpi")
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    t = torch.ones(2)
    group._allreduce_python([t], opts)  # learns the plan of (float32, SUM)
    seen, code = [], [0]
    size = MPI._sizeof(MPI.COMM_SELF)  # this MPI's handles: ints (MPICH) or pointers (Open MPI)
    handle, mask = (ctypes.c_int, 0xFFFFFFFF) if size == 4 else (ctypes.c_void_p, 0xFFFFFFFFFFFFFFFF)

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, handle, handle, handle)
    def stand_in(send, buffer, count, datatype, op, comm):
        current = group._lane.current
        mine = ((comm or 0) & mask) == (pg._handle(MPI.COMM_SELF) & mask)
        seen.append((current is not None and as_dict(current)["state"], count, mine))
        return code[0]

    address = ctypes.cast(stand_in, ctypes.c_void_p).value
    pg.LEAN.configure(RECORDER, pg.WATCHDOG, pg.run_recorded, pg.profiling, MPI.Exception, address, size,
                      int(MPI.IN_PLACE))  # fmt: skip
    try:
        group.allreduce([t], opts).wait()
        ok = as_dict(RECORDER.slots[(RECORDER.count - 1) % RECORDER.size])
        code[0] = MPI.ERR_TRUNCATE
        try:
            group.allreduce([t], opts)
            error = None
        except MPI.Exception as exc:
            error = (exc.Get_error_class(), str(exc))
        failed = as_dict(RECORDER.slots[(RECORDER.count - 1) % RECORDER.size])
    finally:
        pg._lean_configure.__wrapped__()  # the real MPI_Allreduce again (the cached set-up ran once)
    return seen, ok["state"], failed["state"], failed["error"], error, MPI.ERR_TRUNCATE, group._lane.current


def test_the_watchdog_sees_the_compiled_call_and_an_mpi_error_fails_its_record(mpi_world3):
    seen, ok, failed, recorded, error, truncate, current = mpi_world3.run(_failing_transport)[0]
    assert seen == [("started", 2, True), ("started", 2, True)]  # the running record, this tensor, this communicator
    assert ok == "completed" and current is None
    assert failed == "failed" and error is not None and error[0] == truncate
    assert recorded.startswith("Exception: ") and error[1] in recorded
