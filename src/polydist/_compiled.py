"""polydist's optional compiled modules (built by setup.py), used only where built from the source beside them.

Where one is not used, :data:`STATUS` says why (``polydist info`` prints it) and one line on stderr says so when
polydist loads it: polydist then runs the module's Python version, slower but the same. Why a module was not built
comes from ``_built.json``, which setup.py writes beside this file with the torch it built against.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
from typing import Any

__all__ = ["load", "STATUS"]

# "package.name" of each compiled module polydist tried to load: "" where it is in use, else why not (polydist info).
STATUS: dict = {}
_HERE = os.path.dirname(os.path.abspath(__file__))
_REBUILD = "pip install --no-build-isolation -e ."


def _built() -> dict:
    """setup.py's record of the last build: ``{"torch": version or None, "parts": {name: why not built, or ""}}``."""
    try:
        with open(os.path.join(_HERE, "_built.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):  # built before setup.py wrote one, or never built
        return {}


def _unloadable(exc: ImportError) -> str:
    """Why a module that is there did not load: the usual cause is a build for another torch."""
    why = f"cannot be loaded here ({exc})"
    built, torch = _built().get("torch"), sys.modules.get("torch")
    if built and torch is not None and built != torch.__version__:
        why += (f": it was built for torch {built}, this is torch {torch.__version__}; reinstall polydist under this "
                "torch (pip install --no-build-isolation)")
    return why


def _not_used(key: str, why: str) -> None:
    STATUS[key] = why
    line = " ".join(why.split())  # one line, whatever a compiler or the loader said
    print(f"polydist: {key} {line}; polydist runs its Python version instead", file=sys.stderr)


def load(package: str, name: str, source: str) -> Any:
    """Module ``package.name``, or None where it was not built (or cannot load here, e.g. built for another torch)
    or was built from another version of ``source`` (a file beside it) than the one there: a source checkout not
    rebuilt. Each module's ``SOURCE`` is the SHA-256 of the source it was built from (setup.py)."""
    key = f"{package}.{name}"
    try:
        module = importlib.import_module(key)
    except ImportError as exc:  # not built (pip's isolated build, no compiler, a compile error), or another torch's
        why = _built().get("parts", {}).get(key)  # setup.py's reason where it did not build it
        if exc.name != key:
            _not_used(key, _unloadable(exc))
        else:
            _not_used(key, f"not built here: {why}" if why else f"not built here ({exc})")
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(module.__file__)), source)
    if os.path.exists(path):  # a source tree (an installed wheel has no source)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest != module.SOURCE:
            _not_used(key, f"was built from another version of {source}: rebuild it ({_REBUILD})")
            return None
    STATUS[key] = ""
    return module
