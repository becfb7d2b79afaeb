"""Debug mode: a rank that leaves while the others wait in a collective it never called.

A rank that skips one call of a loop whose calls all look alike goes on to
``finalize()`` (or to the end of the program) while the others wait in the
call it skipped. polydist's own collectives meet such a rank in the
fingerprint exchange of :mod:`polydist.collectives.debug`; an operation that
torch runs for DDP, FSDP2 or the program itself (``dist.all_reduce``) has no
fingerprint, and a leaving rank that joined an exchange would only wait with
the others. So, with ``POLYDIST_DEBUG=1``, ranks also meet on the group's
store, which no stuck transport blocks:

1. a rank that leaves (``finalize()``, or interpreter exit with the group
   alive) writes a note: the number of the last operation it started on each
   group (torch's ``collective_seq_id`` from its flight recorder on gloo and
   NCCL, polydist's count on its Python groups) and polydist's own call
   count, then waits (at most :data:`ANSWER_S`) for every other rank's
   answer;
2. each rank's watcher thread (every :data:`INTERVAL_S`) reads new notes and
   answers: leaving too, nothing to see, "join" (its main thread is in the
   fingerprint exchange of the leaver's next polydist call: the leaver joins
   that exchange and both raise there, as before), or a verdict: it waits in
   operation ``#k`` of a group the leaver is in, and the leaver's last
   operation there was before ``#k`` — the leaver never called it;
3. with a verdict, the leaver raises :class:`~polydist.CollectiveMismatchError`
   naming the operation, its number, its group and itself; the waiting rank,
   blocked in the backend where no exception reaches it, prints the same
   error, writes its flight-recorder dump and ends (its launcher ends the
   rest), as the watchdog does on a timeout.

A rank that reaches a collective only after the leaver has gone learns it
the same way: its fingerprint exchange raises at once, and the watcher ends
it when it waits in torch's operation past the leaver's last. Ranks answer
within one :data:`INTERVAL_S` (and those that left before need not): a
finalize in debug mode costs about that much.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable, Optional

import torch.distributed as dist

from .. import _torch, settings
from ..collectives import timeout_error
from ..collectives.recorder import NAME, SEQ, STARTED, STATE
from ..errors import CollectiveMismatchError
from .watchdog import WATCHDOG, end_process

__all__ = ["start", "announce", "exit_with", "entering", "leaving_exchange", "INTERVAL_S", "ANSWER_S"]

INTERVAL_S = 0.2  # how often a rank's watcher reads the notes
ANSWER_S = 3.0  # how long a leaving rank waits for answers (a rank without a watcher does not answer)
_PREFIX = "polydist/debug/leaving/"
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

lock = threading.Lock()  # between the main thread's fingerprint exchange and the watcher
checking: Optional[tuple] = None  # (group's global ranks, polydist's number of the call) while an exchange runs
_left: list = []  # the notes of the ranks that left this world
_verdicts: dict = {}  # note number -> the verdict this rank reached on it (its answer)
_state: dict = {"thread": None, "generation": 0, "read": 0, "announced": None, "ended": False}  # announced: id(pg)

# Filled in polydist._wiring (the live world and collectives.debug build on backends/: not imported here): at exit
# with a group alive, world_leaves() runs debug mode's check of polydist's world, made or adopted (it has the call
# counts), and returns True; False when polydist has no world (the program's own group, never used: checked here).
world_leaves: Optional[Callable[[], bool]] = None


def _key(ranks: Any) -> str:
    return "-".join(str(r) for r in ranks)


def _prefix() -> str:
    run = ".".join(os.environ.get(k, "") for k in ("TORCHELASTIC_RESTART_COUNT", settings.RESTART_COUNT.name))
    return f"{_PREFIX}{run}/{_state['generation']}/"


def start() -> None:
    """Debug mode: start this process's watcher (once); it idles until a default group exists."""
    if not settings.is_debug() or _state["thread"] is not None:
        return
    _state["thread"] = threading.Thread(target=_watch, name="polydist-debug-leaving", daemon=True)
    _state["thread"].start()
    atexit.register(_at_exit)


def _at_exit() -> None:
    """At interpreter exit, with the group still alive: leave as :func:`announce` says (once per world)."""
    if not dist.is_available() or not dist.is_initialized():
        return
    if world_leaves is not None and world_leaves():  # polydist's world: checked with its call counts
        return
    try:  # the program's own group, that polydist never used
        verdict = announce(dist.get_rank(), list(range(dist.get_world_size())), {}, "exit")
    except Exception:  # noqa: BLE001 - a store gone at exit: nothing to tell
        return
    if isinstance(verdict, tuple):
        exit_with(verdict[0])


def exit_with(text: str) -> None:
    """At exit: print the mismatch and end with status 1 (an exit handler's exception would only be printed)."""
    line = f"polydist: debug: CollectiveMismatchError: {text}\n"
    sys.stderr.write(line)
    end_process(dist.get_rank(), line, 1)


# ------------------------------------------------------------ this rank's operations


def _operations() -> list:
    """``[(group's global ranks, last started number, (name, number) of the last one not known to be complete,
    or None)]`` for torch's own groups (its flight recorder) and polydist's Python groups. gloo's recorder
    leaves its entries "scheduled": the last one stands for the operation the rank may wait in, which only
    matters when a leaver's last operation on that group came before it (then the rank cannot have finished it)."""
    out = []
    by_name = _torch.group_ranks_by_name()
    groups: dict = {}
    for recorder in _torch.fr_dumps(False):
        for e in recorder["entries"]:
            if e.get("is_p2p") or e.get("collective_seq_id") is None:
                continue
            pg = e.get("process_group")
            ranks = by_name.get(str(pg[0] if isinstance(pg, (list, tuple)) else pg))
            if ranks is None:
                continue
            last, running = groups.get(_key(ranks), (ranks, 0, None))[1:]
            seq = int(e["collective_seq_id"])
            if e.get("state") != "completed" and (running is None or seq > running[1]):  # gloo's stay "scheduled"
                running = (str(e.get("profiling_name") or "?").split(":")[-1], seq)
            groups[_key(ranks)] = (ranks, max(last, seq), running)
    out.extend(groups.values())
    for g in list(WATCHDOG.groups):
        record = g._lane.current
        running = (record[NAME], record[SEQ]) if record is not None and record[STATE] == STARTED else None
        out.append((list(g._tag.ranks), g._seq, running))
    return out


def _where() -> str:
    """file:line of the program's frame that is leaving (the first outside polydist and torch), or "exit"."""
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(_PACKAGE) and "/torch/" not in frame.filename and frame.filename[0] != "<":
            return f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return "exit"


# ------------------------------------------------------------ the leaving rank


def announce(rank: int, world: list, calls: dict, how: str) -> Any:
    """Tell the other ranks that this one leaves (``how``: "finalize()" or "exit"); wait for their answers.

    Args:
        rank: this rank (global); world: the world's global ranks.
        calls: polydist's call count on each group (global ranks joined by "-": count).

    Returns:
        None (no rank waits in a call this one skipped), "join" (a rank is
        in the fingerprint exchange of this rank's next polydist call on the
        world: the caller joins it), or ``(text, calls)``: the verdict to
        raise as :class:`~polydist.CollectiveMismatchError`.
    """
    pg = id(_torch.default_pg())
    if _state["announced"] == pg:
        return None
    _state["announced"] = pg
    try:
        store = WATCHDOG._store()
        torch_last = {_key(ranks): last for ranks, last, _ in _operations()}
        where = how if how == "exit" else f"{how} at {_where()}"
        note = {"rank": rank, "where": where, "torch": torch_last, "calls": calls}
        prefix = _prefix()
        n = store.add(prefix + "count", 1)
        store.set(f"{prefix}note/{n}", json.dumps(note))
        gone = {json.loads(store.get(f"{prefix}note/{m}"))["rank"] for m in range(1, n)}
        waiting = {r: f"{prefix}answer/{n}/{r}" for r in world if r != rank and r not in gone}
        deadline = time.monotonic() + ANSWER_S
        answers: dict = {}
        while waiting and time.monotonic() < deadline:
            for r in [r for r, k in waiting.items() if store.check([k])]:
                answers[r] = json.loads(store.get(waiting.pop(r)))
            if waiting:
                time.sleep(0.02)
    except Exception:  # noqa: BLE001 - no store, or its host gone: the caller falls back to the exchange
        return "join"
    finally:
        _state["generation"] += 1  # the next world's notes start afresh
        _state["read"] = 0
        _left.clear()
        _verdicts.clear()
    verdicts = [a for a in answers.values() if a.get("verdict")]
    if verdicts:
        first = min(verdicts, key=lambda a: a["rank"])
        return first["verdict"], {int(k): v for k, v in first["calls"].items()}
    return "join" if any(a.get("join") for a in answers.values()) else None


# ------------------------------------------------------------ the ranks that stay


def entering(ranks: Any, number: int) -> Optional[tuple]:
    """The main thread, before the fingerprint exchange of polydist's call ``number`` on ``ranks``:
    ``(text, calls)`` when a rank of ``ranks`` has left and will not exchange (raise it), else None (then
    :func:`leaving_exchange` after it)."""
    global checking
    start()  # debug mode switched on after the world was made (set_debug): this rank answers from now on
    with lock:
        for note in _left:
            last = note["calls"].get(_key(ranks), 0)
            if note["rank"] in ranks and (number > last + 1 or number == last + 1 and not note.get("join")):
                verdict = _verdicts.setdefault(note["n"], _verdict(note, ranks, "call", number, polydist=True))
                return verdict
        checking = (tuple(ranks), number)
    return None


def leaving_exchange() -> None:
    """The main thread, after a fingerprint exchange (raised or not)."""
    global checking
    checking = None


def _verdict(note: dict, ranks: Any, name: str, number: int, polydist: bool = False) -> tuple:
    me = dist.get_rank()
    last = note["calls" if polydist else "torch"].get(_key(ranks), 0)
    whose = "polydist's" if polydist else "torch's"
    text = (f"{name} #{number} on group {list(ranks)} ({whose} numbering): rank {note['rank']} never called it — it "
            f"left ({note['where']}) after #{last}, while rank {me} waits in it: in debug mode every rank must make "
            "the same calls before it leaves (was one skipped?)")  # fmt: skip
    calls = {me: f"call #{number}: {name}", note["rank"]: f"call #{number}: none, left ({note['where']})"}
    return text, calls


def _answer(store: Any, prefix: str, note: dict) -> None:
    """Answer ``note`` (another rank's leaving); a verdict reached here also ends this process."""
    answer: dict = {"rank": dist.get_rank()}
    end = False
    with lock:  # decided with the main thread's fingerprint exchange held still (see entering)
        _left.append(note)
        verdict = _verdicts.get(note["n"])  # the main thread raised it already
        if verdict is None and _state["announced"] is not None:
            answer["leaving"] = True
        elif verdict is None and checking is not None and note["rank"] in checking[0]:
            ranks, number = checking
            if number == note["calls"].get(_key(ranks), 0) + 1 and len(ranks) == dist.get_world_size():
                answer["join"] = note["join"] = True  # the leaver's finalize() exchange is this one: both raise
            else:
                verdict = _verdicts[note["n"]] = _verdict(note, ranks, "call", number, polydist=True)
                end = True
    if verdict is None and not answer.get("join") and not answer.get("leaving"):
        verdict = _judge(note)
        end = verdict is not None
    if verdict is not None:
        answer["verdict"], answer["calls"] = verdict
    store.set(f"{prefix}answer/{note['n']}/{answer['rank']}", json.dumps(answer))
    if end:
        _end(verdict)


def _judge(note: dict) -> Optional[tuple]:
    """The verdict on ``note``: this rank waits in torch's operation ``#k`` of a group the leaver is in, past
    the leaver's last operation there; None otherwise."""
    for ranks, _, running in _operations():
        if running is not None and note["rank"] in ranks and running[1] > note["torch"].get(_key(ranks), 0):
            return _verdict(note, ranks, running[0], running[1])
    return None


def _end(verdict: tuple) -> None:
    """Print the mismatch, write this rank's dump, end the process (its launcher ends the others)."""
    if _state["ended"]:
        return
    _state["ended"] = True
    error = CollectiveMismatchError(verdict[0], verdict[1])
    text = f"polydist: debug: CollectiveMismatchError: {error}\n"
    sys.stderr.write(text)
    sys.stderr.flush()
    for hook in timeout_error.on_timeout:  # the flight recorder's dump
        hook(error)
    _record_for_launcher(error)
    groups = [g for g in list(WATCHDOG.groups) if g._lane.current is not None]
    if groups:
        groups[0]._end_job(error, text)  # MPI_Abort where the transport cannot be cancelled
    end_process(dist.get_rank(), text)


def _record_for_launcher(error: Exception) -> None:
    """The error in torch elastic's error file (``$TORCHELASTIC_ERROR_FILE``, as its ``@record`` writes it), so
    that the launcher's report shows it, naming the rank that left, for this rank that ends without raising."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    text = f"{type(error).__name__}: {error}"
    data = {"message": {"message": text, "extraInfo": {"py_callstack": text + "\n", "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass


def _watch() -> None:
    while True:
        time.sleep(INTERVAL_S)
        try:
            if not dist.is_available() or not dist.is_initialized() or _state["ended"]:
                continue
            store = WATCHDOG._store()
            prefix = _prefix()
            count = store.add(prefix + "count", 0)
            while _state["read"] < count:
                _state["read"] += 1
                note = json.loads(store.get(f"{prefix}note/{_state['read']}"))
                note["n"] = _state["read"]
                if note["rank"] != dist.get_rank():
                    _answer(store, prefix, note)
            if _state["announced"] is not None and _state["announced"] != id(_torch.default_pg()):
                _state["announced"] = None  # a new world
            if _state["announced"] is None:
                for note in list(_left):  # a rank that reached an operation after the leaver had gone
                    verdict = _judge(note)
                    if verdict is not None:
                        _end(verdict)
        except Exception:  # noqa: BLE001 - a store that is gone, a world being torn down: look again later
            continue
