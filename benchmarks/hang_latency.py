"""From a hang to the end of the job: how long after a rank stops coming does ``polydist run --timeout`` end it.

Run it with plain python (it starts the jobs itself)::

    .venv/bin/python benchmarks/hang_latency.py --repeats 5 --json benchmarks/results/hang_latency.json

Each job has ``--nproc`` ranks (3) and runs ``polydist run --timeout T`` (5 s)
on gloo (``run``) or on MPI (``run-mpi``: ``--backend mpi``, mpi4py under the
mpich wheel's ``mpiexec``). The program all-reduces a small tensor ten times;
at step 3 rank 1 writes ``time.time()`` into a file and sleeps forever, so
the others wait for it in the next ``all_reduce`` until the timeout. The
figure is the time from that moment until ``polydist run`` has exited
(``time.time()`` in this process when ``wait()`` returns): what a user or a
batch system waits for after a hang. Its excess over the timeout is what the
job adds to it: the dumps, the report, the ends of the processes. Two
programs: ``torch``, plain ``torch.distributed`` (``init_process_group``
without a timeout, so the launcher's applies; ``dist.all_reduce``; no polydist
call), and ``polydist`` (``polydist.initialize()``, ``polydist.all_reduce``).
Each job is checked: non-zero exit, and the launcher's first line of the
report names rank 1 as the rank that never called the collective. Jobs run
round-robin, one at a time. The job is this file too (``hang_latency.py job
PROGRAM BACKEND MARK``).

Compare with ``failure_latency.py`` (a rank that raises, is killed or exits:
no timeout to wait for) and ``liveness.py`` (a stopped rank).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from failure_latency import cell, timed_job, write_results  # noqa: E402

LAUNCHERS = ("run", "run-mpi")
PROGRAMS = ("torch", "polydist")
HANG_STEP, STEPS, HANGING_RANK = 3, 10, 1


def job(program: str, backend: str, mark: str) -> None:
    """One rank: ``STEPS`` all_reduces; rank ``HANGING_RANK`` notes the time in ``mark`` and hangs at ``HANG_STEP``."""
    import torch

    if program == "torch":
        import torch.distributed as dist

        dist.init_process_group(None if backend == "gloo" else backend)  # as a user writes it: no timeout
        rank, reduce = dist.get_rank(), dist.all_reduce
    else:
        import polydist as pd

        pd.initialize()
        rank, reduce = pd.get_rank(), pd.all_reduce
    t = torch.ones(4)
    for step in range(STEPS):
        if step == HANG_STEP and rank == HANGING_RANK:
            with open(mark, "w") as f:
                f.write(repr(time.time()))
            while True:
                time.sleep(60)
        reduce(t)
    print("a rank got past the hang", flush=True)


def _command(launcher: str, program: str, mark: str, nproc: int, timeout: float) -> list:
    backend = "mpi" if launcher == "run-mpi" else "gloo"
    tail = [os.path.abspath(__file__), "job", program, backend, mark]
    return [sys.executable, "-m", "polydist", "run", "--nproc-per-node", str(nproc), "--backend", backend,
            "--timeout", repr(timeout), *tail]  # fmt: skip


def _report_line(output: str) -> str:
    """The launcher's first line of its report of a failed job ("" if none)."""
    return next((line for line in output.splitlines() if line.startswith("polydist run: job failed")), "")


def measure(launcher: str, program: str, nproc: int, timeout: float, limit_s: float) -> dict:
    run = timed_job(lambda mark: _command(launcher, program, mark, nproc, timeout), limit_s)
    code, output, start, end, (hung_at,) = run["code"], run["output"], run["start"], run["end"], run["marks"]
    report = _report_line(output)
    after = None if hung_at is None or code is None else end - hung_at
    return {
        "launcher": launcher,
        "program": program,
        "exit_code": code,
        "culprit_named": f"rank {HANGING_RANK} never called it" in report,
        "report": report[:400],
        "job_s": end - start,
        "hang_to_exit_s": after,
        "excess_s": None if after is None else after - timeout,
        "output_tail": output[-3000:] if code in (0, None) or not report else "",
    }


def _summary(rows: list, timeout: float) -> list:
    out = []
    for launcher in dict.fromkeys(r["launcher"] for r in rows):
        for program in dict.fromkeys(r["program"] for r in rows):
            group = [r for r in rows if r["launcher"] == launcher and r["program"] == program]
            times = [r["hang_to_exit_s"] for r in group if r["hang_to_exit_s"] is not None]
            if not group:
                continue
            out.append({
                "launcher": launcher,
                "program": program,
                "runs": len(group),
                "median_s": statistics.median(times) if times else None,
                "min_s": min(times, default=None),
                "max_s": max(times, default=None),
                "excess_median_s": statistics.median(times) - timeout if times else None,
                "excess_max_s": max(times) - timeout if times else None,
                "failed_and_named": sum(r["exit_code"] not in (0, None) and r["culprit_named"] for r in group),
            })  # fmt: skip
    return out


def markdown(summary: list, meta: dict) -> str:
    lines = [
        f"$ {meta['pythonpath']}{meta['interpreter']} {meta['command']}",
        "",
        f"# From a hang to the end of the job ({meta['nproc']} ranks, `polydist run --timeout {meta['timeout']:g}`)",
        "",
        f"hostname: `{meta['hostname']}`, cpu_count: `{meta['cpu_count']}`, torch: `{meta['torch']}`, "
        f"polydist: `{meta['source']}`, git: `{meta['git']}`, date: {meta['date']}, load average before: "
        f"`{meta['load_average']}`, after: `{meta['load_average_after']}`",
        "",
        f"Seconds from the moment rank {HANGING_RANK} stopped coming (it writes `time.time()` just before it "
        "sleeps) to the exit of `polydist run`; the other ranks wait for it in an `all_reduce` until the timeout. "
        "Excess: over the timeout.",
        "",
        "| launcher | program | runs | median (s) | min (s) | max (s) | excess, median (s) | excess, max (s) | "
        "failed, culprit named first |",
        "|:---|:---|---:|---:|---:|---:|---:|---:|:---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['launcher']} | {s['program']} | {s['runs']} | {cell(s['median_s'])} | {cell(s['min_s'])} | "
            f"{cell(s['max_s'])} | {cell(s['excess_median_s'])} | {cell(s['excess_max_s'])} | "
            f"{s['failed_and_named']}/{s['runs']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launchers", default=",".join(LAUNCHERS), help=f"comma-separated, of {', '.join(LAUNCHERS)}")
    p.add_argument("--programs", default=",".join(PROGRAMS), help=f"comma-separated, of {', '.join(PROGRAMS)}")
    p.add_argument("--nproc", type=int, default=3, help="ranks per job (rank 1 hangs)")
    p.add_argument("--timeout", type=float, default=5.0, help="polydist run --timeout, seconds")
    p.add_argument("--repeats", type=int, default=3, help="jobs per launcher and program")
    p.add_argument("--limit", type=float, default=120, help="seconds before a job counts as hung for good")
    p.add_argument("--json", default=None, metavar="PATH", help="write results here, and a .md table beside it")
    args = p.parse_args()
    launchers, programs = args.launchers.split(","), args.programs.split(",")
    for names, allowed in ((launchers, LAUNCHERS), (programs, PROGRAMS)):
        bad = [n for n in names if n not in allowed]
        if bad:
            p.error(f"unknown {bad}; choose from {', '.join(allowed)}")
    import polydist
    from polydist.bench.records import run_metadata

    python = os.path.relpath(sys.executable) if not os.path.relpath(sys.executable).startswith("..") else sys.executable
    meta = run_metadata(nproc=args.nproc, timeout=args.timeout, repeats=args.repeats, launchers=launchers,
                        programs=programs, source=os.path.dirname(polydist.__file__), interpreter=python,
                        pythonpath=f"PYTHONPATH={os.environ['PYTHONPATH']} " if os.environ.get("PYTHONPATH") else "",
                        load_average=[round(x, 2) for x in os.getloadavg()])  # fmt: skip
    rows = []
    for repeat in range(args.repeats):  # round-robin, so a busy spell of the machine hits every case alike
        for launcher in launchers:
            for program in programs:
                row = measure(launcher, program, args.nproc, args.timeout, args.limit)
                rows.append(row)
                print(f"{launcher:8} {program:8} #{repeat}: exit code {row['exit_code']}, culprit named "
                      f"{row['culprit_named']}, ended {cell(row['hang_to_exit_s'])} s after the hang "
                      f"(job {row['job_s']:.1f} s, load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    meta["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    summary = _summary(rows, args.timeout)
    text = markdown(summary, meta)
    print("\n" + text)
    if args.json:
        write_results(args.json, meta, summary, rows, text)
    return 0 if all(s["failed_and_named"] == s["runs"] for s in summary) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["job"]:
        job(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(main())
