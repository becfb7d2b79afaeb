"""Two "hosts" on one machine: two network namespaces joined by a veth pair (for tests/launch/test_multinode.py).

Each host has its own network stack (``lo`` and one end of the veth pair,
with an address in a private /24), so a job spread over the two meets only
through the veth link, as two machines would. ``ip netns exec`` bind-mounts
``/etc/netns/NAME/hosts`` over ``/etc/hosts``: both hosts resolve the two node
names (used with :meth:`TwoHosts.command`'s ``own_hostname``) to the veth
addresses and keep the machine's own entries, so the machine's host name still
resolves as it does outside (here: to 127.0.0.1, as on many real hosts).

Nothing leaves the two namespaces; :meth:`TwoHosts.close` kills every process
still inside them and deletes them (the veth pair goes with them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

_CAP_NET_ADMIN = 12
_ETC_NETNS = "/etc/netns"


class Unavailable(Exception):
    """Network namespaces cannot be used here; the message says why (a skip reason)."""


@dataclass(frozen=True)
class Host:
    netns: str  # namespace name
    ifname: str  # its end of the veth pair
    addr: str  # the address of that end
    hostname: str  # the host name the node gets with own_hostname=True (resolves to addr on both hosts)
    netns_id: str = ""  # readlink /proc/self/ns/net inside it, e.g. "net:[4026532177]"


def _has_cap_net_admin() -> bool:
    try:
        with open("/proc/self/status") as f:
            caps = next(line.split()[1] for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caps, 16) >> _CAP_NET_ADMIN & 1)


def unavailable_reason() -> str:
    """Why two network namespaces cannot be built here, or "" when they may be."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux-only (platform {sys.platform})"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed: cannot create network namespaces"
    if not _has_cap_net_admin():
        who = "root in a container without it?" if os.geteuid() == 0 else "not root"
        return f"no CAP_NET_ADMIN ({who}): `ip netns add` is not permitted"
    return ""


def _ip(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout, check=False)


class TwoHosts:
    """Namespaces ``<tag>a`` and ``<tag>b`` with veth ends at 10.213.<octet>.1 and .2.

    Raises :class:`Unavailable` from :meth:`setup` when ``ip netns`` or veth
    creation is refused; call :meth:`close` in any case.
    """

    def __init__(self, tag: str, octet: int) -> None:
        self.hosts = [
            Host(f"{tag}{x}", f"{tag}v{x}", f"10.213.{octet}.{i + 1}", f"{tag}-node{i}") for i, x in enumerate("ab")
        ]
        self._made: list[str] = []
        self._veth = ""

    def setup(self) -> None:
        reason = unavailable_reason()
        if reason:
            raise Unavailable(reason)
        a, b = self.hosts
        for host in self.hosts:
            _ip("netns", "del", host.netns)  # a leftover of a crashed session with the same pid
            self._step("netns", "add", host.netns)
            self._made.append(host.netns)
        _ip("link", "del", a.ifname)  # likewise
        self._step("link", "add", a.ifname, "type", "veth", "peer", "name", b.ifname)
        self._veth = a.ifname
        entries = "".join(f"{h.addr} {h.hostname}\n" for h in self.hosts)
        with open("/etc/hosts") as f:
            machine = f.read()
        for host in self.hosts:
            self._step("link", "set", host.ifname, "netns", host.netns)
            self._step("-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", host.ifname)
            self._step("-n", host.netns, "link", "set", "lo", "up")
            self._step("-n", host.netns, "link", "set", host.ifname, "up")
            os.makedirs(os.path.join(_ETC_NETNS, host.netns), exist_ok=True)
            with open(os.path.join(_ETC_NETNS, host.netns, "hosts"), "w") as f:
                f.write(machine.rstrip("\n") + "\n" + entries)
        ids = [self._netns_id(h) for h in self.hosts]
        self.hosts = [Host(h.netns, h.ifname, h.addr, h.hostname, i) for h, i in zip(self.hosts, ids)]

    def _step(self, *args: str) -> None:
        out = _ip(*args)
        if out.returncode != 0:
            raise Unavailable(
                f"`ip {' '.join(args)}` failed (network namespaces need root, or CAP_NET_ADMIN and "
                f"CAP_SYS_ADMIN, and veth support): {out.stderr.strip()}"
            )

    def _netns_id(self, host: Host) -> str:
        out = subprocess.run(self.command(host, ["readlink", "/proc/self/ns/net"]), capture_output=True, text=True,
                             timeout=20, check=False)
        if out.returncode != 0:
            raise Unavailable(f"`ip netns exec {host.netns} readlink` failed: {out.stderr.strip()}")
        return out.stdout.strip()

    def command(self, host: Host, argv: Sequence[str], *, own_hostname: bool = False) -> list[str]:
        """``argv`` run inside ``host``'s namespace; with ``own_hostname`` also in a UTS namespace of its
        own whose host name is ``host.hostname`` (which resolves to ``host.addr``)."""
        prefix = ["ip", "netns", "exec", host.netns]
        if own_hostname:
            prefix += ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host.hostname]
        return [*prefix, *argv]

    def kill_inside(self) -> None:
        """SIGKILL every process in the two namespaces (the launchers' workers run in sessions of their own)."""
        for netns in self._made:
            out = _ip("netns", "pids", netns)
            for pid in out.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass

    def close(self) -> None:
        self.kill_inside()
        deadline = time.monotonic() + 10
        for netns in self._made:
            while _ip("netns", "pids", netns).stdout.split() and time.monotonic() < deadline:
                time.sleep(0.1)
            _ip("netns", "del", netns)  # deletes its veth end, and so the pair
            shutil.rmtree(os.path.join(_ETC_NETNS, netns), ignore_errors=True)
        self._made.clear()
        if self._veth:  # still outside when setup failed half-way (else already gone with its namespace)
            _ip("link", "del", self._veth)
            self._veth = ""
        try:
            os.rmdir(_ETC_NETNS)  # only when empty: ours alone
        except OSError:
            pass


@contextlib.contextmanager
def two_hosts(prefix: str, salt: int = 0) -> Iterator[TwoHosts]:
    """Two hosts for a test module (a pytest fixture's body), named from this process so that concurrent
    sessions and modules differ; torn down (processes inside killed, namespaces deleted) even when a test
    fails. Skips the tests where namespaces cannot be built."""
    import pytest

    pid = os.getpid()
    two = TwoHosts(tag=f"{prefix}{pid % 100000}", octet=(pid + salt) % 250 + 1)
    try:
        two.setup()
    except Unavailable as exc:
        two.close()
        pytest.skip(f"two network namespaces cannot be built here: {exc}")
    try:
        yield two
    finally:
        two.close()


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str

    def describe(self, name: str) -> str:
        return f"--- {name}: exit code {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


class Together:
    """Processes started at once (each in a session of its own, output to files) and awaited with one deadline."""

    def __init__(self, commands: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]],
                 cwd: str | None = None) -> None:
        self._files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in commands]
        self._procs = [
            subprocess.Popen(list(cmd), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                             text=True, start_new_session=True)
            for cmd, env, (out, err) in zip(commands, envs, self._files)
        ]

    def __enter__(self) -> Together:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()  # a test that failed before wait(): no process outlives it

    def wait(self, timeout: float, hosts: TwoHosts | None = None) -> list[Finished]:
        """Wait for all; past ``timeout`` seconds kill them (and, given ``hosts``, all inside its namespaces)
        and raise ``TimeoutError`` with their output so far."""
        deadline = time.monotonic() + timeout
        timed_out = False
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            self.kill()
            if hosts is not None:
                hosts.kill_inside()
            for proc in self._procs:
                proc.wait(timeout=10)
        done = [Finished(p.returncode, self._read(out), self._read(err)) for p, (out, err) in zip(self._procs, self._files)]
        if timed_out:
            raise TimeoutError(f"still running after {timeout} s, killed:\n"
                               + "\n".join(f.describe(f"process {i}") for i, f in enumerate(done)))
        return done

    def kill(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    @staticmethod
    def _read(f) -> str:
        f.seek(0)
        text = f.read()
        f.close()
        return text
