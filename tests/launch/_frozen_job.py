"""A job for tests/launch/test_liveness.py: ``python _frozen_job.py MODE MARK HOW``.

MODE ``stop``: the ranks loop over all_reduce; rank 1 writes the time into MARK
and stops itself with SIGSTOP after 20 steps (on the first attempt only, so a
restarted job completes). MODE ``busy``: each rank is busy without
communicating for a few seconds — rank 0 in pure Python, rank 1 in a C call
that holds the GIL, rank 2 in time.sleep — then all ranks all_reduce and print
"busy ok". HOW: ``spawn`` (polydist.spawn, gloo), else the script is the worker
(polydist run, with or without --backend mpi).
"""

import math
import os
import signal
import sys
import time

import torch

import polydist as pd

BUSY_S = 3.0


def _stop(mark):
    for step in range(100000):
        if step == 20 and pd.get_rank() == 1 and pd.restart_count() == 0:
            with open(mark, "w") as f:
                f.write(str(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)
        pd.all_reduce(torch.ones(2))
        time.sleep(0.005)
        if pd.restart_count() > 0 and step == 40:
            print(f"rank {pd.get_rank()} completed after the restart", flush=True)
            return


def _busy():
    r, start = pd.get_rank(), time.monotonic()
    if r == 0:
        while time.monotonic() - start < BUSY_S:  # pure Python
            sum(i * i for i in range(1000))
    elif r == 1:
        while time.monotonic() - start < BUSY_S:  # a C call that holds the GIL (about a second each)
            math.factorial(150000)
    else:
        time.sleep(BUSY_S)
    total = pd.all_reduce(r + 1)
    print(f"rank {r} busy ok {total}", flush=True)


def main(local_rank, mode, mark):
    _stop(mark) if mode == "stop" else _busy()


if __name__ == "__main__":
    mode, mark, how = sys.argv[1:4]
    if how == "spawn":
        pd.spawn("gloo", main, (mode, mark), nproc_per_node=int(os.environ.get("NPROC", "2")))
    else:
        pd.initialize()
        main(None, mode, mark)
