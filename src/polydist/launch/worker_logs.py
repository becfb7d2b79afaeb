"""Where the workers' output goes in a job on PyTorch's elastic agent: the console, and torchrun's log files.

torchrun's ``--log-dir``, ``--redirects``, ``--tee`` and
``--local-ranks-filter`` (:class:`Logs`) become torch elastic's own
:class:`~torch.distributed.elastic.multiprocessing.DefaultLogsSpecs`
(:func:`logs_specs`), with torchrun's meaning: a redirected stream goes to a
file only, a teed one to a file and the console, a local rank outside the
filter reaches the console not at all (its files are still written). The
files are ``LOG_DIR/<run id>_<random>/attempt_<restart>/<local rank>/
{stdout,stderr}.log`` and ``error.json``.

polydist's ``[rankN]: `` prefix is written by torch's tail of a worker's log
file, so with the prefix on every stream that reaches the console is teed
(in a temporary folder, removed afterwards, unless ``log_dir`` is given):
the console shows what torchrun's would, prefixed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Union

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std, to_map

__all__ = ["Logs", "logs_specs", "announce_log_dir"]

Streams = Union[Std, Dict[int, Std]]  # for every local rank, or by local rank (Std.from_str's "0:1,1:2")


@dataclass(frozen=True)
class Logs:
    """torchrun's output options: ``log_dir`` (None: a temporary folder), the streams ``redirects`` sends to
    files only and ``tee`` to files and the console, and the local ranks whose output reaches the console
    (``local_ranks_filter``; None: every one)."""

    log_dir: Optional[str] = None
    redirects: Streams = Std.NONE
    tee: Streams = Std.NONE
    local_ranks_filter: Optional[frozenset] = None


@contextlib.contextmanager
def logs_specs(logs: Optional[Logs], nproc_per_node: int, prefixed: bool) -> Iterator[DefaultLogsSpecs]:
    """torch elastic's logs specs for ``logs`` on ``nproc_per_node`` local ranks; ``prefixed``: the console's
    lines will carry a prefix, so every stream that reaches the console is teed (see the module's docstring).
    A temporary log folder is removed when the block ends."""
    logs = logs or Logs()
    redirects, tee = to_map(logs.redirects, nproc_per_node), to_map(logs.tee, nproc_per_node)
    if prefixed:  # the console streams (not redirected, or teed) are the teed ones
        tee = {rank: Std(int(tee[rank]) | (int(Std.ALL) & ~int(redirects[rank]))) for rank in tee}
    with contextlib.ExitStack() as stack:
        folder = logs.log_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="polydist-logs-"))
        filtered = set(logs.local_ranks_filter) if logs.local_ranks_filter else None
        yield DefaultLogsSpecs(log_dir=folder, redirects=redirects, tee=tee, local_ranks_filter=filtered)


@contextlib.contextmanager
def announce_log_dir(log_dir: Optional[str], who: str) -> Iterator[None]:
    """Around a job with ``log_dir`` given: say on stderr, when it ends, which folder torch made in it for this
    run (its name has a random part)."""
    if not log_dir:
        yield
        return
    before = set(os.listdir(log_dir)) if os.path.isdir(log_dir) else set()
    try:
        yield
    finally:
        made = sorted(set(os.listdir(log_dir)) - before) if os.path.isdir(log_dir) else []
        for name in made:
            folder = os.path.join(os.path.abspath(log_dir), name)
            print(f"{who}: this node's logs are in {folder} (attempt_N/LOCAL_RANK/stdout.log, stderr.log, error.json)",
                  file=sys.stderr, flush=True)  # fmt: skip
