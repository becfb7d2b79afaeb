"""ignite's own ``ignite.distributed`` tests (v0.5.5, shipped unmodified in ``ignite/``) run on polydist.

Run as ignite's ``tests/run_cpu_tests.sh`` runs them, CPU/gloo: a serial
phase (one pytest process) and a ``WORLD_SIZE=4`` phase in which 4
pytest-xdist workers (``--dist=each``) are the 4 ranks of one group. The
plugin ``ignite_swap`` rewrites only the test files' imports of
``ignite.distributed`` to polydist (see there); ``IGNITE_SWAP=0`` runs the same
files on ignite itself. ``ignite_site`` (a ``sitecustomize`` on the tests'
``PYTHONPATH``) carries the swap into the processes the tests start
themselves: ``horovod.run``'s workers, the scripts they start with
``os.system``, and (the swap keeps the harness's ``PYTHONPATH`` in the one
line of ``execute()`` that resets it) the scripts started through the tests'
``execute()``: torchrun, horovodrun, ``python check_idist_parallel.py``.
Every test must pass or be skipped by ignite's own rules, except those
listed in ``EXCLUDED`` with the reason.

Ignite's Horovod tests (``utils/test_horovod.py``, the horovod cases of
``test_auto.py`` and ``test_launcher.py``) skip by ignite's rules without
Horovod. With Horovod installed they run in their own phase, ``horovod``
(``make test-horovod``): one pytest process with ``HOROVOD_DYNAMIC_PROCESS_SETS=1``,
as ignite's Horovod CI, each test starting its ranks itself. By hand, after ``make horovod``::

    cd tests/third_party/ignite
    HOROVOD_DYNAMIC_PROCESS_SETS=1 PATH=../../../.venv/bin:$PATH PYTHONPATH=..:../ignite_site python -m pytest \
        -c pytest.ini --assert=plain -p ignite_swap --timeout=200 tests/ignite/distributed -k "hvd or horovod"

The side-by-side count (ignite itself vs polydist, both phases): ``python tests/third_party/test_ignite_suite.py``.

ignite's XLA tests (marker ``tpu``: ``utils/test_xla.py``, ``comp_models/test_xla.py`` and the xla cases of
the other files) run in a third phase, ``xla``, as ignite's ``run_tpu_tests.sh`` runs them without
``NUM_TPU_WORKERS`` (world size 1, ``PJRT_DEVICE=CPU``), in the venv with torch_xla that ``make test-xla``
makes; elsewhere it skips. Its side-by-side count: ``PJRT_DEVICE=CPU .venv-xla/bin/python
tests/third_party/test_ignite_suite.py xla``.
Re-run by hand (from the repository root)::

    cd tests/third_party/ignite
    PYTHONPATH=.. python -m pytest -c pytest.ini --assert=plain -p ignite_swap tests/ignite/distributed
    WORLD_SIZE=4 PYTHONPATH=.. python -m pytest -c pytest.ini --assert=plain -p ignite_swap \\
        -m distributed --dist=each --tx 4*popen//python=python tests/ignite/distributed
"""

import ast
import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

pytest.importorskip("ignite", reason="pytorch-ignite is not installed (pip install pytorch-ignite==0.5.5)")
pytest.importorskip("xdist", reason="pytest-xdist is not installed")

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.path.join(HERE, "ignite")
D = "tests/ignite/distributed/"

# Tests of ignite's internals, or of behaviour polydist changes on purpose. Node ids as pytest prints them.
EXCLUDED = {
    # ignite internals: its private _model object, which polydist does not have
    D + "test_launcher.py::test_idist_parallel_spawn_n_procs_native": "asserts ignite's private _model._init_method",
    D + "test_launcher.py::test_idist_parallel_n_procs_native": "asserts ignite's private _model._init_method",
    D + "utils/test_native.py::test_native_distrib_single_node_launch_tool_gloo[FILE]":
        "asserts ignite's private _model._init_method (the [None] case runs)",
    D + "utils/test_native.py::test_sync_as_native_gloo": "asserts the class of ignite's private _model",
    D + "utils/test_native.py::test_idist__model_methods_gloo": "calls ignite's private _model._get_max_length",
    D + "utils/test_native.py::test_new_group_native_gloo":
        "judges membership with ignite's private _rank_not_in_group, bound to ignite's own (serial) _model",
    D + "test_auto.py::test_auto_methods_gloo": "expects auto_model(sync_bn=True) on CPU to raise; polydist "
        "degrades it to plain BatchNorm with a warning, so CUDA code runs unchanged on CPU (the rest of the test, "
        "auto_dataloader and auto_model/auto_optim checks, passes before that point)",
    D + "utils/test_native.py::test_idist_broadcast_gloo": "expects broadcast of a list and of None to raise; "
        "polydist broadcasts any value (None too), and needs no safe_mode",
    D + "utils/test_horovod.py::test_sync_as_hvd_inside_gloo_executor": "asserts the class of ignite's private "
        "_model (_HorovodDistModel), as test_sync_as_native_gloo does",
    D + "utils/test_horovod.py::test_sync_as_hvd": "imports ignite's private _HorovodDistModel (skips without "
        "horovodrun's Gloo controller anyway)",
    # check_idist_parallel.py, which these start (torchrun, spawn, two emulated nodes), ends with that same check.
    # They ran ignite itself until the swap reached execute()'s subprocesses; on polydist each fails on that line
    # only (checked by hand), and tests/launch/test_idist_launch_forms.py runs the same launches without it.
    **{D + "test_launcher.py::" + name: "check_idist_parallel.py asserts ignite's private _model._init_method; the "
       "launch itself runs in tests/launch/test_idist_launch_forms.py" for name in (
           "test_check_idist_parallel_spawn_n_procs_native[gloo]",
           "test_check_idist_parallel_torch_launch_n_procs_native[gloo-None]",
           "test_check_idist_parallel_torch_launch_n_procs_native[gloo-FILE]",
           # was "hangs" (issue 31 item 4): node 0 (os.system, this harness's PYTHONPATH) ran on polydist and
           # node 1 (execute(), PYTHONPATH reset) on ignite, so the two nodes never met
           "test_smoke_test_check_idist_parallel_spawn_multinode_n_procs_gloo")},
    # Horovod (phase "horovod", make test-horovod): ignite's private names, and what ignite 0.5.5 refuses on
    # Horovod that polydist runs on the group's process set (issue 31 item 2)
    D + "utils/test_horovod.py::test_idist__model_methods_hvd": "calls ignite's private _model._get_max_length, "
        "as test_idist__model_methods_gloo",
    D + "utils/test_horovod.py::test_idist_new_group_hvd": "judges membership with ignite's private "
        "_rank_not_in_group, as test_new_group_native_gloo (the group's ranks, group.ranks, are checked before)",
    D + "utils/test_horovod.py::test_idist_broadcast_hvd": "expects broadcast of a list and of None to raise, "
        "as test_idist_broadcast_gloo",
    D + "utils/test_horovod.py::test_idist_all_reduce_hvd": "expects all_reduce with a group to raise "
        "NotImplementedError on Horovod (ignite 0.5.5 has no group all_reduce there); polydist runs it on the "
        "group's process set. The world part (_test_distrib_all_reduce) passes before that",
    D + "utils/test_horovod.py::test_idist_all_gather_hvd": "expects all_gather of an object with a group to raise "
        "NotImplementedError on Horovod; polydist gathers it on the group's process set. The world part and "
        "the group's tensor all_gather pass before that",
    # deliberate differences
    D + "test_launcher.py::test_idist_parallel_tcp_init_method_error":
        "expects init_method='tcp://...' to be refused ('will hang'); polydist supports tcp:// rendezvous",
    D + "utils/test_serial.py::test_no_distrib": "reads show_config's log lines under ignite's logger name "
        "'ignite.distributed.utils'; polydist's show_config prints the same fields and returns them as a dict",
}


# ignite's XLA tests (phase "xla") that cannot test polydist, left out of its run there; the side-by-side count runs them.
XLA_EXCLUDED = {
    **{D + "comp_models/test_xla.py::" + name: "tests ignite's private _XlaDistModel (ignite.distributed.comp_models), "
       "not the public API" for name in ("test__xla_model", "test__xla_dist_model_spawn_one_proc",
                                          "test__xla_dist_model_create_from_backend",
                                          "test__xla_dist_model_create_from_context",
                                          "test__xla_dist_model_run_parallel_n_threads_without_sync")},
    D + "utils/test_xla.py::test_sync_as_xla": "asserts the class of ignite's private _model (_XlaDistModel)",
    D + "test_launcher.py::test_idist_parallel_spawn_params_xla": "calls ignite's private Parallel._setup_spawn_params",
    D + "utils/test_xla.py::test_idist_all_reduce_xla": "asserts a world size above 1 (_test_distrib_all_reduce_group), "
        "which PJRT's CPU client cannot make (torch_xla #9089); its world-size-1 part passes before that assertion",
    D + "utils/test_xla.py::test_idist_all_gather_xla": "asserts a world size above 1 (_test_distrib_all_gather_group), "
        "as test_idist_all_reduce_xla",
}


def _run(phase: str, swap: bool, tmp_path, excluded: bool = True) -> dict:
    """``{node id: outcome}`` of one phase ("serial", "distributed", "horovod" or "xla"), from pytest's JUnit XML,
    with ``_output`` (pytest's last lines) and ``_texts`` (each failed test's report); ``excluded``: leave out
    the phase's excluded tests."""
    report = tmp_path / f"{phase}-{int(swap)}.xml"
    # ignite_site's sitecustomize carries the swap into the processes the tests start (horovod.run, os.system)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.path.join(HERE, "ignite_site")]), IGNITE_SWAP="1" if swap else "0")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # torchrun, beside this Python
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    args = [sys.executable, "-m", "pytest", "-c", "pytest.ini", "--assert=plain", "-p", "ignite_swap",
            "-p", "no:cacheprovider", "-q", f"--junitxml={report}", D]
    if phase == "distributed":
        env["WORLD_SIZE"] = "4"
        args += ["-m", "distributed", "--dist=each", "--tx", "4*popen//python=python"]
    elif phase == "xla":
        env.setdefault("PJRT_DEVICE", "CPU")
        args += ["-m", "tpu"]
    if phase == "horovod":
        # as ignite's Horovod CI runs them: one pytest process; the tests start their ranks themselves (horovod.run,
        # horovodrun, idist.spawn). Process sets made after hvd.init need dynamic process sets, as in ignite's CI.
        env["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
        args += ["-k", "hvd or horovod"]
    elif importlib.util.find_spec("horovod") is not None:
        args += ["-k", "not hvd and not horovod"]  # their own phase, "horovod"
    for node in (XLA_EXCLUDED if phase == "xla" else EXCLUDED) if excluded else ():
        args += ["--deselect", node]
    out = subprocess.run(args, cwd=SUITE, env=env, capture_output=True, text=True, timeout=900)
    assert report.exists(), out.stdout[-3000:] + out.stderr[-3000:]
    outcomes: dict = {}
    texts: dict = {}  # node -> what its failures printed (traceback, captured output), for DIFFERENCES
    for case in ET.parse(report).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        node = f"{path}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        if outcome == "failed":
            texts[node] = texts.get(node, "") + "\n".join(
                (child.get("message") or "") + (child.text or "") for child in case)
        if outcomes.get(node) != "failed":  # --dist=each: one entry per worker; any failure counts
            outcomes[node] = outcome
    outcomes["_output"] = out.stdout[-6000:]
    outcomes["_texts"] = texts
    return outcomes


def test_swap_finds_the_line_of_execute_it_rewrites():
    """``ignite_swap`` finds ``execute()``'s ``PYTHONPATH`` line by its exact text; were it not found, the scripts
    that ``execute()`` starts would silently run on ignite itself again."""
    with open(os.path.join(HERE, "ignite_swap.py")) as f:
        tree = ast.parse(f.read())
    line = next(node.value.value for node in tree.body
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_EXECUTE_PATH")
    with open(os.path.join(SUITE, D, "test_launcher.py")) as f:
        assert [text.strip() for text in f].count(line) == 1, line


def _assert_passes(phase: str, tmp_path, at_least: int) -> None:
    """Every test of the phase that was run passed on polydist, and at least ``at_least`` did (the suite ran)."""
    got = _run(phase, True, tmp_path)
    output, texts = got.pop("_output"), got.pop("_texts")
    failed = sorted(node for node, outcome in got.items() if outcome == "failed")
    first = texts[failed[0]][-4000:] if failed else ""
    assert not failed, f"{len(failed)} of ignite's tests failed on polydist: {failed}\n{first}\n{output}"
    assert sum(outcome == "passed" for outcome in got.values()) >= at_least, output


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("phase", ["serial", "distributed"])
def test_ignite_suite_passes_on_polydist(phase, tmp_path):
    _assert_passes(phase, tmp_path, 10 if phase == "serial" else 5)


@pytest.mark.timeout(900)
@pytest.mark.skipif(importlib.util.find_spec("horovod") is None, reason="Horovod is not installed (make test-horovod)")
def test_ignite_horovod_tests_pass_on_polydist(tmp_path):
    _assert_passes("horovod", tmp_path, 11)  # all 11 that test polydist (EXCLUDED: the other 5)


@pytest.mark.timeout(600)
@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="torch_xla is not installed (make test-xla)")
def test_ignite_xla_tests_pass_on_polydist(tmp_path):
    _assert_passes("xla", tmp_path, 11)  # all 11 of the 20 that test polydist (the other 9: XLA_EXCLUDED)


if __name__ == "__main__":  # the side-by-side count: python tests/third_party/test_ignite_suite.py [xla]
    import collections
    import pathlib
    import tempfile

    xla = sys.argv[1:] == ["xla"]
    horovod = ("horovod",) if importlib.util.find_spec("horovod") is not None else ()
    for phase in ("xla",) if xla else ("serial", "distributed", *horovod):
        for swap, name in ((False, "ignite"), (True, "polydist")):
            with tempfile.TemporaryDirectory() as folder:
                got = _run(phase, swap, pathlib.Path(folder), excluded=not xla)
                got.pop("_output")
                got.pop("_texts")
                counts = collections.Counter(got.values())
                print(f"{phase:12} {name:9} " + ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "skipped")))
                if xla:
                    for node in sorted(n for n, o in got.items() if o == "failed"):
                        print(f"    failed: {node}" + (f"  ({XLA_EXCLUDED[node]})" if node in XLA_EXCLUDED else ""))
    if xla:
        print(f"(every test marked tpu, none left out; {len(XLA_EXCLUDED)} of them cannot test polydist, see XLA_EXCLUDED)")
    else:
        print(f"({len(EXCLUDED)} tests excluded for both, see EXCLUDED)")
