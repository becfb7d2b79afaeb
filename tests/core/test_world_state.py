"""torch.distributed's group rules, one state per world, rank and size from the group, ``tensor=``, settings.

The group example of the seeds (PyTorch's "Writing Distributed Applications"
tutorial, seed 004; the collective examples of seed 001) runs unchanged on 4
ranks with the outputs the seeds print.
"""

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.distributed as dist

import polydist as pd
from polydist import context, settings
from conftest import ROOT

pytestmark = pytest.mark.timeout(180)


# ------------------------------------------------------------ the seeds' group examples, on 4 ranks


def _seed_004_group_example():
    rank = pd.get_rank()
    group = pd.new_group([0, 1])  # every rank calls it, as in the tutorial
    tensor = torch.ones(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pd.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    line = f"Rank {rank} has data {tensor[0]}"  # the tutorial's print
    return line, group is dist.GroupMember.NON_GROUP_MEMBER, len(caught)


@pytest.mark.subgroups(groups=[])  # every rank calls new_group already
def test_seed_004_group_example_runs_unchanged_on_4_ranks(world4):
    results = world4.run(_seed_004_group_example)
    assert [line for line, _, _ in results] == [
        "Rank 0 has data 2.0",
        "Rank 1 has data 2.0",
        "Rank 2 has data 1.0",  # not in the group: the call was a no-op
        "Rank 3 has data 1.0",
    ]
    assert [non_member for _, non_member, _ in results] == [False, False, True, True]
    assert [warned for _, _, warned in results] == [0, 0, 1, 1]


def _seed_001_examples():
    rank, size = pd.get_rank(), pd.get_world_size()
    group = pd.new_group(list(range(size)))
    out = {}
    tensor = torch.ones(1)
    pd.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    out["all_reduce"] = f"[{rank}] data = {tensor[0]}"
    tensor = torch.ones(1)
    pd.reduce(tensor, dst=0, op=dist.ReduceOp.SUM, group=group)
    out["reduce"] = f"[{rank}] data = {tensor[0]}"
    tensor = torch.tensor([rank + 1.0])
    pd.broadcast(tensor, src=0, group=group)
    out["broadcast"] = f"[{rank}] data = {tensor[0]}"
    return out


def test_seed_001_collectives_with_a_group_of_every_rank(world4):
    results = world4.run(_seed_001_examples)
    assert [r["all_reduce"] for r in results] == [f"[{r}] data = 4.0" for r in range(4)]
    # Only rank 0 has the sum. The seed prints partial sums on ranks 1-3 (gloo writes them into the
    # inputs); polydist leaves those inputs untouched, a documented fix.
    assert [r["reduce"] for r in results] == ["[0] data = 4.0", "[1] data = 1.0", "[2] data = 1.0", "[3] data = 1.0"]
    assert [r["broadcast"] for r in results] == [f"[{r}] data = 1.0" for r in range(4)]


def _non_member_calls():
    rank = pd.get_rank()
    context.world().warned.clear()  # warnings are once per group and world; this shared world saw others before
    group = pd.new_group([2, 0])
    t = torch.full((2,), float(rank))
    out = {"is_non_member": group is dist.GroupMember.NON_GROUP_MEMBER}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["all_reduce"] = pd.all_reduce(t, group=group).tolist()
        out["number"] = pd.all_reduce(rank + 10, group=group)
        out["broadcast"] = pd.broadcast(f"from {rank}", src=0, group=group)
        out["all_gather"] = pd.all_gather(rank, group=group)
        out["reduce"] = pd.reduce(t, dst=2, group=group).tolist()
        out["list_group"] = pd.all_reduce(torch.ones(1), group=[0, 2]).item()
        out["async"] = pd.all_reduce(torch.ones(1), group=group, async_op=True).wait().item()
        pd.barrier(group=group)
    out["warnings"] = len(caught)
    out["world"] = pd.all_reduce(1)  # every rank still in step on the world
    return out


@pytest.mark.subgroups(groups=[])  # every rank calls new_group already
def test_non_members_get_their_input_back_and_one_warning_per_group(world3):
    results = world3.run(_non_member_calls)
    r0, r1, r2 = results
    assert not r0["is_non_member"] and r1["is_non_member"] and not r2["is_non_member"]
    assert r0["all_reduce"] == r2["all_reduce"] == [2.0, 2.0] and r1["all_reduce"] == [1.0, 1.0]
    assert r0["number"] == r2["number"] == 22 and r1["number"] == 11
    assert r0["broadcast"] == r2["broadcast"] == "from 0" and r1["broadcast"] == "from 1"
    assert r0["all_gather"] == r2["all_gather"] == [0, 2] and r1["all_gather"] == 1
    assert r1["reduce"] == [1.0, 1.0] and r2["reduce"] == [4.0, 4.0]
    assert r0["list_group"] == r2["list_group"] == 2.0 and r1["list_group"] == 1.0
    assert r0["async"] == r2["async"] == 2.0 and r1["async"] == 1.0
    # rank 1 was warned once for NON_GROUP_MEMBER and once for the rank list [0, 2]; members never
    assert (r0["warnings"], r1["warnings"], r2["warnings"]) == (0, 2, 0)
    assert all(r["world"] == 3 for r in results)


# ------------------------------------------------------------ tensor= keyword calls, as torch.distributed and idist


def _keyword_calls():
    rank = pd.get_rank()
    out = {}
    out["all_reduce"] = pd.all_reduce(tensor=torch.ones(2), op="SUM").tolist()
    out["reduce"] = pd.reduce(tensor=torch.ones(1), dst=0).item()
    out["broadcast"] = pd.broadcast(tensor=torch.tensor([rank + 5.0]), src=1).item()
    out["all_gather"] = pd.all_gather(tensor=torch.tensor([rank])).tolist()
    out["gather"] = pd.gather(tensor=rank, dst=0)
    out["value"] = pd.all_reduce(tensor=rank + 1)
    out["scatter"] = pd.scatter(tensors=[10, 20] if rank == 0 else None, src=0)
    out["all_to_all"] = pd.all_to_all(tensors=[f"{rank}->0", f"{rank}->1"])
    out["reduce_scatter"] = pd.reduce_scatter(tensor=torch.arange(4.0)).tolist()
    if rank == 0:
        pd.send(tensor=torch.tensor([7.0]), dst=1)
    else:
        out["recv"] = pd.recv(tensor=torch.zeros(1), src=0).item()
    return out


@pytest.mark.p2p
def test_collectives_take_tensor_as_a_keyword(world2):
    r0, r1 = world2.run(_keyword_calls)
    assert r0["all_reduce"] == r1["all_reduce"] == [2.0, 2.0]
    assert r0["reduce"] == 2.0 and r1["reduce"] == 1.0
    assert r0["broadcast"] == r1["broadcast"] == 6.0
    assert r0["all_gather"] == r1["all_gather"] == [0, 1]
    assert r0["gather"] == [0, 1] and r1["gather"] is None
    assert r0["value"] == r1["value"] == 3
    assert (r0["scatter"], r1["scatter"]) == (10, 20)
    assert r0["all_to_all"] == ["0->0", "1->0"] and r1["all_to_all"] == ["0->1", "1->1"]
    assert r0["reduce_scatter"] == [0.0, 2.0] and r1["reduce_scatter"] == [4.0, 6.0]
    assert r1["recv"] == 7.0


def test_tensor_keyword_serially():
    t = torch.ones(2)
    assert pd.all_reduce(tensor=t) is t and pd.broadcast(tensor=t, src=0) is t
    assert pd.all_gather(tensor=3) == [3] and pd.reduce(tensor=2, dst=0) == 2


# ------------------------------------------------------------ one state per world; rank and size from the group


def _run_python(code: str, env: dict) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=150
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out


@pytest.fixture
def clean_env(cli_env):
    return {k: v for k, v in cli_env.items() if k not in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")}


REINIT = """
    import os, tempfile, torch, torch.distributed as dist
    import polydist as pd

    rank, size = int(os.environ["R"]), 2
    folder = os.environ["STORE_DIR"]
    dist.init_process_group("gloo", init_method=f"file://{folder}/a", rank=rank, world_size=size)
    first = pd.new_group([0, 1])
    assert pd.all_reduce(torch.ones(1), group=[0, 1]).item() == 2.0
    pd.all_reduce(torch.ones(1))
    dist.destroy_process_group()  # the user's own teardown, behind polydist's back
    dist.init_process_group("gloo", init_method=f"file://{folder}/b", rank=rank, world_size=size)
    second = pd.new_group([0, 1])
    assert second is not first, "a group of the destroyed world came back"
    assert pd.all_reduce(torch.ones(1), group=[1, 0]).item() == 2.0
    with pd.set_debug(True):  # fingerprints compare sequence numbers: the new world's start from 1
        assert pd.all_reduce(torch.ones(1)).item() == 2.0
        assert pd.all_reduce(torch.ones(1), group=second).item() == 2.0
    dist.destroy_process_group()
    print("ok", rank)
"""


def test_destroy_and_reinit_leaves_nothing_stale(clean_env, tmp_path):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(REINIT)],
            env=dict(clean_env, R=str(r), STORE_DIR=str(tmp_path)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=150) for p in procs]
    for r, (p, (stdout, stderr)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and stdout.strip() == f"ok {r}", stdout + stderr


WORLD_SIZE_ONLY = """
    import torch, torch.distributed as dist
    import polydist as pd

    # serial: the incomplete variables do not poison queries or collectives
    assert (pd.get_rank(), pd.get_world_size(), pd.all_reduce(3)) == (0, 1, 3)
    assert pd.all_gather("x") == ["x"] and pd.auto_dataloader(list(range(4)), batch_size=2) is not None
    try:
        pd.initialize("gloo")  # only creating a group reads them, and says what is wrong
    except ValueError as exc:
        print("initialize:", exc)
    # inside the user's own group, rank and size come from the group
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert (pd.get_rank(), pd.get_world_size(), pd.get_local_rank()) == (0, 1, 0)
    t = torch.ones(2)
    assert pd.all_reduce(t) is t and pd.all_gather(7) == [7]
    model = pd.auto_model(torch.nn.Linear(2, 1))
    assert isinstance(model, torch.nn.Linear)  # world size 1: not wrapped
    pd.initialize()  # adopts the user's group
    assert pd.backend() == "gloo"
    dist.destroy_process_group()
    print("ok")
"""


def test_world_size_without_rank_does_not_poison_calls(clean_env):
    env = dict(clean_env, WORLD_SIZE="4")
    env.pop("RANK", None)
    out = _run_python(WORLD_SIZE_ONLY, env)
    assert out.stdout.strip().endswith("ok")
    assert "initialize:" in out.stdout and "WORLD_SIZE" in out.stdout


# ------------------------------------------------------------ settings


def test_set_debug_and_set_allow_pickle_restore_as_context_managers():
    before_debug, before_pickle = pd.is_debug(), settings.pickle_allowed()
    with pd.set_debug(not before_debug):
        assert pd.is_debug() is (not before_debug)
        with pd.set_allow_pickle(True):
            assert settings.pickle_allowed()
        assert settings.pickle_allowed() is before_pickle
    assert pd.is_debug() is before_debug
    pd.set_debug(True)  # a plain call stays in force
    try:
        assert pd.is_debug()
    finally:
        pd.set_debug(before_debug)


def test_variables_name_themselves_when_malformed():
    assert settings.TIMEOUT.read({"POLYDIST_TIMEOUT": "2.5"}) == 2.5
    assert settings.TIMEOUT.read({}) is None and settings.DEBUG.read({"POLYDIST_DEBUG": " "}) is False
    assert settings.DEBUG.read({"POLYDIST_DEBUG": "On"}) is True
    with pytest.raises(ValueError, match=r"\$POLYDIST_TIMEOUT='-1' is not valid"):
        settings.TIMEOUT.read({"POLYDIST_TIMEOUT": "-1"})
    with pytest.raises(ValueError, match=r"\$POLYDIST_DEBUG='maybe' is not valid"):
        settings.DEBUG.read({"POLYDIST_DEBUG": "maybe"})


def test_every_polydist_variable_is_declared_in_settings():
    root = os.path.join(ROOT, "src", "polydist")
    declared = {v.name for v in vars(settings).values() if isinstance(v, settings.Variable)}
    import re

    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py") and name != "settings.py":
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    code = f.read()
                quoted = set(re.findall(r"[\"'](POLYDIST_[A-Z_]+)[\"']", code))
                assert not quoted, f"{name} spells {quoted} as a literal; use polydist.settings"
    assert {"POLYDIST_DEBUG", "POLYDIST_ALLOW_PICKLE", "POLYDIST_TIMEOUT", "POLYDIST_BACKEND"} <= declared
