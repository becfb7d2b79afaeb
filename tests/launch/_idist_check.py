"""ignite's ``check_idist_parallel.py`` flow on polydist's public API, for ``test_idist_launch_forms.py``.

Same options and body as ignite's script (``tests/third_party/ignite/tests/ignite/distributed/``), less its
last check, which reads ignite's private ``_model``: each rank all-reduces its rank, checks the sum and its
local rank, and prints one line that the test reads.
"""

import argparse
import sys
import time

import torch

import polydist as idist


def training(local_rank, config, **kwargs):
    time.sleep(idist.get_rank() * 0.1)
    t = idist.all_reduce(torch.tensor([idist.get_rank()], device=idist.device())).item()
    ws = idist.get_world_size()
    assert t == ws * (ws - 1) / 2, f"{t} vs {ws}"
    assert local_rank == idist.get_local_rank()
    # One write of the whole line: print writes the text and its newline apart, and two ranks sharing the
    # launcher's stdout then ran their lines together ("...backend=gloorank 2 of 4: ...").
    sys.stdout.write(f"rank {idist.get_rank()} of {ws}: node {idist.get_node_rank()} local rank {local_rank} "
                     f"sum {t} config {config} kwargs {kwargs} - backend={idist.backend()}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    parser = argparse.ArgumentParser("Check polydist.Parallel as ignite's check_idist_parallel.py")
    for name, kind in (("backend", str), ("nproc_per_node", int), ("nnodes", int), ("node_rank", int),
                       ("master_addr", str), ("master_port", str), ("init_method", str)):
        parser.add_argument(f"--{name}", type=kind, default=None)
    args = parser.parse_args()
    dist_config = dict(nproc_per_node=args.nproc_per_node, nnodes=args.nnodes, node_rank=args.node_rank,
                       master_addr=args.master_addr, master_port=args.master_port)
    if args.init_method is not None:
        dist_config["init_method"] = args.init_method
    with idist.Parallel(backend=args.backend, **dist_config) as parallel:
        parallel.run(training, {"model": "resnet18", "lr": 0.01}, a=1, b=2)
