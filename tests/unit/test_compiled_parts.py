"""polydist info says which compiled parts are in use, and why one is not (issue 52, part 3)."""

from __future__ import annotations

import json

import pytest
import torch

import polydist  # noqa: F401 - importing it loads the compiled parts (the recorder, the MPI backend's)
from polydist import _compiled, cli


def test_info_lists_each_compiled_part_and_why_one_is_not_used(capsys):
    cli._compiled_parts()
    out = capsys.readouterr().out
    assert out.startswith("compiled parts:")
    assert "polydist.collectives._record" in _compiled.STATUS
    for name, why in _compiled.STATUS.items():
        assert f"{name}" in out and (why or "in use") in out


def test_a_part_not_built_says_so():
    assert _compiled.load("polydist", "_no_such_part", "_no_such_part.c") is None
    assert _compiled.STATUS.pop("polydist._no_such_part") == (
        "not built here (No module named 'polydist._no_such_part')"
    )


def _record(monkeypatch, tmp_path, record):
    (tmp_path / "_built.json").write_text(json.dumps(record))
    monkeypatch.setattr(_compiled, "_HERE", str(tmp_path))


def test_a_part_that_failed_to_build_says_why_in_one_line(monkeypatch, tmp_path, capsys):
    """setup.py's build record gives the reason (the compiler's first error line); the warning is one line."""
    why = "it did not compile against torch 2.14.1: g++ failed: fatal error: c10d/PyProcessGroup.hpp: No such file"
    _record(monkeypatch, tmp_path, {"torch": "2.14.1", "parts": {"polydist._no_such_part": why}})
    assert _compiled.load("polydist", "_no_such_part", "_no_such_part.c") is None
    assert _compiled.STATUS.pop("polydist._no_such_part") == f"not built here: {why}"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("polydist: polydist._no_such_part not built here: it did not compile")
    assert "runs its Python version" in err


def test_a_part_built_for_another_torch_names_both(monkeypatch, tmp_path, capsys):
    """A module that is there but does not load (built under another torch: undefined symbols) says which torch
    it was built for and how to rebuild it."""
    _record(monkeypatch, tmp_path, {"torch": "2.0.0", "parts": {}})
    broken = tmp_path / "polydist_broken_part.py"
    broken.write_text("raise ImportError('undefined symbol: _ZN4c10d12ProcessGroup')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _compiled.load("polydist_broken_part", "x", "x.c") is None  # a package that fails to import
    why = _compiled.STATUS.pop("polydist_broken_part.x")
    assert why.startswith("cannot be loaded here (undefined symbol") and f"this is torch {torch.__version__}" in why
    assert "built for torch 2.0.0" in why and "--no-build-isolation" in why
    assert capsys.readouterr().err.count("\n") == 1


def test_the_build_record_agrees_with_what_loaded():
    """Where setup.py built the parts for this torch, its record beside the package says so for each one in use."""
    record = _compiled._built()
    if record.get("torch") != torch.__version__:
        pytest.skip("no build record for this torch here (built by hand before setup.py wrote one, or by another venv)")
    for name, why in _compiled.STATUS.items():
        if why == "" and name in record["parts"]:
            assert record["parts"][name] == "", name
