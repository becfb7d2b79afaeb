"""Fault injection: the main job under ``polydist run --max-restarts 3``, ranks failed at random moments.

    .venv/bin/python benchmarks/fault.py --backends gloo,mpi --runs 5 --faults 3 --seed 0 \\
        --json benchmarks/results/fault_gloo_mpi.json

Plain python (not under a launcher). Per backend it first runs the main job,
examples/train_digits.py, once uninterrupted (the reference), then ``--runs``
times as::

    polydist run --max-restarts 3 --nproc-per-node 2 [--backend mpi] benchmarks/_faulty_train.py \\
        --epochs 60 --hidden 4096 --checkpoint PATH

with ``--faults`` K faults (K ≤ --max-restarts), one in each of the job's
first K runs of its workers (restart counts 0 .. K-1). Each fault has a
random rank, a random kind and a random moment, drawn from
``random.Random("SEED:BACKEND:RUN")``, so a run is the same whatever else is
run beside it:

* kinds: ``SIGKILL`` and ``SIGTERM``, sent by this script to the worker's pid
  (found in /proc: a descendant of the launcher whose environment holds the
  rank and the restart count); ``exception`` (a ``RuntimeError``) and
  ``exit`` (``sys.exit(3)``), raised inside the training loop by the
  wrapper benchmarks/_faulty_train.py, which runs the example unchanged with
  its epoch function wrapped, the plan in ``$FAULT_PLAN``;
* moment: a number of epochs into that run of the workers (uniform below
  ``--epochs / (K + 1)``, so that every fault lands before training ends),
  plus a uniform fraction of the next epoch: the step ``fraction * steps``
  for the in-process kinds, ``fraction * epoch time`` (of the reference)
  after the previous checkpoint line for the signals.

The default settings (60 epochs of a 4096-wide hidden layer: ~0.25 s an
epoch on a 2-vCPU VM, against ~0.05 s at the example's defaults) make a
moment "mid-training" one among many steps of many epochs; the reference
runs with the same settings.

This script reads the job's stdout and stderr line by line, each line
timestamped on arrival, and reports per fault:

* ``at``: how far training had got when the fault hit, in epochs: those in
  the checkpoint on disk, plus the fraction of the epoch in progress (exact
  for the in-process kinds; for the signals, the time since that save over
  the run's epoch time, capped below 1);
* ``resumed``: the epoch the next run of the workers resumed from
  ("resuming from PATH after epoch E"); ``lost`` = ``at`` − ``resumed``
  (below 1 when no saved epoch was lost);
* ``detect``: fault → the launcher's announcement "polydist: restart K of N:
  rank R ... failed first, with exit code C" on stderr, whose rank and exit
  code are checked against the fault (``blamed``; under mpiexec the code is
  mpiexec's: a killed rank's signal number);
* ``recover``: fault → the "resuming from" line (training again);
  ``ckpt``: fault → the first checkpoint saved after the restart.

Per run: the exit code, the final test accuracy and whether the saved model
is bit-for-bit that of the reference (same world size, data order a
function of seed + epoch). A summary table per backend, and with --json all
of it, including every fault's plan and the announcements seen.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Iterator, Optional

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_digits.py")
WRAPPER = os.path.join(ROOT, "benchmarks", "_faulty_train.py")
PLAN_VARIABLE = "FAULT_PLAN"  # read by _faulty_train.py
KINDS = ("SIGKILL", "SIGTERM", "exception", "exit")
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM}
# The exit code the launcher should announce for each kind: the rank's own (a signal: minus its number), except
# under mpiexec, whose exit code polydist announces for a rank killed by a signal: the signal's number.
EXIT_CODES = {"exception": 1, "exit": 3}


def expected_code(kind: str, backend: str) -> int:
    if kind in SIGNALS:
        return int(SIGNALS[kind]) if backend == "mpi" else -int(SIGNALS[kind])
    return EXIT_CODES[kind]

# The job's lines (the launcher prefixes the ranks' output with "[rankN]: "; tqdm's \r splits lines).
GENERATION = re.compile(r"\[rank0\]: world size (\d+), backend ([^,]+),.*?(?:; restart (\d+))?\s*$")
RESUMED = re.compile(r"resuming from .* after epoch (\d+) \(saved on (\d+) ranks\)|no checkpoint at .* yet")
CHECKPOINT = re.compile(r"checkpoint: epoch (\d+) saved to ")
FAULT_LINE = re.compile(r"fault: (\w+) in run (\d+), epoch offset (\d+), step (\d+) of (\d+)")
ANNOUNCED = re.compile(r"^polydist: restart (\d+) of (\d+): rank (-?\d+)(.*)$")
RESTARTING = re.compile(r"^polydist: restarting every worker \(restart (\d+) of (\d+), (\d+) left\)")
ACCURACY = re.compile(r"final test accuracy: (\d\.\d+)")
WALL = re.compile(r"wall time: ([\d.]+) s")
EXIT_CODE = re.compile(r"exit code (-?\d+)")


@dataclass
class Fault:
    """One planned fault: in the workers' run ``run`` (their restart count), rank ``rank`` fails by ``kind``
    after ``epoch`` epochs of that run and ``fraction`` of the next."""

    run: int
    rank: int
    kind: str
    epoch: int
    fraction: float


@dataclass
class Line:
    t: float  # seconds since the job started, on arrival here
    stream: str  # "out" or "err"
    text: str


@dataclass
class Hit:
    """A fault as it happened: when (seconds since the job started) and where in the job's output."""

    fault: Fault
    t: float
    index: int  # lines seen by then
    saved: int  # epochs in the checkpoint on disk
    fraction: float  # of the epoch in progress: exact in-process (step / steps), from the clock for the signals
    pid: Optional[int] = None  # signals: the worker signalled


@dataclass
class RunResult:
    backend: str
    run: int
    plan: list
    exit_code: Optional[int]
    wall_s: float
    accuracy: Optional[float]
    same_model: Optional[bool]  # the saved model equals the reference's bit for bit
    faults: list = field(default_factory=list)
    announcements: list = field(default_factory=list)
    error: str = ""


# ------------------------------------------------------------------ command line and plans


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--backends", default="gloo,mpi", help="comma-separated: gloo, mpi (default gloo,mpi)")
    p.add_argument("--runs", type=int, default=5, help="faulted runs of the job per backend")
    p.add_argument("--faults", type=int, default=3, help="faults per run, one per run of the workers (≤ --max-restarts)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"the kinds drawn from (default {','.join(KINDS)})")
    p.add_argument("--max-restarts", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2, help="ranks (--nproc-per-node)")
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ddp", action="store_true", help="train the example with --ddp")
    p.add_argument("--seed", type=int, default=0, help="of the fault plans (the training seed stays the example's)")
    p.add_argument("--job-timeout", type=float, default=600, help="seconds before a job is declared hung and killed")
    p.add_argument("--json", metavar="PATH", help="write the plans, per-fault figures and summary here")
    args = p.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    args.kinds = [k for k in args.kinds.split(",") if k]
    if not set(args.kinds) <= set(KINDS):
        p.error(f"--kinds: unknown {sorted(set(args.kinds) - set(KINDS))}; known {', '.join(KINDS)}")
    if not 0 <= args.faults <= args.max_restarts:
        p.error("--faults must be between 0 and --max-restarts")
    return args


def plan_faults(args: argparse.Namespace, backend: str, run: int) -> list[Fault]:
    """The faults of one run: one in each of the workers' first ``--faults`` runs, drawn from a seeded RNG."""
    rng = random.Random(f"{args.seed}:{backend}:{run}")
    window = max(1, args.epochs // (args.faults + 1))  # K windows of epochs leave the last one to finish in
    return [
        Fault(run=g, rank=rng.randrange(args.nproc), kind=rng.choice(args.kinds),
              epoch=rng.randrange(window), fraction=round(rng.random(), 3))
        for g in range(args.faults)
    ]  # fmt: skip


def job_command(args: argparse.Namespace, backend: str, script: str, checkpoint: str) -> list[str]:
    cmd = [sys.executable, "-m", "polydist", "run", "--max-restarts", str(args.max_restarts),
           "--nproc-per-node", str(args.nproc)]  # fmt: skip
    if backend != "gloo":
        cmd += ["--backend", backend]
    cmd += [script, "--epochs", str(args.epochs), "--hidden", str(args.hidden), "--checkpoint", checkpoint]
    return cmd + (["--ddp"] if args.ddp else [])


def job_env(plan: list[Fault]) -> dict:
    """The environment of a job: this one without launcher variables, with the venv first and the plan."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env[PLAN_VARIABLE] = json.dumps([asdict(f) for f in plan])
    return env


# ------------------------------------------------------------------ a running job and its processes


class Job:
    """``polydist run`` as a child process; two threads read its stdout and stderr line by line, timestamped."""

    def __init__(self, cmd: list[str], env: dict, timeout: float) -> None:
        self.t0 = time.monotonic()
        self.deadline = self.t0 + timeout
        self.lines: list[Line] = []
        self.changed = threading.Condition()
        self.open_streams = 2
        self.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, errors="replace")  # fmt: skip
        self.readers = [threading.Thread(target=self._read, args=(s, n), daemon=True)
                        for s, n in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]  # fmt: skip
        for r in self.readers:
            r.start()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _read(self, stream, name: str) -> None:
        for text in stream:  # universal newlines: tqdm's "\r" ends a line too
            with self.changed:
                self.lines.append(Line(self.now(), name, text.rstrip("\n")))
                self.changed.notify_all()
        with self.changed:
            self.open_streams -= 1
            self.changed.notify_all()

    def wait_for(self, pattern: re.Pattern, start: int = 0, nth: int = 1, stream: Optional[str] = "out") -> Optional[int]:
        """Index of the ``nth`` line from ``start`` on that matches ``pattern`` in ``stream`` (None: either);
        None once the output ended (or the job's deadline passed) without it."""
        with self.changed:
            seen, i = 0, start
            while True:
                for i in range(i, len(self.lines)):
                    line = self.lines[i]
                    if stream in (None, line.stream) and pattern.search(line.text):
                        seen += 1
                        if seen == nth:
                            return i
                i = len(self.lines)
                if not self.open_streams or time.monotonic() > self.deadline:
                    return None
                self.changed.wait(timeout=1.0)

    def finish(self) -> Optional[int]:
        """Wait for the job to end (killing it and its workers at the deadline); its exit code, None if killed."""
        try:
            code = self.proc.wait(timeout=max(1.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for pid in reversed(descendants(self.proc.pid)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait()
            code = None
        for r in self.readers:
            r.join(timeout=10)
        return code


def descendants(pid: int) -> list[int]:
    """``pid`` and all its descendants, from /proc (the launcher's workers run in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [pid], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def worker_pid(launcher: int, rank: int, run: int) -> Optional[int]:
    """The pid of the worker of global rank ``rank`` in the workers' run ``run``, among the launcher's descendants.

    A worker is a ``polydist.launch.worker`` process; its environment names its rank (torch elastic's
    ``RANK``, Hydra's ``PMI_RANK``, Open MPI's ``OMPI_COMM_WORLD_RANK``) and the restart count
    (``TORCHELASTIC_RESTART_COUNT``, ``POLYDIST_RESTART_COUNT`` under mpiexec).
    """
    ranks = {f"{name}={rank}" for name in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK")}
    runs = {f"{name}={run}" for name in ("TORCHELASTIC_RESTART_COUNT", "POLYDIST_RESTART_COUNT")}
    return next((pid for pid, env in workers(launcher) if env & ranks and env & runs), None)


def workers(launcher: int) -> Iterator[tuple[int, set]]:
    """(pid, environment as a set of ``NAME=value``) of each ``polydist.launch.worker`` below the launcher."""
    for pid in descendants(launcher)[1:]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"polydist.launch.worker" not in f.read():
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = set(f.read().decode(errors="replace").split("\0"))
        except OSError:
            continue
        yield pid, env


# ------------------------------------------------------------------ injecting the faults


def inject(job: Job, fault: Fault, checkpoint: str, epoch_s: float, start: int) -> Optional[Hit]:
    """Make ``fault`` happen in the workers' run that began at line ``start``; None if it could not."""
    if fault.kind in SIGNALS:
        return send_signal(job, fault, checkpoint, epoch_s, start)
    # The wrapper fails by itself, after saying so on stdout. torch's agent may stop copying a failed
    # worker's output before its last lines: then the exception's own message, in the launcher's
    # announcement on stderr, says it (later: detection then reads as 0 s).
    i = job.wait_for(FAULT_LINE, start, stream=None)
    if i is None:
        return None
    _, _, _, step, steps = FAULT_LINE.search(job.lines[i].text).groups()
    # The other ranks cannot finish the epoch without the failed one: the checkpoint on disk stays as it was.
    saved, _ = saved_epochs(checkpoint)
    return Hit(fault, job.lines[i].t, i + 1, saved, int(step) / int(steps))


def send_signal(job: Job, fault: Fault, checkpoint: str, epoch_s: float, start: int) -> Optional[Hit]:
    """Signal the worker ``fraction`` of an epoch after the run's ``epoch``-th checkpoint (or its start)."""
    mark = job.wait_for(CHECKPOINT, start, nth=fault.epoch) if fault.epoch else start
    if mark is None:
        return None
    time.sleep(max(0.0, job.lines[mark].t + fault.fraction * epoch_s - job.now()))
    pid = worker_pid(job.proc.pid, fault.rank, fault.run)
    if pid is None:
        return None
    saved, saved_at = saved_epochs(checkpoint)  # what a restart can resume from, read just before the fault
    try:
        os.kill(pid, SIGNALS[fault.kind])
    except ProcessLookupError:
        return None
    t = job.now()
    # Into the epoch in progress: since the last save, or since this run of the workers began training.
    since = min(t - job.lines[start].t, math.inf if saved_at is None else time.time() - saved_at)
    with job.changed:
        index = len(job.lines)
    return Hit(fault, t, index, saved, min(0.999, since / run_epoch_s(job, start, epoch_s)), pid)


def saved_epochs(checkpoint: str) -> tuple[int, Optional[float]]:
    """The finished epochs in the checkpoint on disk and when it was written (0, None: none yet)."""
    try:
        mtime = os.stat(checkpoint).st_mtime
        return torch.load(checkpoint, weights_only=True)["epoch"], mtime
    except FileNotFoundError:
        return 0, None


def run_epoch_s(job: Job, start: int, fallback: float) -> float:
    """Seconds an epoch takes in the workers' run that began at line ``start`` so far (median between its
    checkpoint lines), else ``fallback``."""
    with job.changed:
        times = [ln.t for ln in job.lines[start:] if ln.stream == "out" and CHECKPOINT.search(ln.text)]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return statistics.median(gaps) if gaps else fallback


def run_job(args: argparse.Namespace, backend: str, plan: list[Fault], epoch_s: float,
            checkpoint: str) -> tuple[Job, Optional[int], list[Hit], str]:  # fmt: skip
    """Run the faulty job once: launch it, inject each fault in its run of the workers, wait for the end."""
    job = Job(job_command(args, backend, WRAPPER, checkpoint), job_env(plan), args.job_timeout)
    hits, error, cursor = [], "", 0
    for fault in plan:
        start = job.wait_for(GENERATION, cursor, nth=1)
        while start is not None and generation_of(job.lines[start].text) < fault.run:
            start = job.wait_for(GENERATION, start + 1)
        if start is None:
            error = f"the workers' run {fault.run} never started"
            break
        hit = inject(job, fault, checkpoint, epoch_s, start)
        if hit is None:
            error = f"fault {asdict(fault)} could not be injected (the job ended first?)"
            break
        hits.append(hit)
        cursor = hit.index
    code = job.finish()
    if code is None:
        error = error or f"killed after --job-timeout {args.job_timeout:g} s"
    return job, code, hits, error


def generation_of(text: str) -> int:
    return int(GENERATION.search(text).group(3) or 0)


# ------------------------------------------------------------------ reading the outcome


def generations(lines: list[Line]) -> dict[int, dict]:
    """Per run of the workers: when it began, the epoch it resumed from (and when), its checkpoints."""
    gens: dict[int, dict] = {}
    current = None
    for ln in lines:
        if ln.stream != "out":
            continue
        if m := GENERATION.search(ln.text):
            current = gens[int(m.group(3) or 0)] = {"start": ln.t, "resumed": 0, "resumed_t": None, "checkpoints": []}
        elif current is None:
            continue
        elif m := RESUMED.search(ln.text):
            current["resumed"], current["resumed_t"] = int(m.group(1) or 0), ln.t
        elif m := CHECKPOINT.search(ln.text):
            current["checkpoints"].append((int(m.group(1)), ln.t))
    return gens


def announcements(lines: list[Line]) -> list[dict]:
    """The launcher's restart announcements on stderr: restart K of N, the rank blamed, how it ended."""
    found = []
    for ln in lines:
        if ln.stream == "err" and (m := ANNOUNCED.match(ln.text)):
            code = EXIT_CODE.search(m.group(4))
            found.append({"t": round(ln.t, 3), "restart": int(m.group(1)), "of": int(m.group(2)),
                          "rank": int(m.group(3)), "exit_code": int(code.group(1)) if code else None,
                          "line": ln.text})  # fmt: skip
    restarting = [ln.text for ln in lines if ln.stream == "err" and RESTARTING.match(ln.text)]
    for a in found:
        a["restarting_line"] = any(f"(restart {a['restart']} of {a['of']}," in r for r in restarting)
    return found


def fault_figures(hit: Hit, gens: dict[int, dict], announced: list[dict], backend: str) -> dict:
    """One fault's figures: how far training had got, where it resumed, how long recovery took, who was blamed."""
    f = hit.fault
    after = gens.get(f.run + 1)
    at = hit.saved + hit.fraction
    row = {**asdict(f), "t": round(hit.t, 3), "pid": hit.pid, "at": round(at, 3)}
    if after is not None:
        first_ckpt = next((t for e, t in after["checkpoints"]), None)
        row.update(
            resumed=after["resumed"],
            lost=round(at - after["resumed"], 3),
            recover_s=round(after["resumed_t"] - hit.t, 3) if after["resumed_t"] is not None else None,
            ckpt_s=round(first_ckpt - hit.t, 3) if first_ckpt is not None else None,
        )
    ann = next((a for a in announced if a["restart"] == f.run + 1), None)
    if ann is not None:
        row.update(
            detect_s=round(ann["t"] - hit.t, 3),
            blamed_rank=ann["rank"],
            announced_code=ann["exit_code"],
            blamed=ann["rank"] == f.rank and ann["exit_code"] == expected_code(f.kind, backend),
        )
    return row


def final_accuracy(lines: list[Line]) -> Optional[float]:
    found = [float(m.group(1)) for ln in lines if (m := ACCURACY.search(ln.text))]
    return found[-1] if found else None


def same_model(path: str, reference: str) -> Optional[bool]:
    """Whether the models saved in the two checkpoints are bit for bit equal (None: one is missing)."""
    if not (os.path.exists(path) and os.path.exists(reference)):
        return None
    a, b = (torch.load(p, weights_only=True)["model"] for p in (path, reference))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------ one backend


def reference_run(args: argparse.Namespace, backend: str, folder: str) -> dict:
    """The uninterrupted job (the example itself, same settings): its accuracy, checkpoint and epoch time."""
    path = os.path.join(folder, f"reference_{backend}.pt")
    job = Job(job_command(args, backend, EXAMPLE, path), job_env([]), args.job_timeout)
    code = job.finish()
    text = "\n".join(ln.text for ln in job.lines)
    wall = WALL.search(text)
    if code != 0 or wall is None:
        raise SystemExit(f"the reference run on {backend} failed (exit code {code}):\n{text[-4000:]}")
    return {"exit_code": code, "accuracy": final_accuracy(job.lines), "train_s": float(wall.group(1)),
            "epoch_s": float(wall.group(1)) / args.epochs, "job_s": round(job.now(), 3), "checkpoint": path}  # fmt: skip


def faulted_run(args: argparse.Namespace, backend: str, run: int, reference: dict, folder: str) -> RunResult:
    path = os.path.join(folder, f"{backend}_{run}.pt")
    plan = plan_faults(args, backend, run)
    job, code, hits, error = run_job(args, backend, plan, reference["epoch_s"], path)
    gens, announced = generations(job.lines), announcements(job.lines)
    result = RunResult(
        backend=backend, run=run, plan=[asdict(f) for f in plan], exit_code=code, wall_s=round(job.now(), 3),
        accuracy=final_accuracy(job.lines), same_model=same_model(path, reference["checkpoint"]),
        faults=[fault_figures(h, gens, announced, backend) for h in hits], announcements=announced, error=error,
    )  # fmt: skip
    if code != 0 or error:
        result.error = (error + "\n" if error else "") + tail(job.lines)
    return result


def tail(lines: list[Line], n: int = 60) -> str:
    return "\n".join(f"{ln.t:8.3f} {ln.stream} {ln.text}" for ln in lines[-n:])


def bench_backend(args: argparse.Namespace, backend: str, folder: str) -> dict:
    log(f"# {backend}: reference run ({args.epochs} epochs, hidden {args.hidden}{', --ddp' if args.ddp else ''})")
    reference = reference_run(args, backend, folder)
    log(f"  accuracy {reference['accuracy']:.4f}, training {reference['train_s']:.1f} s "
        f"({reference['epoch_s'] * 1000:.0f} ms an epoch), job {reference['job_s']:.1f} s")  # fmt: skip
    runs = []
    for run in range(args.runs):
        result = faulted_run(args, backend, run, reference, folder)
        log(describe_run(result, reference))
        runs.append(result)
    return {"backend": backend, "reference": reference, "runs": [asdict(r) for r in runs],
            "summary": summarize(runs, reference)}  # fmt: skip


# ------------------------------------------------------------------ reporting


def log(text: str) -> None:
    print(text, flush=True)


def describe_run(r: RunResult, reference: dict) -> str:
    acc = f"{r.accuracy:.4f}" if r.accuracy is not None else "-"
    verdict = "same model" if r.same_model else "DIFFERENT model" if r.same_model is False else "no model"
    lines = [f"  run {r.run}: exit {r.exit_code}, {r.wall_s:.1f} s, accuracy {acc} "
             f"(reference {reference['accuracy']:.4f}), {verdict}, {len(r.announcements)} restart(s) announced"]  # fmt: skip
    for f in r.faults:
        lines.append(
            f"    restart {f['run'] + 1}: {f['kind']:<9} rank {f['rank']} at epoch {f['at']:6.2f} -> resumed "
            f"{f.get('resumed', '-')}, lost {fmt(f.get('lost'), '.2f')} epochs; detect {fmt(f.get('detect_s'))} s, "
            f"recover {fmt(f.get('recover_s'))} s, first checkpoint {fmt(f.get('ckpt_s'))} s; blamed "
            f"rank {f.get('blamed_rank', '-')} code {f.get('announced_code', '-')}"
            + ("" if f.get("blamed") else "  <-- NOT the fault's rank/exit code")
        )
    if r.error:
        lines.append("    ERROR: " + r.error.replace("\n", "\n    | "))
    return "\n".join(lines)


def fmt(value: Optional[float], spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def spread(values: list) -> dict:
    """Median, min and max of the values that are there (None when none is)."""
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(runs: list[RunResult], reference: dict) -> dict:
    faults = [f for r in runs for f in r.faults]
    planned = sum(len(r.plan) for r in runs)
    return {
        "runs": len(runs),
        "completed": sum(r.exit_code == 0 for r in runs),
        "same_accuracy": sum(r.accuracy == reference["accuracy"] for r in runs),
        "same_model": sum(bool(r.same_model) for r in runs),
        "faults_planned": planned,
        "faults_injected": len(faults),
        "by_kind": {k: sum(f["kind"] == k for f in faults) for k in KINDS},
        "announced": sum(len(r.announcements) for r in runs),
        "blamed_right": sum(bool(f.get("blamed")) for f in faults),
        "lost_epochs": spread([f.get("lost") for f in faults]),
        "whole_epochs_lost": sum(math.floor(f["lost"]) for f in faults if f.get("lost") is not None),
        "detect_s": spread([f.get("detect_s") for f in faults]),
        "recover_s": spread([f.get("recover_s") for f in faults]),
        "ckpt_s": spread([f.get("ckpt_s") for f in faults]),
        "wall_s": spread([r.wall_s for r in runs]),
        "kinds": {k: kind_summary([f for f in faults if f["kind"] == k]) for k in KINDS},
    }


def kind_summary(faults: list[dict]) -> dict:
    return {
        "faults": len(faults),
        "blamed_right": sum(bool(f.get("blamed")) for f in faults),
        "lost_epochs": spread([f.get("lost") for f in faults]),
        "detect_s": spread([f.get("detect_s") for f in faults]),
        "recover_s": spread([f.get("recover_s") for f in faults]),
    }


def med(s: dict, spec: str = ".2f") -> str:
    """A spread as "median (min–max)"."""
    if s["median"] is None:
        return "-"
    return f"{s['median']:{spec}} ({s['min']:{spec}}–{s['max']:{spec}})"


def markdown(rows: list[tuple]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def summary_table(results: list[dict]) -> str:
    rows = [("backend", "runs ok", "same acc.", "same model", "faults (kill/term/exc/exit)", "announced",
             "blamed right", "epochs lost", "detect s", "recover s", "1st ckpt s", "job s (ref.)")]  # fmt: skip
    for res in results:
        s, ref = res["summary"], res["reference"]
        kinds = "/".join(str(s["by_kind"][k]) for k in KINDS)
        rows.append((
            res["backend"], f"{s['completed']}/{s['runs']}", f"{s['same_accuracy']}/{s['runs']}",
            f"{s['same_model']}/{s['runs']}", f"{s['faults_injected']}/{s['faults_planned']} ({kinds})",
            str(s["announced"]), f"{s['blamed_right']}/{s['faults_injected']}", med(s["lost_epochs"]),
            med(s["detect_s"]), med(s["recover_s"]), med(s["ckpt_s"]),
            f"{med(s['wall_s'], '.1f')} ({ref['job_s']:.1f})",
        ))  # fmt: skip
    return markdown(rows)


def kinds_table(results: list[dict]) -> str:
    """Per backend and kind of fault: how many, blamed right, epochs lost, detection and recovery times."""
    rows = [("backend", "kind", "faults", "blamed right", "epochs lost", "detect s", "recover s")]
    for res in results:
        for kind, s in res["summary"]["kinds"].items():
            if s["faults"]:
                rows.append((res["backend"], kind, str(s["faults"]), f"{s['blamed_right']}/{s['faults']}",
                             med(s["lost_epochs"]), med(s["detect_s"]), med(s["recover_s"])))  # fmt: skip
    return markdown(rows)


def write_json(path: str, args: argparse.Namespace, results: list[dict]) -> None:
    doc = {
        "command": " ".join([os.path.relpath(sys.executable, ROOT), *sys.argv]),
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "meta": {"torch": torch.__version__, "python": platform.python_version(), "cpus": os.cpu_count(),
                 "loadavg_end": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S")},  # fmt: skip
        "backends": results,
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def main(argv: Optional[list] = None) -> int:
    args = parse_args(argv)
    log(f"# fault injection: {args.runs} run(s) per backend, {args.faults} fault(s) each, kinds {','.join(args.kinds)}, "
        f"--max-restarts {args.max_restarts}, {args.nproc} ranks, seed {args.seed}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    folder = tempfile.mkdtemp(prefix="polydist-fault-")
    try:
        results = [bench_backend(args, backend, folder) for backend in args.backends]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    log("\n" + summary_table(results) + "\n\n" + kinds_table(results))
    log("(medians, min–max in brackets. epochs lost: the epoch reached when the fault hit (checkpointed epochs + the "
        "fraction of the one in progress) − the epoch resumed from. detect: fault → the launcher's restart "
        "announcement; recover: fault → \"resuming from\"; 1st ckpt: fault → the first checkpoint after the restart.)")
    if args.json:
        write_json(args.json, args, results)
        log(f"written: {args.json}")
    ok = all(r["summary"]["completed"] == r["summary"]["runs"] == r["summary"]["same_model"] for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
