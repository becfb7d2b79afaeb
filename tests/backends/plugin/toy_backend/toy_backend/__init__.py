"""A backend from outside polydist: torch's gloo under the name "toy", with a record of its own.

Its registry entry refuses every reduction but SUM on float32/int64 (checked before anything is sent), names
its computation model "toy-dist", so a test can see polydist use the entry.
"""

import torch
import torch.distributed as dist
from polydist import ops
from polydist.backends import registry

NAME = "toy"


def _create(store, rank, size, timeout):
    return dist.ProcessGroupGloo(store, rank, size, timeout)


class _ToyLifecycle(registry.Lifecycle):
    def register(self) -> bool:
        if NAME not in dist.Backend.backend_list:
            dist.Backend.register_backend(NAME, _create, devices=["cpu"])
        return True


_DTYPES = frozenset({torch.float32, torch.int64})
registry.declare(registry.Backend(
    NAME, lifecycle=_ToyLifecycle(), model_name="toy-dist",
    torch_devices=("cpu",),
    reductions=ops.Reductions(NAME, _DTYPES, refused={op: _DTYPES for op in ("PRODUCT", "MIN", "MAX", "AND", "OR", "XOR")},
                              source="the toy plugin: gloo, SUM only"),
))
