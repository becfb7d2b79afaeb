"""Put the scenario table that tests/launch/test_hang_table.py observed into docs/howto/debugging-a-hang.md.

``python tools/hang_table.py [RESULTS] [DOC]``: reads ``build/hang-table/*.json`` (one file per scenario, written
by the test) and replaces what lies between the doc's ``<!-- hang-table:start -->`` and ``<!-- hang-table:end -->``
lines, so that every row of the docs' table is a line a test produced. ``make hang-table`` runs the tests, then
this. Exits 1 when the folder holds no results.
"""

from __future__ import annotations

import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = "<!-- hang-table:start -->", "<!-- hang-table:end -->"
ORDER = {name: i for i, name in enumerate(
    ["polydist run", "mpiexec", "torchrun", "gloo", "mpi", "torch", "ddp", "fsdp2", "any",
     "stall", "raise", "kill", "freeze"])}  # fmt: skip
PROGRAMS = {"torch": "plain `torch.distributed`", "ddp": "DDP", "fsdp2": "FSDP2", "any": "any"}
FAULTS = {"stall": "stalls", "raise": "raises", "kill": "is killed (SIGKILL)", "freeze": "is frozen (SIGSTOP)", "any": "—"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")


def table(rows: list) -> str:
    rows = sorted(rows, key=lambda r: tuple(ORDER.get(r[k], 99) for k in ("launcher", "backend", "program", "fault")))
    notes: dict = {}  # a gap's reason -> its note's number, told once under the table
    lines = ["| launcher | backend | program | rank 1 | names it | s | first line of the report |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        gap = f" ({notes.setdefault(r['gap'], len(notes) + 1)})" if r.get("gap") else ""
        named = "yes" if r["named"] else f"no{gap}"
        named = "refused" if r["fault"] == "any" else named
        lines.append(f"| {r['launcher']} | {r['backend']} | {PROGRAMS[r['program']]} | {FAULTS[r['fault']]} | {named} | "
                     f"{r['seconds']:g} | `{_cell(r['line'])}` |")  # fmt: skip
    lines += [""] + [f"({n}) {_cell(reason)}." for reason, n in notes.items()]
    return "\n".join(lines)


def main(results: str = os.path.join(ROOT, "build", "hang-table"),
         doc: str = os.path.join(ROOT, "docs", "howto", "debugging-a-hang.md")) -> int:  # fmt: skip
    rows = []
    for path in glob.glob(os.path.join(results, "*.json")):
        with open(path, encoding="utf-8") as f:
            rows.append(json.load(f))
    if not rows:
        print(f"hang_table: no results in {results} (make hang-table runs the tests first)", file=sys.stderr)
        return 1
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    head, rest = text.split(START + "\n", 1)
    _, tail = rest.split(END, 1)
    with open(doc, "w", encoding="utf-8") as f:
        f.write(f"{head}{START}\n{table(rows)}\n{END}{tail}")
    print(f"hang_table: {len(rows)} rows into {os.path.relpath(doc, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
