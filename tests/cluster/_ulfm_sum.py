"""One rank of a ULFM job spread over two hosts (tests/cluster/test_mpi_two_hosts.py): every rank all-reduces a
vector of ``rank + 1`` each step; rank ``--kill`` SIGKILLs itself before step ``--at``'s all-reduce. Each survivor
prints one ``ULFM {json}`` line: whether its all-reduce of that step failed, the vote on the step
(``MPI_Comm_agree``), the ranks lost in the shrink, and the first sum over the survivors afterwards."""

import argparse
import json
import os
import signal

import numpy as np
from mpi4py import MPI

from polydist.backends.mpi4py import ulfm

p = argparse.ArgumentParser()
p.add_argument("--kill", type=int, default=2)
p.add_argument("--at", type=int, default=20)
args = p.parse_args()
comm = MPI.COMM_WORLD.Dup()
comm.Set_errhandler(MPI.ERRORS_RETURN)
rank = comm.Get_rank()
record = {"rank": rank}
for step in range(args.at + 2):
    data = np.full(20000, rank + 1, dtype=np.float32)  # 80 KB: large enough for the hierarchical algorithms
    if step == args.at and rank == args.kill:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.Allreduce(MPI.IN_PLACE, data, op=MPI.SUM)
        failed = False
    except MPI.Exception:
        failed = True
    vote = ulfm.agree_bits(comm, 0 if failed else 1)
    if step == args.at:
        record.update(failed=failed, vote=vote)
    if not vote:
        comm, lost = ulfm.shrink(comm)
        record["lost"] = lost
    elif step == args.at + 1:
        record["sum"] = float(data[0]) if bool((data == data[0]).all()) else None
print("ULFM " + json.dumps(record), flush=True)
