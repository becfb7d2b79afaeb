"""The ``polydist`` command: ``run`` launches a script on N ranks (:mod:`polydist.launch.cli`), ``bench``
measures collectives (:mod:`polydist.bench.cli`), ``trace`` reads flight-recorder dumps
(:mod:`polydist.trace.cli`), ``info`` shows the context. Each subcommand's module is imported when it is used."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

__all__ = ["main"]


class _Command(argparse.ArgumentParser):
    """A subcommand's parser: an argument it does not know is an error with the subcommand's own usage.

    argparse hands a subcommand's unknown arguments up to ``polydist``'s
    parser, whose usage (``polydist [-h] {run,bench,trace,info}``) names none
    of the subcommand's options.
    """

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        ns, extra = super().parse_known_args(args, namespace)
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return ns, extra


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polydist", description="Run distributed PyTorch programs on any backend.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Command)

    from .launch import cli as run

    run.add_parser(sub)
    from .bench import cli as bench

    bench.add_parser(sub)
    from .trace import cli as trace

    trace.add_parser(sub)
    sub.add_parser(
        "info",
        help="show what polydist detects about this process",
        description="Print the launcher polydist detects (and the environment variable behind each field), "
        "then the distributed configuration. Works in a plain shell and under any launcher.",
    )
    return parser


def _info() -> int:
    from dataclasses import fields

    from .launch.environment import detect

    try:
        info = detect()
    except ValueError as exc:  # contradicting launcher variables: say which, instead of a traceback
        print(f"polydist info: {exc}", file=sys.stderr)
        return 1
    sources = dict(info.sources)
    names = [f.name for f in fields(info) if f.name not in ("sources", "note")]
    width = max(map(len, names))
    print("detected environment:")
    for name in names:
        source = f"  ({sources[name]})" if name in sources else ""
        print(f"  {name:<{width}} : {getattr(info, name)}{source}")
    if info.note:
        print(f"  {'note':<{width}} : {info.note}")
    print("configuration:", flush=True)
    from .context import show_config

    show_config()
    _compiled_parts()
    return 0


def _compiled_parts() -> None:
    """Which of polydist's compiled parts are in use, and why not where one is not (its Python version runs)."""
    from ._compiled import STATUS

    width = max(map(len, STATUS), default=0)
    print("compiled parts:")
    for name, why in sorted(STATUS.items()):
        print(f"  {name:<{width}} : {why or 'in use'}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``polydist`` console script; returns the exit code."""
    ns = _parser().parse_args(argv)
    if ns.command == "run":
        from .launch import cli as run

        return run.run(ns)
    if ns.command == "bench":
        from .bench import cli as bench

        return bench.run(ns)
    if ns.command == "info":
        return _info()
    if ns.command == "trace":
        from .trace import cli as trace

        return trace.run(ns)
    return 2
