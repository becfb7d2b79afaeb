"""What torch.distributed is told about each backend polydist implements is what its registry entry says."""

from __future__ import annotations

import torch.distributed as dist

import polydist  # noqa: F401 - registers the backends
from polydist.backends import registry


def test_torch_capability_matches_the_registry_for_every_registered_backend():
    told = 0
    for name in registry.names():
        entry = registry.get(name)
        if entry.torch_devices is None or name not in dist.Backend.backend_capability:
            continue  # torch's own backend (or one not registered here): torch's word stands
        assert dist.Backend.backend_capability[name] == list(entry.torch_devices), name
        told += 1
    assert told >= 1  # mpi4py at least, registered on every test machine


def test_torch_mpi_stand_in_is_cpu_only():
    mpi = registry.get("mpi")
    if mpi.torch_devices is None:  # a PyTorch built with MPI: its ProcessGroupMPI's own capability
        return
    assert mpi.torch_devices == ("cpu",)
    assert dist.Backend.backend_capability["mpi"] == ["cpu"]  # torch's checkpoint code picks CUDA from ['cpu', 'cuda']
