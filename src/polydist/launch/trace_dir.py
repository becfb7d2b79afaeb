"""The trace directory of a job that polydist launches (``polydist run``, ``spawn``).

Every rank writes its flight-recorder dump there (:mod:`polydist.trace.dump`).
The user names it (``polydist run --trace-dir DIR``), or the launcher makes a
fresh one in the temp dir; afterwards the launcher says where the dumps are,
or removes a folder it made that stayed empty.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import sys
import tempfile
from typing import Iterator, Optional

__all__ = ["job_trace_dir"]


@contextlib.contextmanager
def job_trace_dir(chosen: Optional[str], who: str) -> Iterator[str]:
    """Yield the job's trace directory (``chosen``, else a new temporary one); report it on exit.

    ``who`` prefixes the report line on stderr ("polydist run").
    """
    folder = os.path.abspath(chosen) if chosen else tempfile.mkdtemp(prefix="polydist-trace-")
    try:
        yield folder
    finally:
        dumps = glob.glob(os.path.join(folder, "rank*.json"))
        groups = sorted({os.path.dirname(d) for d in glob.glob(os.path.join(folder, "*", "rank*.json"))})
        if dumps:
            print(
                f"{who}: flight-recorder dumps of {len(dumps)} rank(s) in {folder}; read them with: polydist trace {folder}",
                file=sys.stderr,
                flush=True,
            )
        for group in groups:  # a fault-tolerant job's replica groups: a folder each
            n = len(glob.glob(os.path.join(group, "rank*.json")))
            print(f"{who}: flight-recorder dumps of {n} rank(s) in {group}; read them with: polydist trace {group}",
                  file=sys.stderr, flush=True)  # fmt: skip
        if not dumps and not groups and not chosen:
            shutil.rmtree(folder, ignore_errors=True)
