"""The compiled parts of polydist, both optional: everything else is in pyproject.toml.

* ``polydist.collectives._record`` is the flight recorder's per-call path in C (src/polydist/collectives/_record.c).
  It is built where a C compiler is found, on CPython 3.11 and later.
* ``polydist.backends.mpi4py._lean`` is the MPI group's torch-level all_reduce in C++
  (src/polydist/backends/mpi4py/_lean.cpp), a torch extension: it is built where torch is importable at build time
  (``pip install --no-build-isolation``, as ``make setup`` does; pip's isolated build has no torch) and a C++
  compiler is found, and it loads only under the torch it was built for.
* ``polydist.backends._dispatch`` is the c10d Backend behind which torch makes the Python groups' ProcessGroups
  (src/polydist/backends/_dispatch.cpp), so torch-level calls take torch's dispatcher ops; built as ``_lean``.

Where one cannot be built, the install goes on and polydist runs the same code in Python
(``polydist.collectives.recorder.COMPILED``, ``polydist.backends.mpi4py.process_group.LEAN``,
``polydist.backends.dispatch.DISPATCH`` are None then). Each
module carries the SHA-256 of the source it was built from, so that polydist ignores a build older than its source.
"""

import hashlib
import platform
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

RECORD = "src/polydist/collectives/_record.c"
LEAN = "src/polydist/backends/mpi4py/_lean.cpp"
DISPATCH = "src/polydist/backends/_dispatch.cpp"


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


extensions, command = [], build_ext
if sys.version_info >= (3, 11) and platform.python_implementation() == "CPython":
    extensions.append(
        Extension("polydist.collectives._record", [RECORD], define_macros=[("POLYDIST_RECORD_SOURCE", f'"{digest(RECORD)}"')],
                  optional=True)  # fmt: skip
    )
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:  # pip's isolated build: the Python group's all_reduce
        pass
    else:
        lean = CppExtension("polydist.backends.mpi4py._lean", [LEAN], define_macros=[("POLYDIST_LEAN_SOURCE", f'"{digest(LEAN)}"')])  # fmt: skip
        dispatch = CppExtension("polydist.backends._dispatch", [DISPATCH],
                                define_macros=[("POLYDIST_DISPATCH_SOURCE", f'"{digest(DISPATCH)}"')])  # fmt: skip
        lean.optional = dispatch.optional = True
        extensions += [lean, dispatch]
        command = BuildExtension.with_options(use_ninja=False)
setup(ext_modules=extensions, cmdclass={"build_ext": command})
