"""What ``polydist run --fault-tolerant`` tells the user: one line per fault, one per rejoin, and how the job ended.

:class:`Report` reads the job's fault log (:mod:`~polydist.launch.ft_events`)
event by event and returns the lines to print:

* a **fault** line once the survivors trained again: who was lost and how
  (the agent's view: killed by a signal, exit code and the error's last
  line, frozen), or, for a replica group that hung without dying, which
  replica groups were left out of the next quorum; how many steps the
  survivors discarded, at which step, and how long after the fault they
  committed again (or formed a quorum without it, when no step was in
  flight); whether a replacement is starting;
* a **rejoin** line when a replacement received the live state: its size,
  how long that took, and how long after the fault; likewise when a replica
  group that was left out but stayed alive (its link dropped, or it hung
  for a while) is back, having taken the live state;
* a **given up** line when a replica group's replacements ran out;
* at the end, whether the replica groups that finished hold the same model
  and optimizer state (their digests), with the totals.

Times are the events' own (``time.time()`` of the process that logged them;
on several nodes, of each node's clock: the nodes' clocks are assumed in
step, as with NTP).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

__all__ = ["Report"]

_PREFIX = "polydist: fault-tolerant:"


def _groups(indices: list) -> str:
    items = sorted(indices)
    return ("replica group " if len(items) == 1 else "replica groups ") + ", ".join(map(str, items))


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 // 10 else f"{n / 2**10:.1f} KiB"


@dataclass
class _Fault:
    t0: float  # the first sign: the agent saw its rank end, or a survivor's step failed
    replica: Optional[int] = None  # the lost replica group, when an agent saw one end
    rank: int = -1
    how: str = ""
    error: str = ""
    replacement: str = ""  # "1 of 3": the replacement the agent is starting; "" when none
    step: Optional[int] = None  # the step the survivors discarded first
    failed: set = field(default_factory=set)  # replica groups whose step failed
    errors: list = field(default_factory=list)


class Report:
    """Lines for the fault-tolerant launcher, from the fault log's events (:meth:`feed`, :meth:`end`)."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.faults = 0
        self.discarded = 0
        self._open: Optional[_Fault] = None
        self._lost_at: dict[int, float] = {}  # replica group -> when it was last lost
        self._incarnation: dict[int, int] = {}
        self._members: list = list(range(replicas))  # of the last quorum logged
        self._quorums = 0
        self.finished: dict[int, tuple] = {}  # replica group -> (step, digest)
        self.given_up: set = set()
        self.stopped: set = set()  # replacements the launcher stopped because the job finished first
        self.rejoined: set = set()  # replica groups whose current incarnation has received the live state
        self._out: dict[int, float] = {}  # replica group left out of a fault's quorum, alive (cut off, hung) -> since
        self._alone: set = set()  # replica groups that went on in a quorum of their own after others had finished

    def started(self, replica: int) -> bool:
        """Whether replica group ``replica`` logged a start."""
        return replica in self._incarnation

    def replacing(self, replica: int) -> bool:
        """Whether ``replica`` runs a replacement that has not received the live state yet."""
        return self._incarnation.get(replica, 0) > 0 and replica not in self.rejoined or (
            replica in self._lost_at and replica not in self._incarnation)

    def left_behind(self, replica: int) -> bool:
        """Whether ``replica`` can no longer finish with the others: a replacement that has not received the
        live state, or a replica group left out of the last quorum (hung), or one that went on in a quorum
        without those that finished; once the others have finished, nobody is left to give it the state."""
        return self.replacing(replica) or (self._quorums > 0 and replica not in self._members) or replica in self._alone

    def feed(self, event: dict) -> list:
        """The lines ``event`` completes (often none)."""
        kind, replica, t = event["kind"], event["replica"], event["t"]
        if kind == "started":
            self._incarnation[replica] = event["incarnation"]
            self.rejoined.discard(replica)
            self._out.pop(replica, None)
        elif kind == "lost":
            self._lost_at[replica] = t
            what = f"{event['how']}: {event['error']}" if event["error"] else event["how"]
            then = f"starting its replacement ({event['replacement']} of {event['of']})"
            unnamed = self._open is not None and self._open.replica is None  # the survivors' failed step: this one
            if not unnamed and (not self._quorums or replica not in self._members):  # nothing waits for it
                since = "before the first step" if not self._quorums else "after the others had gone on without it"
                return [f"{_PREFIX} rank {event['rank']} ({_groups([replica])}) lost {since} ({what}); {then}"]
            fault = self._open if unnamed else _Fault(t0=t)
            fault.t0 = min(fault.t0, t)
            fault.replica, fault.rank, fault.how, fault.error = replica, event["rank"], event["how"], event["error"]
            fault.replacement = f"{event['replacement']} of {event['of']}"
            lines = self._close_open() if self._open is not None and self._open is not fault else []
            self._open = fault
            return lines
        elif kind == "failed":
            if replica in self._out:  # the left-out replica group's own view of that fault (a link that came back)
                return []
            if self._open is None:
                self._open = _Fault(t0=event["since"])  # the step began then: a hang shows only at its timeout
            fault = self._open
            fault.t0 = min(fault.t0, event["since"])  # a hang, or MPI's detector, shows only after its timeout
            fault.failed.add(replica)
            fault.step = event["step"] if fault.step is None else min(fault.step, event["step"])
            if event["error"]:
                fault.errors.append(event["error"])
        elif kind == "quorum":
            if self.replacing(replica) or replica in self._out:  # a replacement's own first quorum, alone or
                return []  # joining, or one of a replica group cut off from the others: not the job's
            if self.finished and not set(event["members"]) & set(self.finished):  # behind, and the others are done:
                self._alone.add(replica)  # it would train on alone and end with another state
                return []
            left = sorted(set(self._members) - set(event["members"])) if self._quorums else []
            self._members, self._quorums = event["members"], self._quorums + 1
            fault = self._open
            if fault is not None and not fault.failed and fault.replica is not None and fault.replica not in self._members:
                return self._resolve(fault, lost=0, t=t, step=event["step"])  # lost between steps: nothing discarded
            if fault is None and left:  # gone between two steps, before its agent saw it end (frozen, hung)
                return self._resolve(_Fault(t0=event["since"]), lost=0, t=t, step=event["step"])
        elif kind == "recovered":
            fault = self._open
            if fault is not None and replica in fault.failed:
                return self._resolve(fault, lost=event["lost"], t=t, step=event["step"])
        elif kind == "healed":
            if replica in self._out:  # alive all along, left out, back: it was behind and took the live state
                since = t - self._out.pop(replica)
                return [f"{_PREFIX} {_groups([replica])} is back at step {event['step']}, {since:.1f} s after it was "
                        f"left out: it received the live state ({_size(event['bytes'])}) in "
                        f"{event['seconds']:.2f} s"]  # fmt: skip
            if self._incarnation.get(replica, 0) > 0 and replica not in self.rejoined:
                self.rejoined.add(replica)
                self._members = sorted(set(self._members) | {replica})  # in the quorum that gave it the state
                since = t - self._lost_at[replica] if replica in self._lost_at else None
                after = f", {since:.1f} s after it was lost" if since is not None else ""
                return [f"{_PREFIX} {_groups([replica])} rejoined at step {event['step']}: its replacement received "
                        f"the live state ({_size(event['bytes'])}) in {event['seconds']:.2f} s{after}"]  # fmt: skip
        elif kind == "given_up":
            self.given_up.add(replica)
            what = f"{event['how']}: {event['error']}" if event["error"] else event["how"]
            return [f"{_PREFIX} {_groups([replica])} given up: rank {event['rank']} failed again ({what}) and its "
                    "replacements ran out (--max-restarts); the others train on"]  # fmt: skip
        elif kind == "finished":
            self.finished[replica] = (event["step"], event["digest"])
        return []

    def _resolve(self, fault: _Fault, lost: int, t: float, step: int) -> list:
        self._open = None
        self.faults += 1
        self.discarded += lost
        at = fault.step if fault.step is not None else step
        if fault.replica is not None:
            what = f"{fault.how}: {fault.error}" if fault.error else fault.how
            who = f"rank {fault.rank} ({_groups([fault.replica])}) lost ({what}) at step {at}"
            then = f"; starting its replacement ({fault.replacement})" if fault.replacement else ""
        else:
            missing = sorted(set(range(self.replicas)) - set(self._members))
            self._out.update({r: fault.t0 for r in missing if r not in self._lost_at or self._lost_at[r] < fault.t0})
            reason = f" ({fault.errors[0]})" if fault.errors else ""
            who = (f"{_groups(missing)} did not take part in step {at}{reason}" if missing
                   else f"step {at} failed{reason}")  # fmt: skip
            if missing and not lost and not fault.errors:
                who = f"{_groups(missing)} did not ask to join step {at} (stopped, hung or gone)"
            then = ""
        did = f"{lost} step{'s' if lost != 1 else ''} discarded" if lost else "no step discarded"
        return [f"{_PREFIX} {who}; the other replica groups went on after {t - fault.t0:.2f} s, {did}{then}"]

    def _close_open(self) -> list:
        """The line of a fault no survivor recovered from (a rank lost at start, or at the very end)."""
        fault = self._open
        self._open = None
        if fault is None:
            return []
        if fault.replica is not None:
            what = f"{fault.how}: {fault.error}" if fault.error else fault.how
            then = f"; starting its replacement ({fault.replacement})" if fault.replacement else ""
            return [f"{_PREFIX} rank {fault.rank} ({_groups([fault.replica])}) lost ({what}) before any step "
                    f"depended on it{then}"] if fault.step is None else [
                    f"{_PREFIX} rank {fault.rank} ({_groups([fault.replica])}) lost ({what}) at step {fault.step}; "
                    f"no survivor committed a step after it{then}"]  # fmt: skip
        return [f"{_PREFIX} step {fault.step} failed on {_groups(sorted(fault.failed))} "
                f"({fault.errors[0] if fault.errors else 'no error given'}); no survivor committed a step after it"]  # fmt: skip

    def end(self, exits: dict) -> tuple[list, bool]:
        """The closing lines, given each replica group's agent exit code; and whether the job succeeded: no
        replica group failed for good but those given up, at least one finished, and the replica groups that
        logged their end (polydist.finalize) hold one state at one step."""
        lines = self._close_open()
        finished = sorted(r for r, code in exits.items() if code == 0)
        failed = sorted(r for r, code in exits.items() if code != 0 and r not in self.given_up | self.stopped)
        states = {self.finished[r] for r in finished if r in self.finished}
        ok = bool(finished) and not failed and len(states) <= 1
        tally = (f"{self.faults} fault{'s' if self.faults != 1 else ''} survived, {self.discarded} "
                 f"step{'s' if self.discarded != 1 else ''} discarded")  # fmt: skip
        if len(states) > 1:
            detail = "; ".join(f"{r}: step {self.finished[r][0]}, sha256 {self.finished[r][1][:12]}"
                               for r in finished if r in self.finished)  # fmt: skip
            lines.append(f"{_PREFIX} ERROR: the replica groups ended with different states ({detail}); {tally}")
        elif failed:
            codes = ", ".join(str(exits[r]) for r in failed)
            lines.append(f"{_PREFIX} {_groups(failed)} failed (agent exit code {codes}); {tally}")
        elif not finished:
            lines.append(f"{_PREFIX} no replica group finished; {tally}")
        elif states:
            ((step, digest),) = states
            lines.append(f"{_PREFIX} {_groups(finished)} finished at step {step} with identical model and optimizer "
                         f"state (sha256 {digest[:12]}); {tally}")  # fmt: skip
        else:
            lines.append(f"{_PREFIX} {_groups(finished)} finished (no state digest: the program did not call "
                         f"polydist.finalize); {tally}")  # fmt: skip
        if self.given_up:
            lines.append(f"{_PREFIX} {_groups(sorted(self.given_up))} had been given up before the end")
        return lines, ok
