"""A rank of ``polydist run`` or ``polydist.spawn``, and the launcher, end without freeing torch's objects one by
one at exit (``polydist._at_exit.no_teardown``): what a program counts on at exit still happens, whether it ends well or
fails — its ``atexit`` handlers and ``weakref.finalize`` callbacks run, the files it left open are flushed, and
its exit status and traceback reach the launcher's report."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

PROGRAM = textwrap.dedent(
    """
    import atexit, sys, weakref
    import torch.distributed as dist

    dist.init_process_group("gloo")
    out = sys.argv[1]
    left_open = open(out + ".open", "w")
    left_open.write("x" * 100_000 + "end")  # never closed: flushed at exit

    class Held:
        pass

    held = Held()
    weakref.finalize(held, lambda: open(out + ".finalized", "w").write("done"))
    atexit.register(lambda: open(out + ".atexit", "w").write("done"))
    if sys.argv[2] == "raise":
        raise RuntimeError("deliberate failure")
    if sys.argv[2] == "exit":
        sys.exit(3)
    """
)


@pytest.mark.parametrize("ending, code", [("finish", 0), ("raise", 1), ("exit", 1)])
def test_what_a_program_counts_on_at_exit_still_happens(cli_env, tmp_path, ending, code):
    script, out = tmp_path / "prog.py", tmp_path / "out"
    script.write_text(PROGRAM)
    done = subprocess.run(["polydist", "run", "--nproc-per-node", "1", str(script), str(out), ending], env=cli_env,
                          capture_output=True, text=True, timeout=100)  # fmt: skip
    assert done.returncode == code, done.stderr[-3000:]
    assert (tmp_path / "out.open").read_text().endswith("end")
    assert (tmp_path / "out.atexit").read_text() == "done"
    assert (tmp_path / "out.finalized").read_text() == "done"
    if ending == "raise":
        assert "RuntimeError: deliberate failure" in done.stderr
    if ending == "exit":
        assert "rank 0 (local rank 0" in done.stderr and "exit code 3" in done.stderr


class _Cycle:
    """Garbage in a reference cycle: only the garbage collector frees it, and then writes to ``path`` (opened
    now: at the end of the interpreter's teardown ``open`` may be gone)."""

    def __init__(self, path: str) -> None:
        import os

        self.me, self.write, self.fd = self, os.write, os.open(path, os.O_WRONLY | os.O_CREAT)

    def __del__(self) -> None:
        self.write(self.fd, b"collected")


def _leaves_things_at_exit(local_rank: int, out: str) -> int:
    import atexit
    import sys
    import types
    import weakref

    # A module only sys.modules holds: the interpreter's teardown frees it, and its cycle is garbage then.
    probe = types.ModuleType("_teardown_probe")
    probe.kept = _Cycle(f"{out}{local_rank}.collected")
    sys.modules[probe.__name__] = probe
    left_open = open(f"{out}{local_rank}.open", "w")  # noqa: SIM115 - never closed: flushed at exit
    left_open.write("x" * 100_000 + "end")
    weakref.finalize(probe.kept, lambda: open(f"{out}{local_rank}.finalized", "w").write("done"))
    atexit.register(lambda: open(f"{out}{local_rank}.atexit", "w").write("done"))
    return local_rank


def test_spawns_ranks_end_without_the_last_collections_and_keep_what_a_program_counts_on(tmp_path, monkeypatch):
    """polydist.spawn's ranks end as polydist run's: no collection of what is left at exit (a cycle alive
    then is never freed one by one), and the exit handlers, finalizers and flushing still run."""
    import os

    import polydist as pd

    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    out = str(tmp_path / "rank")
    assert pd.spawn("gloo", _leaves_things_at_exit, args=(out,), nproc_per_node=2) == [0, 1]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.open").read_text().endswith("end")
        assert (tmp_path / f"rank{rank}.atexit").read_text() == "done"
        assert (tmp_path / f"rank{rank}.finalized").read_text() == "done"
        assert (tmp_path / f"rank{rank}.collected").read_text() == "", "the interpreter's last collections ran"
