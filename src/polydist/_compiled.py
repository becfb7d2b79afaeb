"""polydist's optional compiled modules (built by setup.py), used only where built from the source beside them."""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from typing import Any

__all__ = ["load", "STATUS"]

# "package.name" of each compiled module polydist tried to load: "" where it is in use, else why not (polydist info).
STATUS: dict = {}


def load(package: str, name: str, source: str) -> Any:
    """Module ``package.name``, or None where it was not built (or cannot load here, e.g. built for another torch)
    or was built from another version of ``source`` (a file beside it) than the one there: a source checkout not
    rebuilt (``pip install --no-build-isolation -e .`` rebuilds it), which is said once on stderr. Each module's ``SOURCE`` is the
    SHA-256 of the source it was built from (setup.py)."""
    key = f"{package}.{name}"
    try:
        module = importlib.import_module(key)
    except ImportError as exc:  # not built (pip's isolated build, no compiler), or built for another torch
        STATUS[key] = f"not built here ({exc})" if exc.name == key else str(exc)
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(module.__file__)), source)
    if os.path.exists(path):  # a source tree (an installed wheel has no source)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest != module.SOURCE:
            STATUS[key] = f"built from another version of {source}: rebuild it (pip install --no-build-isolation -e .)"
            print(f"polydist: {module.__file__} was built from another version of {path}; polydist runs its Python "
                  "version until it is rebuilt (pip install --no-build-isolation -e .)", file=sys.stderr)  # fmt: skip
            return None
    STATUS[key] = ""
    return module
