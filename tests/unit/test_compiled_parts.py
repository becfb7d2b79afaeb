"""polydist info says which compiled parts are in use, and why one is not (issue 52, part 3)."""

from __future__ import annotations

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
