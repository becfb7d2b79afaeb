"""The tutorials' example scripts (docs/tutorials/), run the way the pages tell users to run them.

Each script checks its own results and exits 1 on a wrong one; these tests
assert exit status 0 and the lines the pages show. 2 ranks each (a 2-rank job
costs about 4-6 s on 2 cores).
"""

import glob
import os
import re
import subprocess
import sys

import pytest

from _world import mpi_job_env, mpiexec
from conftest import ROOT, _mpi_missing
from training.test_examples import _launch  # polydist run --nproc-per-node N --backend gloo, asserts exit 0

EXAMPLES = os.path.join(ROOT, "examples")
needs_mpi = pytest.mark.skipif(bool(_mpi_missing()), reason=_mpi_missing() or "mpi available")


def _script(name: str) -> str:
    return os.path.join(EXAMPLES, name)


def _run(cmd, env, timeout=100) -> str:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"exit code {out.returncode}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"
    return out.stdout


@pytest.mark.timeout(120)
def test_groups(cli_env):
    out = _launch(2, _script("groups.py"), env=cli_env)
    assert "groups: all results as expected on 2 ranks" in out
    assert "WRONG" not in out
    for r in (0, 1):
        assert f"rank {r}: all_reduce(ones(1), group=pair) -> tensor([2.])" in out
        assert f"rank {r}: broadcast(str, src={r}, group=[{r}]) -> from global rank {r}" in out
        assert f"rank {r}: all_reduce(group=[0, 0]) -> ValueError: group ranks must be distinct" in out


@pytest.mark.timeout(120)
def test_async_work(cli_env):
    out = _launch(2, _script("async_work.py"), env=cli_env)
    assert "async work: all results as expected on 2 ranks" in out
    assert "WRONG" not in out
    assert "rank 1: irecv(empty(3), src=0).wait() -> tensor([0., 0., 0.])" in out
    assert "rank 0: irecv(None, src=1).wait() -> {'from': 1, 'step': 7}" in out
    assert "rank 1: all_reduce(full((4,), rank + 1), async_op=True).wait() -> tensor([3., 3., 3., 3.])" in out


@pytest.mark.timeout(120)
def test_values_and_shapes(cli_env):
    out = _launch(2, _script("values_and_shapes.py"), env=cli_env)
    assert "values and shapes: all results as expected on 2 ranks" in out
    assert "WRONG" not in out
    assert "rank 1: all_reduce(2**70 + 1) -> 2361183241434822606849" in out
    assert "rank 1: broadcast('naïve café, 東京 ✓' on rank 0, None elsewhere, src=0) -> 'naïve café, 東京 ✓'" in out
    assert "rank 0: all_to_all([f'{rank}->{i}' for i]) -> ['0->0', '1->0']" in out
    assert "rank 1: all_gather(Point(0) on rank 0) -> TypeError" in out  # the error reaches every rank


# ------------------------------------------------------------ unified_api.py under each launcher

UNIFIED = _script("unified_api.py")
_LOSS = "8 batches of {} per epoch, loss 7.9246 -> 0.5564, parameters identical on all ranks: True"


def _unified_lines(out: str, world: int, launcher: str, backend: str) -> None:
    for r in range(world):
        line = f"rank {r}/{world} (local rank {r}, launcher {launcher}, backend {backend}): "
        assert line + _LOSS.format(32 // world) in out, out


@pytest.mark.timeout(60)
def test_unified_api_serial(cli_env):
    out = _run([sys.executable, UNIFIED], env=cli_env)
    _unified_lines(out, 1, "serial", "None")


@pytest.mark.timeout(120)
def test_unified_api_polydist_run(cli_env):
    out = _launch(2, UNIFIED, env=cli_env)
    _unified_lines(out, 2, "polydist", "gloo")


@pytest.mark.timeout(120)
def test_unified_api_spawn(cli_env):
    out = _run([sys.executable, UNIFIED, "--spawn", "2"], env=cli_env)
    _unified_lines(out, 2, "torchrun", "gloo")  # spawn runs torch's elastic agent: its workers see torchrun's variables
    assert "spawn returned [{'rank': 0, 'ok': True}, {'rank': 1, 'ok': True}]" in out


@needs_mpi
@pytest.mark.timeout(120)
def test_unified_api_mpiexec(cli_env):
    out = _run([mpiexec(), "-n", "2", sys.executable, UNIFIED], env=cli_env)
    _unified_lines(out, 2, "mpi", "gloo")


# ------------------------------------------------------------ mpi_stock_wheel.py


@needs_mpi
@pytest.mark.timeout(120)
def test_mpi_stock_wheel(cli_env):
    out = _run([mpiexec(), "-n", "2", sys.executable, _script("mpi_stock_wheel.py")], env=cli_env)
    assert "WRONG" not in out
    for r in (0, 1):
        assert f"rank {r}: dist.is_mpi_available(), dist.get_backend() -> (True, 'mpi')" in out
        assert f"rank {r}: dist.all_reduce(full((2,), rank + 1), async_op=True) -> tensor([3., 3.])" in out
        assert f"rank {r}: DDP: parameters identical on all ranks after 3 steps -> True" in out
        assert f"rank {r}: pd.backend() -> mpi4py" in out
        assert f"rank {r}: pd.all_gather(arange(rank + 1), async_op=True).wait() -> tensor([0, 0, 1])" in out


# ------------------------------------------------------------ the pages' snippets

_SNIPPET = re.compile(r'^--8<-- "(?P<path>[^":]+)(?::(?P<start>\d+):(?P<end>\d+))?"$', re.MULTILINE)


def test_tutorial_snippets_point_at_whole_definitions():
    """Every ``--8<--`` include of docs/tutorials/ names an existing file; a line range starts at a
    ``def`` (or its decorator) and ends at the last line of that definition, so edits to an example
    that shift its lines show up here instead of as a wrong excerpt on the site."""
    pages = sorted(glob.glob(os.path.join(ROOT, "docs", "tutorials", "*.md")))
    assert pages
    for page in pages:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for m in _SNIPPET.finditer(text):
            path = os.path.join(ROOT, m["path"])
            assert os.path.isfile(path), f"{page}: {m['path']} does not exist"
            if m["start"] is None:
                continue
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
            start, end = int(m["start"]), int(m["end"])
            first, after = lines[start - 1], lines[end] if end < len(lines) else ""
            where = f"{page}: {m['path']}:{start}:{end}"
            assert first.startswith(("def ", "@")) or first.startswith("    def "), f"{where} starts at {first!r}"
            assert lines[end - 1].startswith((" ", "\t")), f"{where} ends outside the definition: {lines[end - 1]!r}"
            assert not after.startswith((" ", "\t")), f"{where} stops inside the definition, before {after!r}"


# ------------------------------------------------------------ sharded_training.py (issue 27)


def _sharded_lines(out: str, backend: str) -> None:
    assert "WRONG" not in out
    assert f"[rank0]: sharded training on {backend}: all results as expected on 2 ranks" in out
    for r in (0, 1):
        assert f"rank {r}: FSDP2 after 3 steps == the unsharded model -> True" in out
        assert f"rank {r}: Checkpointer resume of the sharded model: epoch 3, same weights -> True" in out
        assert f"rank {r}: tensor parallel: this rank holds 16 of 32 hidden units -> True" in out


@pytest.mark.heavy  # make test runs it on MPI (below); gloo's FSDP2 and TP are in tests/backends, tests/training
@pytest.mark.timeout(120)
def test_sharded_training_gloo(cli_env):
    _sharded_lines(_launch(2, _script("sharded_training.py"), env=cli_env), "gloo")


@needs_mpi
@pytest.mark.timeout(120)
def test_sharded_training_mpi(cli_env):
    cmd = ["polydist", "run", "--backend", "mpi", "--nproc-per-node", "2", _script("sharded_training.py")]
    _sharded_lines(_run(cmd, env=mpi_job_env(cli_env)), "mpi4py")
