"""examples/train_digits.py with an exception raised at one step: the in-process half of benchmarks/fault_tolerant.py.

    FT_RAISE=RANK:STEP polydist run --fault-tolerant --nproc-per-node 4 benchmarks/_ft_faulty_train.py --epochs 10

Runs the example's ``main`` unchanged, with ``polydist.auto_optim`` wrapped so
that the optimizer of job rank RANK (``fault_tolerance().rank`` under
``--fault-tolerant``, else ``get_rank()``) raises a ``RuntimeError`` at its
STEP-th ``step`` call, on the job's first start only (``restart_count() == 0``).
Before raising it prints ``fault: raise at step STEP`` on stdout.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import polydist as pdist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _faulty_train import load_example  # noqa: E402


def faulty(auto_optim: Any) -> Any:
    spec = os.environ.get("FT_RAISE", "")

    @functools.wraps(auto_optim)
    def wrapped(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        optim = auto_optim(optimizer, *args, **kwargs)
        if not spec or pdist.restart_count():
            return optim
        rank, at = map(int, spec.split(":"))
        ft = pdist.fault_tolerance()
        if (ft.rank if ft is not None else pdist.get_rank()) != rank:
            return optim
        calls, step = [0], optim.step

        def counted(*a: Any, **k: Any) -> Any:
            calls[0] += 1
            if calls[0] == at:
                print(f"fault: raise at step {at}", flush=True)
                raise RuntimeError(f"injected fault at step {at}")
            return step(*a, **k)

        optim.step = counted
        return optim

    return wrapped


if __name__ == "__main__":
    example = load_example()
    example.pdist.auto_optim = faulty(example.pdist.auto_optim)
    sys.exit(example.main())
