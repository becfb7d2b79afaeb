"""One rank of PyTorch's own distributed test suite, run under ``mpiexec`` (driver: ``../test_torch_suite.py``).

``python rank.py OUT_DIR TEST [TEST ...]`` with ``BACKEND`` (gloo, mpi4py or
mpi), ``WORLD_SIZE`` and optionally ``POLYDIST_SUITE_GROUP`` set. The suite is
``torch.testing._internal.distributed.distributed_test.DistributedTest._DistTestBase``
from the installed wheel, unmodified. Each test gets what PyTorch's harness
(``TestDistBackend``) gives it: a fresh ``TEMP_DIR`` with its barrier
directory, a fresh ``file://`` init file, ``init_process_group`` with the
suite's timeout, the suite's file barrier before and after, and
``destroy_process_group`` after. The one difference: ``TestDistBackend``
forks one process per rank for every test, while here the ``mpiexec`` ranks
run the tests one after the other, as PyTorch's old ``TestMPI`` harness did
(an MPI job cannot fork its ranks). Each rank appends one JSON line per test
to ``OUT_DIR/rank<r>.jsonl``: ``{"test", "outcome": passed|failed|skipped,
"detail", "seconds"}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import unittest
from datetime import timedelta

RANK = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
os.environ["RANK"] = str(RANK)
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")

import torch.distributed as dist  # noqa: E402

import polydist  # noqa: E402,F401 - registers the mpi4py backend and torch's "mpi" on stock wheels
from torch.testing._internal.common_distributed import TEST_SKIPS  # noqa: E402
from torch.testing._internal.common_utils import TestCase  # noqa: E402
from torch.testing._internal.distributed import distributed_test as dt  # noqa: E402  (reads BACKEND)


# The backend of the groups; BACKEND is the one the suite's rules judge by (they differ only for
# the gloo-reserved tests run on the mpi4py group, see GLOO_RESERVED in the driver).
GROUP = os.environ.get("POLYDIST_SUITE_GROUP", dt.BACKEND)


class Case(dt.DistributedTest._DistTestBase, TestCase):
    """The suite's test base with TestDistBackend's per-test set-up, on an existing rank."""

    rank = RANK
    file_name = ""
    skip_return_code_checks: list = []

    @property
    def world_size(self) -> str:
        return os.environ["WORLD_SIZE"]

    @property
    def init_method(self) -> str:
        return f"{dt.FILE_SCHEMA}{self.file_name}"

    @property
    def destroy_pg_upon_exit(self) -> bool:
        return False

    def _callTestMethod(self, method):  # noqa: N802 - unittest's name
        # The suite skips some tests by exiting the rank with a code of TEST_SKIPS, which
        # MultiProcessTestCase reads from the forked process's exit code; here it is a skip.
        try:
            return super()._callTestMethod(method)
        except SystemExit as e:
            if e.code in SKIP_CODES:
                raise unittest.SkipTest(SKIP_CODES[e.code]) from None
            raise


SKIP_CODES = {skip.exit_code: skip.message for skip in TEST_SKIPS.values()}


def _outcome(result: unittest.TestResult) -> tuple[str, str]:
    if result.skipped:
        return "skipped", result.skipped[0][1]
    problems = result.errors + result.failures
    if problems:
        return "failed", problems[0][1][-4000:]
    if result.expectedFailures:
        return "passed", "expected failure"
    if result.unexpectedSuccesses:
        return "failed", "unexpected success"
    return "passed", ""


def _prepare(test_dir: str) -> None:
    """TestDistBackend.setUp's temp directories, made by rank 0 (the harness makes them in the parent)."""
    if RANK == 0:
        for sub in ("barrier", "test_dir", "init_dir"):
            os.makedirs(os.path.join(test_dir, sub))
        open(os.path.join(test_dir, "ready"), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(test_dir, "ready")):
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank 0 did not prepare {test_dir}")
        time.sleep(0.01)
    os.environ["TEMP_DIR"] = test_dir
    dt.Barrier.barrier_id = 0


def run_one(name: str, test_dir: str) -> tuple[str, str]:
    case = Case(name)
    method = getattr(case, name)
    if getattr(method, "__unittest_skip__", False):  # the suite's rule, decided at import: no group needed
        return "skipped", method.__unittest_skip_why__
    _prepare(test_dir)
    case.file_name = os.path.join(test_dir, "init_file")
    result = unittest.TestResult()
    try:
        timeout = timedelta(seconds=dt.CUSTOM_PG_TIMEOUT.get(name, dt.default_pg_timeout))
        dist.init_process_group(init_method=case.init_method, backend=GROUP,
                                world_size=int(case.world_size), rank=RANK, timeout=timeout)
        case._barrier()
        case.run(result)
        case._barrier()
    except Exception:  # the harness itself failed around the test
        return "failed", traceback.format_exc()[-4000:]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return _outcome(result)


def main(out_dir: str, names: list[str]) -> None:
    log = os.path.join(out_dir, f"rank{RANK}.jsonl")
    for name in names:
        start = time.monotonic()
        outcome, detail = run_one(name, os.path.join(out_dir, name))
        with open(log, "a") as f:
            f.write(json.dumps({"test": name, "outcome": outcome, "detail": detail,
                                "seconds": round(time.monotonic() - start, 2)}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
