"""What the hostile-bytes checks cost: codec round trips before and after them (issue 18), in one process.

``before`` is ``polydist/codec.py`` as of a git revision (default 20f086c: the
nested-extension codec without size or depth checks), loaded from
``git show``, with today's ``pickle_allowed`` lookup patched in (that one
read the environment per call, which issue 11 removed); ``after`` is the
installed one. For each value, both encode and
decode it alternately in rounds; the table gives the median round-trip time
and after/before. Run from the repository root:

    python benchmarks/codec_checks.py [--rev 20f086c] [--rounds 7] \\
        [--md benchmarks/results/codec_checks.md]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import timeit

import numpy as np
import torch

from polydist import codec as after
from polydist import settings


def _load_before(rev: str):
    source = subprocess.run(["git", "show", f"{rev}:src/polydist/codec.py"], check=True, capture_output=True, text=True).stdout
    source = source.replace("from .settings import pickle_allowed", "from polydist.settings import pickle_allowed")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("codec_before", f.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # 20f086c read POLYDIST_ALLOW_PICKLE from the environment on every call (issue 11 moved that into
    # polydist.settings); use today's lookup so the comparison isolates the format and the checks.
    module.pickle_allowed = settings.pickle_allowed
    return module


VALUES = {
    "float": 0.125,
    "metrics dict": {"loss": 0.25, "accuracy": 0.9, "epoch": 3, "lr": 1e-3},
    "1000 (int, str) tuples": [(i, f"item{i}") for i in range(1000)],
    "set of 1000 ints": set(range(1000)),
    "tensor 1 MiB": torch.zeros(2**18),
    "ndarray 1 KiB": np.zeros(128),
    "10 tensors 4 KiB": [torch.ones(1024) for _ in range(10)],
}


def medians(candidates: dict, rounds: int) -> dict:
    """Median seconds per call of each ``candidates[label]()`` (no arguments) over ``rounds`` rounds.

    A round times each candidate over the same number of calls (about 0.05 s of the first candidate),
    alternating which goes first, so that drifts of a shared machine hit them alike.
    """
    first = next(iter(candidates.values()))
    number = max(1, int(0.05 / max(timeit.timeit(first, number=1), 1e-7)))
    times = {label: [] for label in candidates}
    for r in range(rounds):
        order = list(candidates.items())
        for label, fn in order if r % 2 == 0 else order[::-1]:
            times[label].append(timeit.timeit(fn, number=number) / number)
    return {label: statistics.median(t) for label, t in times.items()}


def report(lines: list, md=None) -> None:
    """Print the table's ``lines``; also write them to the file ``md`` when given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if md:
        with open(md, "w") as f:
            f.write(text)


def _round_trip(codec, value):
    return lambda: codec.decode(codec.encode(value))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="20f086c")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--md")
    args = parser.parse_args(argv)
    before = _load_before(args.rev)
    lines = [
        f"`python benchmarks/codec_checks.py --rev {args.rev} --rounds {args.rounds}`",
        "",
        "| value | bytes | before µs | after µs | after/before |",
        "|---|---|---|---|---|",
    ]
    for name, value in VALUES.items():
        got = medians({"after": _round_trip(after, value), "before": _round_trip(before, value)}, args.rounds)
        b, a = got["before"], got["after"]
        lines.append(f"| {name} | {len(after.encode(value))} | {b * 1e6:.1f} | {a * 1e6:.1f} | {a / b:.2f} |")
    report(lines, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
