"""A rank that all-reduces in a loop for ``--seconds`` (the dropped-link job): rank 0 touches ``--ready`` after
a few steps so that the test knows the world runs, then the test takes a host's link down. Collectives time
out after ``--timeout`` seconds (``polydist.initialize(timeout=...)``), and the error names the ranks that did
not arrive."""

import argparse
import pathlib
import time

import torch

import polydist as pdist

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="gloo")
parser.add_argument("--timeout", type=float, required=True)
parser.add_argument("--ready", required=True)
parser.add_argument("--seconds", type=float, default=120)
args = parser.parse_args()
pdist.initialize(args.backend, timeout=args.timeout)
end, step = time.monotonic() + args.seconds, 0
while time.monotonic() < end:
    assert pdist.all_reduce(torch.ones(1024)).eq(pdist.get_world_size()).all()
    step += 1
    if step == 5 and pdist.get_rank() == 0:
        pathlib.Path(args.ready).touch()
    time.sleep(0.1)
pdist.finalize()
