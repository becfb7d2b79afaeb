"""One replica group of a fault-tolerant job: PyTorch's elastic agent over its ranks, replacing them when lost.

``polydist run --fault-tolerant`` (:mod:`~polydist.launch.fault_tolerant`)
starts one of these per replica group, as a process of its own, so that a
lost rank takes down its own replica group only: the agent stops the group's
other ranks and starts the whole group again (up to ``--max-restarts``
times, each start on a fresh store: torchft's manager address of a dead
generation must not be read by the next), while the other replica groups
train on. Each loss is recorded in the job's fault log
(:mod:`~polydist.launch.ft_events`), which the launcher reports from; a
replica group whose replacements are all used up is recorded as given up.

Usage (by the launcher only): ``python -m polydist.launch.replica SPEC``,
SPEC a JSON object: ``replica``, ``group_size``, ``max_restarts``,
``prefix_output`` and ``worker`` (the worker's argument list).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, Optional

from torch.distributed.elastic.multiprocessing.api import SignalException

from .. import settings
from ..errors import WorkerFailedError
from . import ft_events
from .elastic import first_failure, launch
from .process_setup import die_with_parent, signal_name

__all__ = ["main"]


def main(argv: Optional[list] = None) -> int:
    spec = json.loads((argv or sys.argv)[1])
    replica, size, most = int(spec["replica"]), int(spec["group_size"]), int(spec["max_restarts"])
    die_with_parent()  # the fault-tolerant launcher
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)  # torch's agent logs its own lines: the launcher reports
    os.environ[settings.LAUNCHER_PID.name] = str(os.getpid())  # the group's ranks die with this agent
    os.environ["REPLICA_GROUP_ID"] = str(replica)
    first = replica * size

    def lost(failures: Optional[dict], done: int, of: int) -> None:
        if failures is None:  # a membership change: single-node replica groups have none
            return
        rank, how, error = first_failure(failures)
        ft_events.record("lost", replica, rank=first + rank, how=how, error=error, replacement=done, of=of)

    prefix = f"[rank{first}]: " if size == 1 else f"[replica{replica} rank${{rank}}]: "
    try:
        launch(sys.executable, spec["worker"], size, prefix_output=bool(spec["prefix_output"]), prefix=prefix,
               max_restarts=most, on_restart=lost, first_rank=first)  # fmt: skip
    except SignalException as exc:  # the launcher stopped this replica group (the job ended, or Ctrl-C)
        return 128 + exc.sigval
    except WorkerFailedError as exc:
        failures: Any = exc.failures or {}
        rank = exc.root_rank if exc.root_rank is not None and exc.root_rank >= 0 else 0
        code, text = failures.get(rank, (None, ""))
        how = f"killed by {signal_name(-code)}" if isinstance(code, int) and code < 0 else f"exit code {code}"
        lines = [line for line in (text or "").strip().splitlines() if line.strip()]
        ft_events.record("given_up", replica, rank=first + rank, how=how, error=(lines or [""])[-1][:300])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
