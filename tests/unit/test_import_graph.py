"""polydist's import graph has no loops: no circle of files, no circle of folders.

The graph is built with ``ast`` from every ``import`` statement in
``src/polydist`` (module level and inside functions alike: a lazy import is
still a dependency). Nodes are modules; a folder's edges are its modules'
edges to modules of other folders (``polydist/*.py`` counts as the package
root, which the sub-packages may use, so edges into the root are not folder
edges). ``TYPE_CHECKING``-only imports count too: a reader follows them.
"""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "polydist"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The longest known module that ``target`` names (``a.b.name`` → ``a.b``)."""
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    """Module → the polydist modules it imports (self-edges and package parents dropped)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                # ``from pkg import mod`` imports the module ``pkg.mod``.
                targets = [f"{stem}.{alias.name}" for alias in node.names]
            for target in targets:
                found = _resolve(target, modules)
                # Importing a sub-module runs its parents' __init__; those are
                # not edges a reader follows, and would make every package
                # depend on itself.
                if found and found != name and not name.startswith(found + "."):
                    edges.add(found)
        graph[name] = edges
    return graph


def _folder(module: str) -> str:
    parts = module.split(".")
    # polydist.x (a top-level module or sub-package __init__) lives at the root
    # unless it is a sub-package.
    return ".".join(parts[:2]) if len(parts) > 2 else "polydist"


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    modules = _modules()
    folders: dict[str, set[str]] = {}
    for module, edges in graph.items():
        source = module if modules[module].name == "__init__.py" and module != "polydist" else _folder(module)
        for target in edges:
            dest = target if modules[target].name == "__init__.py" and target != "polydist" else _folder(target)
            if dest not in (source, "polydist"):
                folders.setdefault(source, set()).add(dest)
        folders.setdefault(source, set())
    return folders


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_one_cycle(graph, set(c)) for c in components]


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first node, for the message."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle in component {sorted(component)}")


def test_graph_sees_function_level_imports():
    # A guard that the walk is not vacuous: ``polydist`` (cli.py) imports its
    # sub-commands inside functions only, so they start fast.
    graph = import_graph()
    assert len(graph) > 50
    assert {"polydist.launch.cli", "polydist.bench.cli", "polydist.trace.cli"} <= graph["polydist.cli"]


# The application folders: each depends only downward, and no file in them is on a circle.
_APPLICATIONS = ("polydist.trace", "polydist.bench", "polydist.launch")


def test_applications_depend_only_downward():
    graph = import_graph()
    files = [c for c in find_cycles(graph) if any(m.startswith(_APPLICATIONS) for m in c)]
    folders = [c for c in find_cycles(folder_graph(graph)) if any(m in _APPLICATIONS for m in c)]
    assert not files + folders, "import cycles through trace/, bench/ or launch/:\n" + "\n".join(
        " -> ".join(c) for c in files + folders)


def test_no_circle_of_files():
    cycles = find_cycles(import_graph())
    assert not cycles, "file-level import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_circle_of_folders():
    cycles = find_cycles(folder_graph(import_graph()))
    assert not cycles, "folder-level import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_cycle_finder_names_the_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


# backends/ sits below the package's API (context, live_world, groups), the pipeline and the applications.
_BACKENDS = "polydist.backends"


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_backends_import_nothing_that_imports_them():
    # A way out of backends/ that leads back in runs up a layer above it: a higher layer reaches the backends
    # through the hooks of polydist/_wiring.py instead. The applications are above it too.
    graph = import_graph()
    upward = sorted(
        f"{module} -> {target}"
        for module in graph if _in(module, _BACKENDS)
        for target in graph[module] if not _in(target, _BACKENDS)
        if any(_in(m, _BACKENDS) for m in _reach(graph, target)) or any(_in(target, a) for a in _APPLICATIONS)
    )  # fmt: skip
    assert not upward, "backends/ imports a layer above it:\n" + "\n".join(upward)


def test_the_shared_backend_modules_import_no_backend():
    # The files directly in backends/ (the registry, the Python groups' template, the watchdog, ...) serve every
    # backend; the registry finds the backends through their entry points.
    modules = _modules()
    graph = import_graph()
    folders = {m for m, p in modules.items() if _in(m, _BACKENDS) and m.count(".") == 2 and p.name == "__init__.py"}
    shared = [m for m, p in modules.items() if _in(m, _BACKENDS) and m.count(".") == 2 and p.name != "__init__.py"]
    found = sorted(f"{m} -> {t}" for m in shared for t in graph[m] if any(_in(t, f) for f in folders))
    assert folders >= {"polydist.backends.mpi4py", "polydist.backends.horovod"} and "polydist.backends.watchdog" in shared
    assert not found, "a shared module of backends/ imports a backend:\n" + "\n".join(found)
