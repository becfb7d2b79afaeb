"""The getting-started page and the README's Quick start, run as a newcomer runs them: from a fresh copy of the repository.

The copy holds what a clone of this working tree would (``git ls-files``:
tracked files and new ones git does not ignore), so a command that needs an
ignored or forgotten file fails here. Its ``.venv`` is a link to the one
``make test`` already set up: ``make setup``, the page's first command, is the
only one not run (it is what every other target runs first). The page's other
commands run as written, in one ``bash -e`` in the copy's root, with a
``PATH`` that does not hold the venv (the page's ``source
.venv/bin/activate`` must put it there), and must print the page's output.
The README's Quick start must be the page's commands, output and code.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(ROOT, "docs", "getting-started.md")
README = os.path.join(ROOT, "README.md")
SET_UP = "make setup"  # run by make test itself before this test


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.M | re.S)


def _commands(text: str) -> list[str]:
    return [line.split("  #")[0].strip() for block in _blocks(text, "sh") for line in block.splitlines() if line.strip()]


def _page() -> str:
    return open(PAGE, encoding="utf-8").read()


def _quick_start() -> str:
    readme = open(README, encoding="utf-8").read()
    return readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]


def test_readme_quick_start_is_the_getting_started_page():
    page, quick = _page(), _quick_start()
    assert _commands(quick) == _commands(page) and _commands(page)[0] == SET_UP
    assert _blocks(quick, "text") == _blocks(page, "text")
    snippet = re.search(r'--8<-- "(examples/hello\.py):(\d+):(\d+)"', page)
    lines = open(os.path.join(ROOT, snippet.group(1)), encoding="utf-8").read().splitlines(keepends=True)
    assert _blocks(quick, "python") == ["".join(lines[int(snippet.group(2)) - 1:int(snippet.group(3))])]


def _fresh_copy(dest: str) -> None:
    try:
        listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                capture_output=True, check=True, timeout=30).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout, or no git: {exc}")
    for path in filter(None, listed):
        source = os.path.join(ROOT, path)
        if os.path.isfile(source):
            os.makedirs(os.path.dirname(os.path.join(dest, path)), exist_ok=True)
            shutil.copy2(source, os.path.join(dest, path))
    os.symlink(os.path.dirname(os.path.dirname(sys.executable)), os.path.join(dest, ".venv"))


@pytest.mark.timeout(150)
def test_getting_started_commands_run_from_a_fresh_clone(tmp_path):
    if not os.path.exists(os.path.join(os.path.dirname(sys.executable), "activate")):
        pytest.skip("the tests do not run in a venv: there is no .venv/bin/activate to source")
    clone = str(tmp_path / "polydist")
    _fresh_copy(clone)
    page = _page()
    commands = [c for c in _commands(page) if c != SET_UP]
    assert "source .venv/bin/activate" in commands
    venv_bin = os.path.dirname(sys.executable)
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    out = subprocess.run(["bash", "-e", "-c", "\n".join(commands)], cwd=clone, env=env, capture_output=True, text=True,
                         timeout=140)
    assert out.returncode == 0, f"exit code {out.returncode}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"
    shown = [line for block in _blocks(page, "text") for line in block.splitlines()]
    assert sorted(out.stdout.splitlines()) == sorted(shown)  # the ranks' lines come in either order


def test_pages_with_commands_say_how_to_get_polydist_on_the_path():
    """A reader who lands on a tutorial finds the set-up: no ``polydist: command not found`` on the README's advice
    to open the site, and every tutorial running ``polydist`` points to the activation step."""
    readme = open(README, encoding="utf-8").read()
    assert "site/index.html" not in readme  # the site's directory links do not work from files on disk
    tutorials = glob.glob(os.path.join(ROOT, "docs", "tutorials", "*.md"))
    missing = [os.path.basename(page) for page in tutorials
               if "polydist run" in (text := open(page, encoding="utf-8").read())
               and not ("source .venv/bin/activate" in text and "(../getting-started.md)" in text)]
    assert len(tutorials) >= 9 and missing == []
