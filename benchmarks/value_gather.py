"""all_gather of Python values: polydist vs torch.distributed.all_gather_object vs ignite.distributed.all_gather.

Values: ASCII strings of the given sizes (different on each rank), a float, and
a small dict like a training log entry. ``size`` is the gathered payload,
world size × the value's nominal bytes (a string's UTF-8 length, 8 for a
float, a dict's JSON length); bandwidths are only indicative here, the times
are what matters. Each implementation's result is checked once against the
expected list; a mismatch is printed and flagged "wrong". ignite must find
the process group polydist created (checked); a value it cannot gather is
recorded as failed. Targets (issue 3): values up to 1 KiB >= 2x faster than
ignite (ignite/polydist >= 2), not slower at 1 MiB.

    polydist run --nproc-per-node 2 --backend gloo benchmarks/value_gather.py \\
        [--json benchmarks/results/value_gather.json]
"""

from __future__ import annotations

import json
from typing import Any, Callable

import _common
import torch.distributed as dist

import polydist as pd
from polydist.bench.records import Record
from polydist.bench.timing import measure_many


def _ignite() -> Any:
    """``ignite.distributed``, or None (with a note) when missing or not on polydist's process group."""
    try:
        import ignite
        import ignite.distributed as idist
    except ImportError:
        _common.log("note: pytorch-ignite is not installed; skipping it")
        return None
    found = (idist.get_world_size(), idist.backend(), idist.get_rank())
    if found != (pd.get_world_size(), pd.backend(), pd.get_rank()):
        _common.log(f"note: ignite sees (world size, backend, rank) = {found}, not polydist's; skipping it")
        return None
    _common.log(f"ignite {ignite.__version__} joined the existing group: world size {found[0]}, backend {found[1]}")
    return idist


def _torch_gather_object(value: Any) -> list:
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _values(sizes: list[int], rank: int) -> list[tuple[str, Callable[[int], Any], int]]:
    """(type label, value of a given rank, nominal bytes) for each value to gather."""
    out: list[tuple[str, Callable[[int], Any], int]] = [
        ("str", lambda r, n=n: chr(ord("a") + r % 26) * n, n) for n in sizes
    ]
    out.append(("float", lambda r: 0.1 * (r + 1), 8))
    entry = lambda r: {"loss": 0.1 * (r + 1), "step": 3, "name": "x"}  # noqa: E731
    out.append(("dict", entry, len(json.dumps(entry(rank)))))
    return out


def main() -> None:
    p = _common.parser(
        __doc__.split("\n")[0],
        sizes="16,256,1KiB,64KiB,1MiB",
        quick_sizes="16,1KiB",
        sizes_help="string lengths in bytes (a float and a dict are always added)",
    )
    args = p.parse_args()
    _common.setup(args)
    rank, world = pd.get_rank(), pd.get_world_size()
    impls: dict[str, Callable[[Any], Any]] = {"polydist": pd.all_gather, "torch": _torch_gather_object}
    idist = _ignite()
    if idist is not None:
        impls["ignite"] = idist.all_gather
    records = []
    for dtype, make, nbytes in _values(_common.sizes(args), rank):
        value, expected = make(rank), [make(r) for r in range(world)]
        fns = {label: (lambda f=f, v=value: f(v)) for label, f in impls.items()}
        right = {}
        for label, fn in fns.items():  # one untimed call each, same order on every rank
            try:
                right[label] = _common.check(f"{label} ({dtype}, {nbytes} B)", list(fn()), expected)
            except Exception:  # noqa: BLE001 - measure_many below records the failure
                right[label] = True
        times = measure_many(fns, **_common.timing(args))
        for label, t in times.items():
            records.append(
                Record.from_timing("all_gather", label, t, size=world * nbytes, dtype=dtype, wrong=not right[label])
            )
    _common.report(records, args, title="all_gather of Python values", reference="polydist")
    _common.finish()


if __name__ == "__main__":
    main()
