"""What polydist's codec costs against pickle for the values programs send (issue 51), in one process.

For each value, ``encode`` then ``decode`` (polydist.codec) against
``pickle.dumps`` then ``pickle.loads`` (protocol 5), alternately in rounds;
the table gives the median round-trip time of each and polydist/pickle.
Target: at most 2 for a dict of 100 floats and a dataclass of 10 fields.
Run from the repository root:

    python benchmarks/codec_types.py [--rounds 9] [--md benchmarks/results/codec_types.md]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime as dt
import decimal
import pickle
import sys
import typing

import torch

from codec_checks import medians, report  # the same alternating rounds as the codec's other benchmark
from polydist import codec


@codec.allow
@dataclasses.dataclass
class TenFields:
    loss: float = 0.3125
    accuracy: float = 0.91
    precision: float = 0.88
    recall: float = 0.87
    f1: float = 0.875
    lr: float = 3e-4
    epoch: int = 7
    step: int = 12000
    split: str = "validation"
    done: bool = False


@codec.allow
class Sample(typing.NamedTuple):
    index: int
    label: str
    weight: float


VALUES = {
    "dict of 100 floats": {f"metric_{i}": i / 7 for i in range(100)},
    "dataclass of 10 fields": TenFields(),
    "list of 100 named tuples": [Sample(i, f"class{i % 10}", i / 3) for i in range(100)],
    "dict of 20 datetimes": {i: dt.datetime(2026, 11, 29, 9, i, tzinfo=dt.timezone.utc) for i in range(20)},
    "20 Decimals": [decimal.Decimal(f"{i}.{i:04d}") for i in range(20)],
    "OrderedDict of 10 tensors (4 KiB)": collections.OrderedDict((f"w{i}", torch.ones(1024)) for i in range(10)),
}
TARGETS = {"dict of 100 floats": 2.0, "dataclass of 10 fields": 2.0}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--md")
    args = parser.parse_args(argv)
    lines = [
        f"`python benchmarks/codec_types.py --rounds {args.rounds}`",
        "",
        f"torch {torch.__version__}, Python {sys.version.split()[0]}; encode+decode vs pickle.dumps+loads, "
        "median of the rounds; target: polydist/pickle ≤ 2 where a target is given",
        "",
        "| value | polydist bytes | pickle bytes | pickle µs | polydist µs | polydist/pickle | target |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, value in VALUES.items():
        got = medians({
            "polydist": lambda: codec.decode(codec.encode(value)),
            "pickle": lambda: pickle.loads(pickle.dumps(value, protocol=5)),
        }, args.rounds)
        p, c = got["pickle"], got["polydist"]
        target = TARGETS.get(name)
        verdict = "" if target is None else f"≤ {target:g}: {'met' if c / p <= target else 'NOT met'}"
        lines.append(
            f"| {name} | {len(codec.encode(value))} | {len(pickle.dumps(value, protocol=5))} | {p * 1e6:.1f} | "
            f"{c * 1e6:.1f} | {c / p:.2f} | {verdict} |"
        )
    report(lines, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
