"""A plain torch.distributed training job on gloo in which rank 1 stalls in its forward pass
(tests/trace/test_torch_hangs.py). It never calls polydist's collectives: DDP's and FSDP2's own do the talking.

``python _gloo_hang.py ddp|fsdp2`` under ``polydist run --nproc-per-node 2 --timeout T``: two training
steps on every rank, then a third in which rank 1 sleeps in forward for 120 s, so rank 0 waits in
DDP's gradient all_reduce (FSDP2: its next all-gather or reduce-scatter) until gloo's timeout ends it.
"""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 1)
        self.stall = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.stall:
            time.sleep(120)  # STALL: rank 1 stops here
        return self.b(torch.relu(h))


def main(mode: str) -> None:
    timeout = timedelta(seconds=float(os.environ["POLYDIST_TIMEOUT"]))
    dist.init_process_group("gloo", timeout=timeout)
    torch.manual_seed(0)
    net = Net()
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(net)
    else:
        from torch.distributed.fsdp import fully_shard

        fully_shard(net.a)
        fully_shard(net.b)
        model = fully_shard(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        net.stall = step == 2 and dist.get_rank() == 1
        loss = model(torch.ones(4, 8)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
