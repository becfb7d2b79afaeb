"""Which node each rank is on: from the launcher's variables or, failing that, by gathering host names."""

from __future__ import annotations

import socket
from typing import Optional

import torch
import torch.distributed as dist

from . import _torch
from ._hosts import HOST_BYTES, host_names, host_row
from ._state import Layout
from .backends import registry
from .launch.environment import ProcessInfo

__all__ = ["layout_from_env", "layout_from_hostnames", "single_node_guess"]


def layout_from_env(info: ProcessInfo) -> Optional[Layout]:
    """The node layout the launcher exported, if complete and about this group."""
    if info.launcher == "serial" or dist.get_rank() != info.rank or dist.get_world_size() != info.world_size:
        return None
    fields = (info.local_rank, info.local_world_size, info.nnodes, info.node_rank)
    if any(f is None for f in fields):
        return None
    return Layout(*fields)  # type: ignore[arg-type]


def layout_from_hostnames() -> Layout:
    """Derive the layout by gathering every rank's host name (a collective).

    Names travel as fixed-size byte rows, not through ``all_gather_object``:
    nothing another rank sends is unpickled.
    """
    dev = registry.get(str(dist.get_backend())).comm_device()
    every = torch.empty(dist.get_world_size() * HOST_BYTES, dtype=torch.uint8, device=dev)
    _torch.all_gather_single(every, torch.from_numpy(host_row(socket.gethostname())).to(dev))
    hosts = host_names(every.cpu().numpy())
    me = hosts[dist.get_rank()]
    nodes = list(dict.fromkeys(hosts))  # in order of first appearance
    return Layout(
        local_rank=hosts[: dist.get_rank()].count(me),
        nproc_per_node=hosts.count(me),
        nnodes=len(nodes),
        node_rank=nodes.index(me),
    )


def single_node_guess() -> Layout:
    """One node holding every rank: the stand-in layout of an adopted group whose launcher exported none, until
    the ranks learn the real one (``initialize`` on the adopted group gathers host names)."""
    return Layout(local_rank=dist.get_rank(), nproc_per_node=dist.get_world_size(), nnodes=1, node_rank=0)
