"""What a Horovod job needs besides the process group: the ``horovod://`` rendezvous and process sets.

Under ``horovodrun`` (or ``horovod.run``) Horovod knows every rank already;
``horovod://`` starts Horovod (``hvd.init()``), takes rank and world size
from it, and serves rank 0's TCP store (torch.distributed needs one) at a
port announced over Horovod, so no MASTER_ADDR/MASTER_PORT is needed.

Subgroups are Horovod process sets (:func:`process_set`), which exist only
when Horovod was started with dynamic process sets
(``HOROVOD_DYNAMIC_PROCESS_SETS=1`` before ``hvd.init``, as ignite sets it on
import); ``hvd.add_process_set`` is collective over the whole job, so every
rank, member or not, registers each set, in the same order.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any, Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist

from ..store import check_requested, serve_store
from .process_group import hvd

__all__ = ["rendezvous", "start", "stop", "adopt", "dynamic_sets", "process_set", "registered_set"]

_started = False  # whether polydist called hvd.init() (and so shuts Horovod down in finalize)
_sets: dict = {}  # sorted global ranks -> the hvd.ProcessSet this process registered for them
_asked = 0  # process_set calls so far: names their all-gathers, the same on every rank


def start() -> Any:
    """``horovod.torch``, initialized (``hvd.init()`` once per process)."""
    global _started
    module = hvd()
    if not module.is_initialized():
        module.init()
        _started = True
    return module


def stop() -> None:
    """Shut Horovod down if polydist started it (``finalize``); a Horovod the program started is left running."""
    global _started, _asked
    _sets.clear()  # Horovod forgets its process sets at shutdown
    _asked = 0
    if _started:
        _started = False
        hvd().shutdown()


def dynamic_sets() -> bool:
    """Whether Horovod's dynamic process sets are on: ``HOROVOD_DYNAMIC_PROCESS_SETS`` a positive integer, which
    ``hvd.init`` reads (``hvd.init(process_sets="dynamic")`` sets it to 1)."""
    try:
        return int(os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "0")) > 0
    except ValueError:
        return False


def process_set(ranks: list, every_rank: bool = False) -> Any:
    """The Horovod process set of global ``ranks``, added (``hvd.add_process_set``) the first time on this rank.

    ``hvd.add_process_set`` is collective over the whole job and Horovod aborts the job when its ranks add
    different sets, while torch lets each rank create only its own group (ranks 0, 2 make [0, 2] as 1, 3
    make [1, 3]). So the ranks first all-gather which set each asks for and every rank adds all of them,
    in rank order: every rank must reach this call at the same point, for one set each (as every rank calls
    torch's ``new_group``). ``every_rank`` (``polydist.new_group``, which every rank calls each time): the
    all-gather runs also for a set this rank already has, so that ranks asking for a known set and ranks
    asking for a new one meet in it instead of hanging; without it (a rank list given to a collective) a
    known set costs nothing. Callers check :func:`dynamic_sets` first.
    """
    global _asked
    key = tuple(sorted(ranks))
    if key in _sets and not every_rank:
        return _sets[key]
    h = start()
    wanted = torch.zeros(1, h.size(), dtype=torch.uint8)
    wanted[0, list(key)] = 1
    _asked += 1
    rows = h.allgather(wanted, name=f"polydist.process_sets.{_asked}")
    for row in rows.tolist():
        asked = tuple(r for r, member in enumerate(row) if member)
        if asked not in _sets:
            _sets[asked] = h.add_process_set(list(asked))
    return _sets[key]


def registered_set(ranks: list) -> Optional[Any]:
    """The process set :func:`process_set` registered for ``ranks`` on this rank, or None."""
    return _sets.get(tuple(sorted(ranks)))


def adopt() -> bool:
    """Make a process group over a Horovod the program started itself (``hvd.init()``), without communicating.

    Code written for ``ignite.distributed`` calls ``hvd.init()`` and then the
    idist functions, which find Horovod by themselves; polydist does the same
    here, called when no process group exists. The group's store is a
    process-local ``HashStore``: Horovod needs none, and creating a group
    must not communicate, since adoption may happen on one rank only. Returns
    False (and does nothing) when Horovod is not imported or not initialized.
    """
    if "horovod.torch" not in sys.modules:
        return False
    h = hvd()
    if not h.is_initialized():
        return False
    dist.init_process_group("horovod", store=dist.HashStore(), rank=h.rank(), world_size=h.size())
    return True


def rendezvous(url: str, timeout: timedelta = timedelta(minutes=10), **kwargs: Any) -> Iterator[tuple]:
    """The ``horovod://`` init method: rank and world size from Horovod, a TCP store on rank 0.

    Raises:
        ValueError: the caller asked for another rank or world size than Horovod's.
    """
    h = start()
    rank, size = h.rank(), h.size()
    check_requested(url, rank, size, "horovod", "Horovod", "horovodrun")

    def all_gather_rows(row: np.ndarray) -> np.ndarray:
        return h.allgather(torch.from_numpy(row).reshape(1, -1), name="polydist.rendezvous.hosts").numpy()

    def broadcast_port(port: int) -> int:
        announced = torch.tensor([port], dtype=torch.int64)  # a plain integer, not a pickle
        h.broadcast_(announced, 0, name="polydist.rendezvous.port")
        return int(announced[0])

    store = serve_store(rank, size, timeout, all_gather_rows, broadcast_port, "horovod")
    yield (store, rank, size)
    raise RuntimeError("the horovod:// rendezvous cannot be repeated (e.g. to restart a job); start a new horovodrun")
