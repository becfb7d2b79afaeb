"""``ignite.distributed``'s names that polydist's own API does not need, so that ignite code runs unchanged.

Flags of what this PyTorch can do, ignite's list of its computation models,
and ``sync``. Source: ``ignite.distributed.utils`` (ignite 0.5).
"""

from __future__ import annotations

import importlib.util

import torch.distributed as dist

from .context import world

__all__ = ["has_native_dist_support", "has_xla_support", "has_hvd_support", "sync", "registered_computation_models"]

has_native_dist_support: bool = dist.is_available()
"""True when this PyTorch has ``torch.distributed`` (ignite's ``idist.has_native_dist_support``)."""
has_xla_support: bool = importlib.util.find_spec("torch_xla") is not None
"""True when ``torch_xla`` is installed (ignite's flag): ``initialize("xla-tpu")`` then works (the Choosing a backend guide)."""
has_hvd_support: bool = importlib.util.find_spec("horovod") is not None
"""True when ``horovod`` is installed (ignite's flag): ``initialize("horovod")`` then works under ``horovodrun``."""


def sync(temporary: bool = False) -> None:
    """Adopt a process group the user created with ``torch.distributed`` (ignite's ``idist.sync``).

    polydist adopts such a group by itself at the next call, so this is only
    needed by code written for ignite; ``temporary`` is accepted and ignored.
    """
    world()


def registered_computation_models() -> list:
    """The kinds of world polydist runs in, by ignite's names: ``["serial", "native-dist"]``, then
    ``"xla-dist"`` where torch_xla is installed and ``"horovod-dist"`` where Horovod is, in ignite's order.

    ignite returns its internal model classes; no user code needs those.
    """
    return ["serial", "native-dist"] + (["xla-dist"] if has_xla_support else []) + (["horovod-dist"] if has_hvd_support else [])
