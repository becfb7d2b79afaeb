"""How a job ends on Ctrl-C or SIGTERM: seconds until ``polydist run`` exited, and the lines it printed.

Run it with plain python (it starts the jobs itself)::

    .venv/bin/python benchmarks/interrupt.py --repeats 3 --json benchmarks/results/interrupt.json

Each job is ``polydist run --nproc-per-node N`` (gloo, or ``--backend mpi``)
of a loop of all_reduces; once every rank printed that it started, the
signal goes either to the job's whole process group, as a terminal's Ctrl-C
does (``ctrl-c``), or to the launcher alone (``sigint``, ``sigterm``: ``kill``
from another shell or a batch system). The figure is the time from the signal
until the launcher exited; the job is checked for leftover ranks and its
output's line count is recorded (the goal: one line per rank at most, plus
the launcher's).
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

LOOP = """
import time, torch, polydist as pd
pd.initialize()
print("started", flush=True)
while True:
    pd.all_reduce(torch.ones(4))
    time.sleep(0.01)
"""
HOW = {"ctrl-c": (signal.SIGINT, True), "sigint": (signal.SIGINT, False), "sigterm": (signal.SIGTERM, False)}


def one(backend: str, how: str, nproc: int, folder: str) -> dict:
    script = os.path.join(folder, "loop.py")
    with open(script, "w") as f:
        f.write(LOOP)
    command = [sys.executable, "-m", "polydist", "run", "--nproc-per-node", str(nproc), "--backend", backend, script]
    out = open(os.path.join(folder, "out.txt"), "w+")
    # A session of its own, SIGINT handled (a shell's background job would ignore it): a terminal's foreground job
    job = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        out.seek(0)
        if out.read().count("started") >= nproc:
            break
        time.sleep(0.2)
    time.sleep(0.5)
    sig, group = HOW[how]
    t0 = time.monotonic()
    os.killpg(job.pid, sig) if group else os.kill(job.pid, sig)
    try:
        code = job.wait(60)
    except subprocess.TimeoutExpired:
        code = None
    seconds = time.monotonic() - t0
    leftover = subprocess.run(["pgrep", "-f", script], capture_output=True, text=True).stdout.split()
    if code is None or leftover:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    out.seek(0)
    lines = [ln for ln in out.read().splitlines() if "started" not in ln]
    return {"backend": backend, "how": how, "exit_code": code, "seconds": round(seconds, 2),
            "leftover_ranks": len(leftover), "lines": len(lines), "output": lines[:40]}  # fmt: skip


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="gloo,mpi")
    p.add_argument("--how", default="ctrl-c,sigint,sigterm")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args(argv)
    print(f"$ {' '.join([os.path.relpath(sys.executable), *sys.argv])}\n", flush=True)
    rows = []
    for backend in args.backends.split(","):
        for how in args.how.split(","):
            runs = []
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory(prefix="polydist-interrupt-") as folder:
                    runs.append(one(backend, how, args.nproc, folder))
            rows += runs
            secs = [r["seconds"] for r in runs]
            print(f"{backend:5} {how:8} exit {sorted({r['exit_code'] for r in runs}, key=str)}, "
                  f"{statistics.median(secs):.2f} s median [{max(secs):.2f} max], lines {[r['lines'] for r in runs]}, "
                  f"leftover ranks {sum(r['leftover_ranks'] for r in runs)}", flush=True)  # fmt: skip
            for line in runs[-1]["output"]:
                print(f"    | {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"nproc": args.nproc, "runs": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
