"""Worker-side entry of ``polydist run``: run the user's script as ``__main__``.

Wrapped in torch elastic's ``@record`` so that an uncaught exception is written
to the agent's error file and the launcher can show the failing rank's
traceback. Usage (by the launcher only): ``python -m polydist._script SCRIPT
[ARGS...]`` or ``python -m polydist._script -m MODULE [ARGS...]``.
"""

from __future__ import annotations

import os
import runpy
import sys

from torch.distributed.elastic.multiprocessing.errors import record

from .launch import worker_setup


@record
def main() -> None:
    argv = sys.argv[1:]
    worker_setup()
    try:
        _run(argv)
    finally:
        # torch's excepthook prefixes tracebacks with "[rankN]"; the launcher already
        # prefixes every line, so keep Python's own hook and print them once.
        sys.excepthook = sys.__excepthook__


def _run(argv: list) -> None:
    if argv[0] == "-m":
        module, rest = argv[1], argv[2:]
        sys.argv = [module, *rest]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, rest = argv[0], argv[1:]
        sys.argv = [script, *rest]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
