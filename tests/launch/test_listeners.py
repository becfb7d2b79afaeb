"""Single-node jobs listen on loopback only: every TCP listener a rank holds is on 127.0.0.1 or ::1.

The listeners are read from ``/proc/net/tcp{,6}`` (state 0A) and matched to the
process's own socket file descriptors, while the job runs.
"""

import ast
import os
import socket
import struct

import pytest
import torch

import polydist as pd
from polydist import _torch

pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")]


def _address(hex_addr: str, v6: bool) -> str:
    raw = bytes.fromhex(hex_addr)
    if not v6:
        return socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(hex_addr, 16)))
    words = struct.unpack("<4I", raw)  # four host-order 32-bit words
    return socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words))


def listeners(pid: str = "self") -> list:
    """``[(address, port)]`` of the TCP sockets process ``pid`` listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for name, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        if not os.path.exists(name):
            continue
        with open(name) as f:
            for line in list(f)[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    addr, port = cols[1].split(":")
                    found.append((_address(addr, v6), int(port, 16)))
    return found


def _loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr in ("::1", "::ffff:127.0.0.1")


def _store_listener():
    """This rank's listeners, and the port of the mpi:// rendezvous store (rank 0 holds its server)."""
    pd.all_reduce(torch.ones(1))
    store = _torch.default_store()
    while not hasattr(store, "port"):  # the default store is a PrefixStore over the TCPStore
        store = store.underlying_store
    return listeners(), store.port


def test_mpi_rendezvous_store_listens_on_loopback_only(mpi_world3):
    """The mpi:// store on rank 0 of a single-host job binds 127.0.0.1, not every interface.

    MPI's own runtime listens too (mpiexec's PMI socket, inherited by the
    ranks; MPICH's TCP transport on the host's address): those belong to the
    MPI installation and are configured there (e.g. ``FI_TCP_IFACE=lo``).
    """
    (found, port), *others = mpi_world3.run(_store_listener)
    mine = [a for a, p in found if p == port]
    assert mine, f"rank 0 does not hold the store's listener (port {port}); it listens on {found}"
    assert all(_loopback(a) for a in mine), f"the mpi:// store listens on {mine}"
    assert all(p not in [q for _, q in other] for other, _ in others for p in [port])  # only rank 0 serves it


JOB = """
import os, sys
sys.path.insert(0, {here!r})
import torch, polydist as pd
from test_listeners import listeners
pd.initialize()
pd.all_reduce(torch.ones(1))
found = listeners() + listeners(str(os.getppid()))  # this rank's and its launcher's (the elastic agent)
print("LISTENERS", pd.get_rank(), found, flush=True)
pd.barrier()
"""


@pytest.mark.parametrize("restarts", [[], ["--max-restarts", "1"]], ids=["plain", "restartable"])
def test_polydist_run_listens_on_loopback_only(restarts, tmp_path, cli_env):
    """The launcher's rendezvous store, the store it shares with its workers, and the workers' gloo pairs.

    A restartable job's workers meet on a store of their own, served by rank 0
    (polydist._torch_elastic.fresh_worker_store).
    """
    import subprocess

    script = tmp_path / "job.py"
    script.write_text(JOB.format(here=os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        ["polydist", "run", *restarts, "--nproc-per-node", "2", str(script)],
        env=cli_env, capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line.split("LISTENERS ", 1)[1] for line in out.stdout.splitlines() if "LISTENERS" in line]
    assert len(lines) == 2, out.stdout
    launcher_ports = 0
    for line in lines:
        rank, found = line.split(" ", 1)
        found = ast.literal_eval(found)
        assert found and all(_loopback(a) for a, _ in found), f"rank {rank} or its launcher listens on {found}"
        launcher_ports = max(launcher_ports, len(found))
    assert launcher_ports >= 3  # the two launcher stores plus at least one gloo listener were seen
