"""examples/train_digits.py with faults raised inside its training loop: the in-process half of benchmarks/fault.py.

    FAULT_PLAN='[{"run": 0, "rank": 1, "kind": "exception", "epoch": 3, "fraction": 0.5}]' \\
        polydist run --max-restarts 3 --nproc-per-node 2 benchmarks/_faulty_train.py --checkpoint ckpt.pt

Runs the example's ``main`` unchanged, with its two epoch functions
(``train_epoch``, ``train_epoch_ddp``) wrapped. ``$FAULT_PLAN`` is a JSON list
of faults; one fires in the run of the job whose ``polydist.restart_count()``
is ``run``, on global rank ``rank``, in the ``epoch``-th epoch that run trains
(0: its first, whatever epoch it resumed from), just before the optimizer step
of step ``int(fraction * steps per epoch)``. ``kind`` is ``exception`` (a
``RuntimeError`` raised there) or ``exit`` (``sys.exit(3)`` there); other kinds
(the signals benchmarks/fault.py sends from outside) are ignored here. Before
failing, the rank prints ``fault: KIND in run R, epoch offset D, step S of N``
on stdout, which benchmarks/fault.py timestamps as the moment of the fault.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
import json
import math
import os
import sys
from typing import Any, Callable, Iterator

import polydist as pdist

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "train_digits.py")
PLAN_VARIABLE = "FAULT_PLAN"
IN_PROCESS_KINDS = ("exception", "exit")
EXIT_CODE = 3


def load_example() -> Any:
    """examples/train_digits.py as a module (not run: its ``main`` is called below)."""
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def my_faults() -> dict[int, dict]:
    """This process's in-process faults from ``$FAULT_PLAN``, by the epoch offset they fire in (after initialize)."""
    run, rank = pdist.restart_count(), pdist.get_rank()
    plan = json.loads(os.environ.get(PLAN_VARIABLE, "[]"))
    return {
        f["epoch"]: f for f in plan if f["run"] == run and f["rank"] == rank and f["kind"] in IN_PROCESS_KINDS
    }


def fail(fault: dict, step: int, steps: int) -> None:
    """Announce the fault on stdout, then raise or exit as ``fault["kind"]`` says."""
    what = f"{fault['kind']} in run {fault['run']}, epoch offset {fault['epoch']}, step {step} of {steps}"
    print(f"fault: {what}", flush=True)
    if fault["kind"] == "exit":
        sys.exit(EXIT_CODE)
    raise RuntimeError(f"injected fault: {what}")


@contextlib.contextmanager
def failing_at_step(optimizer: Any, fault: dict, steps: int) -> Iterator[None]:
    """Within the block, ``optimizer.step`` fails (:func:`fail`) at its call number ``fraction * steps``."""
    target = min(int(fault["fraction"] * steps), steps - 1)
    calls = itertools.count()
    step = optimizer.step

    def counted(*args: Any, **kwargs: Any) -> Any:
        n = next(calls)
        if n == target:
            fail(fault, n, steps)
        return step(*args, **kwargs)

    optimizer.step = counted  # an instance attribute, over the class's method
    try:
        yield
    finally:
        optimizer.step = step


def with_faults(train: Callable, steps_of: Callable[..., int], epochs: Iterator[int]) -> Callable:
    """``train(model, optimizer, ...)`` (one epoch) that fails where a fault of :func:`my_faults` is due.

    ``epochs`` counts the epochs this process trains (shared by both wrapped functions); ``steps_of(*args)``
    is the number of optimizer steps of the epoch.
    """

    @functools.wraps(train)
    def wrapped(model: Any, optimizer: Any, *args: Any) -> Any:
        fault = my_faults().get(next(epochs))
        if fault is None:
            return train(model, optimizer, *args)
        with failing_at_step(optimizer, fault, steps_of(*args)):
            return train(model, optimizer, *args)

    return wrapped


def main() -> int:
    example = load_example()
    epochs = itertools.count()
    # train_epoch(model, optimizer, x, y, global_batch, seed); train_epoch_ddp(model, optimizer, loader)
    example.train_epoch = with_faults(
        example.train_epoch, lambda x, y, batch, seed: math.ceil(len(x) / batch), epochs
    )
    example.train_epoch_ddp = with_faults(example.train_epoch_ddp, lambda loader: len(loader), epochs)
    return example.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
