"""A host's link dropped: the main job on two hosts, fault-tolerant vs restart, side by side in one run (needs root).

    .venv/bin/python benchmarks/fault_tolerant_two_hosts.py --runs 10 --epochs 80 \\
        --json benchmarks/results/fault_tolerant_two_hosts.json

Two hosts are two network namespaces joined by a veth pair (tests/_netns.py), each running ``polydist run
--nnodes 2 --node-rank R --master-addr HOST0 --master-port P --nproc-per-node 2`` on the main job
(examples/train_digits.py, unchanged): 4 ranks. First one run of each path without a fault (the references),
then, per run, host 1's link is set down for ``--drop`` seconds (``ip link set down``, then up) at a random
moment between 15 % and 50 % of the reference's training time (late enough to be mid-training, early enough
for the cut-off replica groups to come back before the others finish) (``random.Random("SEED:drop:RUN")``, the same on
both paths):

* **fault-tolerant**: ``--fault-tolerant``, 4 replica groups of one process (2 a host), ``--timeout T``;
  figures from node 0's launcher: ``went_on_s`` (the survivors' first commit after the fault's first sign),
  ``discarded`` (steps), ``back_s`` (from the link going down to the "is back" line of host 1's replica
  groups, the last of them: the link's own time down included), how many came back, whether every replica group ended with the same state, and
  whether any rank was restarted (it should not be);
* **restart**: ``--max-restarts 1 --timeout T ... --ddp --checkpoint PATH`` (today's path: every rank stops
  and restarts from the last epoch's checkpoint, GLOO_SOCKET_IFNAME naming each host's end of the link);
  ``detect_s`` (node 0's "restart 1 of 1" line after the link went down), ``recover_s`` (the "resuming from"
  line), whether the ranks ended with identical parameters.

Both: each node's exit code and the final test accuracy (rank 0, on host 0), against the path's reference.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from _netns import TwoHosts  # noqa: E402
from fault import Job, job_env  # noqa: E402
from fault_tolerant import ACCURACY, FT_END, FT_FAULT, WALL, restart_figures  # noqa: E402

EXAMPLE = os.path.join(ROOT, "examples", "train_digits.py")
TRAINING = re.compile(r"\[rank0\]: (?:world size \d+|\d+ fault-tolerant replica groups), ")
FT_BACK = re.compile(r"^polydist: fault-tolerant: replica groups? ([\d, ]+) (?:is|are) back at step")
PORT = 29620


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--runs", type=int, default=10, help="faulted runs per path")
    p.add_argument("--epochs", type=int, default=80, help="about 23 s of training on 2 CPUs")
    p.add_argument("--drop", type=float, default=4.0, help="seconds host 1's link stays down")
    p.add_argument("--timeout", type=float, default=3.0, help="collective timeout")
    p.add_argument("--paths", default="ft,restart", help="comma-separated: ft, restart")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job-timeout", type=float, default=300)
    p.add_argument("--json", default=None)
    p.add_argument("--logs", default=None, help="folder for each job's output, one file per node and run")
    args = p.parse_args(argv)
    args.paths = [k for k in args.paths.split(",") if k]
    return args


def command(two: TwoHosts, args: argparse.Namespace, node: int, path: str, checkpoint: str) -> list:
    run = [sys.executable, "-m", "polydist", "run", "--nnodes", "2", "--node-rank", str(node), "--master-addr",
           two.hosts[0].addr, "--master-port", str(PORT), "--nproc-per-node", "2", "--timeout", str(args.timeout)]
    if path == "ft":
        run += ["--fault-tolerant", EXAMPLE, "--epochs", str(args.epochs)]
    else:
        run += ["--max-restarts", "1", EXAMPLE, "--ddp", "--epochs", str(args.epochs), "--checkpoint", checkpoint]
    return two.command(two.hosts[node], run)


def one_job(two: TwoHosts, args: argparse.Namespace, path: str, moment: Optional[float], reference_s: float) -> dict:
    """Run one job on both hosts, host 1's link dropped at ``moment`` of the reference's training (None: no
    fault); its figures."""
    with tempfile.TemporaryDirectory(prefix="polydist-ft2bench-") as folder:
        jobs = []
        for node, host in enumerate(two.hosts):
            env = job_env([])
            if path == "restart":
                env["GLOO_SOCKET_IFNAME"] = host.ifname
            jobs.append(Job(command(two, args, node, path, os.path.join(folder, "ckpt.pt")), env, args.job_timeout))
        start = jobs[0].wait_for(TRAINING, stream="out")
        down, error = None, ""
        if start is None:
            error = "training never started"
        elif moment is not None:
            time.sleep(max(0.0, jobs[0].lines[start].t + moment * reference_s - jobs[0].now()))
            host = two.hosts[1]
            subprocess.Popen(["sh", "-c", f"ip -n {host.netns} link set {host.ifname} down; sleep {args.drop}; "
                              f"ip -n {host.netns} link set {host.ifname} up"])  # fmt: skip
            down = jobs[0].now()
        codes = [job.finish() for job in jobs]
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
        for node, job in enumerate(jobs):
            name = f"{path}-{'reference' if moment is None else f'{moment:.3f}'}-node{node}.log"
            with open(os.path.join(args.logs, name), "w") as f:
                f.writelines(f"{ln.t:8.3f} {ln.stream} {ln.text}\n" for ln in job.lines)
    return figures(jobs, path, down, codes, error)


def figures(jobs: list, path: str, down: Optional[float], codes: list, error: str) -> dict:
    lines = jobs[0].lines
    err = [ln for ln in lines if ln.stream == "err"]
    row = {"path": path, "kind": "drop" if down is not None else None, "exit_codes": codes, "error": error,
           "accuracy": next((float(m.group(1)) for ln in reversed(lines) if (m := ACCURACY.search(ln.text))), None),
           "wall_s": next((float(m.group(1)) for ln in reversed(lines) if (m := WALL.search(ln.text))), None)}  # fmt: skip
    if path == "ft":
        row["identical"] = any(FT_END.match(ln.text) for ln in err)
        row["restarted"] = any("starting its replacement" in ln.text for job in jobs for ln in job.lines)
        fault = next((ln for ln in err if FT_FAULT.match(ln.text)), None)
        if fault is not None:
            went, discarded = FT_FAULT.match(fault.text).groups()
            row.update(went_on_s=float(went), discarded=0 if discarded == "no step" else int(discarded.split()[0]))
        back = [ln for ln in err if FT_BACK.match(ln.text)]
        row["back"] = sum(len(FT_BACK.match(ln.text).group(1).split(",")) for ln in back)  # of host 1's 2
        if back and down is not None:
            row["back_s"] = round(back[-1].t - down, 3)  # the last of them
        return row
    return restart_figures(row, lines, down)


def ok(row: dict, reference: Optional[float]) -> bool:
    """Ended right: both nodes exit 0, identical state, accuracy within 0.5 points of the path's reference."""
    return (row["exit_codes"] == [0, 0] and row["identical"] and row["accuracy"] is not None and reference is not None
            and abs(row["accuracy"] - reference) <= 0.005)  # fmt: skip


def main(argv: Optional[list] = None) -> int:
    args = parse_args(argv)
    print(f"$ {' '.join([os.path.relpath(sys.executable, ROOT), *sys.argv])}\n", flush=True)
    print(f"# 2 hosts x 2 ranks, {args.epochs} epochs, link of host 1 down {args.drop:g} s, {args.runs} run(s), paths "
          f"{','.join(args.paths)}, --timeout {args.timeout:g}, seed {args.seed}; load average "
          f"{os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs", flush=True)  # fmt: skip
    two = TwoHosts(tag=f"fth{os.getpid() % 100000}", octet=(os.getpid() + 31) % 250 + 1)
    rows: list = []
    try:
        two.setup()
        reference = {}
        for path in args.paths:
            row = one_job(two, args, path, None, 0.0)
            rows.append(row)
            reference[path] = row
            print(f"  reference {path}: exits {row['exit_codes']}, accuracy {row['accuracy']}, training "
                  f"{row['wall_s']} s, identical {row['identical']}", flush=True)  # fmt: skip
        for run in range(args.runs):
            moment = random.Random(f"{args.seed}:drop:{run}").uniform(0.15, 0.5)
            for path in args.paths:
                row = one_job(two, args, path, moment, reference[path]["wall_s"] or 10.0)
                row.update(run=run, moment=round(moment, 3), ok=ok(row, reference[path]["accuracy"]))
                rows.append(row)
                shown = {k: row.get(k) for k in ("ok", "exit_codes", "accuracy", "identical", "restarted", "went_on_s",
                                                  "discarded", "back", "back_s", "detect_s", "recover_s", "error")
                         if row.get(k) not in (None, "")}  # fmt: skip
                print(f"  run {run} drop at {moment:.2f} {path:7}: {shown}", flush=True)
    finally:
        two.close()
    print("\n# per path: runs ended right (both nodes exit 0, identical state, accuracy within 0.5 points), medians [max]")
    table = {}
    for path in args.paths:
        faulted = [r for r in rows if r["path"] == path and r["kind"] is not None]
        values = {k: [r[k] for r in faulted if r.get(k) is not None]
                  for k in ("went_on_s", "discarded", "back", "back_s", "detect_s", "recover_s")}  # fmt: skip
        table[path] = {"runs": len(faulted), "ok": sum(r["ok"] for r in faulted),
                       "restarted": sum(bool(r.get("restarted")) for r in faulted),
                       "median": {k: round(statistics.median(v), 3) for k, v in values.items() if v},
                       "max": {k: round(max(v), 3) for k, v in values.items() if v}}  # fmt: skip
        s = table[path]
        text = ", ".join(f"{k} {s['median'][k]:g} [{s['max'][k]:g}]" for k in s["median"])
        print(f"  {path:8} {s['ok']}/{s['runs']} right; {text}" + (f"; {s['restarted']} with a rank restarted"
                                                                  if path == "ft" else ""))  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "platform": platform.platform(), "rows": rows, "summary": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
