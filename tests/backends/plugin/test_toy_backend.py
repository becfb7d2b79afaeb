"""A backend from another package, found through the ``polydist.backends`` entry point with no edit in polydist.

The package (``toy_backend/``: torch's gloo under the name "toy", with its own registry entry) is installed
into a temporary folder, and a 2-rank job started with ``polydist run --backend toy`` runs value collectives,
a subgroup and the flight recorder on it; its entry is seen at work (its model name, a reduction it refuses
before anything is sent).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent


@pytest.fixture(scope="module")
def toy_path(tmp_path_factory):
    target = tmp_path_factory.mktemp("toy_site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(HERE / "toy_backend")],
                   check=True, capture_output=True, timeout=120)
    return target


@pytest.mark.timeout(240)
def test_a_backend_from_another_package_runs_by_name(toy_path, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(toy_path), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(
        [sys.executable, "-m", "polydist", "run", "--nproc-per-node", "2", "--backend", "toy", "--timeout", "60",
         str(HERE / "toy_job.py"), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=220,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, s in enumerate(seen):
        assert (s["backend"], s["model_name"], s["world"]) == ("toy", "toy-dist", 2)
        assert s["sum"] == 3 and s["object"] == {"from": 0} and s["gathered"] == [0, 10]
        assert s["group_sum"] == [1.0]
        assert "the toy backend cannot reduce dtype torch.float32 with op MAX" in s["refused"]
        dump = json.loads(pathlib.Path(s["dump"]).read_text())
        assert "all_reduce" in json.dumps(dump) and "all_gather" in json.dumps(dump)
