"""pytest plugin: ignite's own distributed tests, with polydist in place of ``ignite.distributed``.

Loaded with ``-p ignite_swap`` by ``test_ignite_suite.py``. The test files
under ``ignite/tests`` are shipped unmodified; this plugin rewrites, as each
of them is imported, only their imports of ``ignite.distributed``:

* ``import ignite.distributed as idist`` → ``import polydist as idist``;
* ``from ignite.distributed[.auto|.utils|.launcher] import a, _b`` → the
  public names (``a``) from ``polydist``, the private ones (``_b``: ignite's
  internals, such as ``_model`` or ``_set_model``) still from ignite.

And one line that is not an import: ``test_launcher.py``'s ``execute()``
sets its subprocesses' ``PYTHONPATH`` to ignite's folder alone, so the
scripts it starts (torchrun, horovodrun, ``python check_idist_parallel.py``)
would run on ignite itself; the rewrite keeps this process's ``PYTHONPATH``
after ignite's folder, so that ``ignite_site`` carries the swap into them.

Everything else, ignite's ``Engine`` and metrics included, stays ignite's.
A shipped file run as a script (``check_idist_parallel.py``, in a process
whose ``PYTHONPATH`` still holds ``ignite_site``, whose ``sitecustomize``
imports this module) gets polydist's public names as its
``ignite.distributed``, a package whose submodules stay ignite's. With ``IGNITE_SWAP=0`` in the environment nothing is rewritten: ignite's own
run of the same files, for the side-by-side count.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import re
import sys
import types

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ignite")
_FROM = re.compile(r"^(?P<indent>\s*)from ignite\.distributed(?P<sub>\.(?:auto|utils|launcher))? import (?P<names>[^()\n]+)$")


_EXECUTE_PATH = 'env["PYTHONPATH"] = f"{os.path.dirname(ignite.__path__[0])}"'


def swap(source: str) -> str:
    out = []
    for line in source.splitlines():
        if line.strip() == _EXECUTE_PATH:
            line += ' + os.pathsep + os.environ.get("PYTHONPATH", "")'
        if line.strip() == "import ignite.distributed as idist":
            line = line.replace("import ignite.distributed as idist", "import polydist as idist")
        match = _FROM.match(line)
        if match:
            names = [n.strip() for n in match["names"].split(",")]
            public = [n for n in names if not n.startswith("_")]
            private = [n for n in names if n.startswith("_")]
            parts = []
            if public:
                parts.append(f"from polydist import {', '.join(public)}")
            if private:
                parts.append(f"from ignite.distributed{match['sub'] or ''} import {', '.join(private)}")
            line = match["indent"] + "; ".join(parts)
        out.append(line)
    return "\n".join(out) + "\n"


class _Loader(importlib.abc.SourceLoader):
    def __init__(self, path: str) -> None:
        self.path = path

    def get_filename(self, fullname: str) -> str:
        return self.path

    def get_data(self, path: str) -> bytes:
        with open(path, "rb") as f:
            data = f.read()
        return swap(data.decode("utf-8")).encode("utf-8") if path == self.path else data


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``tests.ignite...`` in the shipped copy and loads it through :func:`swap`."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "tests" and not fullname.startswith("tests."):
            return None
        base = os.path.join(HERE, *fullname.split("."))
        for candidate, is_package in ((os.path.join(base, "__init__.py"), True), (base + ".py", False)):
            if os.path.isfile(candidate):
                return importlib.util.spec_from_file_location(
                    fullname, candidate, loader=_Loader(candidate),
                    submodule_search_locations=[base] if is_package else None,
                )
        return None


class _PolydistAsIdist(importlib.abc.Loader):
    def create_module(self, spec):
        import polydist

        module = types.ModuleType(spec.name, polydist.__doc__)
        module.__dict__.update({name: getattr(polydist, name) for name in dir(polydist) if not name.startswith("__")})
        # Still a package whose submodules are ignite's own: ``import ignite`` imports ignite.metrics, which
        # imports ``ignite.distributed.utils``; a plain module stopped every shipped script at import
        # ("'ignite.distributed' is not a package").
        module.__path__ = list(spec.submodule_search_locations or [])
        return module

    def exec_module(self, module) -> None:
        pass


def _ignite_distributed_path() -> list:
    """Where ignite's own ``ignite.distributed`` package lives (found, not imported)."""
    ignite = importlib.util.find_spec("ignite")
    return [os.path.join(folder, "distributed") for folder in ignite.submodule_search_locations] if ignite else []


_SCRIPT_CHILD = "IGNITE_SWAP_SCRIPT_CHILD"


class _ScriptFinder(importlib.abc.MetaPathFinder):
    """``ignite.distributed`` is polydist's public API in a process whose main script is a shipped file, and in
    the processes that script starts (``horovod.run``'s workers, whose main is Horovod's, unpickle the script's
    functions, which name ``ignite.distributed``): the environment variable marks them."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "ignite.distributed":
            return None
        main = getattr(sys.modules.get("__main__"), "__file__", None) or ""
        if os.path.abspath(main).startswith(HERE + os.sep):
            os.environ[_SCRIPT_CHILD] = "1"
        elif os.environ.get(_SCRIPT_CHILD) != "1":
            return None
        spec = importlib.util.spec_from_loader(fullname, _PolydistAsIdist(), is_package=True)
        spec.submodule_search_locations[:] = _ignite_distributed_path()
        return spec


if os.environ.get("IGNITE_SWAP", "1") != "0":  # IGNITE_SWAP=0: ignite's own run of the same files, for comparison
    sys.meta_path[:0] = [_Finder(), _ScriptFinder()]
