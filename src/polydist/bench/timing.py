"""The timing harness of collective benchmarks: interleaved candidates, repeated blocks, the max over ranks.

Its one job is to time zero-argument callables on every rank
(:func:`measure_many`, :func:`measure`), one :class:`Timing` each, for the
scripts in ``benchmarks/`` and for ``polydist bench``. It talks to
``torch.distributed`` directly (a barrier before each timed block and one MAX
all-reduce of the times at the end) so it measures polydist without
depending on it; with no process group (serial, world size 1) it times
locally. Times are in **seconds**, as nccl-tests takes them: the mean time of
one call over ``iters`` back-to-back calls, the maximum over ranks (the
collective is as slow as its slowest rank), then the median over ``repeats``
such blocks. Sizes and bandwidths are in :mod:`polydist.units`;
records, tables and results files in :mod:`polydist.bench.records`.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch
import torch.distributed as dist

from ..backends import registry

__all__ = ["Timing", "measure", "measure_many"]


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one callable, one value per repeat, each the max over ranks.

    ``error`` is set (and ``per_repeat_s`` empty) when the callable raised.
    """

    per_repeat_s: tuple = ()
    iters: int = 0
    warmup: int = 0
    error: Optional[str] = None

    @property
    def median_s(self) -> Optional[float]:
        """Median over repeats of the per-call time, seconds (None when failed)."""
        return statistics.median(self.per_repeat_s) if self.per_repeat_s else None

    @property
    def min_s(self) -> Optional[float]:
        """Fastest repeat's per-call time, seconds (None when failed)."""
        return min(self.per_repeat_s) if self.per_repeat_s else None


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _nccl(group: Any) -> bool:
    return _distributed() and registry.get(str(dist.get_backend(group))) is registry.NCCL


def _max_over_ranks(values: list[float], group: Any) -> list[float]:
    """Element-wise MAX over the ranks of ``group``, through raw torch.distributed (float64)."""
    if not _distributed() or not values:
        return values
    device = torch.device("cuda", torch.cuda.current_device()) if _nccl(group) else torch.device("cpu")
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.cpu().tolist()


def measure_many(
    fns: Mapping[str, Callable[[], Any]],
    *,
    iters: Optional[int] = None,
    warmup: int = 3,
    repeats: int = 5,
    target_s: float = 0.05,
    max_iters: int = 10_000,
    group: Any = None,
    sync: Optional[Callable[[], None]] = None,
    catch: bool = False,
    local: bool = False,
) -> dict[str, Timing]:
    """Time several callables against each other, interleaving their repeats.

    Every rank must call this with the same ``fns`` keys (in the same order)
    and arguments. Per callable: barrier, ``warmup`` untimed calls (timed
    singly only to choose ``iters``). Then ``repeats`` rounds, each timing
    every callable in turn (round ``r`` starts with callable ``r mod k``):
    barrier, ``iters`` back-to-back calls between two ``time.perf_counter()``
    reads, per-call mean. Interleaving spreads slow drifts of the machine
    (other load, clock changes) over all callables alike, and rotating the
    order keeps any one from always going first, so their ratios are fair. Last, one MAX all-reduce over the ranks
    of ``group`` (raw torch.distributed) makes the results the same on every
    rank.

    Args:
        fns: label → zero-argument callable running one operation (e.g. one
            collective call on a preallocated tensor).
        iters: calls per timed block. None: per callable, enough for a block
            of about ``target_s`` seconds judging by the slowest rank's median
            warm-up call (1 to ``max_iters``).
        warmup: untimed calls before timing (at least 1 when ``iters`` is None).
        repeats: timed blocks per callable (>= 1).
        group: the process group to barrier and reduce over (None: world).
        sync: called after the calls, before reading the clock, to wait for
            asynchronous device work; default ``torch.cuda.synchronize`` with
            nccl, nothing otherwise.
        catch: record an exception of a callable as ``Timing.error`` and skip
            that callable from then on, instead of raising. Only safe when
            the failure happens on every rank alike (e.g. before any
            communication): a rank failing alone leaves the others waiting.
        local: time in this process only, even inside a job: no barriers,
            no reduction over ranks (e.g. a memory-bandwidth reference that
            one rank measures while the others wait).

    Returns:
        label → :class:`Timing`, the same on every rank. Serial (no process
        group): local times, no barriers.
    """
    if repeats < 1 or (iters is not None and iters < 1):
        raise ValueError(f"repeats and iters must be >= 1, got repeats={repeats}, iters={iters}")
    warmup = max(warmup, 1) if iters is None else warmup
    distributed = _distributed() and not local
    if sync is None and _nccl(group):
        sync = torch.cuda.synchronize
    labels = list(fns)
    errors: dict[str, str] = {}

    def over_ranks(values: list[float]) -> list[float]:
        return values if local else _max_over_ranks(values, group)

    def block(label: str, n: int) -> float:
        """Barrier, then mean seconds per call of ``n`` back-to-back calls; inf once the callable failed."""
        if distributed:
            dist.barrier(group=group)
        if label in errors:
            return math.inf
        try:
            t0 = time.perf_counter()
            for _ in range(n):
                fns[label]()
            if sync is not None:
                sync()
            return (time.perf_counter() - t0) / n
        except Exception as exc:  # noqa: BLE001 - recorded for the report
            if not catch:
                raise
            errors[label] = f"{type(exc).__name__}: {exc}"
            return math.inf

    estimates = [statistics.median([block(label, 1) for _ in range(warmup)]) if warmup else 0.0 for label in labels]
    counts = {}
    for label, est in zip(labels, over_ranks(estimates)):
        auto = math.ceil(target_s / est) if 0 < est < math.inf else max_iters
        counts[label] = iters if iters is not None else max(1, min(max_iters, auto))
    rounds = []
    for r in range(repeats):  # rotate who goes first, so no candidate always pays for leaving the barrier first
        order = labels[r % len(labels) :] + labels[: r % len(labels)]
        times = {label: block(label, counts[label]) for label in order}
        rounds.append([times[label] for label in labels])
    flat = over_ranks([t for row in rounds for t in row])
    results = {}
    for i, label in enumerate(labels):
        times = tuple(flat[r * len(labels) + i] for r in range(repeats))
        if label in errors or math.inf in times:
            results[label] = Timing((), counts[label], warmup, errors.get(label, "failed on another rank"))
        else:
            results[label] = Timing(times, counts[label], warmup)
    return results


def measure(fn: Callable[[], Any], **kwargs: Any) -> Timing:
    """Time one zero-argument callable on every rank; see :func:`measure_many` for the steps and arguments."""
    return measure_many({"": fn}, **kwargs)[""]

