"""Run by tests/backends/plugin/test_toy_backend.py under ``polydist run --backend toy`` (2 ranks)."""

import json
import os
import sys

import torch

import polydist as pdist

pdist.initialize()  # the backend comes from polydist run --backend toy
rank, out_dir = pdist.get_rank(), sys.argv[1]
seen = {"backend": pdist.backend(), "model_name": pdist.model_name(), "world": pdist.get_world_size()}
seen["sum"] = pdist.all_reduce(rank + 1)
seen["object"] = pdist.broadcast({"from": rank} if rank == 0 else None, src=0, safe_mode=True)
seen["gathered"] = pdist.all_gather(rank * 10)
group = pdist.new_group([0, 1])
seen["group_sum"] = pdist.all_reduce(torch.tensor([float(rank)]), group=group).tolist()
try:
    pdist.all_reduce(torch.ones(1), op="MAX")  # the toy entry refuses it: raised here, nothing sent
    seen["refused"] = None
except TypeError as exc:
    seen["refused"] = str(exc)
seen["dump"] = pdist.dump_trace(os.path.join(out_dir, f"dump{rank}"))
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(seen, f)
pdist.finalize()
