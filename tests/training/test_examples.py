"""The examples as users run them: examples/collectives_tour.py and examples/ring_allreduce.py under `polydist run`.

The tour checks the seeds' results itself and exits 1 on a wrong one; these
tests also read the labelled lines, so that the printed results are the seeds'
(4 ranks: reduce of ones to rank 0 gives 4 there, all_reduce of rank+1 gives
10, scatter of [1, 2, 3, 4] gives rank+1, gather/all_gather of [rank] gives
[0, 1, 2, 3]; for n ranks the same formulas).
"""

import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

pytestmark = pytest.mark.timeout(180)

TOUR = os.path.join(ROOT, "examples", "collectives_tour.py")
RING = os.path.join(ROOT, "examples", "ring_allreduce.py")


def _launch(nproc, script, *args, env):
    out = subprocess.run(["polydist", "run", "--nproc-per-node", str(nproc), "--backend", "gloo", script, *args],
                         env=env, capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, f"exit code {out.returncode}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"
    return out.stdout


def _t(*values) -> str:
    """How the tour prints a float32 tensor of ``values``."""
    return " ".join(repr(torch.tensor(values, dtype=torch.float32)).split())


# ------------------------------------------------------------ collectives_tour.py


@pytest.mark.parametrize("n", [3, 4])
def test_collectives_tour_prints_the_seeds_results(n, cli_env):
    out = _launch(n, TOUR, env=cli_env)
    assert f"collectives tour: world size {n}, backend gloo" in out
    assert "WRONG" not in out
    assert f"all results as expected on {n} ranks" in out
    ranks = _t(*map(float, range(n)))  # [0., 1., ..., n-1]
    expected = [
        # seed 001: reduce of ones to rank 0 -> n there; polydist leaves the other inputs untouched
        f"rank 0: reduce(ones(1), dst=0) -> {_t(float(n))}",
        *(f"rank {r}: reduce(ones(1), dst=0) -> {_t(1.0)}" for r in range(1, n)),
        # seed 002: all_reduce of rank + 1 -> n(n+1)/2 (10 for 4 ranks); seed 001: ones -> n
        *(f"rank {r}: all_reduce(tensor([{r + 1}.]), op=SUM) -> {_t(n * (n + 1) / 2)}" for r in range(n)),
        *(f"rank {r}: all_reduce(ones(1), op=SUM) -> {_t(float(n))}" for r in range(n)),
        # seed 001: gather / all_gather of [rank] -> [0, ..., n-1]
        f"rank 0: gather(tensor([0.]), dst=0) -> {ranks}",
        *(f"rank {r}: gather(tensor([{r}.]), dst=0) -> None" for r in range(1, n)),
        *(f"rank {r}: all_gather(tensor([{r}.])) -> {ranks}" for r in range(n)),
        # seed 004: send/recv and isend/irecv of zeros + 1
        *(f"rank {r}: recv(zeros(1), src=0) -> {_t(1.0)}" for r in range(1, n)),
        *(f"rank {r}: irecv(zeros(1), src=0).wait() -> {_t(1.0)}" for r in range(1, n)),
        # seed 000 (idist values)
        *(f"rank {r}: all_reduce({r + 1}) -> {n * (n + 1) // 2}" for r in range(n)),
        *(f"rank {r}: all_gather({2.0 * r}) -> {[2.0 * i for i in range(n)]}" for r in range(n)),
        *(f"rank {r}: broadcast('hello from rank {r}', src=0) -> 'hello from rank 0'" for r in range(n)),
        # seed 004: new_group([0, 1])
        *(f"rank {r}: all_reduce(ones(1), group=new_group([0, 1])) -> {_t(2.0)}" for r in (0, 1)),
        # what polydist adds
        *(f"rank {r}: [polydist] recv(None, src=0) -> {{'to': {r}, 'msg': 'hello'" for r in range(1, n)),
        *(f"rank {r}: [polydist] all_gather(full(({r + 1}, 2), {r})).shape (uneven) -> ({n * (n + 1) // 2}, 2)"
          for r in range(n)),
        *(f"rank {r}: [polydist] scatter([dict per rank], src={n - 1}) -> {{'rank': {r}, 'task': 'part {r} of {n}'}}"
          for r in range(n)),
        *(f"rank {r}: [polydist] all_to_all(['{r}->0', ..., '{r}->{n - 1}']) -> {[f'{j}->{r}' for j in range(n)]}"
          for r in range(n)),
        "rank 0: [polydist] broadcast(16777217, src=0) (idist: 16777216.0) -> 16777217",
    ]
    missing = [line for line in expected if line not in out]
    assert not missing, "\n".join(["missing lines:", *missing, "--- stdout", out])
    # seed 001: scatter of [1, ..., n] from rank 0 -> rank + 1 (rank 0 passes the list, the others None)
    for r in range(n):
        assert re.search(rf"rank {r}: scatter\(.*, src=0\) -> {re.escape(_t(r + 1.0))}\n", out), out
    # every section's lines are there, in the seeds' order
    titles = ["send / recv", "isend / irecv", "== all_reduce", "== reduce", "== broadcast", "== all_gather",
              "== gather", "== scatter", "== reduce_scatter", "== all_to_all", "== barrier", "== groups",
              "ignite.distributed value examples"]
    positions = [out.find(title) for title in titles]
    assert -1 not in positions and positions == sorted(positions), list(zip(titles, positions))


def test_collectives_tour_needs_two_ranks(cli_env):
    out = subprocess.run([sys.executable, TOUR], env=cli_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "needs at least 2 ranks" in out.stderr


# ------------------------------------------------------------ ring_allreduce.py

_ROW = re.compile(
    r"all_reduce\s+65536\s+16384\s+float32"
    r"\s+(?P<t_ring>[\d.]+)\s+(?P<alg_ring>[\d.]+)\s+(?P<bus_ring>[\d.]+)"
    r"\s+(?P<t_ar>[\d.]+)\s+(?P<alg_ar>[\d.]+)\s+(?P<bus_ar>[\d.]+)\s+(?P<ratio>[\d.]+)\s*$",
    re.MULTILINE,
)


def test_ring_allreduce_matches_and_reports_busbw(cli_env):
    n = 3  # 64 KiB = 16384 floats: chunks of 5462, 5461, 5461
    out = _launch(n, RING, "--sizes", "64KiB", "--iters", "2", "--repeats", "2", "--warmup", "1", env=cli_env)
    assert f"[rank0]: ring all-reduce matches all_reduce on {n} ranks" in out
    assert "MISMATCH" not in out
    assert "ring (isend/recv)" in out and "polydist.all_reduce" in out and "busbw(GB/s)" in out
    rows = _ROW.findall(out)
    assert len(rows) == 1, out
    row = _ROW.search(out)
    for impl in ("ring", "ar"):
        t, alg, bus = (float(row[f"{k}_{impl}"]) for k in ("t", "alg", "bus"))
        assert t > 0
        assert alg == pytest.approx(65536 / (t * 1e-6) / 1e9, rel=0.02, abs=2e-4)  # GB/s = 1e9 B/s, time in µs
        assert bus == pytest.approx(alg * 2 * (n - 1) / n, rel=0.02, abs=2e-4)  # busbw factor of all_reduce


def test_ring_allreduce_check_only_with_uneven_chunks(cli_env):
    # 1000 B = 250 floats over 4 ranks (63, 63, 62, 62); the check also runs 1, 3, 5, 1001 elements and 3x7.
    out = _launch(4, RING, "--sizes", "1000B", "--check-only", env=cli_env)
    assert "ring all-reduce matches all_reduce on 4 ranks (float32 element counts: 1, 3, 5, 250, 1001, 3x7)" in out
    assert "busbw" not in out  # no timing
