"""Plain torch.distributed programs on polydist's ``mpi`` group, for tests/trace/test_watchdog_mpi.py.

``python _torch_hang.py MODE`` on 2 ranks (mpiexec or ``polydist run --backend mpi``): the program imports
polydist only for the ``mpi`` backend and calls ``init_process_group("mpi", timeout=$HANG_TIMEOUT s)``.

- ``all_reduce``: rank 1 is busy for ``$HANG_BUSY`` s while rank 0 waits in its second all_reduce.
- ``ddp``: a DDP step where rank 1 stalls in its forward pass; rank 0 waits in the gradient all_reduce.
- ``fsdp2``: an FSDP2 (``fully_shard``) step where rank 1 stalls before its forward; rank 0 waits in an all-gather.
- ``once``: rank 1 is busy for ``$HANG_BUSY`` s (less than the timeout: no alarm), then torch-level, polydist
  and DDP calls and a send/recv inside a comms profile; rank 0 prints the records and the profile's rows as JSON lines
  (``RECORD ...``, ``ROW ...``).

Rank 0 prints ``WAITING <time.time()>`` where rank 1 turns busy.
"""

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import polydist  # noqa: F401 - the "mpi" backend on stock wheels

BUSY = float(os.environ.get("HANG_BUSY", "60"))


def busy_rank_1() -> None:
    """Rank 1 is busy here; rank 0 goes on to the call it will wait in (and says when it went on)."""
    if dist.get_rank() == 1:
        time.sleep(BUSY)  # the busy line
    else:
        print(f"WAITING {time.time()}", flush=True)


class Stalling(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        busy_rank_1()
        return self.lin(x)


def main(mode: str) -> None:
    dist.init_process_group("mpi", timeout=datetime.timedelta(seconds=float(os.environ.get("HANG_TIMEOUT", "10"))))
    t = torch.ones(2)
    dist.all_reduce(t)
    if mode == "all_reduce":
        busy_rank_1()
        dist.all_reduce(t)
    elif mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(Stalling())
        model(torch.ones(4, 8)).sum().backward()
    elif mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        busy_rank_1()
        model(torch.ones(4, 8)).sum().backward()
    elif mode == "once":
        once()
    print(f"rank {dist.get_rank()} finished", flush=True)
    dist.destroy_process_group()


def once() -> None:
    import polydist as pdist
    from polydist.collectives.recorder import RECORDER, as_dict

    busy_rank_1()
    dist.all_reduce(torch.ones(2))  # rank 0 waits here longer than the watchdog's interval, less than the timeout
    first = RECORDER.count
    with pdist.comms_profile(show=False) as prof:
        dist.all_reduce(torch.ones(256))
        pdist.all_reduce(torch.ones(256))
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        model(torch.ones(3, 4)).sum().backward()
        if dist.get_rank() == 0:
            dist.send(torch.ones(3), dst=1)
        else:
            dist.recv(torch.empty(3), src=0)
    if dist.get_rank() == 0:
        for record in RECORDER.records()[0]:
            if record[0] >= first:
                entry = as_dict(record)
                print("RECORD " + json.dumps({k: entry[k] for k in ("collective", "seq", "op", "shapes", "state", "file", "line")}))
        for row in prof.as_dict()["rows"]:
            print("ROW " + json.dumps(row))


if __name__ == "__main__":
    main(sys.argv[1])
