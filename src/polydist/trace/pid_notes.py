"""Each rank's pid, noted in the trace directory when it starts, for ``polydist trace --signal`` (:mod:`.signal_job`)."""

from __future__ import annotations

import contextlib
import os
import re
from typing import Optional

from .. import settings

__all__ = ["PID_FILE", "note_pid"]

PID_FILE = re.compile(r"rank(\d+)\.pid")


def note_pid(rank: Optional[int]) -> None:
    """Write this process's pid to ``$POLYDIST_TRACE_DIR/rank<R>.pid`` (nothing without both); never raises."""
    folder = settings.TRACE_DIR.read()
    if not folder or rank is None:
        return
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)  # the launcher names it; the first rank to write makes it
        with open(os.path.join(folder, f"rank{rank}.pid"), "w") as f:
            f.write(f"{os.getpid()}\n")
