"""A user's program, for tests/launch/test_hang_table.py: ``python _hang_scenario.py BACKEND PROGRAM FAULT PIDS``.

It never calls polydist's functions (it imports polydist, which serves torch's ``"mpi"`` on wheels without MPI
and, under plain ``mpiexec`` without ``MASTER_ADDR``, the ``mpi://`` rendezvous for gloo). PROGRAM: ``torch``
(``dist.all_reduce`` in a loop), ``ddp`` (DistributedDataParallel), ``fsdp2`` (``fully_shard``). At step 2,
rank 1 meets FAULT before the step's collectives: ``stall`` (sleeps in its forward pass), ``raise``, ``kill``
(SIGKILL to itself), ``freeze`` (SIGSTOP to itself). Each rank writes its pid into the folder PIDS, so that the
test can end whatever is left. The groups' timeout is 5 s.
"""

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

import polydist  # noqa: F401 - torch's "mpi" and the mpi:// rendezvous

backend, program, fault, pids = sys.argv[1:5]


def fault_of_rank_1(step: int) -> None:
    if dist.get_rank() != 1 or step != 2:
        return
    if fault == "stall":
        time.sleep(120)  # STALLS
    elif fault == "raise":
        raise RuntimeError("gives up at step 2")  # RAISES
    elif fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # KILLED
    elif fault == "freeze":
        os.kill(os.getpid(), signal.SIGSTOP)  # FROZEN


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.step = nn.Linear(8, 8), nn.Linear(8, 1), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if program == "ddp":
            fault_of_rank_1(self.step)  # in DDP's forward: the gradient all-reduce of the step waits for it
        return self.b(torch.relu(self.a(x)))


init = "mpi://" if backend == "gloo" and "MASTER_ADDR" not in os.environ else None  # plain mpiexec
dist.init_process_group(backend, init_method=init, timeout=timedelta(seconds=5))
with open(os.path.join(pids, str(os.getpid())), "w"):
    pass
net = Net()
if program == "ddp":
    model = nn.parallel.DistributedDataParallel(net)
elif program == "fsdp2":
    from torch.distributed.fsdp import fully_shard

    fully_shard(net.a)
    model = fully_shard(net)
else:
    model = net
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    net.step = step
    if program == "torch":
        fault_of_rank_1(step)
        dist.all_reduce(torch.ones(4))
        continue
    if program == "fsdp2":
        fault_of_rank_1(step)  # before the forward pass: its all-gather waits for it
    model(torch.ones(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
