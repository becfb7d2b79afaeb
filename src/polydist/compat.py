"""``ignite.distributed``'s names that polydist's own API does not need, so that ignite code runs unchanged.

Flags of what this PyTorch can do, ignite's computation models (the live
world's, and the list of them), and ``sync``. Source: ``ignite.distributed.utils``
(ignite 0.5).
"""

from __future__ import annotations

import importlib.util

import torch.distributed as dist

from .backends import registry
from .context import world

__all__ = [
    "has_native_dist_support", "has_xla_support", "has_hvd_support", "model_name", "sync", "registered_computation_models",
]

has_native_dist_support: bool = dist.is_available()
"""True when this PyTorch has ``torch.distributed`` (ignite's ``idist.has_native_dist_support``)."""
has_xla_support: bool = importlib.util.find_spec("torch_xla") is not None
"""True when ``torch_xla`` is installed (ignite's flag): ``initialize("xla-tpu")`` then works (the Choosing a backend guide)."""
has_hvd_support: bool = "horovod-dist" in registry.model_names()
"""True when Horovod's PyTorch binding is installed (ignite's flag: ``import horovod.torch`` works), so that a
backend of idist's "horovod-dist" model can run: ``initialize("horovod")`` then works under ``horovodrun``."""


def model_name() -> str:
    """``"horovod-dist"`` in a group of the horovod backend, ``"xla-dist"`` on xla-tpu, ``"native-dist"``
    in any other torch.distributed process group, else ``"serial"``.

    Source: ``ignite.distributed.model_name``.
    """
    state = world()
    if state is None:
        return "serial"
    return registry.get(str(dist.get_backend(state.pg))).model_name


def sync(temporary: bool = False) -> None:
    """Adopt a process group the user created with ``torch.distributed`` (ignite's ``idist.sync``).

    polydist adopts such a group by itself at the next call, so this is only
    needed by code written for ignite; ``temporary`` is accepted and ignored.
    """
    world()


def registered_computation_models() -> list:
    """The kinds of world polydist runs in, by ignite's names: ``["serial", "native-dist"]``, and
    ``"horovod-dist"`` where Horovod is installed, ``"xla-dist"`` where torch_xla is (the idist model names
    of the backends that can run here,
    :func:`polydist.backends.registry.model_names`).

    ignite returns its internal model classes; no user code needs those.
    """
    return ["serial", *registry.model_names()]
