"""A rank of ``polydist run``, and the launcher, end without freeing torch's objects one by one at exit
(``polydist._at_exit.no_teardown``): what a program counts on at exit still happens, whether it ends well or
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
