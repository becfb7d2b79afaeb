"""The backend registry (``backends/registry.py``): core modules take a backend's traits from its entry, never its name.

A backend declared here (as the XLA backend will be) changes what the core
does without any edit to it; a backend declared nowhere gets torch.distributed's
defaults. No process group is made.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import polydist
from polydist import ops
from polydist.backends import declaration, registry
from polydist.collectives import reduce
from polydist.launch.environment import ProcessInfo

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def declared():
    """Declare entries for the test; the registry and the reduction tables are restored afterwards."""
    entries, suspect = dict(declaration.DECLARED), set(ops.SUSPECT)
    yield registry.declare
    declaration.DECLARED.clear()
    declaration.DECLARED.update(entries)
    ops.SUSPECT.clear()
    ops.SUSPECT.update(suspect)


def test_a_backend_declared_nowhere_has_torch_distributed_defaults():
    entry = registry.get("some-registered-backend")
    assert entry.name == "some-registered-backend"
    assert entry.comm_device() == torch.device("cpu")
    assert entry.model_name == "native-dist"
    assert not entry.reduce_keeps_input and not entry.native_avg  # reduce copies non-root inputs; AVG divides
    assert entry.no_subgroups is None and entry.reductions is None
    ops.check_backend(entry.reductions, "MAX", torch.uint64)  # nothing second-guessed


def test_the_entries_keep_what_the_core_used_to_know_by_name(monkeypatch):
    monkeypatch.delenv("HOROVOD_DYNAMIC_PROCESS_SETS", raising=False)  # horovod's subgroups need dynamic sets
    gloo, nccl = registry.get("gloo"), registry.get("nccl")
    assert not gloo.reduce_keeps_input and not gloo.native_avg and gloo.lifecycle.offers_host_address
    assert nccl.reduce_keeps_input and nccl.native_avg and nccl.device == "cuda" and nccl.default_for == "cuda"
    assert registry.get("mpi").reduce_keeps_input and registry.get("mpi").lifecycle.ranks_from_backend
    mpi4py = registry.get("mpi4py")
    assert mpi4py.native_avg and mpi4py.lifecycle.init_url == "mpi://" and registry.by_init_url("mpi://") is mpi4py
    horovod = registry.get("horovod")
    assert horovod.model_name == "horovod-dist" and horovod.lifecycle.init_url == "horovod://"
    assert isinstance(horovod.no_subgroups([0]), NotImplementedError)
    with pytest.raises(TypeError, match="gloo backend cannot reduce dtype torch.uint16"):
        ops.check_backend(gloo.reductions, "SUM", torch.uint16)
    assert polydist.context.available_backends() == polydist.available_backends()
    assert all(registry.get(name).lifecycle.available() for name in polydist.context.available_backends() if name in registry.names())


def test_a_declared_entry_drives_the_core_without_an_edit_to_it(declared):
    table = ops.Reductions("pdtest", frozenset({torch.float32}), source="this test")
    entry = declared(registry.Backend("pdtest", native_avg=True, reduce_keeps_input=True, model_name="pdtest-dist",
                                      reductions=table, no_subgroups=lambda ranks: NotImplementedError(str(ranks))))
    assert registry.get("pdtest").model_name == "pdtest-dist"
    res = SimpleNamespace(backend="pdtest", entry=registry.get("pdtest"), size=2)
    assert reduce._op("AVG", res) == (dist.ReduceOp.AVG, False)  # native: no division afterwards
    assert reduce._op("AVG", SimpleNamespace(backend="gloo", entry=registry.get("gloo"), size=2)) == (dist.ReduceOp.SUM, True)
    assert ("SUM", torch.int64) in ops.SUSPECT  # its table is checked before anything is sent
    with pytest.raises(TypeError, match="pdtest backend cannot reduce dtype torch.int64"):
        ops.check_backend(registry.get("pdtest").reductions, "SUM", torch.int64)
    assert registry.get("pdtest") is entry and "pdtest" in registry.names()


class _Alias(registry.Lifecycle):
    def resolve(self, name):
        return "gloo"


class _Own(registry.Lifecycle):
    init_url = "pdown://"


class _Host(registry.Lifecycle):
    init_url = "pdhost://"

    def hosts_rendezvous(self, info):
        return True


def test_resolve_and_the_rendezvous_come_from_the_lifecycle(declared):
    declared(registry.Backend("pdalias", lifecycle=_Alias()))
    assert registry.resolve("PDALIAS") == "gloo"
    with pytest.raises(ValueError, match="Unknown backend 'pdnowhere'"):
        registry.resolve("pdnowhere")
    own = declared(registry.Backend("pdown", lifecycle=_Own()))
    info = ProcessInfo(launcher="serial", rank=0, world_size=1)
    assert registry.rendezvous_for(own, info) is own and registry.rendezvous_for(registry.get("gloo"), info) is None
    hosted = dataclasses.replace(own, name="pdhost", lifecycle=_Host())
    declared(hosted)
    assert registry.rendezvous_for(registry.get("gloo"), info) is hosted  # the job's rendezvous comes first


class _NeedsLauncher(registry.Lifecycle):
    needs_launcher = "pdlaunch"


def test_spawn_refusal_names_the_launcher_the_lifecycle_needs():
    said = _NeedsLauncher().spawn_refusal("pdneeds")
    assert said.startswith("spawn with backend 'pdneeds': only pdlaunch starts its ranks"), said
    assert "polydist run --backend pdneeds" in said and "polydist.initialize('pdneeds')" in said
    assert registry.get("mpi").lifecycle.spawn_refusal("mpi").startswith(
        "spawn with backend 'mpi': MPI sees only the ranks an MPI launcher starts")  # MPI's own words


def test_the_requested_backend_is_the_variable_else_the_default(monkeypatch):
    monkeypatch.delenv("POLYDIST_BACKEND", raising=False)
    assert registry.requested_name() == registry.default_name() == registry.resolve(None)
    monkeypatch.setenv("POLYDIST_BACKEND", "GLOO")
    assert registry.requested_name() == "GLOO" and registry.resolve(None) == "gloo"  # resolve also checks it
    monkeypatch.setenv("POLYDIST_BACKEND", "pdnowhere")
    assert registry.requested_name() == "pdnowhere"
    with pytest.raises(ValueError, match="Unknown backend 'pdnowhere'"):
        registry.resolve(None)


def test_the_launchers_world_is_wired_when_polydist_is_imported():
    """Backends ask launch/ through registry.world (they cannot import it): wired by polydist/__init__."""
    from polydist.launch import announced, environment

    assert registry.world.announced is environment.launcher
    assert (registry.world.check_group, registry.world.refuse) == (announced.check_group, announced.refuse)


def test_the_mover_comes_from_the_entry(declared):
    from polydist.backends.direct import DirectProcessGroup
    from polydist.backends.mpi4py import native_mpi_available

    direct_group, torch_group = DirectProcessGroup(0, 1), dist.ProcessGroup(0, 1)
    assert registry.get("mpi4py").moves_direct(direct_group) and not registry.get("gloo").moves_direct(direct_group)
    # torch's "mpi" and polydist's stand-in share the name: the entry knows which one this PyTorch has
    assert registry.get("mpi").mover == (registry.SLOTS if native_mpi_available() else registry.DIRECT)
    undeclared = declared(registry.Backend("pdgroup"))  # no mover declared: the group's class says
    assert undeclared.moves_direct(direct_group) and not undeclared.moves_direct(torch_group)
    wrong = declared(registry.Backend("pdwrong", mover=registry.DIRECT))
    with pytest.raises(TypeError, match="'pdwrong' declares the direct mover, but its group is a ProcessGroup"):
        wrong.moves_direct(torch_group)


def test_point_to_point_is_refused_from_the_entry_before_anything_is_sent(declared):
    from polydist.collectives import p2p

    declared(registry.Backend("pdnop2p", point_to_point=False))
    res = SimpleNamespace(backend="pdnop2p", entry=registry.get("pdnop2p"))
    for spec, name in ((p2p._SEND, "send"), (p2p._RECV, "recv")):
        with pytest.raises(NotImplementedError, match=f"^{name}: the pdnop2p backend has no point-to-point"):
            spec.check(res, torch.ones(1), 1, 0, None)
        spec.check(SimpleNamespace(backend="gloo", entry=registry.get("gloo")), torch.ones(1), 1, 0, None)


class _Sees(registry.Lifecycle):
    def __init__(self, visible):
        self.visible = visible

    def sees_device(self, device):
        return device == "pdaccel" and self.visible


class _NotInstalled(registry.Lifecycle):
    def register(self):
        return False


def test_a_device_the_lifecycle_sees_makes_it_the_default(declared):
    cuda_default = registry.get("nccl").device_visible() and registry.get("nccl").lifecycle.available()
    declared(registry.Backend("pdaccel", device="pdaccel", default_for="pdaccel", lifecycle=_Sees(False)))
    assert registry.default_name() == ("nccl" if cuda_default else "gloo")  # its device is not visible
    declared(registry.Backend("pdaccel", device="pdaccel", default_for="pdaccel", lifecycle=_Sees(True)))
    assert registry.default_name() == ("nccl" if cuda_default else "pdaccel")
    assert registry.get("gloo").device_visible()  # cpu and cuda as before


def test_idist_model_names_come_from_the_entries_that_can_run(declared):
    assert registry.model_names()[0] == "native-dist"
    assert polydist.registered_computation_models() == ["serial", *registry.model_names()]
    assert polydist.has_hvd_support == ("horovod-dist" in registry.model_names())
    declared(registry.Backend("pdmodel", model_name="pdmodel-dist"))
    declared(registry.Backend("pdabsent", model_name="pdabsent-dist", lifecycle=_NotInstalled()))  # not installed
    assert "pdmodel-dist" in registry.model_names() and "pdabsent-dist" not in registry.model_names()


# ---------------------------------------------------------------- what torch.distributed is told
# (each backend polydist implements: what its registry entry says)


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


def test_torch_refuses_local_synchronization_by_name_only_where_polydist_lifts_it():
    from polydist import _torch

    lifted = getattr(dist.distributed_c10d._new_group_with_tag, "_polydist", False)
    assert lifted == (registry.get("mpi").torch_devices is not None)  # the stand-in; a native ProcessGroupMPI keeps it
    assert not _torch.allow_local_synchronization("gloo")  # torch refuses nothing by gloo's name
