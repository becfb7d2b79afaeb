"""How fast a stopped worker is named, per launcher, and what the liveness watch costs (issue 29).

Run it with plain python (it starts the jobs itself)::

    .venv/bin/python benchmarks/liveness.py --repeats 3 --json benchmarks/results/liveness.json

**Time to the report.** Each job has ``--nproc`` ranks (3) looping over
``all_reduce``; after 20 steps rank 1 writes ``time.time()`` into a file and
stops itself with ``SIGSTOP``. The figures are the time from that moment to
the launcher's notice on stderr (``polydist: rank 1 ... is frozen``, read as
it arrives) and to the launcher's exit with the report; each job is checked
(non-zero exit, rank 1 named as frozen). The bound is the default
``POLYDIST_FROZEN_AFTER`` (10 s) unless ``--bound`` is given. Launchers:
``spawn`` (``polydist.spawn``, gloo), ``run`` (``polydist run``, gloo),
``run-mpi`` (``polydist run --backend mpi``).

**Cost of the watch.** The watch runs in the launcher, reading
``/proc/PID/stat`` of each local worker every 0.1 s (elastic agent) or
0.25 s (``polydist run --backend mpi``); the workers run nothing for it. Its
cost on them is measured where it would show most: an 8-byte ``all_reduce``
on 2 MPI ranks under ``polydist run --backend mpi`` (about 4 µs a call),
timed in ``--blocks`` blocks of ``--calls`` calls, the median block per
call; jobs with the watch off (``POLYDIST_FROZEN_AFTER=0``) and on (the
default) alternate ``--pairs`` times, so drift on a shared machine hits
both alike. The job is this file too (``liveness.py job MODE OUT``).
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
import threading
import time

HERE = os.path.abspath(__file__)
LAUNCHERS = ("spawn", "run", "run-mpi")


# ---------------------------------------------------------------- the jobs (run inside the launchers)


def stop_rank_1(local_rank: int, mark: str) -> None:
    import torch

    import polydist as pd

    for step in range(10**6):
        if step == 20 and pd.get_rank() == 1:
            with open(mark, "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)
        pd.all_reduce(torch.ones(2))
        time.sleep(0.005)


def time_all_reduce(out: str, calls: int, blocks: int) -> None:
    import torch

    import polydist as pd

    t = torch.ones(2)  # 8 bytes
    for _ in range(2000):
        pd.all_reduce(t)
    per_call = []
    for _ in range(blocks):
        pd.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            pd.all_reduce(t)
        per_call.append((time.perf_counter() - start) / calls * 1e6)
    if pd.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(per_call, f)


def _job(argv: list) -> None:
    mode, target = argv[0], argv[1]
    if mode == "spawn":
        import polydist as pd

        pd.spawn("gloo", stop_rank_1, (target,), nproc_per_node=int(argv[2]))
        return
    import polydist as pd

    pd.initialize()
    if mode == "stop":
        stop_rank_1(0, target)
    else:
        time_all_reduce(target, int(argv[2]), int(argv[3]))
    pd.finalize()


# ---------------------------------------------------------------- the measurements


def _command(launcher: str, nproc: int, *job: str) -> list:
    if launcher == "spawn":
        return [sys.executable, HERE, "job", "spawn", *job[1:2], str(nproc)]
    backend = ["--backend", "mpi"] if launcher == "run-mpi" else []
    return [sys.executable, "-m", "polydist", "run", *backend, "--nproc-per-node", str(nproc), HERE, "job", *job]


def time_to_report(launcher: str, nproc: int, env: dict) -> dict:
    """One job whose rank 1 stops: seconds from the SIGSTOP to the notice and to the launcher's exit."""
    with tempfile.TemporaryDirectory() as tmp:
        mark = os.path.join(tmp, "mark")
        proc = subprocess.Popen(_command(launcher, nproc, "stop", mark), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        notice, lines = [], []

        def read() -> None:
            for line in proc.stderr:
                lines.append(line)
                if "is frozen:" in line and not notice:
                    notice.append(time.time())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        code = proc.wait(timeout=300)
        ended = time.time()
        reader.join(timeout=5)
        text = "".join(lines)
        if code == 0 or "rank 1 (" not in text or "was frozen: stopped" not in text or not os.path.exists(mark):
            raise RuntimeError(f"{launcher}: the job did not report rank 1 as frozen (exit code {code}):\n{text[-3000:]}")
        with open(mark) as f:
            stopped = float(f.read())
    return {"launcher": launcher, "notice_s": round(notice[0] - stopped, 3) if notice else None,
            "report_s": round(ended - stopped, 3)}


def all_reduce_cost(env: dict, frozen_after: str, calls: int, blocks: int) -> float:
    """Median µs per 8-byte all_reduce on 2 MPI ranks under ``polydist run --backend mpi``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        command = _command("run-mpi", 2, "time", out, str(calls), str(blocks))
        subprocess.run(command, env=dict(env, POLYDIST_FROZEN_AFTER=frozen_after), check=True,
                       stdout=subprocess.DEVNULL, timeout=600)
        with open(out) as f:
            return statistics.median(json.load(f))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "job":
        _job(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="jobs per launcher (the median is reported)")
    p.add_argument("--nproc", type=int, default=3)
    p.add_argument("--bound", type=float, default=None, help="POLYDIST_FROZEN_AFTER for the jobs (default: unset, 10 s)")
    p.add_argument("--launchers", default=",".join(LAUNCHERS))
    p.add_argument("--pairs", type=int, default=5, help="watch-off/watch-on job pairs for the cost")
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--json", default=None, metavar="PATH", help="write results here, and a .md table beside it")
    args = p.parse_args()
    from polydist.bench.records import run_metadata

    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYDIST_")}
    env["PYTHONUNBUFFERED"] = "1"
    if args.bound is not None:
        env["POLYDIST_FROZEN_AFTER"] = str(args.bound)
    launchers = [x for x in args.launchers.split(",") if x]
    runs = [time_to_report(launcher, args.nproc, env) for _ in range(args.repeats) for launcher in launchers]
    report = []
    for launcher in launchers:
        mine = [r for r in runs if r["launcher"] == launcher]
        notices = [r["notice_s"] for r in mine if r["notice_s"] is not None]
        report.append({"launcher": launcher, "notice_s": statistics.median(notices) if notices else None,
                       "report_s": statistics.median(r["report_s"] for r in mine), "runs": mine})
        print(f"{launcher:8s} SIGSTOP -> notice {report[-1]['notice_s']} s, -> report (launcher exit) "
              f"{report[-1]['report_s']} s", flush=True)
    off, on = [], []
    for _ in range(args.pairs):
        off.append(all_reduce_cost(env, "0", args.calls, args.blocks))
        on.append(all_reduce_cost(env, "10", args.calls, args.blocks))
    cost = {"off_us": [round(x, 3) for x in off], "on_us": [round(x, 3) for x in on],
            "off_median_us": round(statistics.median(off), 3), "on_median_us": round(statistics.median(on), 3)}
    print(f"8-byte MPI all_reduce, 2 ranks: watch off {cost['off_median_us']} µs, on {cost['on_median_us']} µs "
          f"(per job: off {cost['off_us']}, on {cost['on_us']})", flush=True)
    if args.json:
        result = {"metadata": run_metadata(), "args": vars(args), "bound_s": args.bound or 10.0,
                  "time_to_report": report, "watch_cost": cost}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        md = os.path.splitext(args.json)[0] + ".md"
        command = " ".join([".venv/bin/python", "benchmarks/liveness.py", *sys.argv[1:]])
        with open(md, "w") as f:
            f.write(f"Command: `{command}`\n\n")
            f.write(f"# Liveness: SIGSTOP to report ({args.nproc} ranks, bound {args.bound or 10.0:g} s, "
                    f"median of {args.repeats})\n\n| launcher | to the notice (s) | to the report, launcher exited (s) |\n"
                    "|---|---|---|\n")
            for r in report:
                f.write(f"| {r['launcher']} | {r['notice_s']} | {r['report_s']} |\n")
            f.write(f"\n# The watch's cost: 8-byte all_reduce, 2 MPI ranks (median of {args.pairs} jobs each)\n\n"
                    f"| watch | µs per call | per job |\n|---|---|---|\n"
                    f"| off (POLYDIST_FROZEN_AFTER=0) | {cost['off_median_us']} | {cost['off_us']} |\n"
                    f"| on (10 s) | {cost['on_median_us']} | {cost['on_us']} |\n")


if __name__ == "__main__":
    main()
