"""The fault-tolerant launcher's words (launch/ft_report.py) and its fault log (launch/ft_events.py), from events
as the replica groups and their agents write them; no process is started."""

import json
import os

import pytest

from polydist.launch import ft_events
from polydist.launch.ft_report import Report


def ev(kind, replica, t, **fields):
    return {"kind": kind, "replica": replica, "t": float(t), **fields}


def quorum(replica, t, step, members, since=None):
    return ev("quorum", replica, t, step=step, participants=len(members), members=members, since=since or t - 0.1)


def lost(replica, t, how="killed by SIGKILL", error="", n=1, of=3):
    return ev("lost", replica, t, rank=replica, how=how, error=error, replacement=n, of=of)


def feed(report, *events):
    lines = []
    for event in events:
        assert ft_events._checked(event) is not None, event  # the tests write events the log would accept
        lines += report.feed(event)
    return lines


def started(replicas, incarnation=0, t=0.0):
    return [ev("started", r, t, incarnation=incarnation) for r in replicas]


def test_a_rank_killed_mid_step_one_line_with_the_steps_discarded_and_the_time_to_recover():
    report = Report(3)
    lines = feed(report, *started(range(3)), quorum(0, 1, 0, [0, 1, 2]),
                 ev("failed", 0, 10.2, step=41, error="Connection reset by peer", since=10.0),
                 lost(2, 10.3),
                 ev("failed", 1, 10.25, step=41, error="Connection reset by peer", since=10.0),
                 quorum(0, 11.0, 41, [0, 1], since=10.4),
                 ev("recovered", 0, 11.0, step=41, lost=1, since=10.2),
                 ev("recovered", 1, 11.1, step=41, lost=1, since=10.25))
    assert lines == ["polydist: fault-tolerant: rank 2 (replica group 2) lost (killed by SIGKILL) at step 41; the other "
                     "replica groups went on after 1.00 s, 1 step discarded; starting its replacement (1 of 3)"]
    assert (report.faults, report.discarded) == (1, 1)


def test_a_loss_logged_after_the_survivors_shrank_still_names_the_lost_rank():
    """MPI: a survivor may log its failed step and its new quorum before the one that tells of the loss."""
    report = Report(3)
    lines = feed(report, *started(range(3)), quorum(0, 1, 0, [0, 1, 2]),
                 ev("failed", 1, 10.2, step=30, error="MPI_ERR_PROC_FAILED", since=10.0),
                 quorum(1, 10.3, 30, [0, 1]), lost(2, 10.4, how="a process failure, MPI_ERR_PROC_FAILED"),
                 ev("recovered", 1, 11.0, step=30, lost=1, since=10.2))
    assert lines == ["polydist: fault-tolerant: rank 2 (replica group 2) lost (a process failure, MPI_ERR_PROC_FAILED) "
                     "at step 30; the other replica groups went on after 1.00 s, 1 step discarded; starting its "
                     "replacement (1 of 3)"]


def test_a_rank_lost_between_steps_discards_nothing():
    report = Report(2)
    lines = feed(report, *started(range(2)), quorum(0, 1, 0, [0, 1]), lost(1, 5.0, how="exit code 1", error="ValueError: x"),
                 quorum(0, 5.8, 12, [0]))
    assert lines == ["polydist: fault-tolerant: rank 1 (replica group 1) lost (exit code 1: ValueError: x) at step 12; "
                     "the other replica groups went on after 0.80 s, no step discarded; starting its replacement (1 of 3)"]


def test_a_hang_names_the_replica_group_left_out_and_counts_from_the_step_start():
    report = Report(3)
    lines = feed(report, *started(range(3)), quorum(0, 1, 0, [0, 1, 2]),
                 ev("failed", 0, 13.0, step=7, error="future did not complete within 0:00:03", since=10.0),
                 ev("failed", 1, 13.0, step=7, error="future did not complete within 0:00:03", since=10.0),
                 quorum(0, 14.0, 7, [0, 1]), ev("recovered", 0, 14.0, step=7, lost=1, since=13.0))
    assert lines == ["polydist: fault-tolerant: replica group 2 did not take part in step 7 (future did not complete "
                     "within 0:00:03); the other replica groups went on after 4.00 s, 1 step discarded"]
    assert report.left_behind(2) and not report.left_behind(0)


def test_a_frozen_rank_left_between_steps_then_ended_by_its_agent():
    report = Report(3)
    lines = feed(report, *started(range(3)), quorum(0, 1, 0, [0, 1, 2]), quorum(0, 6.0, 30, [0, 2], since=5.0),
                 lost(1, 9.0, how="frozen: stopped (process state T) for 3.0 s"))
    assert lines == [
        "polydist: fault-tolerant: replica group 1 did not ask to join step 30 (stopped, hung or gone); the other "
        "replica groups went on after 1.00 s, no step discarded",
        "polydist: fault-tolerant: rank 1 (replica group 1) lost after the others had gone on without it (frozen: "
        "stopped (process state T) for 3.0 s); starting its replacement (1 of 3)",
    ]
    assert report.faults == 1


def test_a_replacement_rejoins_and_its_own_first_quorum_is_not_a_fault():
    report = Report(2)
    feed(report, *started(range(2)), quorum(0, 1, 0, [0, 1]), lost(1, 5.0), quorum(0, 5.8, 12, [0]))
    assert report.left_behind(1)
    lines = feed(report, ev("started", 1, 7.0, incarnation=1), quorum(1, 7.5, 0, [1]),  # alone: not the job's quorum
                 quorum(1, 8.0, 20, [0, 1]), ev("healed", 1, 8.0, step=21, seconds=0.25, bytes=3 * 2**20))
    assert lines == ["polydist: fault-tolerant: replica group 1 rejoined at step 21: its replacement received the live "
                     "state (3.0 MiB) in 0.25 s, 3.0 s after it was lost"]
    assert not report.left_behind(1) and report.faults == 1


def test_the_first_start_heals_no_one_in_the_words():
    report = Report(2)
    assert feed(report, *started(range(2)), quorum(1, 1, 0, [0, 1]), ev("healed", 1, 1.1, step=1, seconds=0.1, bytes=10)) == []


def test_lost_before_the_first_step_and_given_up():
    report = Report(2)
    lines = feed(report, *started(range(2)), lost(1, 1.0, how="exit code 1", error="ImportError: nope", n=1, of=1),
                 ev("given_up", 1, 2.0, rank=1, how="exit code 1", error="ImportError: nope"))
    assert lines == [
        "polydist: fault-tolerant: rank 1 (replica group 1) lost before the first step (exit code 1: ImportError: nope); "
        "starting its replacement (1 of 1)",
        "polydist: fault-tolerant: replica group 1 given up: rank 1 failed again (exit code 1: ImportError: nope) and "
        "its replacements ran out (--max-restarts); the others train on",
    ]


def test_the_end_compares_the_replica_groups_states():
    report = Report(3)
    feed(report, *[ev("finished", r, 9.0, step=100, digest="ab" * 32) for r in range(3)])
    lines, ok = report.end({0: 0, 1: 0, 2: 0})
    assert ok and lines == [f"polydist: fault-tolerant: replica groups 0, 1, 2 finished at step 100 with identical "
                            f"model and optimizer state (sha256 {'ab' * 6}); 0 faults survived, 0 steps discarded"]
    report = Report(2)
    feed(report, ev("finished", 0, 9.0, step=100, digest="ab" * 32), ev("finished", 1, 9.0, step=100, digest="cd" * 32))
    lines, ok = report.end({0: 0, 1: 0})
    assert not ok and lines[0].startswith("polydist: fault-tolerant: ERROR: the replica groups ended with different states")
    lines, ok = Report(2).end({0: 0, 1: 1})
    assert not ok and "replica group 1 failed (agent exit code 1)" in lines[0]
    lines, ok = Report(2).end({0: 0, 1: 0})
    assert ok and "no state digest" in lines[0]
    lines, ok = Report(2).end({0: 1, 1: 1})
    assert not ok


def _cut_off_at_step_60(late: bool) -> list:
    """Replica group 1's link drops in step 60 and comes back: both sides fail the step; 0 goes on without 1;
    1 takes the live state and is back. ``late``: 1's events reach this node only once its link is up (node 0's
    view), after 0's recovery; else they come in time order (node 1's own view, where 0's arrive late)."""
    mine = [ev("failed", 0, 13.1, step=60, error="Timed out waiting 3000ms", since=10.0),
            quorum(0, 14.0, 60, [0], since=13.2), ev("recovered", 0, 14.1, step=60, lost=1, since=13.1)]
    theirs = [ev("failed", 1, 13.0, step=60, error="Timed out waiting 3000ms", since=10.0),
              quorum(1, 17.0, 95, [0, 1], since=16.9), ev("healed", 1, 17.1, step=95, seconds=0.01, bytes=6 * 1024),
              ev("recovered", 1, 17.2, step=95, lost=1, since=13.0)]
    return mine + theirs if late else sorted(mine + theirs, key=lambda e: e["t"])


@pytest.mark.parametrize("late", [True, False], ids=["node 0's view", "node 1's view"])
def test_a_replica_group_cut_off_and_back_is_one_fault_and_one_line_when_it_is_back(late):
    report = Report(2)
    lines = feed(report, *started(range(2)), quorum(0, 1, 0, [0, 1]), *_cut_off_at_step_60(late))
    assert lines == [
        "polydist: fault-tolerant: replica group 1 did not take part in step 60 (Timed out waiting 3000ms); the other "
        "replica groups went on after 4.10 s, 1 step discarded",
        "polydist: fault-tolerant: replica group 1 is back at step 95, 7.1 s after it was left out: it received the "
        "live state (6.0 KiB) in 0.01 s"]
    assert (report.faults, report.discarded) == (1, 1)


def test_a_replica_group_that_goes_on_alone_after_the_others_finished_is_left_behind():
    """A replacement that rejoined, fell behind (left out of the last quorums) and trains on in quorums of its own
    once the others have finished would end with another state: the launcher is told to stop it."""
    report = Report(3)
    feed(report, *started(range(3)), quorum(0, 1, 0, [0, 1, 2]), ev("finished", 0, 9.0, step=200, digest="ab" * 32),
         ev("finished", 2, 9.1, step=200, digest="ab" * 32))
    assert not report.left_behind(1)
    feed(report, quorum(1, 9.5, 198, [1]))
    assert report.left_behind(1) and report._members == [0, 1, 2]


def test_a_replacement_stopped_at_the_end_is_not_a_failure():
    report = Report(2)
    feed(report, ev("finished", 0, 9.0, step=100, digest="ab" * 32))
    report.stopped.add(1)
    lines, ok = report.end({0: 0, 1: 143})
    assert ok and lines[0].startswith("polydist: fault-tolerant: replica group 0 finished at step 100")


# ---------------------------------------------------------------- the fault log


def test_events_round_trip_and_a_reader_sees_each_once(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYDIST_FT_EVENTS", str(tmp_path))
    monkeypatch.setattr(ft_events, "_files", {})
    ft_events.record("failed", 2, step=5, error="x", since=1.0)
    reader = ft_events.Reader(str(tmp_path))
    (event,) = reader.new()
    assert (event["kind"], event["replica"], event["step"]) == ("failed", 2, 5)
    assert reader.new() == []
    ft_events.record("recovered", 2, step=5, lost=1, since=1.0)
    assert [e["kind"] for e in reader.new()] == ["recovered"]


def test_record_refuses_events_of_the_wrong_shape(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYDIST_FT_EVENTS", str(tmp_path))
    with pytest.raises(ValueError):
        ft_events.record("failed", 1, step="5", error="x", since=1.0)
    with pytest.raises(ValueError):
        ft_events.record("nonsense", 1)


def test_the_reader_skips_what_is_not_an_event_and_waits_for_a_whole_line(tmp_path):
    good = json.dumps(ev("failed", 0, 1.0, step=3, error="e", since=0.5))
    bad = [
        "not json",
        json.dumps([1, 2]),
        json.dumps(ev("failed", 0, 1.0, step=True, error="e", since=0.5)),  # a bool is not a step
        json.dumps(ev("failed", 0, 1.0, step=3, error="e")),  # a field missing
        json.dumps({**ev("failed", 0, 1.0, step=3, error="e", since=0.5), "extra": 1}),
        json.dumps(ev("quorum", 0, 1.0, step=1, participants=1, members=["0"], since=0.5)),  # members not ints
        json.dumps(ev("unknown", 0, 1.0)),
        "x" * (ft_events._MAX_LINE + 1),
    ]
    path = tmp_path / "events-1.jsonl"
    path.write_text("\n".join(bad + [good]) + "\n" + good[:10])  # a line still being written at the end
    reader = ft_events.Reader(str(tmp_path))
    assert [e["step"] for e in reader.new()] == [3]
    with open(path, "a") as f:
        f.write(good[10:] + "\n")
    assert [e["step"] for e in reader.new()] == [3]
    (tmp_path / "other.txt").write_text(good + "\n")  # not a log of ours
    assert reader.new() == []


def test_nothing_is_written_outside_a_fault_tolerant_job(tmp_path, monkeypatch):
    monkeypatch.delenv("POLYDIST_FT_EVENTS", raising=False)
    ft_events.record("failed", 1, step=1, error="", since=0.0)
    assert os.listdir(tmp_path) == []


class _Events:
    """A fault log read as ft_events.Reader reads it: ``new()`` gives what was written since the last call."""

    def __init__(self, events):
        self._events = list(events)

    def new(self):
        events, self._events = self._events, []
        return events

    def close(self, timeout=0.0):
        pass


@pytest.mark.timeout(60)
def test_an_mpi_job_that_hangs_after_every_replica_group_finished_is_stopped_and_succeeds(monkeypatch, capsys):
    """Open MPI's MPI_Finalize after a lost rank sometimes never returns: once every replica group logged that it
    finished, the launcher gives mpiexec a grace period, then stops it; the job succeeds on the states' digests."""
    import subprocess
    import sys
    import time

    from polydist.launch import fault_tolerant

    monkeypatch.setattr(fault_tolerant, "_FINISHED_GRACE_S", 0.5)
    monkeypatch.setattr(fault_tolerant, "_STOP_GRACE_S", 5.0)
    mpiexec = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # a hung mpiexec
    events = _Events([ev("finished", r, 9.0, step=100, digest="ab" * 32) for r in range(3)])
    start = time.monotonic()
    try:
        code = fault_tolerant._supervise({r: mpiexec for r in range(3)}, Report(3), events, None, one_job=True)
    finally:
        mpiexec.kill()
    assert code == 0
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err
    assert "every replica group finished, but mpiexec had not ended 0.5 s later" in err
    assert "finished at step 100 with identical model and optimizer state" in err


@pytest.mark.timeout(60)
def test_an_mpi_job_is_not_stopped_while_a_replica_group_has_not_finished(monkeypatch):
    import subprocess
    import sys

    from polydist.launch import fault_tolerant

    monkeypatch.setattr(fault_tolerant, "_FINISHED_GRACE_S", 0.2)
    mpiexec = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])  # ends by itself, after 3 s
    events = _Events([ev("finished", r, 9.0, step=100, digest="ab" * 32) for r in range(2)])  # 2 of 3 finished
    code = fault_tolerant._supervise({r: mpiexec for r in range(3)}, Report(3), events, None, one_job=True)
    assert mpiexec.returncode == 0  # it ended on its own: never stopped
    assert code == 1  # replica group 2 never finished
