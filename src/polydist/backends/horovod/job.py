"""What a Horovod job needs besides the process group: the ``horovod://`` rendezvous.

Under ``horovodrun`` (or ``horovod.run``) Horovod knows every rank already;
``horovod://`` starts Horovod (``hvd.init()``), takes rank and world size
from it, and serves rank 0's TCP store (torch.distributed needs one) at a
port announced over Horovod, so no MASTER_ADDR/MASTER_PORT is needed.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist

from ..store import check_requested, serve_store
from .process_group import hvd

__all__ = ["rendezvous", "start", "stop", "adopt"]

_started = False  # whether polydist called hvd.init() (and so shuts Horovod down in finalize)


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
    global _started
    if _started:
        _started = False
        hvd().shutdown()


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
