"""How long a failed rank takes to end a job, per launcher (issue 5).

Run it with plain python (it starts the jobs itself)::

    .venv/bin/python benchmarks/failure_latency.py --repeats 5 --json benchmarks/results/failure_latency.json

Each job has ``--nproc`` ranks (3). After a barrier, the last rank fails — it
raises, is killed with SIGKILL, or calls ``sys.exit(3)`` — while the others
wait for it in an ``all_reduce``. Just before failing it writes
``time.time()`` into a file; the figure is the time from that moment until the
launcher's process has exited (``time.time()`` again, in this process, when
``wait()`` returns): what a user or a batch system waits for. For ``spawn`` the
moment ``polydist.spawn`` raised is also recorded (the launching program may
do more before it exits). Process start-up is not part of the figure. Each job
is checked: non-zero exit code, and the failing rank named in the output.

Launchers: ``run`` (``polydist run``, gloo), ``spawn`` (``polydist.spawn``,
gloo), ``run-mpi`` (``polydist run --backend mpi``, mpi4py under mpiexec) and
``mpiexec`` (plain ``mpiexec -n N python job.py`` with
``polydist.initialize("mpi")``). Jobs run one after another. The job is this
file too (``failure_latency.py job HOW MARK LAUNCHER NPROC``, and
:func:`fail_last_rank` for spawn); tests/test_failures.py runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable

import torch

import polydist as pd
from polydist.bench.records import run_metadata


def fail_last_rank(local_rank: int, how: str, mark: str) -> None:
    """The last rank fails (``how``: raise, kill, exit) after noting the time in ``mark``; the others wait for it."""
    rank = pd.get_rank()
    if rank == pd.get_world_size() - 1:
        time.sleep(0.3)  # the others are waiting in the all_reduce by now
        with open(mark, "w") as f:
            f.write(repr(time.time()))
        if how == "raise":
            raise RuntimeError(f"deliberate failure on rank {rank}")
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(3)
    pd.all_reduce(torch.ones(1024))
    print("a waiting rank got past the failure", flush=True)


def job(how: str, mark: str, launcher: str, nproc: int) -> None:
    """One job: the spawn launcher here, or one rank of a job started by another launcher."""
    if launcher == "spawn":
        try:
            pd.spawn("gloo", fail_last_rank, args=(how, mark), nproc_per_node=nproc)
        except pd.WorkerFailedError as exc:
            with open(mark + ".raised", "w") as f:
                f.write(repr(time.time()))
            print(exc, file=sys.stderr, flush=True)
            sys.exit(1)
        return
    pd.initialize("mpi" if launcher == "mpiexec" else None)
    pd.barrier()
    fail_last_rank(pd.get_local_rank(), how, mark)

LAUNCHERS = ("run", "spawn", "run-mpi", "mpiexec")
KINDS = ("raise", "kill", "exit")
# Under plain mpiexec nothing turns sys.exit(n) into MPI_Abort: the exiting rank waits in MPI_Finalize and
# the others in their collective, until the job is killed (polydist run --backend mpi does turn it).
HANGS = {("mpiexec", "exit"): "plain mpiexec: sys.exit(n) on one rank leaves the job waiting (no MPI_Abort)"}


def _command(launcher: str, how: str, mark: str, nproc: int) -> list[str]:
    tail = [os.path.abspath(__file__), "job", how, mark, launcher, str(nproc)]
    if launcher == "run":
        return [sys.executable, "-m", "polydist", "run", "--nproc-per-node", str(nproc), "--backend", "gloo", *tail]
    if launcher == "run-mpi":
        return [sys.executable, "-m", "polydist", "run", "--nproc-per-node", str(nproc), "--backend", "mpi", *tail]
    if launcher == "mpiexec":
        from polydist.launch.mpiexec import find

        return [find(), "-n", str(nproc), sys.executable, *tail]
    return [sys.executable, *tail]


def _named(launcher: str, output: str, rank: int) -> bool:
    """Whether the output names the failing rank (plain mpiexec names a killed process by its pid only)."""
    marks = [f"rank {rank} (", f"rank {rank} failed first", f"rank {rank} raised", f"rank {rank} exited"]
    return any(m in output for m in marks) or (launcher == "mpiexec" and "BAD TERMINATION" in output)


def _read_time(path: str) -> float | None:
    try:
        with open(path) as f:
            return float(f.read())
    except (OSError, ValueError):
        return None


def timed_job(command_for: Callable[[str], list], limit_s: float, suffixes: tuple = ("",)) -> dict:
    """Run ``command_for(mark)`` (``mark``: a path in a fresh folder, where the job writes the time of its event)
    for at most ``limit_s`` seconds: its exit code (None past the limit), output, start and end times, and the
    times the job wrote at ``mark`` + each of ``suffixes`` (None where it wrote none)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "POLYDIST_"))}
    env["PYTHONUNBUFFERED"] = "1"
    with tempfile.TemporaryDirectory(prefix="polydist-latency-") as tmp:
        mark = os.path.join(tmp, "event_at")
        start = time.time()
        try:
            out = subprocess.run(command_for(mark), env=env, capture_output=True, text=True, timeout=limit_s)
            code, output = out.returncode, out.stdout + out.stderr
        except subprocess.TimeoutExpired as exc:
            code, output = None, f"still running after {limit_s} s: {exc}"
        end = time.time()
        marks = [_read_time(mark + suffix) for suffix in suffixes]
    return {"code": code, "output": output, "start": start, "end": end, "marks": marks}


def write_results(path: str, meta: dict, summary: list, rows: list, text: str) -> None:
    """The runs as JSON at ``path``, and the summary's Markdown ``text`` beside it (``.md``)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "summary": summary, "runs": rows}, f, indent=1)
    md = os.path.splitext(path)[0] + ".md"
    with open(md, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {path} and {md}", flush=True)


def measure(launcher: str, how: str, nproc: int, timeout_s: float) -> dict:
    job = timed_job(lambda mark: _command(launcher, how, mark, nproc), timeout_s, ("", ".raised"))
    code, output, start, end = job["code"], job["output"], job["start"], job["end"]
    failed_at, raised_at = job["marks"]
    return {
        "launcher": launcher,
        "failure": how,
        "nproc": nproc,
        "exit_code": code,
        "named": _named(launcher, output, nproc - 1),
        "survivor_went_on": "got past the failure" in output,
        "job_s": end - start,
        "end_after_failure_s": None if failed_at is None or code is None else end - failed_at,
        "raise_after_failure_s": None if failed_at is None or raised_at is None else raised_at - failed_at,
        "output_tail": output[-3000:] if code in (0, None) or not _named(launcher, output, nproc - 1) else "",
    }


def _summary(rows: list[dict]) -> list[dict]:
    out = []
    for launcher in dict.fromkeys(r["launcher"] for r in rows):
        for how in dict.fromkeys(r["failure"] for r in rows):
            group = [r for r in rows if r["launcher"] == launcher and r["failure"] == how]
            if not group:
                continue
            times = [r["end_after_failure_s"] for r in group if r["end_after_failure_s"] is not None]
            raised = [r["raise_after_failure_s"] for r in group if r["raise_after_failure_s"] is not None]
            out.append({
                "launcher": launcher,
                "failure": how,
                "runs": len(group),
                "median_s": statistics.median(times) if times else None,
                "min_s": min(times, default=None),
                "max_s": max(times, default=None),
                "spawn_raised_median_s": statistics.median(raised) if raised else None,
                "nonzero_and_named": sum(r["exit_code"] not in (0, None) and r["named"] for r in group),
                "exit_codes": sorted({r["exit_code"] for r in group}, key=str),
            })  # fmt: skip
    return out


def cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def markdown(summary: list[dict], meta: dict) -> str:
    skipped = [n for (launcher, how), n in HANGS.items() if launcher in meta["launchers"] and how in meta["failures"]]
    lines = [
        "# Time for a failed rank to end a job",
        "",
        f"ranks: `{meta['nproc']}`, hostname: `{meta['hostname']}`, cpu_count: `{meta['cpu_count']}`, "
        f"torch: `{meta['torch']}`, git: `{meta['git']}`, date: {meta['date']}, load average before: "
        f"`{meta['load_average']}`",
        "",
        f"Command: `{meta['command']}`",
        "",
        "Seconds from the moment the failing rank failed (it writes `time.time()` just before) to the exit of the "
        "launcher's process; the other ranks were waiting in an `all_reduce`. Process start-up is not included.",
        "",
        *[f"Not measured: {note}.\n" for note in skipped],
        "| launcher | failure | runs | median (s) | min (s) | max (s) | spawn raised, median (s) | runs with non-zero "
        "exit and the rank named | exit codes |",
        "|:---|:---|---:|---:|---:|---:|---:|:---|:---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['launcher']} | {s['failure']} | {s['runs']} | {cell(s['median_s'])} | {cell(s['min_s'])} | "
            f"{cell(s['max_s'])} | {cell(s['spawn_raised_median_s'])} | "
            f"{s['nonzero_and_named']}/{s['runs']} | {', '.join(map(str, s['exit_codes']))} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launchers", default=",".join(LAUNCHERS), help=f"comma-separated, of {', '.join(LAUNCHERS)}")
    p.add_argument("--failures", default="raise,kill,exit", help=f"comma-separated, of {', '.join(KINDS)}")
    p.add_argument("--nproc", type=int, default=3, help="ranks per job (the last one fails)")
    p.add_argument("--repeats", type=int, default=3, help="jobs per launcher and failure")
    p.add_argument("--timeout", type=float, default=120, help="seconds before a job counts as hung")
    p.add_argument("--json", default=None, metavar="PATH", help="write results here, and a .md table beside it")
    args = p.parse_args()
    launchers, kinds = args.launchers.split(","), args.failures.split(",")
    for name, allowed in ((launchers, LAUNCHERS), (kinds, KINDS)):
        bad = [n for n in name if n not in allowed]
        if bad:
            p.error(f"unknown {bad}; choose from {', '.join(allowed)}")
    meta = run_metadata(
        nproc=args.nproc,
        repeats=args.repeats,
        launchers=launchers,
        failures=kinds,
        load_average=[round(x, 2) for x in os.getloadavg()],
    )
    rows = []
    for repeat in range(args.repeats):  # round-robin, so a busy spell of the machine hits every case alike
        for launcher in launchers:
            for how in kinds:
                if (launcher, how) in HANGS:
                    if repeat == 0:
                        print(f"skipped {launcher} {how}: {HANGS[launcher, how]}", flush=True)
                    continue
                row = measure(launcher, how, args.nproc, args.timeout)
                rows.append(row)
                print(
                    f"{launcher:8} {how:6} #{repeat}: exit code {row['exit_code']}, rank named {row['named']}, "
                    f"ended {cell(row['end_after_failure_s'])} s after the failure (job {row['job_s']:.1f} s)",
                    flush=True,
                )
    summary = _summary(rows)
    text = markdown(summary, meta)
    print("\n" + text)
    if args.json:
        write_results(args.json, meta, summary, rows, text)
    return 0 if all(s["nonzero_and_named"] == s["runs"] for s in summary) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["job"]:
        job(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        sys.exit(main())
