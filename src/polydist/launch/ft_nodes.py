"""The nodes of a multi-node fault-tolerant job: what each node's launcher tells the others.

``polydist run --fault-tolerant --nnodes N`` runs one launcher per node.
Node 0's serves torchft's lighthouse and the job's TCP store (at
``--master-addr``/``--master-port``); every launcher starts and replaces its
own node's replica groups and reads its own node's fault log
(:mod:`~polydist.launch.ft_events`). Through the store, each launcher:

* publishes its node's events and reads the other nodes' (:meth:`Nodes.exchange`),
  so that every node's report knows which replica groups were lost, which
  rejoined and which finished (with their state digests), and a node can
  stop a replacement of its own once the others have finished;
* posts its replica groups' exit codes when they have all ended
  (:meth:`Nodes.post_exits`); node 0 waits for every node's
  (:meth:`Nodes.exits`) before it reports how the whole job ended, and keeps
  the lighthouse and the store up until then.

A node cut off from node 0 (its link dropped) keeps its events and sends
them once the store answers again; each store call is bounded by a short
timeout so that the launcher's own loop never stalls for long. The other
nodes' lines are as hostile as any bytes from the network: they are parsed
with the fault log's checks (:func:`~polydist.launch.ft_events.parse`), and
a node's log is read up to :data:`MAX_LOG_BYTES` only.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from typing import Any, Callable, Optional

from . import ft_events

__all__ = ["Nodes", "MAX_LOG_BYTES", "CALL_TIMEOUT"]

MAX_LOG_BYTES = 4 * 2**20  # a node's events are a few hundred bytes each, a job logs thousands at most; below
# the TCP store's largest message (8 MiB in torch 2.13)
CALL_TIMEOUT = timedelta(seconds=2)  # one store call from a launcher: a node cut off must not stall its loop
_RETRY_S = 1.0  # after a failed call, how long a launcher waits before it tries the store again


def _events_key(node: int) -> str:
    return f"polydist/ft/events/{node}"


def _exits_key(node: int) -> str:
    return f"polydist/ft/exits/{node}"


class Nodes:
    """Node ``node_rank`` of ``nnodes``: its exchange with the others through the store ``connect()`` returns
    (node 0's own store, or a client of it; called again after a failed call, for a fresh connection)."""

    def __init__(self, node_rank: int, nnodes: int, connect: Callable[[], Any]) -> None:
        self.node_rank = node_rank
        self._connect = connect
        self._store: Optional[Any] = None
        self._pending = b""  # this node's events not yet in the store
        self._sent = 0  # bytes of this node's events in the store
        self._offsets = {n: 0 for n in range(nnodes) if n != node_rank}  # bytes of each node's log read so far
        self._too_long: set = set()
        self._appends: dict[int, int] = {}  # node -> its appends counted when its log was last fetched
        self._exits: dict[int, dict] = {}  # node -> {replica group: agent exit code}
        self._retry_at = 0.0

    def _call(self, what: Callable[[Any], Any]) -> tuple[bool, Any]:
        """``(True, what(store))``, or ``(False, None)`` when the store did not answer (tried again after
        :data:`_RETRY_S`)."""
        if time.monotonic() < self._retry_at:
            return False, None
        try:
            if self._store is None:
                self._store = self._connect()
            return True, what(self._store)
        except Exception:  # noqa: BLE001 - a node cut off, or node 0 gone: keep going, try again later
            self._store, self._retry_at = None, time.monotonic() + _RETRY_S
            return False, None

    def exchange(self, events: list) -> list:
        """Publish this node's ``events`` (kept until the store takes them); return the other nodes' new ones."""
        if events and self._sent + len(self._pending) < MAX_LOG_BYTES:  # past it the others stop reading anyway
            self._pending += b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in events)
        key = _events_key(self.node_rank)
        if self._pending and self._call(lambda s: (s.append(key, self._pending), s.add(key + "/appends", 1)))[0]:
            self._sent, self._pending = self._sent + len(self._pending), b""
        new: list = []
        for node, offset in self._offsets.items():
            if node in self._too_long:
                continue
            _, appends = self._call(lambda s, n=node: s.add(_events_key(n) + "/appends", 0))
            if not appends or appends == self._appends.get(node):  # nothing new: the log is not fetched again
                continue
            ok, data = self._call(lambda s, n=node: s.get(_events_key(n)))
            if not ok or len(data) <= offset:
                continue
            self._appends[node] = appends
            if len(data) > MAX_LOG_BYTES:
                self._too_long.add(node)
                print(f"polydist: fault-tolerant: node {node}'s fault log passed {MAX_LOG_BYTES} bytes; no longer "
                      "read", file=sys.stderr, flush=True)  # fmt: skip
                continue
            end = data.rfind(b"\n") + 1
            if end > offset:
                new += ft_events.parse(data[offset:end])
                self._offsets[node] = end
        return new

    def post_exits(self, exits: dict, stopped: set) -> bool:
        """Post this node's ``{replica group: agent exit code}`` once its agents have all ended, and those of
        them its launcher ``stopped`` (left behind when the others finished: no failure); whether the store
        took it (and this node's last events)."""
        self.exchange([])
        if self._pending:
            return False
        text = json.dumps({str(r): "stopped" if r in stopped else code for r, code in exits.items()})
        return self._call(lambda s: s.set(_exits_key(self.node_rank), text))[0]

    def exits(self) -> dict:
        """``{replica group: agent exit code, or "stopped"}`` of the other nodes that posted theirs so far."""
        for node in self._offsets:
            if node in self._exits:
                continue
            _, text = self._call(lambda s, n=node: s.get(_exits_key(n)) if s.check([_exits_key(n)]) else None)
            if text:
                self._exits[node] = _checked_exits(text)
        return {r: code for posted in self._exits.values() for r, code in posted.items()}

    def missing(self) -> list:
        """The other nodes that have not posted their exits (asked again)."""
        self.exits()
        return sorted(n for n in self._offsets if n not in self._exits)


def _checked_exits(text: bytes) -> dict:
    """``{replica group: exit code or "stopped"}`` from another node's post; what is not one (hostile or
    broken) is dropped."""
    try:
        posted = json.loads(text[:65536])
    except ValueError:
        return {}
    if not isinstance(posted, dict):
        return {}
    out = {}
    for key, code in posted.items():
        if isinstance(key, str) and key.isdigit() and (code == "stopped" or isinstance(code, int) and not
                                                        isinstance(code, bool)):  # fmt: skip
            out[int(key)] = code
    return out
