"""The Python groups' argument checks are one rule, written once: the mpi4py and horovod groups refuse
the same calls with the same error, before anything is queued or sent (no world, no MPI, no Horovod:
a call that passed its checks would reach the transport, which these groups lack here)."""

from __future__ import annotations

import pytest
import torch

from polydist.backends.horovod.process_group import HorovodProcessGroup
from polydist.backends.mpi4py.process_group import MPIProcessGroup

f32, f64 = torch.float32, torch.float64


def _groups():
    return {"mpi4py": MPIProcessGroup(None, 0, 3), "horovod": HorovodProcessGroup(0, 3)}


def _empty(*shape, dtype=f32):
    return torch.empty(*shape, dtype=dtype)


# call -> the words both groups raise (torch's rule for the list forms: one tensor per group rank,
# each of the other side's dtype and number of elements, as ProcessGroupMPI's checkSameSizeAndType)
BAD_CALLS = {
    "all_gather: a short list": (
        lambda g: g.allgather([[_empty(2)] * 2], [torch.ones(2)]),
        "all_gather: invalid output tensor list (expected length 3, one per group rank, got 2)",
    ),
    "all_gather: another dtype, as many elements": (  # mpi4py converted the values before
        lambda g: g.allgather([[_empty(2, dtype=f64)] * 3], [torch.ones(2)]),
        "all_gather: invalid output tensor at index 0 (expected torch.float32 of 2 elements as the input, got torch.float64 of 2)",
    ),
    "all_gather: another dtype, as many bytes": (  # horovod reinterpreted the bytes before
        lambda g: g.allgather([[_empty(2), _empty(2), _empty(1, dtype=f64)]], [torch.ones(2)]),
        "all_gather: invalid output tensor at index 2 (expected torch.float32 of 2 elements as the input, got torch.float64 of 1)",
    ),
    "gather: another dtype, as many bytes": (
        lambda g: g.gather([[_empty(1, dtype=f64)] * 3], [torch.ones(2)]),
        "gather: invalid output tensor at index 0 (expected torch.float32 of 2 elements as the input, got torch.float64 of 1)",
    ),
    "scatter: a long list": (
        lambda g: g.scatter([_empty(2)], [[torch.ones(2)] * 4]),
        "scatter: invalid input tensor list (expected length 3, one per group rank, got 4)",
    ),
    "scatter: a larger input": (
        lambda g: g.scatter([_empty(2)], [[torch.ones(2), torch.ones(3), torch.ones(2)]]),
        "scatter: invalid input tensor at index 1 (expected torch.float32 of 2 elements as the output, got torch.float32 of 3)",
    ),
    "all_gather_coalesced: a smaller output": (  # horovod did not check the sizes before
        lambda g: g.allgather_coalesced([[_empty(2)]] * 3, [torch.ones(3)]),
        "all_gather_coalesced: invalid output tensor at index 0 (expected torch.float32 of 3 elements as the input, got torch.float32 of 2)",
    ),
    "all_to_all: a short list": (  # mpi4py did not check the lists before
        lambda g: g.alltoall([_empty(2)] * 2, [torch.ones(2)] * 3),
        "all_to_all: invalid output tensor list (expected length 3, one per group rank, got 2)",
    ),
    "all_to_all_single: dim 0 does not split evenly": (  # mpi4py split the bytes mid-row before
        lambda g: g.all_to_all_single(_empty(2, 3), torch.ones(2, 3), [], []),
        "all_to_all_single: input dim 0 (2) is not divisible by the group size 3",
    ),
    "all_to_all_single: unequal sides": (
        lambda g: g.all_to_all_single(_empty(6), torch.ones(3), [], []),
        "all_to_all_single: input (12 B) and output (24 B) must be equal",
    ),
    "all_to_all_single: bad split sizes": (
        lambda g: g.all_to_all_single(_empty(3), torch.ones(3), [1, 1, 1], [1, 2]),
        "all_to_all_single: input split sizes [1, 2] do not split dim 0 (3) into 3",
    ),
    "all_gather_into_tensor: a short output": (
        lambda g: g._allgather_base(_empty(5), torch.ones(2)),
        "all_gather: output has 20 bytes, need input's 8 x group size 3",
    ),
    "reduce_scatter_tensor: another dtype": (
        lambda g: g._reduce_scatter_base(_empty(2, dtype=f64), torch.ones(6)),
        "reduce_scatter: input dtype torch.float32 differs from output dtype torch.float64",
    ),
    "all_gather_into_tensor coalesced: a short output": (
        lambda g: g.allgather_into_tensor_coalesced([_empty(6), _empty(5)], [torch.ones(2), torch.ones(2)]),
        "all_gather_into_tensor_coalesced: output 1 has 20 bytes, need input 1's 8 x group size 3",
    ),
    "reduce_scatter_tensor coalesced: a short input": (
        lambda g: g.reduce_scatter_tensor_coalesced([_empty(2), _empty(2)], [torch.ones(6), torch.ones(5)]),
        "reduce_scatter_tensor_coalesced: input 1 (5 x torch.float32) must hold output 1's 2 x torch.float32 elements"
        " x group size 3",
    ),
    "reduce_scatter_tensor coalesced: fewer outputs than inputs": (
        lambda g: g.reduce_scatter_tensor_coalesced([_empty(2)], [torch.ones(6), torch.ones(6)]),
        "reduce_scatter_tensor_coalesced: 1 output tensors for 2 input tensors",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_both_groups_refuse_a_bad_call_alike_before_sending(name):
    call, words = BAD_CALLS[name]
    for backend, group in _groups().items():
        with pytest.raises(ValueError) as exc:
            call(group)
        assert str(exc.value) == words, backend
        assert isinstance(exc.value, RuntimeError), backend  # what torch's own backends raise (InvalidArgumentError)
        assert group._lane.pending == 0 and group._lane._thread is None  # nothing was queued


def test_a_tensor_off_the_cpu_is_named_by_every_check():
    meta = torch.ones(3, device="meta")
    for backend, group in _groups().items():
        for call in (
            lambda: group.allgather([[torch.ones(3)] * 3], [meta]),
            lambda: group.allgather([[torch.ones(3), meta, torch.ones(3)]], [torch.ones(3)]),
            lambda: group.broadcast([meta]),
            lambda: group.alltoall([torch.ones(3)] * 3, [meta] * 3),
            lambda: group.all_to_all_single(torch.ones(3), meta, [], []),
            lambda: group.allgather_into_tensor_coalesced([torch.ones(9), torch.ones(9, device="meta")], [torch.ones(3)] * 2),
            lambda: group.reduce_scatter_tensor_coalesced([torch.ones(1), torch.ones(1, device="meta")], [torch.ones(3)] * 2),
        ):
            with pytest.raises(ValueError, match=f"the {backend} backend moves CPU tensors only.*got a tensor on meta"):
                call()
