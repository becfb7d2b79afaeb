"""``polydist run`` refuses what it can check itself before any rank starts: one line, exit code 2, nothing left behind."""

import subprocess

import pytest

from polydist.backends import registry
from polydist.cli import main
from polydist.launch.cli import BACKENDS

pytestmark = pytest.mark.timeout(60)


def test_the_backends_help_names_are_the_registrys():
    assert set(BACKENDS) <= set(registry.names())


def test_an_unknown_backend_is_refused_before_any_rank_starts(cli_env, tmp_path):
    name = "foo"
    script = tmp_path / "job.py"
    script.write_text("raise SystemExit('a rank started')\n")
    temp = tmp_path / "tmp"
    temp.mkdir()
    out = subprocess.run(["polydist", "run", "--nproc-per-node", "2", "--backend", name, str(script)],
                         env={**cli_env, "TMPDIR": str(temp)}, capture_output=True, text=True, timeout=50)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr == f"polydist run: unknown backend {name!r}; use one of: {', '.join(BACKENDS)}\n"
    assert list(temp.iterdir()) == []  # no flight-recorder dump folder, no log folder


def test_help_names_the_same_backends(capsys):
    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    assert done.value.code == 0
    assert ", ".join(BACKENDS) in " ".join(capsys.readouterr().out.split())
