"""Gradient averaging of a many-tensor model: one coalesced call vs one call per parameter.

The model is ``nn.Sequential`` of ``--layers`` ``nn.Linear(width, width)``
(2 parameter tensors per layer: 100 tensors for the default 50 layers), for
each width in ``--widths``. Gradients come from one backward pass; one
timed call averages all of them across ranks, in place:

* "polydist coalesced": ``polydist.all_reduce(grads, op="AVG")``, a list of
  tensors in one call. Where this polydist does not take a list yet, labelled
  "polydist flat (fallback)": ``_flatten_dense_tensors`` + one
  ``polydist.all_reduce(flat, op="AVG")`` + copy back;
* "polydist per-param": ``for g in grads: polydist.all_reduce(g, op="AVG")``;
* "torch per-param": the same with raw torch.distributed (SUM and divide on
  backends without a native AVG, as polydist does);
* "torch flat": flatten + one raw all_reduce + divide + copy back.

``size`` is the bytes of all gradients. The coalesced result is checked once.
Target (issue 3): polydist per-param / coalesced >= 10.

    polydist run --nproc-per-node 2 --backend gloo benchmarks/grad_averaging.py \\
        [--json benchmarks/results/grad_averaging.json]
"""

from __future__ import annotations

from typing import Callable

import _common
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

import polydist as pd
from polydist.bench.records import Record
from polydist.bench.timing import measure_many


def _gradients(layers: int, width: int, device: torch.device) -> list[torch.Tensor]:
    """Gradients of a seeded ``layers`` × Linear(width, width) model after one backward pass (same on every rank)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device)
    model(torch.randn(8, width, device=device)).square().mean().backward()
    return [p.grad for p in model.parameters()]


def _flat(grads: list[torch.Tensor], all_reduce_avg: Callable[[torch.Tensor], None]) -> Callable[[], None]:
    """Average ``grads`` through one flat buffer reduced by ``all_reduce_avg``, then copied back."""

    def fn() -> None:
        flat = _flatten_dense_tensors(grads)
        all_reduce_avg(flat)
        for g, avg in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(avg)

    return fn


def _torch_avg(world: int) -> Callable[[torch.Tensor], None]:
    if dist.get_backend() == "nccl":
        return lambda t: dist.all_reduce(t, op=dist.ReduceOp.AVG)

    def avg(t: torch.Tensor) -> None:
        dist.all_reduce(t)
        t.div_(world)

    return avg


def _coalesced(grads: list[torch.Tensor]) -> tuple[str, Callable[[], None]]:
    """polydist's list all_reduce when it exists (probed with one call), else the flatten fallback."""
    probe = [g.clone() for g in grads]
    try:
        pd.all_reduce(probe, op="AVG")
    except (TypeError, ValueError) as exc:
        why = f"{type(exc).__name__}: {str(exc)[:80]}..."
        _common.log(f"note: polydist.all_reduce does not take a list of tensors here ({why}); using flatten fallback")
        return "polydist flat (fallback)", _flat(grads, lambda t: pd.all_reduce(t, op="AVG"))
    return "polydist coalesced", lambda: pd.all_reduce(grads, op="AVG")


def main() -> None:
    p = _common.parser(__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=50, help="Linear layers (2 parameter tensors each)")
    p.add_argument("--widths", default="16,64,256", help="comma-separated layer widths, one table row each")
    args = p.parse_args()
    _common.setup(args)
    world, device = pd.get_world_size(), pd.device()
    torch_avg = _torch_avg(world)
    widths = [int(w) for w in ("64" if args.quick else args.widths).split(",")]
    records = []
    for width in widths:
        grads = _gradients(args.layers, width, device)
        expected = [g.clone() for g in grads]  # the same on every rank, so the average equals it
        coalesced_label, coalesced = _coalesced(grads)
        coalesced()
        right = _common.check(coalesced_label, all(torch.allclose(g, e) for g, e in zip(grads, expected)), True)

        def per_param(avg: Callable[[torch.Tensor], None], grads: list = grads) -> Callable[[], None]:
            def fn() -> None:
                for g in grads:
                    avg(g)

            return fn

        fns = {
            coalesced_label: coalesced,
            "polydist per-param": per_param(lambda t: pd.all_reduce(t, op="AVG")),
            "torch per-param": per_param(torch_avg),
            "torch flat": _flat(grads, torch_avg),
        }
        times = measure_many(fns, **_common.timing(args))
        size = sum(g.nbytes for g in grads)
        for label, t in times.items():
            records.append(
                Record.from_timing(
                    "all_reduce", label, t, size=size, dtype="float32", count=size // 4,
                    case=f"{len(grads)} tensors, width {width}", wrong=label == coalesced_label and not right,
                    tensors=len(grads), layers=args.layers, width=width,
                )
            )
    _common.report(
        records, args, title="gradient averaging: coalesced vs per-parameter", reference=records[0].implementation
    )
    _common.finish()


if __name__ == "__main__":
    main()
