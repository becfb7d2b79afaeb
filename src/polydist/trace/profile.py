"""The comms profile: where communication time goes, per collective and size, and which rank arrives last.

``with polydist.comms_profile():`` (:func:`comms_profile`, whose docstring
defines every figure) or ``polydist run --profile-comms`` for the whole job
(``$POLYDIST_PROFILE_COMMS``: :func:`start_session` in ``initialize()``,
:func:`end_session` in ``finalize()``). Calls come from the flight recorder's
feed (:attr:`polydist.collectives.recorder.Recorder.keep`); at the end each
rank packs its own (:func:`_pack`), the group's first rank matches them
across ranks by (group, sequence number) and sums them up
(:func:`~polydist.trace.profile_stats.summarize`), and everyone gets the
summary; :func:`~polydist.trace.profile_stats.format_profile` prints it.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Optional

import numpy as np

from .. import _torch, context, settings
from ..backends import dispatch
from ..collectives.broadcast import barrier, broadcast
from ..collectives.gather import all_gather, gather
from ..collectives.recorder import FAILED, RECORDER, as_dict
from ..groups import GroupLike, resolve
from .profile_stats import FAILED_CALL, VALUE_CALL, format_profile, summarize

__all__ = ["CommsProfile", "comms_profile", "summarize", "format_profile", "start_session", "end_session"]



class CommsProfile:
    """A comms profile of one group: a context manager, filled when its block exits (see :func:`comms_profile`).

    Use :func:`comms_profile` to make one. After the block, every member of
    the group holds the same summary: :meth:`as_dict`, :meth:`table`,
    :attr:`per_rank`. A non-member's profile stays empty (as a collective is
    a no-op there); so does one left by an exception (see :func:`comms_profile`).
    """

    def __init__(self, group: GroupLike = None, show: bool = True) -> None:
        self.group, self.show = group, show
        self._open: Optional[dict] = None  # while inside the block
        self._summary: Optional[dict] = None

    def __enter__(self) -> CommsProfile:
        if self._open is not None:
            raise RuntimeError("this comms profile is already open")
        state = context.world()
        res = resolve(state, self.group) if state is not None else None
        if state is not None and res is None:
            self._open = {"member": False}
            return self
        if res is not None:
            barrier(self.group)
            clocks = all_gather((context.hostname(), time.time()), self.group)  # read right after the barrier
            # Calls are matched across ranks by the group's call number, which is out of step where a
            # rank once called fewer collectives (an error it recovered from): count from here instead.
            base = _count(res)
        else:  # serial: collectives are not recorded, the profile stays empty
            clocks, base = [(context.hostname(), time.time())], 0
        owner = RECORDER.keep is None  # a profile inside another shares its feed (and adds its own calls to it)
        feed = [] if owner else RECORDER.keep
        self._open = {
            "member": True, "world": state, "ranks": list(res.ranks) if res else [0], "backend": res and res.backend,
            "hosts": [h for h, _ in clocks],
            "offsets": _offsets([h for h, _ in clocks], [t for _, t in clocks]), "was_on": RECORDER.on,
            "owner": owner, "feed": feed, "first": len(feed), "start": time.time(), "base": base,
        }  # fmt: skip
        RECORDER.keep, RECORDER.on = feed, True
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._close(communicate=exc_type is None)

    def _close(self, communicate: bool) -> None:
        opened, self._open = self._open, None
        if opened is None:
            raise RuntimeError("this comms profile is not open")
        if not opened["member"]:
            return
        entries = opened["feed"][opened["first"]:]  # before this profile's own collectives below
        if opened["owner"]:
            RECORDER.keep = None
        RECORDER.on = opened["was_on"]
        if not communicate:  # an exception: the other ranks may not be leaving, so no collective
            return
        if opened["world"] is not context.world():
            raise RuntimeError("the comms profile's process group was destroyed before the profile ended")
        ranks = opened["ranks"]
        mine = _pack([as_dict(r) for r in entries], frozenset(ranks), tuple(ranks), opened["base"])
        distributed = opened["world"] is not None
        payloads = gather(mine, dst=ranks[0], group=self.group) if distributed else [mine]
        summary = None
        if payloads is not None:  # the group's first rank: compute, and tell the others the result or the error
            try:
                summary = summarize(payloads, ranks, opened["offsets"])
                took = time.time() - opened["start"]
                summary.update(backend=opened["backend"], hosts=opened["hosts"], duration_s=took)
            except Exception as error:  # noqa: BLE001 - the other ranks must not wait for a summary that never comes
                summary = {"error": f"{type(error).__name__}: {error}"}
        if distributed:
            summary = broadcast(summary, src=ranks[0], group=self.group)
        if "error" in summary:
            raise RuntimeError(f"the comms profile could not be summarized on rank {ranks[0]}: {summary['error']}")
        self._summary = summary
        if self.show and payloads is not None:
            print(self.table(), flush=True)

    def as_dict(self) -> dict:
        """The summary, the same on every member (keys: see :func:`summarize`; also backend, hosts, duration_s).

        Raises:
            RuntimeError: the block has not ended, ended by an exception,
                or this rank is not a member of the group.
        """
        if self._summary is None:
            raise RuntimeError("a comms profile is filled on its group's members, when the block ends without an exception")
        return self._summary

    def table(self) -> str:
        """The printed table (:func:`format_profile`)."""
        return format_profile(self.as_dict())

    @property
    def per_rank(self) -> list:
        """Each member's own figures, in group-rank order (``as_dict()["ranks"]``, see :func:`summarize`)."""
        return self.as_dict()["ranks"]


def comms_profile(group: GroupLike = None, *, show: bool = True) -> CommsProfile:
    """Profile the calls of ``group`` inside a ``with`` block: counts, bytes, times, algbw/busbw, stragglers.

    Enter and leave it on every rank of ``group`` at the same point of the
    program, as a collective: entering is a barrier and an all_gather of the
    ranks' clocks; leaving gathers every rank's calls to the group's first
    rank, which computes the summary, prints it (``show``) and broadcasts
    it, so that every member gets the same :meth:`CommsProfile.as_dict`.

    Args:
        group: None (the world), a ProcessGroup or a list of global ranks.
            Calls on groups inside it (subgroups too) are profiled.
        show: print the table (:func:`format_profile`) on the group's first
            rank (rank 0 for the world) when the block ends.

    Returns:
        A :class:`CommsProfile`, filled when the block ends.

    Figures, one row per (collective, group size, size bucket). A
    collective *call* is one sequence number of one group. Its *size* is
    nccl-tests' (:mod:`polydist.units`): the sum of the ranks' tensor
    bytes for all_gather and gather (the gathered buffer), the largest
    rank's otherwise (all_reduce's tensor, scatter's input on src,
    all_to_all's whole send buffer); calls of Python values have none
    ("value"), barrier has 0. Calls fall in the *bucket* of the power of two
    at or above their size. A rank's *arrival* is when it entered the call
    (``time.time()``, on rank 0's clock, below). Per call:

    - **time** = latest end − latest arrival over the ranks: the
      collective's own duration once every rank is there, without the wait
      for a late one (DeepSpeed's summary takes the smallest of the ranks'
      latencies for the same). An ``async_op`` call ends when its ``wait()``
      returns: its time includes what ran before the wait;
    - **spread** = latest arrival − earliest arrival: how long the first
      rank waited for the last, whom the row names (*last most often*).

    A row gives calls; bytes, the sum of call sizes; total and median time;
    algbw = mean size / median time and busbw = algbw × nccl-tests' factor
    for the group size, in GB/s = 1e9 B/s
    (:func:`~polydist.units.bandwidths`); the median and total
    spread, in seconds. A call that some member did not complete (it failed
    there, or started before the profile) counts in calls and bytes only,
    as *partial*. Point-to-point calls have no sequence number to match
    across ranks: each rank's sends and recvs count on their own (time: that
    rank's own duration, waiting included), without bandwidth or spread.

    Clocks: after the entry barrier every rank reads its clock. Ranks on
    one host share a clock, so only other hosts are corrected, by the
    median of their readings minus that of rank 0's host: this removes the
    skew between nodes down to the spread of the barrier's exits (about one
    message latency between nodes), not below.

    Cost: while the block runs, the flight recorder records (also with
    ``POLYDIST_TRACE=0``; restored after) and every ended call is kept,
    about 450 bytes each, and summing up takes some 15 µs per call: profile a
    window of a long job rather than all of it. The calls of a profile
    nested inside another count in the outer one too. Leaving the block by
    an exception ends the profile without communicating (the other ranks
    may not be leaving) and without a summary.

    Raises:
        RuntimeError: on entering a profile object that is already open;
            on leaving, when the group was destroyed meanwhile or the
            summary failed (then on every rank).

    Example::

        with pdist.comms_profile() as prof:
            for _ in range(10):
                pdist.all_reduce(torch.ones(1024))
        prof.as_dict()["rows"][0]["calls"]       # 10, on every rank; rank 0 printed the table

    Sources: DeepSpeed's comms logger (``deepspeed.comm.log_summary(show_straggler=True)``:
    count, latency, algbw/busbw per op and message size; its straggler
    figure is each rank's latency minus the smallest, which arrival times
    measure here directly) and nccl-tests ``doc/PERFORMANCE.md`` (algbw,
    busbw and their factors).
    """
    return CommsProfile(group, show)


# ---------------------------------------------------------------- what each rank sends


def _count(res: Any) -> int:
    """The number the group's next recorded call follows: a Python group
    numbers its records with its own count of operations, whoever called them (polydist.backends.python_group);
    other groups with polydist's."""
    group = dispatch.behind(res.pg if res.pg is not None else _torch.default_pg())
    return getattr(group, "_seq", res.seq)


def _offsets(hosts: list, clocks: list) -> list:
    """Seconds to subtract from each rank's clock to read rank 0's: 0 on its host, else host medians' difference."""
    by_host: dict = {}
    for host, t in zip(hosts, clocks):
        by_host.setdefault(host, []).append(t)
    median = {host: statistics.median(ts) for host, ts in by_host.items()}
    return [median[host] - median[hosts[0]] for host in hosts]


def _pack(entries: list, members: frozenset, profiled: tuple = (), base: int = 0) -> dict:
    """One rank's calls on groups inside ``members``, compact for the codec: numbers in two arrays.

    ``ints`` rows: (group index, name index, seq or -1 for point-to-point,
    bytes, flags); ``times`` rows: (start, end). Calls on the ``profiled``
    group are numbered from its number ``base`` at the profile's start.
    """
    groups: dict = {}
    names: dict = {}
    ints, times = [], []
    for e in entries:
        key = tuple(e["group"])
        if not members.issuperset(key):
            continue
        flags = (FAILED_CALL if e["state"] == FAILED else 0) | (VALUE_CALL if e["value"] else 0)
        seq = -1 if e["seq"] is None else e["seq"] - (base if key == profiled else 0)
        name = names.setdefault(e["collective"], len(names))
        ints.append((groups.setdefault(key, len(groups)), name, seq, e["bytes"], flags))
        times.append((e["start"], e["end"]))
    ints_array, times_array = np.array(ints, dtype=np.int64), np.array(times, dtype=np.float64)
    return {"groups": [list(g) for g in groups], "names": list(names),
            "ints": ints_array.reshape(-1, 5), "times": times_array.reshape(-1, 2)}  # fmt: skip


# ---------------------------------------------------------------- polydist run --profile-comms

_session: Optional[CommsProfile] = None


def start_session() -> None:
    """Start the process-wide profile when ``$POLYDIST_PROFILE_COMMS`` is on (``initialize()`` calls it on every rank).

    Off (the default), it does nothing and does not communicate. On, it
    enters :func:`comms_profile` on the world: a barrier and an all_gather.

    Raises:
        ValueError: ``$POLYDIST_PROFILE_COMMS`` is not a flag.
    """
    global _session
    if _session is None and settings.PROFILE_COMMS.read():
        profile = comms_profile()
        profile.__enter__()
        _session = profile


def end_session() -> None:
    """End the process-wide profile and print its table on rank 0 (``finalize()`` calls it on every rank).

    Does nothing when no session was started, or a second time. A process
    ending by an exception only stops recording: the others may be dead or
    elsewhere, so it does not communicate. Never raises (``finalize()`` must
    go on): a failure is reported on stderr.
    """
    global _session
    profile, _session = _session, None
    if profile is None:
        return
    failing = sys.exc_info()[1] is not None or getattr(sys, "last_value", None) is not None  # in except / at exit
    try:
        profile._close(communicate=not failing)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        print(f"polydist: the comms profile (--profile-comms) failed: {type(exc).__name__}: {exc}", file=sys.stderr)

