"""PyTorch's own distributed test suite on polydist's MPI backend, with gloo as the reference in the same run.

The suite is ``DistributedTest._DistTestBase`` from
``torch.testing._internal.distributed.distributed_test``, which ships in the
wheel; it runs unmodified, 3 ranks under ``mpiexec`` (PyTorch's MPI setting),
each test with TestDistBackend's set-up (``torch_suite/rank.py``). Backends:

* ``gloo``: the reference.
* ``mpi4py``: polydist's backend under its own name. The suite does not know
  the name, so its rules skip what they reserve for named backends.
* ``mpi``: the same ProcessGroup as torch's ``"mpi"`` backend (stock wheels
  lack it; polydist provides it): the suite applies its MPI rules (profiler
  events, all-to-all, groups, DDP ``no_sync``, ...).
* ``mpi4py-as-gloo``: tests the suite reserves for gloo whose semantics are
  backend-neutral (object collectives, coalesced all-reduce,
  ``batch_isend_irecv``, ...), run on the mpi4py group with the suite's gloo
  rules (``GLOO_RESERVED``).

Every test must pass or be skipped by the suite's own rules; the driver
excludes none. What gloo runs and polydist does not is listed, with the
reason, in ``GLOO_ONLY``. A test passes when it passes on every rank; a
rank that stops making progress for ``STALL`` seconds fails the test it is in
and the job goes on from the next one.

``make test`` runs the suite on ``mpi`` and ``mpi4py-as-gloo``, polydist's
own configurations (about 1 minute on 2 cores; tests skipped by a decorator
of the suite are judged without starting a group); ``make test-heavy`` runs
all four and checks polydist against gloo side by side (about 3 minutes).
Side-by-side counts and every failure: ``python
tests/third_party/test_torch_suite.py`` (``--backend NAME`` and test names to
narrow it).
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "torch_suite", "rank.py")
WORLD_SIZE = 3
STALL = 90  # seconds without a finished test on some rank: that rank is stuck

BACKENDS = ("gloo", "mpi4py", "mpi")

# Tests the suite's rules reserve for gloo whose semantics do not depend on the backend.
GLOO_RESERVED = (
    "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",
    *(f"test_all_reduce_coalesced_{g}{op}" for g in ("", "full_group_") for op in ("sum", "product", "min", "max")),
    "test_all_gather_coalesced_simple", "test_all_gather_coalesced_complex",
    "test_all_gather_coalesced_full_group", "test_all_gather_coalesced_with_empty",
    "test_all_gather_object_default_pg", "test_all_gather_object_subgroup", "test_scatter_object_list",
    "test_grads_same_across_ranks_with_no_sync", "test_DistributedDataParallel_requires_grad",
)

# Tests the suite reserves for gloo that are not run on polydist with gloo's rules, with the reason.
GLOO_ONLY = {
    "test_sparse_all_reduce_sum": "sparse tensors: only gloo implements a sparse all-reduce (PyTorch's MPI backend "
    "neither); the mpi4py backend rejects them",
    "test_barrier_timeout_global": "per-call timeouts: a blocking MPI collective cannot be abandoned (the MPI "
    "standard has no cancel for collectives); polydist's own collectives name the ranks that did not arrive and "
    "end the job with MPI_Abort instead",
    "test_barrier_timeout_full_group": "per-call timeouts, as test_barrier_timeout_global",
    "test_monitored_barrier_gloo": "torch.distributed.monitored_barrier itself refuses any backend but gloo",
    "test_monitored_barrier_gloo_subgroup": "as test_monitored_barrier_gloo",
    "test_monitored_barrier_gloo_rank_0_timeout": "as test_monitored_barrier_gloo",
}


def suite_file() -> str:
    import torch

    return os.path.join(os.path.dirname(torch.__file__), "testing", "_internal", "distributed", "distributed_test.py")


def all_tests() -> list[str]:
    """The ``test_*`` methods of ``_DistTestBase``, read from the source (importing it needs ``BACKEND`` set)."""
    tree = ast.parse(open(suite_file()).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "_DistTestBase":
            return [f.name for f in node.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")]
    raise RuntimeError("no _DistTestBase in " + suite_file())


def _mpiexec() -> str:
    return os.path.join(os.path.dirname(sys.executable), "mpiexec")


def _read(out_dir: str) -> list[dict]:
    """Per rank, ``{test: record}`` of the tests it finished."""
    ranks = []
    for r in range(WORLD_SIZE):
        done = {}
        try:
            with open(os.path.join(out_dir, f"rank{r}.jsonl")) as f:
                for line in f:
                    if line.endswith("\n"):
                        rec = json.loads(line)
                        done[rec["test"]] = rec
        except FileNotFoundError:
            pass
        ranks.append(done)
    return ranks


def run_suite(backend: str, tests: list[str], out_dir: str, rules: str | None = None) -> dict:
    """``{test: (outcome, detail)}``: each test on ``backend``, ``rules`` the BACKEND the suite judges by."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(BACKEND=rules or backend, POLYDIST_SUITE_GROUP=backend, WORLD_SIZE=str(WORLD_SIZE),
               INIT_METHOD=f"file://{out_dir}/shared_init_file", PYTHONWARNINGS="ignore")
    results: dict = {}
    remaining = list(tests)
    attempt = 0
    while remaining:
        attempt += 1
        job_dir = os.path.join(out_dir, f"job{attempt}")
        os.makedirs(job_dir)
        log = open(os.path.join(job_dir, "output.txt"), "w")
        proc = subprocess.Popen([_mpiexec(), "-n", str(WORLD_SIZE), sys.executable, RANK_SCRIPT, job_dir, *remaining],
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        last, seen = time.monotonic(), 0
        while proc.poll() is None:
            time.sleep(0.5)
            count = sum(len(r) for r in _read(job_dir))
            if count != seen:
                last, seen = time.monotonic(), count
            elif time.monotonic() - last > STALL:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        ranks = _read(job_dir)
        for name in list(remaining):
            recs = [r.get(name) for r in ranks]
            if all(recs):
                results[name] = _combine(recs)
                remaining.remove(name)
                continue
            missing = [i for i, rec in enumerate(recs) if rec is None]
            how = "stuck" if proc.returncode == -signal.SIGKILL else f"job ended (exit {proc.returncode})"
            results[name] = ("failed", f"ranks {missing} never finished it: {how}; see {job_dir}/output.txt")
            remaining.remove(name)
            break
    return results


def _combine(recs: list[dict]) -> tuple[str, str]:
    outcomes = [rec["outcome"] for rec in recs]
    for want in ("failed", "skipped"):
        if want in outcomes:
            rank = outcomes.index(want)
            return want, f"rank {rank}: {recs[rank]['detail']}"
    return "passed", ""


def run_all(tests: list[str], root: str, backends: tuple[str, ...] = BACKENDS) -> dict:
    """``{config: {test: (outcome, detail)}}`` for ``backends`` (gloo, mpi4py, mpi) and mpi4py-as-gloo."""
    out = {backend: run_suite(backend, tests, os.path.join(root, backend)) for backend in backends}
    reserved = [t for t in tests if t in GLOO_RESERVED]
    if reserved:
        out["mpi4py-as-gloo"] = run_suite("mpi4py", reserved, os.path.join(root, "as-gloo"), rules="gloo")
    return out


def table(results: dict) -> str:
    lines = [f"{'config':<16} {'passed':>7} {'failed':>7} {'skipped':>8}"]
    for config, res in results.items():
        c = Counter(outcome for outcome, _ in res.values())
        lines.append(f"{config:<16} {c['passed']:>7} {c['failed']:>7} {c['skipped']:>8}")
    return "\n".join(lines)


def _failures(results: dict) -> dict:
    return {f"{config} {name}": detail[-1500:] for config, res in results.items()
            for name, (outcome, detail) in res.items() if outcome == "failed"}


def _check_polydist(results: dict) -> None:
    assert _failures(results) == {}
    # The suite really ran on the MPI rules: profiler-checked collectives, all-to-all, groups.
    for t in ("test_all_reduce_sum", "test_send_recv_torch_profiler", "test_all_to_all", "test_ddp_logging_data_cpu",
              "test_all_reduce_group_sum"):
        assert results["mpi"][t][0] == "passed", t
    assert all(results["mpi4py-as-gloo"][t][0] == "passed" for t in GLOO_RESERVED)


@pytest.mark.timeout(600)
def test_pytorch_distributed_suite_on_polydist(tmp_path):
    results = run_all(all_tests(), str(tmp_path), backends=("mpi",))
    print("\n" + table(results))
    _check_polydist(results)


@pytest.mark.heavy
@pytest.mark.timeout(900)
def test_pytorch_distributed_suite_side_by_side_with_gloo(tmp_path):
    tests = all_tests()
    results = run_all(tests, str(tmp_path))
    print("\n" + table(results))
    _check_polydist(results)
    gloo, mpi = results["gloo"], results["mpi"]
    # What gloo passes, polydist passes as "mpi", or as-gloo, or it is listed with its reason.
    assert [t for t in tests if gloo[t][0] == "passed" and mpi[t][0] != "passed"
            and results["mpi4py-as-gloo"].get(t, ("",))[0] != "passed" and t not in GLOO_ONLY] == []


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, help="one backend only")
    parser.add_argument("--json", help="write every outcome here")
    parser.add_argument("tests", nargs="*")
    args = parser.parse_args()
    names = args.tests or all_tests()
    root = tempfile.mkdtemp(prefix="polydist-torch-suite-")
    start = time.monotonic()
    if args.backend:
        results = {args.backend: run_suite(args.backend, names, os.path.join(root, args.backend))}
    else:
        results = run_all(names, root)
    for config, res in results.items():
        for name, (outcome, detail) in sorted(res.items()):
            if outcome == "failed":
                print(f"--- {config} {name}\n{detail[-1500:]}\n")
    print(table(results))
    print(f"{len(names)} tests, {time.monotonic() - start:.0f} s; logs in {root}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
