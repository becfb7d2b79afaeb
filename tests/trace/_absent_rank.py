"""A plain torch.distributed job on gloo in which rank 1 goes away (tests/trace/test_absent_rank.py).

``python _absent_rank.py kill|stop`` under ``polydist run --nproc-per-node 2``: every rank all-reduces once a
step; at step ``STEP`` rank 1 SIGKILLs or SIGSTOPs itself, so rank 0 waits in all_reduce #STEP+1 on gloo until
the peer's death (or gloo's timeout, ``$HANG_TIMEOUT`` s) ends it. No polydist call.
"""

import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

STEP = 3


def main(mode: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get("HANG_TIMEOUT", "5"))))
    t = torch.ones(4)
    for step in range(2 * STEP):
        if dist.get_rank() == 1 and step == STEP:
            os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
        dist.all_reduce(t)  # THE CALL
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
