"""Launcher detection: what started this process, as one :class:`ProcessInfo`.

Reads only environment variables; never writes them. Recognised today:
torchrun / ``polydist run`` / ``polydist.spawn`` (all three use PyTorch's
elastic agent, which exports ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``) and any launcher that sets the same variables. A process
with none of them is serial (world size 1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

__all__ = ["ProcessInfo", "detect"]


@dataclass(frozen=True)
class ProcessInfo:
    """Where this process sits in the job, as its launcher described it.

    Fields a launcher does not export are ``None`` (e.g. the node layout when
    only ``RANK``/``WORLD_SIZE`` are set); :mod:`polydist.context` then derives
    them from the process group.
    """

    launcher: str  # "serial", "polydist", "torchrun", "env"
    rank: int = 0
    world_size: int = 1
    local_rank: Optional[int] = 0
    local_world_size: Optional[int] = 1
    node_rank: Optional[int] = 0
    nnodes: Optional[int] = 1
    master_addr: Optional[str] = None
    master_port: Optional[int] = None

    @property
    def is_distributed(self) -> bool:
        """True when the launcher started more than one process."""
        return self.world_size > 1


def _int(env: Mapping[str, str], name: str) -> Optional[int]:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def detect(env: Optional[Mapping[str, str]] = None) -> ProcessInfo:
    """Describe this process from its environment (``os.environ`` by default).

    Raises ``ValueError`` naming the variables when they contradict each other
    (e.g. ``RANK`` >= ``WORLD_SIZE``) or only one of ``RANK``/``WORLD_SIZE`` is set.
    """
    env = os.environ if env is None else env
    rank, world_size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if rank is None and world_size is None:
        return ProcessInfo(launcher="serial")
    if rank is None or world_size is None:
        missing = "RANK" if rank is None else "WORLD_SIZE"
        raise ValueError(
            f"environment sets {'WORLD_SIZE' if rank is None else 'RANK'} but not {missing}; "
            "a launcher must set both"
        )
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"environment has RANK={rank} and WORLD_SIZE={world_size}: need 0 <= RANK < WORLD_SIZE")
    local_rank = _int(env, "LOCAL_RANK")
    local_world_size = _int(env, "LOCAL_WORLD_SIZE")
    if local_rank is not None and local_world_size is not None and not 0 <= local_rank < local_world_size:
        raise ValueError(
            f"environment has LOCAL_RANK={local_rank} and LOCAL_WORLD_SIZE={local_world_size}: "
            "need 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE"
        )
    if env.get("POLYDIST_LAUNCHER"):
        launcher = "polydist"
    elif env.get("TORCHELASTIC_RUN_ID"):
        launcher = "torchrun"
    else:
        launcher = "env"
    return ProcessInfo(
        launcher=launcher,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=_int(env, "GROUP_RANK"),
        nnodes=_int(env, "GROUP_WORLD_SIZE"),
        master_addr=env.get("MASTER_ADDR") or None,
        master_port=_int(env, "MASTER_PORT"),
    )
