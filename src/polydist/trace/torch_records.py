"""What a dump holds of torch's own flight recorder: gloo's and NCCL's operations, whoever called them (DDP,
FSDP2, polydist's own calls on those backends), as :mod:`.dump` writes them (format: :mod:`polydist.trace`)."""

from __future__ import annotations

import os
import time
from typing import Optional

from .. import _torch

__all__ = ["torch_records"]

# What a dump keeps of each of torch's entries (torch's names); frames: the innermost few, enough to reach user code.
_TORCH_FIELDS = ("record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "is_p2p", "profiling_name",
                 "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "state", "retired", "timeout_ms",
                 "time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns")  # fmt: skip
_TORCH_FRAMES = 24


def torch_records(stacks: bool = True) -> Optional[dict]:
    """torch's own flight recorder (gloo's, NCCL's operations, whoever called them: DDP, FSDP2, ...), or None
    where this torch has none; ``stacks``: with the entries' frames (a dump written by a signal has none:
    symbolizing them takes seconds). ``buffer``: its size (``TORCH_FR_BUFFER_SIZE``; 0: off, no entries);
    ``groups``: each live group's global ranks by the name its entries give; ``entries``: oldest first."""
    if not _torch.fr_available():
        return None
    if stacks:  # a rank's own error or timeout, not a signal's deadline
        _let_returns_land()
    entries = []
    for recorder in _torch.fr_dumps(stacks):
        for e in recorder["entries"]:
            kept = {k: e.get(k) for k in _TORCH_FIELDS}
            kept["frames"] = list(e.get("frames") or ())[:_TORCH_FRAMES]  # torch's order: innermost first
            kept["recorder"] = recorder["recorder"]
            entries.append(kept)
    size = os.environ.get(_torch.FR_BUFFER_SIZE) or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or "0"
    return {"buffer": int(size) if size.strip().isdigit() else 0, "groups": _torch.group_ranks_by_name(),
            "entries": entries}  # fmt: skip


def _let_returns_land(wait_s: float = 0.05) -> None:
    """Wait up to ``wait_s`` while torch's operations are not all marked returned: gloo's recorder marks one a
    few ms after its ``wait()`` returned, so a rank that raises right after a collective looked still in it."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(not e.get("retired") for r in _torch.fr_dumps(False)
                                              for e in r["entries"]):  # fmt: skip
        time.sleep(0.005)
