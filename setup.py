"""The compiled parts of polydist, all optional: everything else is in pyproject.toml.

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
``polydist.backends.dispatch.DISPATCH`` are None then). Why each was not built goes into ``polydist/_built.json``
beside the package, with the torch it was built against, which ``polydist._compiled`` reads (``polydist info``, and a
one-line warning when polydist loads). Each module carries the SHA-256 of the source it was built from, so that
polydist ignores a build older than its source.
"""

import hashlib
import json
import os
import platform
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

RECORD = "src/polydist/collectives/_record.c"
LEAN = "src/polydist/backends/mpi4py/_lean.cpp"
DISPATCH = "src/polydist/backends/_dispatch.cpp"
TORCH_PARTS = ("polydist.backends.mpi4py._lean", "polydist.backends._dispatch")


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def reporting(base: type) -> type:
    """``base`` (a build_ext), writing ``polydist/_built.json``: each compiled part's reason not to be built ("" where
    built) and the torch it was built against. A compiler's first error line is the reason, where setuptools would
    only say that the compiler failed."""

    class Build(base):
        why: dict = {}

        def build_extension(self, ext):
            spawn = self.compiler.spawn
            self.compiler.spawn = _spawn_keeping_errors
            try:
                super().build_extension(ext)
            except Exception as exc:
                against = f" against torch {TORCH}" if ext.name in TORCH_PARTS else ""
                self.why[ext.name] = f"it did not compile{against}: {exc}"
                raise  # setuptools goes on without an optional extension
            finally:
                self.compiler.spawn = spawn
            self.why[ext.name] = ""

        def run(self):
            super().run()
            if TORCH is None:  # pip's isolated build: no torch to build against
                self.why.update(dict.fromkeys(TORCH_PARTS, "torch was not importable when polydist was built "
                                              "(pip's isolated build; pip install --no-build-isolation builds it)"))
            folders = {os.path.join(self.build_lib, "polydist")}
            if self.inplace:  # also in the source tree (setup.py build_ext --inplace, editable installs)
                folders.add(self.get_finalized_command("build_py").get_package_dir("polydist"))
            for folder in folders:
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, "_built.json"), "w") as f:
                    json.dump({"torch": TORCH, "parts": self.why}, f, indent=1, sort_keys=True)

    return Build


def _spawn_keeping_errors(cmd, **kwargs):
    """The compiler's command, its output passed on, and its first error line kept as the failure's message."""
    out = subprocess.run(cmd, capture_output=True, text=True, env=kwargs.get("env"))
    sys.stdout.write(out.stdout)
    sys.stderr.write(out.stderr)
    if out.returncode:
        lines = (out.stderr + out.stdout).splitlines()
        first = next((line for line in lines if "error" in line.lower()), lines[0] if lines else "")
        raise CompileError(f"{os.path.basename(cmd[0])} failed: {first.strip()}")


TORCH = None
extensions, command, options = [], build_ext, {}
if sys.version_info >= (3, 11) and platform.python_implementation() == "CPython":
    extensions.append(
        Extension("polydist.collectives._record", [RECORD], define_macros=[("POLYDIST_RECORD_SOURCE", f'"{digest(RECORD)}"')],
                  optional=True)  # fmt: skip
    )
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:  # pip's isolated build: the Python group's all_reduce
        pass
    else:
        TORCH = torch.__version__
        lean = CppExtension("polydist.backends.mpi4py._lean", [LEAN], define_macros=[("POLYDIST_LEAN_SOURCE", f'"{digest(LEAN)}"')])  # fmt: skip
        dispatch = CppExtension("polydist.backends._dispatch", [DISPATCH],
                                define_macros=[("POLYDIST_DISPATCH_SOURCE", f'"{digest(DISPATCH)}"')])  # fmt: skip
        lean.optional = dispatch.optional = True
        extensions += [lean, dispatch]
        command = BuildExtension.with_options(use_ninja=False)
        # one build folder per torch: setuptools reuses a build it finds newer than the sources, whatever torch
        # made it (a second venv on another torch would get the first one's modules, which then do not load)
        options = {"build": {"build_base": os.path.join("build", f"torch-{TORCH}")}}
setup(ext_modules=extensions, cmdclass={"build_ext": reporting(command)}, options=options)
