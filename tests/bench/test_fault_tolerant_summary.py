"""benchmarks/fault_tolerant.py's summary: a run whose fault never happened (the harness's ``error``) is not
counted as a faulted run, right or wrong; ``--summarize`` prints a saved run's summary again. No job runs."""

import importlib.util
import json
import os
import subprocess
import sys

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "benchmarks", "fault_tolerant.py")
_spec = importlib.util.spec_from_file_location("fault_tolerant_benchmark", SCRIPT)
fault_tolerant = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fault_tolerant)


def row(path, kind, accuracy=0.9694, **extra):
    return {"path": path, "kind": kind, "exit_code": 0, "identical": True, "accuracy": accuracy, **extra}


ROWS = [row("ft", None), row("ft", "kill", went_on_s=1.0), row("ft", "kill", went_on_s=3.0),
        row("ft", "kill", error="training never started"), row("ft", "stop", accuracy=0.9600)]


def test_a_run_without_its_fault_is_not_a_faulted_run():
    table = fault_tolerant.summary(ROWS)
    assert (table["ft/kill"]["runs"], table["ft/kill"]["ok"], table["ft/kill"]["unfaulted"]) == (2, 2, 1)
    assert table["ft/kill"]["median"]["went_on_s"] == 2.0
    assert (table["ft/stop"]["runs"], table["ft/stop"]["ok"]) == (1, 0)  # 0.94 points below the reference


def test_summarize_prints_a_saved_run_again(tmp_path):
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({"args": {}, "platform": "x", "rows": ROWS, "summary": {}}))
    out = subprocess.run([sys.executable, SCRIPT, "--summarize", str(saved)], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    assert "ft/kill        2/2 right (and 1 run(s) whose fault never happened)" in out.stdout, out.stdout
    assert json.loads(saved.read_text())["summary"]["ft/kill"]["unfaulted"] == 1
