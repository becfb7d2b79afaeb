"""What a torch.distributed call costs on polydist's ``mpi`` group, with recording and the watchdog on and off.

    .venv/bin/python benchmarks/torch_path_cost.py --json benchmarks/results/torch_path_cost.json \\
        --md benchmarks/results/torch_path_cost.md

One 2-rank ``mpiexec`` job (``--ranks 1``: one rank, no peer) (the parent starts it; ``--child`` is a rank). Rows, each timed in ``--blocks``
blocks of back-to-back calls between two ``time.perf_counter_ns()`` reads, the blocks of all rows
interleaved (each block in an order of its own, drawn from the block's number) and each preceded by a raw ``mpi4py`` barrier; a block's time
is the maximum over the ranks; a row reports the median over its blocks, per call:

* 8 B all-gather: raw ``mpi4py`` ``COMM_WORLD.Allgather`` and ``torch.distributed.all_gather_single`` (the
  general path every operation but the lean all_reduce takes: checks, record, lane, work handle);
* 8 B (a 2-element float32 tensor): raw ``mpi4py`` ``COMM_WORLD.Allreduce`` on NumPy arrays (the floor),
  ``polydist.all_reduce``, ``torch.distributed.all_reduce`` on the ``mpi`` group with the flight recorder
  and the watchdog on (the default) and off (``POLYDIST_TRACE=0``'s switch and the watchdog's), on a group of
  the same ranks made with ``POLYDIST_DISPATCH=0`` (no Backend for torch's dispatcher, as before issue 52),
  and on with
  the record made by the Python functions instead of the compiled ones (``polydist.collectives._record``,
  where it was built);
* 16 MiB (float32): raw ``mpi4py`` and ``torch.distributed.all_reduce`` on and off;
* a DDP training step (a 64-256-10 MLP, a batch of 32: forward, backward with DDP's gradient all-reduce
  on the ``mpi`` group, SGD step), recording and watchdog on and off;
* then, in the parent alone (no MPI, no communication), the Python group's per-call pieces: the work
  handle (``LaneWork``), a ``torch.futures.Future``, the profiler check, the record (``_begin``), the
  lane's inline hand-off, reading torch's options object, the record and the lean path's recorded call
  (``run_recorded``) compiled and in Python, a whole ``allreduce(...).wait()`` of a group whose transport does nothing (also called after 2,000 lines of
  a function: a record reads the caller's line only when it is dumped), and
  ``torch.distributed.all_reduce`` on torch's ``fake`` backend (torch's own dispatch to a C++ backend,
  the floor of any torch-level call), and the ``mpi`` group over ``COMM_SELF`` (one process: MPI without
  a peer, so no other rank's scheduling) next to raw ``COMM_SELF.Allreduce``: the group's own cost per
  call, steadier on a loaded machine than the 2-rank rows; also through torch's dispatcher, the path a call
  takes while a tool (``CommDebugMode``, the profiler) watches it.

The ratio column divides by the raw mpi4py row of the same size. The machine's load average is recorded:
figures from a loaded machine are higher and noisier than from a quiet one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable

SMALL, LARGE = 8, 16 << 20


def _time_rows(fns: dict, iters: dict, blocks: int, warmup: int, barrier: Callable[[], None]) -> dict:
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names, clock, out = list(fns), time.perf_counter_ns, {name: [] for name in fns}
    for b in range(blocks):
        for k in range(len(names)):
            name = names[(b + k) % len(names)]
            fn, n = fns[name], iters[name]
            barrier()
            start = clock()
            for _ in range(n):
                fn()
            out[name].append((clock() - start) / n / 1000)  # µs per call
    return out


def _recording() -> tuple:
    """Where the groups call the record's two functions, and the Python versions of both (the "/py/" rows and
    pieces put those in place of the compiled ones, polydist.collectives._record)."""
    from polydist.backends import lane, python_group
    from polydist.backends.mpi4py import process_group
    from polydist.collectives import recorder

    return ((python_group, "record_op"), (process_group, "run_recorded")), (recorder._record_op, lane._run_recorded)


def child(args: argparse.Namespace) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    import polydist as pd
    from polydist.backends.watchdog import WATCHDOG
    from polydist.collectives.recorder import COMPILED, RECORDER

    pd.initialize("mpi")
    where, python = _recording()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    # the same ranks' group made as before issue 52 (POLYDIST_DISPATCH=0): no Backend for torch's dispatcher, as
    # where polydist.backends._dispatch is not built
    os.environ["POLYDIST_DISPATCH"] = "0"
    beside = dist.new_group(list(range(comm.Get_size())))
    del os.environ["POLYDIST_DISPATCH"]
    rank = comm.Get_rank()
    small, large = torch.ones(2), torch.ones(LARGE // 4)
    gathered, gathered_np = torch.empty(2 * comm.Get_size()), np.empty(2 * comm.Get_size(), dtype=np.float32)
    a, b = np.ones(2, dtype=np.float32), np.empty(2, dtype=np.float32)
    la, lb = np.ones(LARGE // 4, dtype=np.float32), np.empty(LARGE // 4, dtype=np.float32)

    def switch(on: bool) -> None:
        RECORDER.on = WATCHDOG.enabled = on

    compiled = [vars(module)[name] for module, name in where]

    from polydist.backends.mpi4py.process_group import LEAN

    def in_python(name: str) -> None:
        """The "/group-py/" rows: the Python group's all_reduce (the compiled one, LEAN, told to pass every call to
        it); the "/py/" rows: that, and the record made by the Python functions."""
        if LEAN is not None:
            LEAN.use("/py/" not in name and "/group-py/" not in name)
        for (module, attr), fallback, fast in zip(where, python, compiled):
            setattr(module, attr, fallback if "/py/" in name else fast)

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    xb, yb = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def ddp_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        optimizer.step()

    fns = {
        "mpi4py/8": lambda: comm.Allreduce(a, b),
        "polydist/8": lambda: pd.all_reduce(small),
        "dist/on/8": lambda: dist.all_reduce(small),
        "dist/off/8": lambda: dist.all_reduce(small),
        "dist/beside/8": lambda: dist.all_reduce(small, group=beside),
        **({"dist/group-py/8": lambda: dist.all_reduce(small)} if LEAN is not None else {}),
        **({"dist/py/8": lambda: dist.all_reduce(small)} if COMPILED is not None or LEAN is not None else {}),
        "mpi4py-ag/8": lambda: comm.Allgather(a, gathered_np),
        "dist-ag/on/8": lambda: dist.all_gather_single(gathered, small),
        "mpi4py/16M": lambda: comm.Allreduce(la, lb),
        "dist/on/16M": lambda: dist.all_reduce(large),
        "dist/off/16M": lambda: dist.all_reduce(large),
        "ddp/on/step": ddp_step,
        "ddp/off/step": ddp_step,
    }
    per_size = {"8": args.iters, "16M": args.iters_large, "step": args.iters_ddp}
    iters = {k: per_size[k.rsplit("/", 1)[1]] for k in fns}
    results: dict = {name: [] for name in fns}
    names = list(fns)
    for name in names:
        for _ in range(args.warmup):
            fns[name]()
    clock = time.perf_counter_ns
    for blk in range(args.blocks):
        # each block in its own order, the same on every rank: a row run right after a 16 MiB row finds its
        # caches cold (40 us for a 1-rank all_reduce), and a fixed rotation puts the same row there every time
        for name in random.Random(blk).sample(names, len(names)):
            fn, n = fns[name], iters[name]
            switch("/off/" not in name)  # "off" rows: for their own blocks, on every rank alike
            in_python(name)
            comm.Barrier()
            start = clock()
            for _ in range(n):
                fn()
            took = (clock() - start) / n / 1000
            switch(True)
            in_python("")
            results[name].append(max(comm.allgather(took)))
    rows = {name: statistics.median(v) for name, v in results.items()}

    if rank == 0:
        print(json.dumps({"rows": rows, "blocks": results}), flush=True)
    pd.finalize()


def pieces(args: argparse.Namespace) -> dict:
    """The Python group's per-call pieces, in this process (no MPI, no communication): µs each."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from polydist.backends import lane
    from polydist.backends.python_group import PythonProcessGroup
    from polydist.backends.work import LaneWork, profiling
    from polydist.collectives import recorder

    class Empty(PythonProcessGroup):
        """A group whose transport does nothing: what is left is the group's own work per call."""

        def _reduce_plan(self, t: torch.Tensor, op: Any) -> Any:
            return op

        def _reduce_now(self, c: torch.Tensor, plan: Any) -> None:
            pass

    group, t = Empty(0, 2, "empty"), torch.ones(2)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    nothing = lambda: None  # noqa: E731
    record, _ = group._begin("all_reduce", [t], None, None, False)
    ring, tag = recorder.Recorder(True, 2000), group._tag
    implementations: tuple = ({"Python": recorder._record_op}, {"Python": lane._run_recorded})
    if recorder.COMPILED is not None:
        implementations[0]["compiled"], implementations[1]["compiled"] = (recorder.COMPILED.record_op,
                                                                          recorder.COMPILED.run_recorded)
    import numpy as np

    from polydist.backends import dispatch
    from polydist.backends.mpi4py import _mpi
    from polydist.backends.mpi4py.process_group import LEAN, MPIProcessGroup

    MPI = _mpi.mpi()  # starts MPI and fills its tables of datatypes

    alone = MPIProcessGroup(MPI.COMM_SELF, 0, 1, "mpi")  # the mpi group over one process: MPI without a peer
    alone.allreduce([t], dist.AllreduceOptions()).wait()  # the group learns the plan of (float32, SUM)
    a, b = np.ones(2, dtype=np.float32), np.empty(2, dtype=np.float32)
    alone.for_torch()  # its Backend for torch's dispatcher registered, as a creator gives it to torch
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)  # torch's C++ dispatch, no transport
    # the same call made after 2,000 lines of a function (a long training script's main()), which are not run
    body = "".join(f"        print({i})\n" for i in range(2000))
    scope: dict = {}
    exec(compile(f"def long_main(g, t, opts):\n    if t is None:\n{body}    return g.allreduce([t], opts).wait()\n",
                 "<long main>", "exec"), scope)  # noqa: S102 - this file's own source
    long_main = scope["long_main"]
    fns = {
        "work handle: LaneWork(result)": lambda: LaneWork(None, backend="mpi"),
        "future: torch.futures.Future()": torch.futures.Future,
        "profiler check: profiling()": profiling,
        "record: _begin (number, caller's frame, record)": lambda: group._begin("all_reduce", [t], None, None, False),
        "lane hand-off, inline: lane.inline(nothing, record)": lambda: group._lane.inline(nothing, record, False),
        "torch's options read: opts.asyncOp, opts.reduceOp.op.value": lambda: (opts.asyncOp, opts.reduceOp.op.value),
        **{f"record: record_op, {kind}": (lambda f=f: f(ring, tag, "all_reduce", 1, "SUM", None, t, False, True))
           for kind, f in implementations[0].items()},
        **{f"the lean path's recorded call: run_recorded(..., nothing), {kind}":
           (lambda f=f: f(ring, group._lane, tag, "all_reduce", 1, "SUM", t, True, nothing))
           for kind, f in implementations[1].items()},
        "lane.run(nothing) inline, with its work handle": lambda: group._lane.run(nothing, None, True, "x", ()),
        "AllreduceOptions() (torch's wrapper makes one)": dist.AllreduceOptions,
        "group.allreduce([t], opts).wait(), empty transport": lambda: group.allreduce([t], opts).wait(),
        "the same, called after 2,000 lines of a function": lambda: long_main(group, t, opts),
        "torch.distributed.all_reduce on torch's fake backend (C++ dispatch floor)": lambda: dist.all_reduce(t),
        "raw mpi4py COMM_SELF.Allreduce(a, b), 8 B": lambda: MPI.COMM_SELF.Allreduce(a, b),
        "mpi group over COMM_SELF: allreduce([t], opts).wait(), 8 B": lambda: alone.allreduce([t], opts).wait(),
        **({"the same, the Python group's all_reduce": lambda: alone._allreduce_python([t], opts).wait()}
           if LEAN is not None else {}),
        "mpi group over COMM_SELF: torch.distributed.all_reduce, 8 B": lambda: dist.all_reduce(t, group=alone),
        **({"mpi group over COMM_SELF through torch's dispatcher (a watched call's path), allreduce, 8 B":
            lambda: dispatch.DISPATCH.allreduce(alone, [t], opts).wait()}
           if alone._dispatch_backend is not None else {}),
    }
    got = _time_rows(fns, {k: args.iters for k in fns}, args.blocks, args.warmup, lambda: None)
    dist.destroy_process_group()
    return {k: statistics.median(v) for k, v in got.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--blocks", type=int, default=21)
    parser.add_argument("--iters", type=int, default=2000, help="calls per block, 8 B rows and pieces")
    parser.add_argument("--iters-large", type=int, default=5, help="calls per block, 16 MiB rows")
    parser.add_argument("--iters-ddp", type=int, default=50, help="steps per block, DDP rows")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--ranks", type=int, default=2, help="1: no peer, so no second process on the other core")
    parser.add_argument("--json")
    parser.add_argument("--md")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    command = [mpiexec, "-n", str(args.ranks), sys.executable, __file__, "--child", "--blocks", str(args.blocks), "--iters",
               str(args.iters), "--iters-large", str(args.iters_large), "--iters-ddp", str(args.iters_ddp),
               "--warmup", str(args.warmup)]  # fmt: skip
    load = os.getloadavg()
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"the job failed:\n{done.stdout}\n{done.stderr}")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    data["pieces"] = pieces(args)
    import torch
    data.update(
        # the interpreter names the venv, so the torch, a result was made with (.venv: 2.13.0; make test-torch's)
        command=" ".join([os.path.relpath(sys.executable), "benchmarks/torch_path_cost.py", *sys.argv[1:]]),
        torch=torch.__version__, when=datetime.now(timezone.utc).isoformat(timespec="seconds"), host=platform.node(),
        cpus=os.cpu_count(), load_before=load, load_after=os.getloadavg(),
    )  # fmt: skip
    rows = data["rows"]
    lines = [
        f"Command: `{data['command']}`; {args.ranks} rank(s) under mpiexec; median over {args.blocks} interleaved blocks "
        "(a block: the slower rank's time).",
        "",
        f"# torch.distributed on polydist's mpi group: cost per call (torch {data['torch']}, {data['when']}, {data['cpus']} CPUs, "
        f"load average {data['load_before'][0]:.1f} before, {data['load_after'][0]:.1f} after)",
        "",
        "| call | size | µs per call | x raw mpi4py |",
        "|---|---|---|---|",
    ]
    labels = {
        "mpi4py": "raw mpi4py COMM_WORLD.Allreduce (floor)", "polydist": "polydist.all_reduce",
        "mpi4py-ag": "raw mpi4py COMM_WORLD.Allgather (floor)",
        "dist-ag/on": "torch.distributed.all_gather_single (the general path), recording + watchdog on",
        "dist/on": "torch.distributed.all_reduce, recording + watchdog on",
        "dist/beside": "torch.distributed.all_reduce, recording + watchdog on, a group without its Backend for "
                       "torch's dispatcher (POLYDIST_DISPATCH=0, or _dispatch not built)",
        "dist/off": "torch.distributed.all_reduce, recording + watchdog off",
        "dist/group-py": "torch.distributed.all_reduce, recording + watchdog on, the Python group's all_reduce",
        "dist/py": "torch.distributed.all_reduce, recording + watchdog on, nothing compiled (Python group, Python record)",
        "ddp/on": "DDP training step, recording + watchdog on", "ddp/off": "DDP training step, recording + watchdog off",
    }  # fmt: skip
    sizes = {"8": "8 B", "16M": "16 MiB", "step": "MLP, 19 k parameters"}
    for key, value in rows.items():
        kind, size = key.rsplit("/", 1)
        floor = rows.get(f"mpi4py-ag/{size}" if kind.startswith(("mpi4py-ag", "dist-ag")) else f"mpi4py/{size}")
        ratio = f"{value / floor:.2f}" if floor else "-"
        lines.append(f"| {labels[kind]} | {sizes[size]} | {value:.2f} | {ratio} |")
    lines += ["", "Per-call pieces of the Python group (one process, no MPI, no communication; run after the job):", "",
              "| piece | µs |", "|---|---|"]  # fmt: skip
    lines += [f"| {k} | {v:.3f} |" for k, v in data["pieces"].items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
