"""The rank's parent under Hydra (``polydist/launch/rank_parent.py``): it exits as its rank did, normally.

MPICH's Hydra SIGKILLs every rank when one of its children dies by a signal; run under this parent, a rank
killed by signal N makes the parent exit with 128 + N instead, and the others live to write their dumps
(``tests/trace/test_scenarios.py::test_killed_rank_has_no_dump_and_the_others_show_where_they_wait[mpi]``
runs it under a real mpiexec).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

from polydist.launch import rank_parent

pytestmark = pytest.mark.timeout(60)

PARENT = [sys.executable, "-I", "-S", rank_parent.__file__]


def _parent(code: str, tmp_path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([*PARENT, str(tmp_path), sys.executable, "-c", code], **kwargs)


def test_exit_status_passes_through(tmp_path):
    assert _parent("import sys; sys.exit(3)", tmp_path).wait(30) == 3
    assert _parent("pass", tmp_path).wait(30) == 0
    assert not list(tmp_path.glob("*.signal"))


def test_a_rank_killed_by_a_signal_makes_a_normal_exit_of_128_plus_n(tmp_path):
    code = "import os, signal; open('child', 'w').write(str(os.getpid())); os.kill(os.getpid(), signal.SIGKILL)"
    proc = _parent(code, tmp_path, cwd=tmp_path)
    assert proc.wait(30) == 128 + signal.SIGKILL  # an exit code, not a death by signal (that would be < 0)
    child = int((tmp_path / "child").read_text())
    assert child != proc.pid
    assert rank_parent.signal_of(str(tmp_path), child) == signal.SIGKILL
    assert rank_parent.signal_of(str(tmp_path), proc.pid) is None


def test_group_signals_reach_the_rank_not_the_parent(tmp_path):
    """Hydra signals the process group (SIGUSR1 notices): the rank handles it, the parent waits for the rank."""
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(7))\n"
        "open('ready', 'w').close()\n"
        "time.sleep(20)\n"
    )
    proc = _parent(code, tmp_path, cwd=tmp_path, start_new_session=True)
    deadline = time.monotonic() + 20
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGUSR1)
    assert proc.wait(30) == 7


def test_the_parent_closes_its_copy_of_the_pmi_socket(tmp_path):
    """Hydra learns that a rank ended when the rank's PMI socket closes: the parent must not hold it open."""
    ours, theirs = socket.socketpair()
    theirs.set_inheritable(True)
    env = {**os.environ, "PMI_FD": str(theirs.fileno())}
    code = "import os, time; os.close(int(os.environ['PMI_FD'])); time.sleep(20)"  # the rank lets go of it
    proc = subprocess.Popen([*PARENT, str(tmp_path), sys.executable, "-c", code], env=env, pass_fds=(theirs.fileno(),))
    theirs.close()
    try:
        ready, _, _ = select.select([ours], [], [], 15)
        assert ready and ours.recv(1) == b"", "the socket stayed open while the rank lived"
        assert proc.poll() is None  # closed by the parent, not by the rank's exit
    finally:
        proc.kill()
        proc.wait(30)
        ours.close()


@pytest.mark.parametrize("args", [[], ["DIR"]])
def test_no_command_is_a_usage_error(args):
    out = subprocess.run([*PARENT, *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "usage" in out.stderr
