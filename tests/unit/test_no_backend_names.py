"""No module outside ``backends/`` names a backend: the core asks the registry entry or calls its hooks.

A parse of ``src/polydist`` (not a grep: docstrings and longer strings that merely mention a backend do not
count) for string literals equal to a declared backend's name. Launcher names that happen to be spelled like
a backend ("mpi" for an MPI launcher, "horovod" for horovodrun) are allowed where they are launcher names:
in the launcher-name module and compared with a ``launcher`` attribute or variable.
"""

from __future__ import annotations

import ast
import pathlib

import polydist
from polydist.backends import registry

SRC = pathlib.Path(polydist.__file__).parent
LAUNCHER_NAMES_MODULE = "launch/_launchers.py"  # detects the launcher from its variables, by the launcher's name


def _docstrings(tree: ast.AST) -> set:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _names_launcher(node: ast.AST) -> bool:
    leaf = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return "launcher" in leaf


def _launcher_comparisons(tree: ast.AST) -> set:
    """Literals compared with a launcher (``info.launcher == "mpi"``, ``base.launcher in ("mpi", "horovod")``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(_names_launcher(n) for n in (node.left, *node.comparators)):
            found.update(id(c) for n in (node.left, *node.comparators) for c in ast.walk(n))
    return found


def backend_names_outside_backends(root: pathlib.Path, names: set) -> list:
    """``file:line: 'name'`` for every backend-name literal in ``root`` outside ``backends/``."""
    hits = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] == "backends" or rel.as_posix() == LAUNCHER_NAMES_MODULE:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        allowed = _docstrings(tree) | _launcher_comparisons(tree)
        hits.extend(
            f"{rel}:{node.lineno}: {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in allowed
            and node.value.lower() in names
        )
    return hits


def test_no_module_outside_backends_names_a_backend():
    names = {n.lower() for n in registry.names()} - {"undefined"}  # torch's placeholder, also a plain word
    assert {"gloo", "nccl", "mpi", "mpi4py"} <= names  # the scan looks for real names
    hits = backend_names_outside_backends(SRC, names)
    assert not hits, "backend names outside backends/ (ask the registry entry instead):\n" + "\n".join(hits)


def test_the_scan_finds_a_comparison_and_skips_docstrings_and_launchers(tmp_path):
    (tmp_path / "core.py").write_text(
        '"""Works on gloo."""\n'
        'def f(backend, info):\n'
        '    """On "nccl" too."""\n'
        '    if info.launcher == "mpi":\n'
        '        return 0\n'
        '    return backend == "gloo"\n'
    )
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "x.py").write_text('NAME = "gloo"\n')
    assert backend_names_outside_backends(tmp_path, {"gloo", "nccl", "mpi"}) == ["core.py:6: 'gloo'"]
