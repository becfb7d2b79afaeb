"""The compiled part of polydist, optional: everything else is in pyproject.toml.

``polydist.collectives._record`` is the flight recorder's per-call path in C (src/polydist/collectives/_record.c).
It is built where a C compiler is found, on CPython 3.11 and later; where it cannot be built, the install goes
on and polydist runs the same code in Python (``polydist.collectives.recorder.COMPILED`` is None then). The
module carries the SHA-256 of the source it was built from, so that polydist ignores a build older than its source.
"""

import hashlib
import platform
import sys

from setuptools import Extension, setup

SOURCE = "src/polydist/collectives/_record.c"

extensions = []
if sys.version_info >= (3, 11) and platform.python_implementation() == "CPython":
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    extensions.append(
        Extension("polydist.collectives._record", [SOURCE], define_macros=[("POLYDIST_RECORD_SOURCE", f'"{digest}"')],
                  optional=True)  # fmt: skip
    )
setup(ext_modules=extensions)
