"""What torch does by the name ``"mpi"``, on polydist's stand-in (issue 52, part 2).

torch 2.13's ``distributed_c10d.py`` treats a backend named ``"mpi"`` as its
native ProcessGroupMPI: ``new_group(ranks, use_local_synchronization=True)``
raises "MPI backend doesn't support use_local_synchronization=True", and
``TORCH_DIST_INIT_BARRIER=1``'s barrier after a new group is the world's. The
stand-in's groups are made by their members alone (MPI's ``Create_group``),
so polydist lifts both (``polydist._torch.allow_local_synchronization``).
Each test reads one line of one job under ``mpiexec``: 3 ranks, where rank 1
never calls anything for the group of ranks 0 and 2, as PyTorch's
``test_subpg_*_object`` tests (test/distributed/test_c10d_object_collectives.py)
leave their non-members out; FSDP2's ``set_separate_reduce_scatter_group``
makes its group that way too.
"""

from __future__ import annotations

import pytest

from conftest import _mpi_missing
from test_mpi import _mpi_env, _mpiexec

pytestmark = [pytest.mark.timeout(280), pytest.mark.skipif(bool(_mpi_missing()), reason=_mpi_missing() or "-")]

_JOB = """
    import os, sys, torch, torch.distributed as dist
    import polydist
    dist.init_process_group("mpi")
    r = dist.get_rank()

    def say(what, value):
        sys.stdout.write(f"rank {r} {what} {value}\\n")

    from torch.distributed.tensor.debug import CommDebugMode
    with CommDebugMode() as mode:
        dist.all_reduce(torch.ones(2))
    say("counted", mode.get_comm_counts()[torch.ops.c10d.allreduce_])

    members = [0, 2]
    if r in members:  # rank 1 calls nothing for this group: the point of a local synchronization
        sub = dist.new_group(members, use_local_synchronization=True)
        say("name", sub.group_name)
        out = [None]
        dist.scatter_object_list(out, [{"to": m} for m in members] if r == 0 else None, src=0, group=sub)
        say("scatter", out[0])
        got = [None, None]
        dist.all_gather_object(got, ("from", r), group=sub)
        say("all_gather", got)
        got = [None, None] if r == 2 else None
        dist.gather_object(("from", r), got, dst=2, group=sub)
        say("gather", got)
        objs = [{"step": 3}, "x"] if r == 2 else [None, None]
        dist.broadcast_object_list(objs, src=2, group=sub)
        say("broadcast", objs)
        os.environ["TORCH_DIST_INIT_BARRIER"] = "1"  # the barrier after init: the new group's, not the world's
        again = dist.new_group(members, use_local_synchronization=True)
        del os.environ["TORCH_DIST_INIT_BARRIER"]
        say("barrier", dist.get_process_group_ranks(again))
        say("polydist", polydist.all_reduce(r, group=members))  # polydist's rank-list groups use the same call
    else:
        say("outside", dist.new_group(members, use_local_synchronization=True))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = fully_shard(torch.nn.Linear(4, 3, bias=False), mesh=init_device_mesh("cpu", (3,)))
    model.set_separate_reduce_scatter_group(True)  # FSDP2 makes that group with use_local_synchronization=True
    model(torch.ones(2, 4) * (r + 1)).sum().backward()
    say("fsdp", model.weight.grad.full_tensor().flatten().tolist())
    dist.barrier()
    dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def lines(cli_env):
    out = _mpiexec(3, _JOB, _mpi_env(cli_env), timeout=240)  # 3 ranks importing torch, on a loaded machine
    assert out.returncode == 0, out.stderr[-3000:]
    found: dict = {}
    for line in out.stdout.splitlines():
        if line.startswith("rank "):
            _, rank, what, value = line.split(" ", 3)
            found[(int(rank), what)] = value
    return found


def test_torch_mpi_is_behind_the_dispatcher(lines):
    from polydist.backends import dispatch

    # issue 52: torch makes the group over polydist's Backend, so CommDebugMode counts as on gloo (the job runs
    # without POLYDIST_* variables: behind the dispatcher wherever the Backend is built)
    assert {lines[(r, "counted")] for r in range(3)} == {"1" if dispatch.DISPATCH is not None else "0"}


def test_subgroup_with_local_synchronization_is_named_alike_on_its_members(lines):
    assert lines[(0, "name")] == lines[(2, "name")]
    assert not lines[(0, "name")].isdigit()  # hashed from the ranks, not the count of groups each member made


def test_a_non_member_gets_none_without_waiting(lines):
    assert lines[(1, "outside")] == "None"


def test_scatter_object_list_on_a_local_subgroup(lines):
    assert lines[(0, "scatter")] == "{'to': 0}" and lines[(2, "scatter")] == "{'to': 2}"


def test_all_gather_object_on_a_local_subgroup(lines):
    assert lines[(0, "all_gather")] == lines[(2, "all_gather")] == "[('from', 0), ('from', 2)]"


def test_gather_object_on_a_local_subgroup(lines):
    assert lines[(2, "gather")] == "[('from', 0), ('from', 2)]" and lines[(0, "gather")] == "None"


def test_broadcast_object_list_on_a_local_subgroup(lines):
    assert lines[(0, "broadcast")] == lines[(2, "broadcast")] == "[{'step': 3}, 'x']"


def test_barrier_after_init_is_the_new_groups(lines):
    assert lines[(0, "barrier")] == lines[(2, "barrier")] == "[0, 2]"  # the world's barrier would hang: rank 1 is not in it


def test_fsdp2_separate_reduce_scatter_group(lines):
    # d(sum(W x))/dW = sum over the batch of x: 2 * (r + 1) per element, averaged over the 3 ranks = 4
    assert lines[(0, "fsdp")] == lines[(1, "fsdp")] == lines[(2, "fsdp")] == str([4.0] * 12)


def test_polydist_rank_list_groups_on_torch_mpi(lines):
    assert lines[(0, "polydist")] == lines[(2, "polydist")] == "2"
