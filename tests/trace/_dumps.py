"""Hand-written flight-recorder dumps for the tests of ``polydist trace`` (format: :mod:`polydist.trace`).

Times are seconds from ``T``; a dump's files go where :func:`write` puts them, ``rank<R>.json``.
"""

from __future__ import annotations

import argparse
import json
import os

from polydist.trace import cli

T = 1_764_000_000.0  # the epoch second every scenario starts at
USER = "/home/u/train.py"
LIB = "/venv/lib/python3.12/site-packages/polydist/collectives/reduce.py"


def call(i, collective, group, seq, start, end=None, *, state=None, line=88, file=USER, function="main", **kw):
    """An entry; completed when it has an end, else started (``state`` overrides)."""
    return {
        "id": i, "collective": collective, "group": list(group), "seq": seq, "op": kw.get("op"),
        "root": kw.get("root"), "dtypes": kw.get("dtypes", ["float32"]), "shapes": kw.get("shapes", [[4]]),
        "bytes": 16, "value": kw.get("value", False), "async": kw.get("is_async", False), "file": file, "line": line,
        "function": function, "start": T + start, "end": None if end is None else T + end,
        "state": state or ("started" if end is None else "completed"), "error": kw.get("error"),
    }  # fmt: skip


def history(group, n, *, first_id=0, collective="all_reduce", **kw):
    """``n`` completed all_reduces #1..#n on ``group``, one a second from t=0."""
    return [call(first_id + k, collective, group, k + 1, k, k + 0.5, op="SUM", **kw) for k in range(n)]


def frames(*frames):
    """Frames from ``(file, line, function)``, outermost first."""
    return [{"file": f, "line": ln, "function": fn, "code": ""} for f, ln, fn in frames]


def stack(*frames_, main=True):
    """A thread's stack from ``(file, line, function)`` frames, outermost first."""
    return {"thread": "MainThread" if main else "Thread-1", "ident": 1, "main": main, "frames": frames(*frames_)}


def dump(rank, world, entries, at, *, reason="timeout", error=None, enabled=True, stacks=(), dropped=0,
         error_frames=None, backend="gloo"):  # fmt: skip
    """A dump; ``error_frames`` None leaves the field out, as dumps of older writers do."""
    data = {
        "format": "polydist-trace", "version": 1, "rank": rank, "world_size": world, "local_rank": rank,
        "host": "node1", "pid": 100 + rank, "backend": backend, "reason": reason, "time": T + at, "error": error,
        "enabled": enabled, "dropped": dropped, "entries": entries, "stacks": list(stacks),
    }  # fmt: skip
    if error_frames is not None:
        data.update(error_frames=error_frames, traceback="Traceback (most recent call last):\n  ...\n" + error)
    return data


def write(directory, *dumps):
    for d in dumps:
        with open(os.path.join(directory, f"rank{d['rank']}.json"), "w") as f:
            json.dump(d, f)
    return str(directory)


def run_cli(capsys, *argv):
    """``polydist trace ARGV``, parsed as polydist's command line will: (exit code, stdout, stderr)."""
    parser = argparse.ArgumentParser(prog="polydist")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    code = cli.run(parser.parse_args(["trace", *argv]))
    out, err = capsys.readouterr()
    return code, out, err


WORLD = (0, 1, 2, 3)
IN_WAIT = stack(("/venv/lib/python3.12/site-packages/polydist/launch/worker.py", 50, "main"), (USER, 95, "main"),
                ("/usr/lib/python3.12/threading.py", 320, "wait"))  # fmt: skip
# The traceback of an exception raised in the user's script under ``polydist run``, outermost first.
RAISED = frames(("/venv/lib/python3.12/site-packages/polydist/launch/elastic.py", 302, "worker_errors"),
                ("/venv/lib/python3.12/site-packages/polydist/launch/worker.py", 44, "main"),
                ("<frozen runpy>", 291, "run_path"), ("/w/job.py", 80, "<module>"), ("/w/job.py", 68, "main"))


def skipped_dumps():
    """Rank 2 skipped all_reduce #5: ranks 0, 1, 3 wait in it; rank 2 runs on in its own code."""
    waiting = [dump(r, 4, history(WORLD, 4) + [call(4, "all_reduce", WORLD, 5, 10.0, op="SUM")], 22.3)
               for r in (0, 1, 3)]  # fmt: skip
    return waiting + [dump(2, 4, history(WORLD, 4), 6.7, reason="signal", stacks=[IN_WAIT])]  # #4 ended at 3.5
