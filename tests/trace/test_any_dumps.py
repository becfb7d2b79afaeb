"""Any valid set of dumps: ``polydist trace`` analyses it and exports it (Chrome, Flight Recorder) without error."""

from __future__ import annotations

import json

from _dumps import IN_WAIT, RAISED, call, dump, write
from hypothesis import given, settings
from hypothesis import strategies as st

from polydist.trace import analyze, chrome, fr_export

_seconds = st.floats(0, 100, allow_nan=False)
_COLLECTIVES = ["all_reduce", "broadcast", "barrier", "reduce", "all_gather", "gather", "scatter", "reduce_scatter",
                "all_to_all"]  # fmt: skip


@st.composite
def _entries(draw, rank, world):
    out = []
    for i in range(draw(st.integers(0, 6))):
        group = tuple(sorted(draw(st.sets(st.integers(0, world - 1), max_size=world)) | {rank}))
        p2p = draw(st.booleans())
        start, length = draw(_seconds), draw(st.one_of(st.none(), _seconds))
        state = "started" if length is None else draw(st.sampled_from(["completed", "failed"]))
        name = draw(st.sampled_from(["send", "recv"] if p2p else _COLLECTIVES))
        out.append(call(i, name, group, None if p2p else draw(st.integers(0, 4)), start,
                        None if length is None else start + length, state=state,
                        root=draw(st.one_of(st.none(), st.integers(0, world))),
                        error="RuntimeError: timed out" if state == "failed" else None, is_async=draw(st.booleans()),
                        shapes=[[draw(st.integers(0, 2))]], value=draw(st.booleans())))  # fmt: skip
    return out


def _plain_types(x):
    """Whether ``x`` holds only what the Flight Recorder export may write."""
    if isinstance(x, (list, tuple)):
        return all(map(_plain_types, x))
    if isinstance(x, dict):
        return all(isinstance(k, str) and _plain_types(v) for k, v in x.items())
    return x is None or type(x) in (str, int, float, bool)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_valid_set_of_dumps_is_analysed_and_exported_without_error(tmp_path_factory, data):
    directory = tmp_path_factory.mktemp("dumps")
    world = data.draw(st.integers(1, 4))
    for rank in data.draw(st.sets(st.integers(0, world - 1), min_size=1)):
        raised = data.draw(st.sampled_from([None, [], RAISED]))  # an exception's dump, of an older writer or not
        write(directory, dump(rank, world, data.draw(_entries(rank, world)), data.draw(_seconds),
                              enabled=data.draw(st.booleans()), stacks=data.draw(st.sampled_from([[], [IN_WAIT]])),
                              reason="exception" if raised is not None else "timeout", error_frames=raised,
                              error="RuntimeError: x" if raised is not None else None))  # fmt: skip
    dumps = analyze.load(str(directory))
    assert dumps.problems == []
    found = analyze.diagnose(dumps)
    assert found.text() and json.loads(json.dumps(found.as_dict(), allow_nan=False))["world_size"] == world
    events = json.loads(json.dumps(chrome.chrome_trace(dumps), allow_nan=False))["traceEvents"]
    lanes: dict = {}
    for e in sorted((e for e in events if e["ph"] == "X"), key=lambda e: e["ts"]):
        assert e["ts"] >= 0 and e["dur"] >= 0
        assert lanes.get((e["pid"], e["tid"]), 0) <= e["ts"] * 1000  # no two calls of a thread overlap
        lanes[e["pid"], e["tid"]] = round((e["ts"] + e["dur"]) * 1000)
    for file in fr_export.fr_dumps(dumps).values():
        assert _plain_types(file) and all(e["process_group"][0] in file["pg_config"] for e in file["entries"])
