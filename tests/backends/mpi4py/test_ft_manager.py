"""MPI's fault-tolerance manager (backends/mpi4py/ft_manager.py) without MPI: what a replacement accepts from the
live ranks (their layout and their state, hostile until checked), and the session rule that makes each process of
a fault-tolerant MPI job serial. The manager at work, under Open MPI's ULFM: tests/launch/test_fault_tolerant.py."""

import re

import pytest
import torch

from polydist import codec
from polydist.backends.mpi4py import ft_manager
from polydist.launch import environment


def _manager(**states):
    manager = ft_manager.UlfmManager(comm=None, replicas_of=[0, 2, 1], replica=1, step=0, command=["python"],
                                     replacements=3)  # fmt: skip
    loaded = {}
    for name, value in states.items():
        manager.register_state_dict_fn(name, lambda v, n=name: loaded.__setitem__(n, v), lambda v=value: v)
    manager.required = frozenset(states)
    return manager, loaded


def test_a_replacement_loads_the_live_state_and_the_step_it_was_sent():
    manager, loaded = _manager(model={"w": torch.zeros(2)})
    received = []
    manager._on_received = lambda size, seconds: received.append(size)
    payload = codec.encode({"step": 41, "states": {"model": {"w": torch.ones(2)}}})
    manager._load(payload)
    assert manager.current_step() == 41 and torch.equal(loaded["model"]["w"], torch.ones(2))
    assert received == [len(payload)]


@pytest.mark.parametrize(
    "state, words",
    [
        ({"step": 3, "states": {}}, "lacks ['model']"),
        ({"step": -1, "states": {"model": {}}}, "is not one"),
        ({"step": True, "states": {"model": {}}}, "is not one"),
        ({"states": {"model": {}}}, "is not one"),
        ([1, 2], "is not one"),
    ],
)
def test_a_state_that_is_not_one_is_refused_before_anything_is_loaded(state, words):
    manager, loaded = _manager(model={"w": torch.zeros(2)})
    with pytest.raises(ValueError, match=re.escape(words)):
        manager._load(codec.encode(state))
    assert loaded == {} and manager.current_step() == 0


def test_bytes_that_are_not_the_codec_are_refused():
    manager, _ = _manager(model={})
    import pickle

    with pytest.raises(ValueError):
        manager._load(pickle.dumps({"step": 1, "states": {"model": {}}}))


@pytest.mark.parametrize(
    "header",
    [
        {"replicas_of": [0, "1"], "step": 0, "quorum": 1, "replaced": {}},
        {"replicas_of": [0, 1], "step": None, "quorum": 1, "replaced": {}},
        {"replicas_of": [0, 1], "step": 0, "quorum": 1, "replaced": {"1": 1}},
        {"replicas_of": [0, 1], "step": 0, "quorum": 1},
        "replicas",
    ],
)
def test_a_layout_that_is_not_one_is_refused(header):
    with pytest.raises(ValueError, match="no job layout"):
        ft_manager._header(header)


def test_a_layout_is_taken_as_sent():
    header = {"replicas_of": [0, 2, 1], "step": 7, "quorum": 3, "replaced": {1: 1}}
    assert ft_manager._header(header) is header


def test_each_rank_of_a_fault_tolerant_mpi_job_is_a_world_of_its_own(monkeypatch):
    """mpiexec announces every rank; under --fault-tolerant with replica groups of one process the launcher's
    world is the process itself, so initialize() stays serial and the queries say rank 0 of 1."""
    monkeypatch.setenv("PMI_RANK", "2")
    monkeypatch.setenv("PMI_SIZE", "3")
    monkeypatch.setenv("HYDRA_CONTROL_FD", "3")  # what makes it MPICH's Hydra to the launcher readers
    assert environment.launcher().world_size == 3  # not fault-tolerant: the MPI job's world
    monkeypatch.setenv("POLYDIST_FAULT_TOLERANT", "1")
    monkeypatch.setenv("POLYDIST_FT_GROUP_SIZE", "1")
    assert (environment.launcher().rank, environment.launcher().world_size) == (0, 1)
    assert environment.detect().rank == 2  # what the worker reads its replica group from
