"""A real Slurm cluster on this machine: ``munged``, ``slurmctld`` and one ``slurmd`` per node, each node a
network namespace with a host name (UTS namespace) and an address of its own (tests/_netns.py's two hosts).

Why namespaces, not Slurm's multiple-slurmd mode (which Debian's build has: ``scontrol show config`` says
``MULTIPLE_SLURMD = Yes``): in that mode every node shares this machine's host name, address and loopback, so no
job would cross a host boundary, and a rank's host name would not be its node's, as it is on a cluster. Here node ``<tag>-node0`` is also the head node (``slurmctld`` runs in its namespace, like a small
cluster's login node), and the clients (``srun``, ``sbatch``, ``squeue``) are run there by :meth:`command`.

Configured for root without cgroups: ``proctrack/linuxproc`` (a job's processes found by parent pid),
``task/none``, no accounting; ``SlurmdParameters=config_overrides`` lets each node offer 4 CPUs on a 2-core
machine. Everything (configuration, munge key and socket, spool, logs) lives in one temporary directory; no file
under /etc is read or written, and the machine's own munged (if any) is not used. :meth:`close` cancels the
jobs, stops the daemons and deletes the namespaces, even after a failed start.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence

from _netns import TwoHosts, Unavailable, unavailable_reason

DAEMONS = ("munged", "slurmctld", "slurmd")
# slurmd initializes its cgroup plugin even with proctrack/linuxproc and task/none, and `ip netns exec` mounts a
# fresh /sys without /sys/fs/cgroup: an empty tmpfs there (in that namespace's own mounts) is enough for
# cgroup/v1, which then never creates a cgroup as no plugin asks for one.
_CGROUP_MOUNT = ["sh", "-c", 'mount -t tmpfs polydist-slurm /sys/fs/cgroup && exec "$@"', "sh"]
CPUS_PER_NODE = 4

# ssh's place: `<wrapper> [options] HOST COMMAND...` runs COMMAND in HOST's namespace under HOST's name.
_ENTER_HOST = """#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
%s
  *) echo "no such host: $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
"""


def write_enter_host(two: TwoHosts, path: str) -> str:
    """Write ``path``, an executable that takes ssh's place for mpiexec (``<path> [options] HOST COMMAND...``:
    COMMAND run by ``sh`` in HOST's namespace under HOST's name; HOST a node name or address of ``two``)."""
    with open(path, "w") as f:
        f.write(_ENTER_HOST % "\n".join(f"  {h.hostname}|{h.addr}) ns={h.netns} ;;" for h in two.hosts))
    os.chmod(path, 0o700)
    return path


def missing() -> str:
    """Why the cluster cannot be made here ("" when it may be): no Slurm/munge, or no namespaces."""
    absent = [name for name in (*DAEMONS, "srun", "sbatch") if shutil.which(name) is None]
    if absent:
        return f"{', '.join(absent)} not installed (make test-slurm installs slurm-wlm and munge)"
    return unavailable_reason()


class SlurmCluster:
    """Two nodes of ``CPUS_PER_NODE`` CPUs in partition ``debug``; :meth:`start` raises :class:`Unavailable`
    with the daemons' logs when the cluster does not come up."""

    def __init__(self, tag: str, octet: int) -> None:
        self.net = TwoHosts(tag=tag, octet=octet)
        self.dir = tempfile.mkdtemp(prefix=f"polydist-slurm-{tag}-")
        os.chmod(self.dir, 0o700)  # munged refuses a key or socket in a directory others may write
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.socket = os.path.join(self.dir, "munge.socket")
        self._daemons: list[tuple[str, subprocess.Popen]] = []

    @property
    def nodes(self) -> list[str]:
        return [h.hostname for h in self.net.hosts]

    @property
    def env(self) -> dict[str, str]:
        """The environment of a client or daemon: this cluster's configuration, nothing Slurm-ish inherited."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
        env["SLURM_CONF"] = self.conf
        return env

    def command(self, argv: Sequence[str], node: int = 0) -> list[str]:
        """``argv`` on node ``node`` (its namespace and host name)."""
        return self.net.command(self.net.hosts[node], list(argv), own_hostname=True)

    def run(self, argv: Sequence[str], *, node: int = 0, timeout: float = 60, env: dict | None = None,
            cwd: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv, node), env=env or self.env, cwd=cwd, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)

    def pids_inside(self) -> list[int]:
        """The processes in the nodes' namespaces (daemons, steps, ranks)."""
        return [int(p) for h in self.net.hosts for p in subprocess.run(
            ["ip", "netns", "pids", h.netns], capture_output=True, text=True, check=False).stdout.split()]

    # ------------------------------------------------------------------ set-up

    def start(self, timeout: float = 60) -> None:
        self.net.setup()
        self._write_conf()
        key = os.path.join(self.dir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        self._spawn("munged", ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={self.socket}",
                               f"--pid-file={self.dir}/munged.pid", f"--log-file={self.dir}/munged.log",
                               f"--seed-file={self.dir}/munged.seed"])
        self._wait_for(lambda: os.path.exists(self.socket), timeout, "munged's socket")
        self._spawn("slurmctld", self.command(["slurmctld", "-D", "-f", self.conf]))
        for i, node in enumerate(self.nodes):
            self._spawn(f"slurmd {node}", self.command([*_CGROUP_MOUNT, "slurmd", "-D", "-N", node, "-f", self.conf], i))
        self._wait_for(self._nodes_idle, timeout, "both nodes idle in sinfo")

    def _write_conf(self) -> None:
        d = self.dir
        for sub in ("state", *(f"spool/{n}" for n in self.nodes)):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        with open(os.path.join(d, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n")
        head = self.net.hosts[0]
        nodes = "".join(f"NodeName={h.hostname} NodeAddr={h.addr} CPUs={CPUS_PER_NODE} State=UNKNOWN\n"
                        for h in self.net.hosts)
        with open(self.conf, "w") as f:
            f.write(f"""\
ClusterName=polydist
SlurmctldHost={head.hostname}({head.addr})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
MailProg=/bin/true
{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(os.path.join(self.dir, f"{name.split()[0]}-{len(self._daemons)}.out"), "w")
        proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self._daemons.append((name, proc))

    def _nodes_idle(self) -> bool:
        out = self.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], timeout=20)
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in self.nodes)

    def _wait_for(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [f"{name} (exit code {p.returncode})" for name, p in self._daemons if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"exited: {', '.join(dead)}" if dead else f"not after {timeout} s"
                raise Unavailable(f"Slurm cluster did not come up, waiting for {what}: {why}\n{self.logs()}")
            time.sleep(0.5)

    def logs(self) -> str:
        """The tails of the daemons' logs, for a failure report."""
        parts = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith((".log", ".out")):
                with open(os.path.join(self.dir, name), errors="replace") as f:
                    parts.append(f"--- {name}\n" + "".join(f.readlines()[-30:]))
        return "\n".join(parts)

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        if self._daemons and self._daemons[-1][1].poll() is None:
            self.run(["scancel", "--full", "--user=root"], timeout=20)
        for _, proc in reversed(self._daemons):  # slurmds, slurmctld, munged last (the others authenticate)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in reversed(self._daemons):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self._daemons.clear()
        self.net.close()  # SIGKILLs whatever is left inside the namespaces (job steps, slurmstepd), deletes them
        shutil.rmtree(self.dir, ignore_errors=True)
