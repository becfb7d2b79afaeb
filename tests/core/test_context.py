"""Context: serial mode, queries in a world, adoption of a user-made group, finalize."""

import dataclasses
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import polydist as pd

pytestmark = pytest.mark.timeout(120)


# ------------------------------------------------------------ serial (this pytest process, no group)


def test_serial_queries():
    assert not dist.is_initialized()
    pd.initialize()  # no launcher, nothing asked: stays serial
    assert not pd.is_initialized() and pd.backend() is None
    assert (pd.get_rank(), pd.get_world_size(), pd.get_local_rank()) == (0, 1, 0)
    assert (pd.get_nproc_per_node(), pd.get_nnodes(), pd.get_node_rank()) == (1, 1, 0)
    # serially, the current CUDA device where one is visible (tests/gpu checks that case), else the CPU
    serial_device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    assert pd.is_main_process() and pd.device() == serial_device
    assert "gloo" in pd.available_backends()
    pd.finalize()


def test_serial_collectives_return_input_values():
    t = torch.arange(3.0)
    assert pd.all_reduce(t) is t and t.tolist() == [0.0, 1.0, 2.0]
    assert pd.all_reduce(5) == 5 and pd.all_reduce(2**80) == 2**80 and pd.all_reduce(3, op="avg") == 3.0
    assert pd.broadcast(t) is t and pd.broadcast("héllo") == "héllo" and pd.broadcast((1, [2])) == (1, [2])
    assert pd.all_gather(1.5) == [1.5] and pd.all_gather("s") == ["s"]
    assert pd.all_gather(torch.tensor(2.0)).tolist() == [2.0]
    assert pd.all_gather(t, concat=False)[0] is t
    pd.barrier()
    with pytest.raises(ValueError, match="src=1"):
        pd.broadcast(t, src=1)
    with pytest.raises(ValueError, match="'bogus'"):
        pd.all_reduce(t, op="bogus")
    with pytest.raises(TypeError, match="Foo"):
        pd.all_gather(type("Foo", (), {})())


def test_show_config_prints(capsys):
    config = pd.show_config()
    printed = capsys.readouterr().out
    assert config["world_size"] == 1 and "world_size" in printed and "backend" in printed


def test_initialize_gloo_world_of_one_and_finalize_keeps_env(monkeypatch):
    monkeypatch.setenv("MY_SETTING", "keep me")
    before = dict(os.environ)
    pd.initialize("gloo")
    try:
        assert pd.backend() == "gloo" and pd.get_world_size() == 1
        t = torch.ones(2)
        assert pd.all_reduce(t).tolist() == [1.0, 1.0]
    finally:
        pd.finalize()
    assert not dist.is_initialized()
    assert dict(os.environ) == before  # nothing added, nothing wiped


def test_initialize_rejects_bad_arguments():
    with pytest.raises(ValueError, match="'nosuch'"):
        pd.initialize("nosuch")
    with pytest.raises(ValueError, match="timeout"):
        pd.initialize("gloo", timeout=-1)
    with pytest.raises(ValueError, match="world_size=2 but no way to rendezvous"):
        pd.initialize("gloo", rank=0, world_size=2)
    assert not dist.is_initialized()


def test_collective_in_launched_process_without_initialize_errors():
    code = (
        "import polydist as pd, torch\n"
        "for call in (lambda: pd.all_reduce(1), lambda: pd.all_gather_tensors_with_shapes(torch.ones(2), [[2]])):\n"
        "    try:\n        call()\n    except pd.NotInitializedError as e:\n        print('ERR', e)"
    )
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.count("ERR this process is rank 1 of 2") == 2 and "initialize()" in out.stdout, out


# ------------------------------------------------------------ in a polydist world


def _queries():
    return (pd.get_rank(), pd.get_world_size(), pd.get_local_rank(), pd.get_nproc_per_node(), pd.get_nnodes(),
            pd.get_node_rank(), pd.is_main_process(), pd.backend(), str(pd.device()), pd.hostname())


def test_queries_in_world(world3):
    results = world3.run(_queries)
    for rank, (r, ws, lr, nproc, nnodes, node, main, backend, device, host) in enumerate(results):
        # The world was started with explicit ranks and no launcher variables: the
        # layout comes from the host-name exchange at initialize().
        assert (r, ws, lr, nproc, nnodes, node) == (rank, 3, rank, 3, 1, 0)
        assert main == (rank == 0) and device == "cpu"
        assert backend == {"mpi": "mpi4py", "horovod": "horovod"}.get(world3.how, "gloo")  # "mpi" on a stock wheel is mpi4py
        assert host == results[0][-1]


# ------------------------------------------------------------ a group the user created


def _adopt():
    r = dist.get_rank()
    before = pd.is_initialized()
    total = pd.all_reduce(torch.tensor([r + 1.0])).item()
    value = pd.broadcast("ünïcode" if r == 0 else None, src=0)
    pd.initialize("gloo")  # explicit adoption: allowed, keeps the group
    try:
        pd.initialize("nccl")
        mismatch = None
    except ValueError as exc:
        mismatch = str(exc)
    pd.finalize()  # adopted: must not destroy the user's group
    still = dist.is_initialized()
    after = pd.all_reduce(1)
    return before, total, value, mismatch, still, after, pd.get_world_size()


def test_user_group_is_adopted_and_left_alone(torch_world2):
    for before, total, value, mismatch, still, after, ws in torch_world2.run(_adopt):
        assert before is True  # adopted on first sight
        assert total == 3.0 and value == "ünïcode"
        assert "already exists" in mismatch
        assert still and after == 2 and ws == 2


def test_multinode_gloo_warns_when_the_host_name_is_loopback(monkeypatch):
    """gloo would offer 127.0.1.1 to the other nodes and fail after a long wait: say so before."""
    import socket
    import warnings

    from polydist import default_group
    from polydist.launch.environment import ProcessInfo

    real = socket.gethostbyname
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "127.0.1.1" if name == socket.gethostname() else real(name))
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    info = ProcessInfo(launcher="polydist", rank=0, world_size=4, local_rank=0, local_world_size=2, node_rank=0,
                       nnodes=2, master_addr="192.0.2.1", master_port=29500)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 29500))
    except OSError:
        pytest.skip("no route to a non-local address on this machine")
    with pytest.warns(RuntimeWarning, match="GLOO_SOCKET_IFNAME"):
        default_group._warn_if_gloo_offers_loopback("gloo", info)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
        default_group._warn_if_gloo_offers_loopback("gloo", info)  # the user chose an interface
        monkeypatch.delenv("GLOO_SOCKET_IFNAME")
        default_group._warn_if_gloo_offers_loopback("gloo", dataclasses.replace(info, master_addr="127.0.0.1"))  # one host
        default_group._warn_if_gloo_offers_loopback("nccl", info)


# ------------------------------------------------------------ ignite.distributed's names (issue 12)


def test_ignite_names_serially():
    assert pd.model_name() == "serial" and pd.registered_computation_models() == ["serial", "native-dist"] + (
        ["horovod-dist"] if pd.has_hvd_support else []) + (["xla-dist"] if pd.has_xla_support else [])
    assert pd.has_native_dist_support is True and pd.has_xla_support is (importlib.util.find_spec("torch_xla") is not None)
    assert isinstance(pd.has_hvd_support, bool)
    t = torch.arange(6.0).view(2, 3)
    assert pd.all_gather_tensors_with_shapes(t, [[2, 3]])[0] is t
    with pytest.raises(ValueError, match=r"shapes\[0\] is \[3, 2\]"):
        pd.all_gather_tensors_with_shapes(t, [(3, 2)])
    with pytest.raises(ValueError, match="2 shapes for a group of 1"):
        pd.all_gather_tensors_with_shapes(t, [(2, 3), (2, 3)])
    with pytest.raises(ValueError, match="non-negative int"):
        pd.set_local_rank(-1)
    pd.sync()  # nothing to adopt: stays serial
    assert pd.model_name() == "serial"


def _ignite_names_in_group():
    r, n = pd.get_rank(), pd.get_world_size()
    mine = torch.full((r + 1, 2), float(r))
    got = pd.all_gather_tensors_with_shapes(mine, [(i + 1, 2) for i in range(n)])
    sub = pd.all_gather_tensors_with_shapes(mine, [(1, 2), (2, 2)], group=[0, 1])
    return pd.model_name(), [t.tolist() for t in got], [t.shape[0] for t in sub]


def _shapes_lists_disagree():
    r, n = pd.get_rank(), pd.get_world_size()
    mine = torch.zeros(r + 1, 2)
    listed = [(i + 1, 2) if i == r else (9, 2) for i in range(n)]  # each rank right about itself only
    with pd.set_debug(True):
        try:
            pd.all_gather_tensors_with_shapes(mine, listed)
        except pd.CollectiveMismatchError as exc:
            return "all_gather_tensors_with_shapes" in str(exc), pd.all_reduce(1)
    return False, None


def test_ranks_listing_other_shapes_are_a_mismatch_in_debug_mode(world3):
    assert world3.run(_shapes_lists_disagree) == [(True, 3)] * 3


@pytest.mark.subgroups
def test_ignite_names_in_a_group(world3):
    for rank, (name, got, sub) in enumerate(world3.run(_ignite_names_in_group)):
        assert name == "native-dist"
        assert got == [[[float(i)] * 2] * (i + 1) for i in range(3)]
        assert sub == ([1, 2] if rank < 2 else [3])  # rank 2 is not in [0, 1]: its own tensor back, as ignite


def test_bad_group_is_both_type_and_value_error():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for call in (lambda: pd.all_reduce(torch.ones(1), group="abc"), lambda: pd.new_group(["a", "b"])):
            with pytest.raises(ValueError):
                call()
            with pytest.raises(TypeError):
                call()
            with pytest.raises(pd.InvalidGroupError):
                call()
    finally:
        dist.destroy_process_group()


WITHOUT_MASTER = """
import os, torch, polydist as pd
pd.initialize("gloo")
assert pd.get_world_size() == 2 and pd.all_reduce(torch.ones(1)).item() == 2.0
print("ok", pd.get_rank())
pd.finalize()
"""


def test_launched_ranks_without_master_meet_on_loopback_15000(cli_env, tmp_path):
    """RANK/WORLD_SIZE/LOCAL_RANK without MASTER_ADDR/MASTER_PORT on one node: idist's 127.0.0.1:15000."""
    script = tmp_path / "job.py"
    script.write_text(WITHOUT_MASTER)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env=dict(cli_env, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=150) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and out.strip() == f"ok {r}", out + err


@pytest.mark.parametrize("init_method", [None, "env://"])
@pytest.mark.parametrize("launched", [True, False])
def test_env_init_without_master_defaults_to_loopback_15000(init_method, launched, monkeypatch):
    """idist's setup_env_vars: env:// without MASTER_ADDR/MASTER_PORT means 127.0.0.1:15000 on one node, as None
    does for launched ranks; env:// with explicit rank/world_size too (idist exports them). Nothing is created."""
    from polydist import rendezvous
    from polydist.launch.environment import ProcessInfo

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    info = ProcessInfo(launcher="env", rank=1, world_size=2, local_rank=1, local_world_size=2) if launched \
        else ProcessInfo(launcher="serial")
    rank, size = (None, None) if launched else (1, 2)
    if not launched and init_method is None:  # polydist's own rule: nothing says where to meet
        with pytest.raises(ValueError, match="world_size=2 but no way to rendezvous"):
            rendezvous.group_kwargs("gloo", init_method, None, rank, size, {}, info)
        return
    got = rendezvous.group_kwargs("gloo", init_method, None, rank, size, {}, info)
    assert "init_method" not in got and (got["rank"], got["world_size"]) == (1, 2)
    assert got["_store"] == rendezvous._StoreAt("127.0.0.1", rendezvous.SINGLE_NODE_PORT, serve=True)


def test_env_init_with_master_is_torchs(monkeypatch):
    from polydist import rendezvous
    from polydist.launch.environment import ProcessInfo

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29511")
    info = ProcessInfo(launcher="env", rank=1, world_size=2, local_rank=1, local_world_size=2)
    got = rendezvous.group_kwargs("gloo", "env://", None, None, None, {}, info)
    assert got["init_method"] == "env://" and "_store" not in got
