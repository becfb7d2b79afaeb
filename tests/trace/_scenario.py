"""Jobs that go wrong on purpose, for the flight-recorder tests (tests/trace/test_scenarios.py).

``python _scenario.py MODE`` under ``polydist run`` (gloo or MPI), with 3 ranks:

- ``skip``: rank 2 skips the fourth all_reduce and waits in a barrier instead: the others time out (gloo).
- ``order``: rank 1 calls broadcast where the others call all_reduce.
- ``loop``: rank 1 spins in a Python loop; the others wait in an all_reduce.
- ``kill``: rank 1 kills itself (SIGKILL) while the others are in an all_reduce.
- ``raise``: rank 1 raises while the others are in an all_reduce.
- ``healthy``: every rank writes its pid, waits for the test's SIGUSR1 dump, and finishes.

Each rank writes ``<dir>/pid<R>`` (``$SCENARIO_DIR``) when it reaches the interesting point.
"""

import os
import signal
import sys
import time

import torch

import polydist as pdist


def mark(name: str) -> None:
    folder = os.environ["SCENARIO_DIR"]
    with open(os.path.join(folder, f"{name}{pdist.get_rank()}.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(folder, f"{name}{pdist.get_rank()}.tmp"), os.path.join(folder, f"{name}{pdist.get_rank()}"))


def spin_forever() -> None:
    n = 0
    while True:  # the loop line the dump must show
        n += 1


def main(mode: str) -> None:
    pdist.initialize()
    rank = pdist.get_rank()
    x = torch.ones(4)
    for _ in range(3):
        pdist.all_reduce(x)
    pdist.barrier()
    mark("pid")
    if mode == "skip":
        if rank != 2:
            pdist.all_reduce(x)  # rank 2 never calls this one
        pdist.barrier()
    elif mode == "order":
        if rank == 1:
            pdist.broadcast(x, src=0)
        else:
            pdist.all_reduce(x)
        pdist.barrier()
    elif mode == "loop":
        if rank == 1:
            spin_forever()
        pdist.all_reduce(x)  # rank 1 is spinning
    elif mode == "kill":
        if rank == 1:
            time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGKILL)
        pdist.all_reduce(x)
    elif mode == "raise":
        if rank == 1:
            time.sleep(1.0)
            raise RuntimeError("rank 1 gives up")
        pdist.all_reduce(x)
    elif mode == "healthy":
        folder = os.environ["SCENARIO_DIR"]
        while not os.path.exists(os.path.join(folder, "go")):
            time.sleep(0.05)
        pdist.all_reduce(x)
        print(f"rank {rank} finished: {x.tolist()}", flush=True)
    pdist.finalize()


if __name__ == "__main__":
    main(sys.argv[1])
