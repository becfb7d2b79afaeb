"""The fault log of an MPI job, carried in mpiexec's standard error (launch/ft_events.py: ``stream_value``,
``record``, ``StreamReader``): events are taken out, every other byte reaches the console unchanged and as it
comes, and what is not an event of this job is never taken for one. A pipe stands in for mpiexec's stderr."""

import io
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from polydist.launch import ft_events

pytestmark = pytest.mark.timeout(60)


def event(step, replica=1):
    return {"kind": "failed", "replica": replica, "t": 1.0 + step, "step": step, "error": "e", "since": 0.5}


class _Console(io.RawIOBase):
    """The launcher's own stderr: records what was written, and when."""

    def __init__(self):
        self.data = b""
        self.grew = threading.Event()

    def writable(self):
        return True

    def write(self, b):
        self.data += bytes(b)
        self.grew.set()
        return len(b)


def relay(value, chunks, pause=0.0):
    """Write ``chunks`` into a pipe read by a StreamReader; return (events, what reached the console)."""
    r, w = os.pipe()
    console = _Console()
    with os.fdopen(r, "rb", buffering=0) as stream:
        reader = ft_events.StreamReader(value, stream, console)
        for chunk in chunks:
            os.write(w, chunk)
            time.sleep(pause)
        os.close(w)
        reader.close(timeout=10)
        return reader.new(), console.data


def marked(value, ev):
    token = value.split(":", 1)[1].encode()
    return ft_events._MARK + token + b" " + json.dumps(ev).encode() + b"\n"


def test_events_are_taken_out_and_the_rest_passes_through_in_order():
    value = ft_events.stream_value()
    text = [b"[rank0]: epoch 1\n", marked(value, event(3)), b"[rank1]: epoch 1\n", marked(value, event(4, 2))]
    events, console = relay(value, text)
    assert [(e["step"], e["replica"]) for e in events] == [(3, 1), (4, 2)]
    assert console == b"[rank0]: epoch 1\n[rank1]: epoch 1\n"


def test_a_mark_split_across_reads_and_a_line_left_open_before_it():
    value = ft_events.stream_value()
    whole = b"progress 50%\r" + marked(value, event(7)) + b"done\n"
    cut = whole.index(b"polydist-ft") + 3  # inside the mark
    events, console = relay(value, [whole[:cut], whole[cut:cut + 20], whole[cut + 20:]], pause=0.05)
    assert [e["step"] for e in events] == [7]
    assert console == b"progress 50%\rdone\n"


def test_output_without_a_newline_reaches_the_console_before_the_line_ends():
    """A progress bar ("\\r", no newline) is not held back until a newline or the job's end."""
    value = ft_events.stream_value()
    r, w = os.pipe()
    console = _Console()
    with os.fdopen(r, "rb", buffering=0) as stream:
        reader = ft_events.StreamReader(value, stream, console)
        os.write(w, b"\r 10%")
        assert console.grew.wait(10), "nothing reached the console"
        assert console.data == b"\r 10%"
        os.close(w)
        reader.close(timeout=10)


def test_what_is_not_an_event_of_this_job_is_never_taken_for_one():
    value, other = ft_events.stream_value(), ft_events.stream_value()
    forged = [
        marked(other, event(1)),  # another job's token: text
        marked(value, {**event(2), "step": "2"}),  # ill-typed: dropped
        ft_events._MARK + value.split(":", 1)[1].encode() + b" not json\n",
    ]
    events, console = relay(value, forged + [marked(value, event(5))])
    assert [e["step"] for e in events] == [5]
    assert console == marked(other, event(1))  # passed on as the program's output


def test_an_endless_marked_line_is_dropped_without_holding_its_bytes():
    """Bytes from the ranks are hostile until checked: a mark followed by megabytes without a newline is dropped
    once longer than any event, up to its newline (the reader does not keep growing), and a later event is
    still read."""
    value = ft_events.stream_value()
    token = value.split(":", 1)[1].encode()
    flood = [ft_events._MARK + token + b" "] + [b"x" * 65536] * 40
    events, console = relay(value, flood + [b"x\nafter\n", marked(value, event(9))])
    assert [e["step"] for e in events] == [9]
    assert console == b"after\n"  # the flood was dropped, neither relayed nor kept


def test_a_process_records_its_events_on_stderr_in_one_line_each():
    """``record`` in a process of a job whose log is on stderr: one marked line per event, nothing on disk."""
    value = ft_events.stream_value()
    code = ("import sys; from polydist.launch import ft_events; "
            "print('before', file=sys.stderr, flush=True); "
            "ft_events.record('failed', 3, step=8, error='boom', since=1.0); "
            "ft_events.record('recovered', 3, step=8, lost=1, since=1.0)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, POLYDIST_FT_EVENTS=value),
                         capture_output=True, timeout=50, check=True)  # fmt: skip
    events, console = relay(value, [out.stderr])
    assert [(e["kind"], e["replica"], e["step"]) for e in events] == [("failed", 3, 8), ("recovered", 3, 8)]
    assert console == b"before\n"
