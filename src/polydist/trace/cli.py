"""``polydist trace DIR``: which ranks of a stuck or failed job wait in which collective, and where the others are.

    polydist trace /tmp/polydist-trace-1234 [--signal] [--chrome timeline.json] [--fr-trace OUT_DIR] [--json]

Reads the ``rank<R>.json`` dumps in DIR (written by the flight recorder on a
timeout, a failure, ``SIGUSR1``/``SIGTERM`` or :func:`polydist.dump_trace`;
format in :mod:`polydist.trace`) and prints what :mod:`.analyze` finds, e.g.::

    polydist trace /tmp/t: dumps from 3 of 4 ranks
    rank 0 (node1, pid 4242): timeout — CollectiveTimeoutError: all_reduce #41 on group [0, 1, 2, 3] timed out ...
    ...
    no dump from rank 2 (it died before it could write one, or was killed by SIGKILL)
    all_reduce #41 on [0,1,2,3]: ranks 0,1,3 waited 5.0 s and timed out at train.py:88; no dump from rank 2

``--signal`` first asks the job's live ranks for fresh dumps
(:mod:`.signal_job`: SIGUSR1 to this job's ranks only; the job goes on).
``--json`` prints the same findings as one JSON object instead
(:meth:`~polydist.trace.analyze.Diagnosis.as_dict`); ``--chrome OUT.json``
also writes every rank's calls on one timeline (:mod:`.chrome`);
``--fr-trace OUT_DIR`` also writes the dumps in the format of PyTorch's Flight
Recorder, one file per rank, for ``python -m
torch.distributed.flight_recorder.fr_trace OUT_DIR`` (:mod:`.fr_export`).

Exit status: 0 nothing is wrong (no call waiting or failed, no
disagreement, a readable dump from every rank); 1 something is (the findings
say what); 2 nothing to analyse (DIR is not a directory or holds no readable
dump) or OUT.json / OUT_DIR cannot be written.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from typing import Any, Callable

from .analyze import Dumps, diagnose, load
from .chrome import write_chrome
from .fr_export import write_fr_trace
from .signal_job import signal_job

__all__ = ["add_parser", "run"]

_DESCRIPTION = (
    "Read the flight recorder's dumps in DIR (one rank<R>.json per rank, written when a collective times out, a "
    "rank fails, on SIGUSR1 and on polydist.dump_trace(); with torch's own flight recorder of gloo's and nccl's "
    "operations, DDP's and FSDP2's included) and say which ranks wait in which collective, which "
    "never called it and where they are instead, and the first collective the ranks disagree on."
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``trace`` subcommand to ``subparsers`` (from ``ArgumentParser.add_subparsers``) and return it."""
    p = subparsers.add_parser("trace", help="say where the ranks of a stuck or failed job are, from their dumps",
                              description=_DESCRIPTION)  # fmt: skip
    p.add_argument("directory", metavar="DIR", help="the trace directory (polydist run --trace-dir)")
    p.add_argument("--chrome", metavar="OUT.json", default=None,
                   help="also write all ranks' calls on one timeline, for ui.perfetto.dev or chrome://tracing")
    p.add_argument("--fr-trace", metavar="OUT_DIR", default=None,
                   help="also write the dumps in PyTorch's Flight Recorder format, one file per rank, for "
                        "python -m torch.distributed.flight_recorder.fr_trace OUT_DIR (torch's own records where the "
                        "dumps hold them: gloo, nccl; else polydist's)")
    p.add_argument("--json", action="store_true", help="print the findings as a JSON object instead of text")
    p.add_argument("--signal", action="store_true",
                   help="first ask the job's live ranks for their dumps (SIGUSR1 to the pids they noted in DIR, "
                        "checked to be this job's), then read them; the job goes on")
    return p


def _chrome(dumps: Dumps, path: str) -> str:
    return f"{write_chrome(dumps, path)} events to {path} (open it in ui.perfetto.dev or chrome://tracing)"


def _fr_trace(dumps: Dumps, folder: str, incomplete: bool) -> str:
    n, flag = len(write_fr_trace(dumps, folder)), " --allow-incomplete-ranks" if incomplete else ""
    return (f"{n} Flight Recorder files (rank_<R>) to {folder} "
            f"(read them with python -m torch.distributed.flight_recorder.fr_trace{flag} {folder})")  # fmt: skip


def _export(target: str, write: Callable[[], str]) -> bool:
    """Run ``write`` (it returns what it wrote) and say so on stderr; False, said there, when ``target`` cannot be."""
    try:
        print(f"polydist trace: wrote {write()}", file=sys.stderr)
    except OSError as exc:
        print(f"polydist trace: cannot write {target}: {exc.strerror or exc}", file=sys.stderr)
        return False
    return True


def run(ns: argparse.Namespace) -> int:
    """Run ``polydist trace`` from its parsed arguments (see :func:`add_parser`); returns the exit status.

    The findings go to stdout; what went wrong with the command itself, and
    what the exports wrote where, to stderr.
    """
    try:
        if ns.signal:
            for line in signal_job(ns.directory):
                print(f"polydist trace: {line}", file=sys.stderr, flush=True)
        dumps = load(ns.directory)
    except OSError as exc:
        print(f"polydist trace: cannot read {ns.directory}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if not dumps.ranks and not dumps.problems:
        print(f"polydist trace: no dump (rank<R>.json) in {ns.directory}", file=sys.stderr)
        return 2
    found = diagnose(dumps)
    print(json.dumps(found.as_dict(), indent=1) if ns.json else found.text(), flush=True)
    code = 0 if found.healthy else 1
    incomplete = bool(found.missing or dumps.problems)
    exports = [(ns.chrome, partial(_chrome, dumps, ns.chrome)),
               (ns.fr_trace, partial(_fr_trace, dumps, ns.fr_trace, incomplete))]  # fmt: skip
    if not all(_export(target, write) for target, write in exports if target):
        return 2
    return code if dumps.ranks else 2
