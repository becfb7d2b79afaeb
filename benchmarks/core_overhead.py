"""polydist's per-call software cost, two source trees side by side (e.g. before / after a redesign).

    .venv/bin/python benchmarks/core_overhead.py --trees /work/base/src /work/wt/src --labels before after \\
        --rounds 5 --json benchmarks/results/core_overhead.json --md benchmarks/results/core_overhead.md

Plain python, no launcher. The parent never imports polydist; it runs, for each of ``--rounds`` rounds and
each tree in turn (before, after, before, after, ...), fresh child processes of this same file with
``PYTHONPATH=<tree>`` (which takes precedence over an installed polydist; the child checks that
``polydist.__file__`` lies in the tree):

* ``--child gloo``: one plain python process, ``polydist.initialize("gloo")`` -- a world-size-1 gloo group
  on a HashStore, no network, so only software cost is left. polydist ``all_reduce`` (float32 tensors of
  8 B and 1 MiB), ``broadcast``, ``all_gather``, ``reduce`` (8 B), ``barrier``, ``all_reduce(3)`` (a Python
  number), each next to the raw ``torch.distributed`` call as its floor (all_gather: ``all_gather_single``
  (``all_gather_into_tensor`` before torch 2.13) into an output it allocates, as polydist returns a new tensor);
* ``--child mpi``: ``mpiexec -n 2``, ``polydist.initialize("mpi")`` (the mpi4py backend), ``polydist.all_reduce``
  of a 2-element float32 tensor (8 B) against raw ``mpi4py`` ``COMM_WORLD.Allreduce`` on NumPy arrays of the
  same size (the floor), and raw ``torch.distributed.all_reduce`` on the same group for reference.

In a child every row is timed in ``--blocks`` blocks of back-to-back calls (``--iters`` for 8 B rows,
``--iters-large`` for 1 MiB ones) between two ``time.perf_counter_ns()`` reads, after a warm-up; the blocks
of all rows are interleaved (block b starts with row b mod k), each preceded by a raw barrier
(torch.distributed's for gloo, mpi4py's for MPI, so the harness does not time through the code under test).
Under MPI a block's time is the maximum over the ranks. A child reports the median over its blocks; the
parent reports, per row and tree, the median over rounds, and the ratio of the two medians
(second tree / first). Alternating trees round by round lets drifts in machine load hit both alike.

A child that fails (e.g. a tree caught half-edited) is shown and retried after ``--retry-wait`` seconds,
up to ``--retries`` times; the parent also fingerprints each tree's ``polydist`` sources around every
child and records whether a tree changed during the run. The load average is recorded per child.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

SMALL = 8  # bytes: a float32 tensor of 2 elements
LARGE = 1 << 20  # 1 MiB: 262144 float32

# Row keys (stable, for the JSON) -> (section, operation, bytes, floor row key or None).
ROWS: dict[str, tuple[str, str, Optional[int], Optional[str]]] = {
    "gloo/pd.all_reduce/8": ("gloo 1 rank", "polydist.all_reduce(t)", SMALL, "gloo/dist.all_reduce/8"),
    "gloo/dist.all_reduce/8": ("gloo 1 rank", "torch.distributed.all_reduce(t) (floor)", SMALL, None),
    "gloo/pd.all_reduce/1M": ("gloo 1 rank", "polydist.all_reduce(t)", LARGE, "gloo/dist.all_reduce/1M"),
    "gloo/dist.all_reduce/1M": ("gloo 1 rank", "torch.distributed.all_reduce(t) (floor)", LARGE, None),
    "gloo/pd.broadcast/8": ("gloo 1 rank", "polydist.broadcast(t, 0)", SMALL, "gloo/dist.broadcast/8"),
    "gloo/dist.broadcast/8": ("gloo 1 rank", "torch.distributed.broadcast(t, 0) (floor)", SMALL, None),
    "gloo/pd.all_gather/8": ("gloo 1 rank", "polydist.all_gather(t)", SMALL, "gloo/dist.all_gather/8"),
    "gloo/dist.all_gather/8": ("gloo 1 rank", "torch.distributed.all_gather_single(new, t) (floor)", SMALL, None),
    "gloo/pd.reduce/8": ("gloo 1 rank", "polydist.reduce(t, 0)", SMALL, "gloo/dist.reduce/8"),
    "gloo/dist.reduce/8": ("gloo 1 rank", "torch.distributed.reduce(t, 0) (floor)", SMALL, None),
    "gloo/pd.barrier": ("gloo 1 rank", "polydist.barrier()", None, "gloo/dist.barrier"),
    "gloo/dist.barrier": ("gloo 1 rank", "torch.distributed.barrier() (floor)", None, None),
    "gloo/pd.all_reduce/number": ("gloo 1 rank", "polydist.all_reduce(3)", None, "gloo/dist.all_reduce/8"),
    "mpi/pd.all_reduce/8": ("mpi 2 ranks", "polydist.all_reduce(t)", SMALL, "mpi/mpi4py.Allreduce/8"),
    "mpi/mpi4py.Allreduce/8": ("mpi 2 ranks", "mpi4py COMM_WORLD.Allreduce(a, b) (floor)", SMALL, None),
    "mpi/dist.all_reduce/8": (
        "mpi 2 ranks", "torch.distributed.all_reduce(t) (mpi4py group)", SMALL, "mpi/mpi4py.Allreduce/8"
    ),
}


# ====================================================================== child: measure one tree


def _time_rows(
    fns: dict[str, Callable[[], Any]],
    iters: dict[str, int],
    blocks: int,
    warmup: int,
    barrier: Callable[[], None],
) -> dict[str, list[float]]:
    """Per row, seconds per call in each of ``blocks`` interleaved blocks (this process only)."""
    keys = list(fns)
    for key in keys:  # warm-up: caches, allocator, lazily built state
        barrier()
        fn = fns[key]
        for _ in range(min(warmup, iters[key])):
            fn()
    out: dict[str, list[float]] = {key: [] for key in keys}
    clock = time.perf_counter_ns
    for b in range(blocks):
        for key in keys[b % len(keys) :] + keys[: b % len(keys)]:
            fn, n = fns[key], iters[key]
            gc.collect()
            barrier()
            t0 = clock()
            for _ in range(n):
                fn()
            t1 = clock()
            out[key].append((t1 - t0) / n / 1e9)
    return out


def _child_facts(tree: Optional[str]) -> dict:
    import polydist
    import torch

    where = os.path.realpath(polydist.__file__)
    if tree and not where.startswith(os.path.realpath(tree) + os.sep):
        path = os.environ.get("PYTHONPATH")
        raise SystemExit(f"polydist imported from {where}, not from the tree {tree} (PYTHONPATH={path})")
    return {
        "polydist_file": where,
        "polydist_version": getattr(polydist, "__version__", None),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "pid": os.getpid(),
    }


def child_gloo(args: argparse.Namespace) -> dict:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    import polydist as pd

    facts = _child_facts(args.tree)
    load_start = os.getloadavg()
    pd.initialize("gloo")
    if dist.get_world_size() != 1:
        raise SystemExit(f"expected a world-size-1 group, got {dist.get_world_size()}")
    small = torch.ones(SMALL // 4)
    large = torch.ones(LARGE // 4)
    ws = dist.get_world_size()
    # Check once that both calls give what they should (world size 1: SUM is the identity).
    assert torch.equal(pd.all_reduce(small), small) and torch.equal(pd.all_reduce(large), large)
    assert torch.equal(pd.all_gather(small), small.repeat(ws)) and pd.all_reduce(3) == 3

    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in 2.13

    def raw_all_gather() -> Any:
        out = torch.empty(ws * small.numel(), dtype=small.dtype)
        gather_single(out, small)
        return out

    fns: dict[str, Callable[[], Any]] = {
        "gloo/pd.all_reduce/8": lambda: pd.all_reduce(small),
        "gloo/dist.all_reduce/8": lambda: dist.all_reduce(small),
        "gloo/pd.all_reduce/1M": lambda: pd.all_reduce(large),
        "gloo/dist.all_reduce/1M": lambda: dist.all_reduce(large),
        "gloo/pd.broadcast/8": lambda: pd.broadcast(small, 0),
        "gloo/dist.broadcast/8": lambda: dist.broadcast(small, 0),
        "gloo/pd.all_gather/8": lambda: pd.all_gather(small),
        "gloo/dist.all_gather/8": raw_all_gather,
        "gloo/pd.reduce/8": lambda: pd.reduce(small, 0),
        "gloo/dist.reduce/8": lambda: dist.reduce(small, 0),
        "gloo/pd.barrier": lambda: pd.barrier(),
        "gloo/dist.barrier": lambda: dist.barrier(),
        "gloo/pd.all_reduce/number": lambda: pd.all_reduce(3),
    }
    iters = {k: (args.iters_large if ROWS[k][2] == LARGE else args.iters) for k in fns}
    blocks = _time_rows(fns, iters, args.blocks, args.warmup, barrier=dist.barrier)
    pd.finalize()
    return {
        "kind": "gloo",
        "world_size": ws,
        "facts": facts,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "iters": iters,
        "blocks_s": blocks,
        "median_s": {k: statistics.median(v) for k, v in blocks.items()},
        "min_s": {k: min(v) for k, v in blocks.items()},
    }


def child_mpi(args: argparse.Namespace) -> Optional[dict]:
    import numpy as np
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    import polydist as pd

    facts = _child_facts(args.tree)
    load_start = os.getloadavg()
    pd.initialize("mpi")
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, ws = comm.Get_rank(), comm.Get_size()
    t = torch.ones(SMALL // 4)
    t_raw = torch.ones(SMALL // 4)  # grows by a factor ws per raw in-place call: harmless, timing only
    a = np.ones(SMALL // 4, dtype=np.float32)
    b = np.empty_like(a)
    got = pd.all_reduce(t)
    comm.Allreduce(a, b, op=MPI.SUM)
    assert torch.equal(got, torch.full_like(t, ws)) and (b == ws).all(), (got, b)

    fns: dict[str, Callable[[], Any]] = {
        "mpi/pd.all_reduce/8": lambda: pd.all_reduce(t),
        "mpi/mpi4py.Allreduce/8": lambda: comm.Allreduce(a, b, op=MPI.SUM),
        "mpi/dist.all_reduce/8": lambda: dist.all_reduce(t_raw),
    }
    iters = {k: args.iters for k in fns}
    mine = _time_rows(fns, iters, args.blocks, args.warmup, barrier=comm.Barrier)
    everyone = comm.gather(mine, root=0)
    result = None
    if rank == 0:  # a block's time: the slowest rank's
        blocks = {k: [max(r[k][i] for r in everyone) for i in range(args.blocks)] for k in fns}
        result = {
            "kind": "mpi",
            "world_size": ws,
            "facts": facts,
            "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
            "loadavg_start": load_start,
            "loadavg_end": os.getloadavg(),
            "iters": iters,
            "blocks_s": blocks,
            "median_s": {k: statistics.median(v) for k, v in blocks.items()},
            "min_s": {k: min(v) for k, v in blocks.items()},
        }
    comm.Barrier()
    pd.finalize()
    return result


def run_child(args: argparse.Namespace) -> None:
    result = child_gloo(args) if args.child == "gloo" else child_mpi(args)
    if result is not None:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f)


# ====================================================================== parent: alternate the trees


def tree_fingerprint(tree: str) -> str:
    """A short hash of the tree's polydist sources (to see whether a tree changed during the run)."""
    h = hashlib.sha256()
    root = Path(tree) / "polydist"
    for path in sorted(root.rglob("*.py")):
        try:
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
        except OSError:  # removed while we read: that is a change too
            h.update(b"missing:" + str(path).encode())
    return h.hexdigest()[:12]


def git_state(tree: str) -> dict:
    def git(*cmd: str) -> Optional[str]:
        try:
            out = subprocess.run(["git", "-C", tree, *cmd], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    status = git("status", "--porcelain", "--", ".")
    return {
        "head": git("rev-parse", "--short=12", "HEAD"),
        "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
        "changed_files": None if status is None else len([s for s in status.splitlines() if s.strip()]),
    }


def _launch(cmd: list[str], env: dict, timeout: float) -> tuple[int, str]:
    """Run ``cmd`` in its own session; on timeout kill that session's process group (mpiexec and its ranks)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:  # SIGTERM first: mpiexec passes it on to its ranks (own process groups)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        return -9, out + f"\n[timed out after {timeout:.0f} s; process group {proc.pid} terminated]"


def child_command(args: argparse.Namespace, kind: str, tree: str, out: str) -> list[str]:
    me = [sys.executable, os.path.abspath(__file__), "--child", kind, "--tree", tree, "--out", out,
          "--iters", str(args.iters), "--iters-large", str(args.iters_large), "--blocks", str(args.blocks),
          "--warmup", str(args.warmup), "--threads", str(args.threads)]  # fmt: skip
    return [args.mpiexec, "-n", "2", *me] if kind == "mpi" else me


def measure_tree(args: argparse.Namespace, kind: str, label: str, tree: str, tmp: str) -> dict:
    """One child run for one tree, retried when it fails; the result JSON, or {"error": ...}."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE",
           "LOCAL_WORLD_SIZE", "MASTER_", "TORCHELASTIC_", "POLYDIST_", "PMI_", "OMPI_", "MPI_"))}  # fmt: skip
    env["PYTHONPATH"] = tree
    env["OMP_NUM_THREADS"] = str(args.threads)
    out = os.path.join(tmp, f"{label}-{kind}.json")
    last_error = ""
    for attempt in range(args.retries + 1):
        if os.path.exists(out):
            os.remove(out)
        before = tree_fingerprint(tree)
        started = time.monotonic()
        rc, text = _launch(child_command(args, kind, tree, out), env, args.child_timeout)
        wall = time.monotonic() - started
        after = tree_fingerprint(tree)
        if rc == 0 and os.path.exists(out):
            with open(out, encoding="utf-8") as f:
                result = json.load(f)
            result.update(wall_s=wall, fingerprint=before, changed_during=before != after, attempts=attempt + 1)
            return result
        last_error = "\n".join(text.strip().splitlines()[-25:])
        print(f"\n!! {label} ({tree}) {kind} child failed (rc {rc}, attempt {attempt + 1}):\n{last_error}\n",
              file=sys.stderr, flush=True)  # fmt: skip
        if attempt < args.retries:
            print(f"!! retrying in {args.retry_wait:.0f} s", file=sys.stderr, flush=True)
            time.sleep(args.retry_wait)
    return {"error": last_error, "fingerprint": tree_fingerprint(tree)}


def us(x: Optional[float]) -> str:
    if x is None:
        return "failed"
    return f"{x * 1e6:.1f}" if x * 1e6 < 1000 else f"{x * 1e6:.0f}"


def size_name(n: Optional[int]) -> str:
    return "-" if n is None else ("1 MiB" if n == LARGE else f"{n} B")


def summarize(labels: list[str], rounds: list[dict]) -> list[dict]:
    """Per row: per tree the per-round medians, their median, min and max, floor gap, ratio of medians."""
    rows = []
    for key, (section, op, nbytes, floor) in ROWS.items():
        row: dict[str, Any] = {"key": key, "section": section, "operation": op, "bytes": nbytes, "floor": floor}
        for label in labels:
            per_round = [r[label][k]["median_s"].get(key) for r in rounds for k in ("gloo", "mpi")
                         if "median_s" in r[label].get(k, {}) and key in r[label][k]["median_s"]]  # fmt: skip
            row[label] = {
                "rounds_s": per_round,
                "median_s": statistics.median(per_round) if per_round else None,
                "min_s": min(per_round) if per_round else None,
                "max_s": max(per_round) if per_round else None,
            }
        a, b = row[labels[0]]["median_s"], row[labels[1]]["median_s"]
        row["ratio"] = b / a if a and b else None
        xs, ys = row[labels[0]]["rounds_s"], row[labels[1]]["rounds_s"]
        row["ratio_per_round"] = [y / x for x, y in zip(xs, ys)] if xs and len(xs) == len(ys) else None  # None: failed
        row["ratio_per_round_median"] = statistics.median(row["ratio_per_round"]) if row["ratio_per_round"] else None
        rows.append(row)
    for r in rows:  # paired within each child (same process, same minutes), then the median over rounds
        for label in labels:
            children = [c["median_s"] for rd in rounds for c in rd[label].values() if "median_s" in c]
            gaps = [m[r["key"]] - m[r["floor"]] for m in children if r["floor"] and r["key"] in m and r["floor"] in m]
            r[label]["over_floor_rounds_s"] = gaps
            r[label]["over_floor_s"] = statistics.median(gaps) if gaps else None
    return rows


def markdown_table(labels: list[str], rows: list[dict]) -> str:
    a, b = labels
    head = ["section", "operation", "size", f"{a} µs", f"{b} µs", f"{b}/{a}",
            f"{b}/{a} per round: median (min–max)", f"{a} − floor µs", f"{b} − floor µs"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|:---|:---|---:|" + "---:|" * (len(head) - 3)]
    for r in rows:
        per = r["ratio_per_round"]
        spread = f"{statistics.median(per):.2f} ({min(per):.2f}–{max(per):.2f})" if per else "-"
        gap = ["-" if r[label]["over_floor_s"] is None else us(r[label]["over_floor_s"]) for label in labels]
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "-"
        cells = [r["section"], f"`{r['operation']}`", size_name(r["bytes"]), us(r[a]["median_s"]), us(r[b]["median_s"]),
                 ratio, spread, *gap]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_parent(args: argparse.Namespace) -> int:
    trees = [os.path.abspath(t) for t in args.trees]
    labels = args.labels
    if len(trees) != 2 or len(labels) != 2:
        raise SystemExit("give exactly two --trees and two --labels")
    if not shutil.which(args.mpiexec):
        raise SystemExit(f"mpiexec not found: {args.mpiexec}")
    command = f"cd {shlex.quote(os.getcwd())} && " + shlex.join([sys.executable, *sys.argv])
    meta: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "cwd": os.getcwd(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "mpiexec": args.mpiexec,
        "trees": {label: {"path": tree, "git": git_state(tree), "fingerprint_start": tree_fingerprint(tree)}
                  for label, tree in zip(labels, trees)},  # fmt: skip
        "settings": {"rounds": args.rounds, "blocks": args.blocks, "iters_small": args.iters,
                     "iters_1MiB": args.iters_large, "warmup": args.warmup, "threads_per_process": args.threads,
                     "mpi_ranks": 2},  # fmt: skip
        "loadavg_start": os.getloadavg(),
    }
    started = time.monotonic()
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="core_overhead-") as tmp:
        for r in range(args.rounds):
            this: dict[str, dict] = {}
            for label, tree in zip(labels, trees):  # before, after, before, after, ...
                this[label] = {}
                for kind in args.parts:
                    res = measure_tree(args, kind, label, tree, tmp)
                    this[label][kind] = res
                    state = "FAILED" if "error" in res else f"{res['wall_s']:.1f} s, load {res['loadavg_start'][0]:.2f}"
                    print(f"round {r + 1}/{args.rounds} {label:>8} {kind:4}: {state}", file=sys.stderr, flush=True)
            rounds.append(this)
    meta["loadavg_end"] = os.getloadavg()
    meta["wall_s"] = round(time.monotonic() - started, 1)
    children = [c for rd in rounds for t in rd.values() for c in t.values() if "facts" in c]
    meta["torch"] = children[0]["facts"]["torch"] if children else None
    for label, tree in zip(labels, trees):
        prints = [rd[label][k]["fingerprint"] for rd in rounds for k in rd[label]]
        changed = any(rd[label][k].get("changed_during") for rd in rounds for k in rd[label])
        meta["trees"][label]["fingerprint_end"] = tree_fingerprint(tree)
        meta["trees"][label]["source_versions_seen"] = len(set(prints))
        meta["trees"][label]["changed_during_a_child"] = changed
        meta["trees"][label]["failed_children"] = sum("error" in rd[label][k] for rd in rounds for k in rd[label])
        meta["trees"][label]["retried_children"] = sum(rd[label][k].get("attempts", 1) > 1 for rd in rounds
                                                       for k in rd[label])  # fmt: skip
        meta["trees"][label]["polydist_files"] = sorted({rd[label][k]["facts"]["polydist_file"] for rd in rounds
                                                         for k in rd[label] if "facts" in rd[label][k]})  # fmt: skip
    loads = [c[f"loadavg_{w}"][0] for c in children for w in ("start", "end")]
    meta["loadavg_1min_children"] = (
        {"min": min(loads), "median": statistics.median(loads), "max": max(loads)} if loads else None
    )
    rows = [r for r in summarize(labels, rounds) if r["key"].split("/")[0] in args.parts]

    a, b = labels
    la = meta["loadavg_1min_children"]
    notes = [
        f"Command: `{command}`",
        "",
        f"# polydist per-call cost: {a} vs {b}",
        "",
        f"{meta['date']}, host `{meta['hostname']}`, {meta['cpu_count']} CPUs, torch `{meta['torch']}`, "
        f"python {meta['python']}; {args.rounds} rounds ({a}, {b}, {a}, {b}, ...), each child a fresh process "
        f"(MPI: `mpiexec -n 2`) with {args.threads} torch thread(s); per row {args.blocks} interleaved blocks of "
        f"{args.iters} calls (1 MiB: {args.iters_large}), block median per child, median over rounds shown. "
        f"Run took {meta['wall_s']:.0f} s.",
        "",
        f"Load average (1 min) at start/end of the run: {meta['loadavg_start'][0]:.2f} / {meta['loadavg_end'][0]:.2f}; "
        + (f"seen by the children: min {la['min']:.2f}, median {la['median']:.2f}, max {la['max']:.2f}" if la else "")
        + f" on {meta['cpu_count']} CPUs (other jobs share the machine: absolute times are inflated and noisy; "
        f"the per-round ratio range shows how much).",
        "",
    ]
    for label in labels:
        t = meta["trees"][label]
        g = t["git"]
        notes.append(
            f"- {label}: `{t['path']}` (HEAD `{g['head']}`, {g['changed_files']} uncommitted changes under it; "
            f"source fingerprint {t['fingerprint_start']} → {t['fingerprint_end']}, {t['source_versions_seen']} "
            f"version(s) measured, changed during a child: {t['changed_during_a_child']}, "
            f"children retried after a failure: {t['retried_children']}, failed for good: {t['failed_children']})"
        )
    notes += [
        "",
        f"`{b}/{a}`: ratio of the two medians (above 1: {b} slower); `per round`: the ratio within each round "
        f"(the two trees measured minutes apart at most), its median and range, more robust when the load shifts "
        f"between rounds. `− floor`: the row's median minus the median of "
        "its raw reference (`torch.distributed` for gloo, mpi4py `Allreduce` for MPI; "
        "`all_reduce(3)` against the 8 B tensor `torch.distributed.all_reduce`) in the same child, median over rounds: "
        "polydist's own cost per call (a negative value is noise).",
        "",
    ]
    table = markdown_table(labels, rows)
    failures = [
        f"- {label} {kind}, round {i + 1}: " + ((rd[label][kind]["error"] or "?").splitlines() or ["?"])[-1]
        for i, rd in enumerate(rounds) for label in labels for kind in rd[label] if "error" in rd[label][kind]
    ]  # fmt: skip
    md = "\n".join(notes) + "\n" + table + "\n"
    md += ("\nFailed children:\n" + "\n".join(failures) + "\n") if failures else ""
    print(md, flush=True)
    doc = {"meta": meta, "rows": rows, "rounds": rounds}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(json.dumps(doc, indent=1) + "\n")
    if args.md:
        os.makedirs(os.path.dirname(os.path.abspath(args.md)), exist_ok=True)
        with open(args.md, "w", encoding="utf-8") as f:
            f.write(md)
    if args.json or args.md:
        print("wrote " + " and ".join(p for p in (args.json, args.md) if p), file=sys.stderr, flush=True)
    return 1 if failures else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", nargs=2, metavar="SRC", default=None, help="two source folders (each holding polydist/)")
    p.add_argument("--labels", nargs=2, default=["before", "after"], help="names of the two trees (before after)")
    p.add_argument("--rounds", type=int, default=5, help="rounds; each runs every tree once, in turn (default 5)")
    p.add_argument("--blocks", type=int, default=7, help="timed blocks per row in a child, median kept (default 7)")
    p.add_argument("--iters", type=int, default=200, help="calls per block for 8 B / value rows (default 200)")
    p.add_argument("--iters-large", type=int, default=50, help="calls per block for 1 MiB rows (default 50)")
    p.add_argument("--warmup", type=int, default=50, help="untimed calls per row before timing (default 50)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process (default 1)")
    p.add_argument("--parts", nargs="+", choices=["gloo", "mpi"], default=["gloo", "mpi"], help="what to measure")
    beside = Path(sys.executable).parent / "mpiexec"  # the mpich wheel's, in the venv
    p.add_argument("--mpiexec", default=str(beside) if beside.exists() else "mpiexec", help="default: the venv's")
    p.add_argument("--retries", type=int, default=3, help="retries of a failed child (default 3)")
    p.add_argument("--retry-wait", type=float, default=60.0, help="seconds before retrying a failed child (default 60)")
    p.add_argument("--child-timeout", type=float, default=180.0, help="seconds before a child is killed (default 180)")
    p.add_argument("--json", metavar="PATH", help="write all results here")
    p.add_argument("--md", metavar="PATH", help="write the markdown report here (starts with the command)")
    p.add_argument("--child", choices=["gloo", "mpi"], help=argparse.SUPPRESS)
    p.add_argument("--tree", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        run_child(args)
        return 0
    if not args.trees:
        p.error("--trees SRC SRC is required")
    return run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
