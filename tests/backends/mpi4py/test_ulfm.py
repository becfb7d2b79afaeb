"""ULFM on Open MPI 5 (polydist.backends.mpi4py.ulfm): a killed or frozen rank costs no restart.

Small MPI programs (``_ulfm_job.py`` beside this file) run under the Open MPI
runtime's ``mpiexec --with-ft ulfm`` (``make mpi-runtimes`` installs it under
``.venv/mpi/openmpi``), 3 ranks: a SIGKILLed rank is detected, the survivors
shrink, vote and reduce again; a replacement is spawned, merged and given the
live state; a SIGSTOPped rank is declared failed by the failure detector,
while a rank computing outside MPI is not. Under MPICH and Intel MPI,
``support()`` returns a reason instead of aborting, and ``launcher_support``
refuses their ``mpiexec`` before any rank starts. The figures measured (ms)
are printed (``pytest -s``); the asserted bounds are loose, behaviour only.
Whole programs under a launcher: marked ``ft`` (make test-ft) and ``system`` (make test-system).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import signal
import stat
import subprocess
import sys

import pytest

from _world import LAUNCHER_VARIABLES
from conftest import ROOT

pytestmark = [pytest.mark.ft, pytest.mark.system, pytest.mark.timeout(120)]

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "_ulfm_job.py")
SOURCE = os.path.join(ROOT, "src", "polydist", "backends", "mpi4py", "ulfm.py")
INSTALL = "make mpi-runtimes"
# The main venv: this Python's, or two folders up from a runtime's venv (tools/mpi_runtime.sh puts them in VENV/mpi/).
MAIN_VENV = os.path.dirname(os.path.dirname(sys.prefix)) if os.path.basename(os.path.dirname(sys.prefix)) == "mpi" \
    else sys.prefix  # fmt: skip
RUNTIME_NAMES = {"openmpi": "Open MPI", "impi": "Intel MPI"}


def _load_ulfm():
    """The module from its file, without importing polydist (torch) or mpi4py.MPI (which would start MPI here)."""
    spec = importlib.util.spec_from_file_location("ulfm_in_pytest", SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ulfm = _load_ulfm()


def _bin(runtime: str) -> str:
    """The bin folder of an MPI runtime: "mpich" (the main venv's wheel), "openmpi" or "impi"; skips where missing."""
    if runtime == "mpich":
        folder = os.path.join(MAIN_VENV, "bin")
        if not os.access(os.path.join(folder, "mpiexec"), os.X_OK):
            pytest.skip(f"no MPICH mpiexec in {folder} (pip install mpich)")
        return folder
    prefix = os.path.join(MAIN_VENV, "mpi", runtime)
    if not os.path.exists(os.path.join(prefix, ".installed")):
        pytest.skip(f"{RUNTIME_NAMES[runtime]} is not installed beside {MAIN_VENV} ({INSTALL})")
    return os.path.join(prefix, "bin")


def _ends_session(session: int) -> None:
    """SIGKILL every process of ``session`` (the job's, started in a session of its own), stopped ones too."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:  # field 6 of stat: the session id
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass


def run_job(runtime: str, scenario: str, folder, mpiexec_options=(), job_options=(), n: int = 3, timeout: float = 60):
    """Run the job under ``runtime``'s mpiexec; returns (exit code, the ranks' records, the output)."""
    bindir = _bin(runtime)
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARIABLES + ("PYTEST_", "POLYDIST_"))}
    if os.geteuid() == 0:  # Open MPI refuses root without both (CI's containers run as root)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["I_MPI_PIN"] = "0"  # Intel MPI would pin each rank to one core
    placement = ["--map-by", "slot:OVERSUBSCRIBE"] if runtime == "openmpi" else []  # 3 ranks on 2 cores, in order
    command = [os.path.join(bindir, "mpiexec"), *placement, *mpiexec_options, "-n", str(n),
               os.path.join(bindir, "python"), JOB, scenario, str(folder), *job_options]  # fmt: skip
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                           start_new_session=True)  # fmt: skip
    try:
        out = job.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        _ends_session(job.pid)
        out = job.communicate()[0]
        pytest.fail(f"{scenario} under {runtime} did not end within {timeout} s:\n{out[-6000:]}")
    finally:
        _ends_session(job.pid)  # a rank left stopped or waiting must not outlive the test
    out = out.replace("\0", "")
    # Each record from its marker on: Intel MPI's Hydra can join two ranks' lines before their newlines.
    decoder = json.JSONDecoder()
    records = [decoder.raw_decode(out, m.end())[0] for m in re.finditer(r"ULFM (?=\{)", out)]
    return job.returncode, records, out


def _survivors(records: list, out: str) -> list:
    survivors = sorted((r for r in records if r.get("rank") is not None), key=lambda r: r["rank"])
    assert [r["rank"] for r in survivors] == [0, 1], out[-6000:]
    return survivors


def _check_recovery(r: dict, out: str) -> None:
    """One survivor's record of one failure: seen as a process failure, shrunk to the other survivor, reduced."""
    assert r["failure"] is True and r["error"] in ("MPI_ERR_PROC_FAILED", "MPI_ERR_REVOKED"), out[-6000:]
    assert r["lost"] == [2] and r["new_size"] == 2 and r["sum_after"] == 3.0, r  # 1 + 2: the survivors only


def _figures(name: str, records: list, keys: tuple) -> None:
    for r in records:
        print(f"ULFM {name} rank {r.get('rank')}: " + ", ".join(f"{k} {r[k]:.3f}" for k in keys if k in r))


# ------------------------------------------------------------ support, without a failure


def test_support_under_open_mpi_with_and_without_ulfm(tmp_path):
    code, records, out = run_job("openmpi", "support", tmp_path, ["--with-ft", "ulfm"])
    assert code == 0 and len(records) == 3, out[-6000:]
    for r in records:
        assert r["reason"] is None and r["split_reason"] is None, r
        assert r["classified"] == [True, True, True, False, False] and r["plain_error"] is False, r
    print("ULFM support() under --with-ft ulfm: " + ", ".join(f"{r['ms']:.1f} ms" for r in records))
    # Without --with-ft the calls run, but a shrink of the revoked duplicate would never return: refused before it.
    code, records, out = run_job("openmpi", "support", tmp_path, timeout=30)
    assert code == 0 and len(records) == 3, out[-6000:]
    for r in records:
        assert r["reason"].startswith("ULFM fault tolerance is not usable with Open MPI v5"), r
        assert "--with-ft ulfm" in r["reason"] and "--max-restarts" in r["reason"], r


@pytest.mark.parametrize("runtime, name", [("mpich", "MPICH"), ("impi", "Intel(R) MPI")])
def test_support_refuses_hydra_mpis_without_aborting(tmp_path, runtime, name):
    code, records, out = run_job(runtime, "support", tmp_path, n=2, timeout=60)
    assert code == 0 and len(records) == 2, out[-6000:]  # returned on both ranks, and the job ended normally
    for r in records:
        assert r["reason"].startswith(f"ULFM fault tolerance is not usable with {name}"), r
        assert "MPI_Comm_revoke is not implemented" in r["reason"] and "--max-restarts N" in r["reason"], r
        # mpi4py makes the ULFM error classes ERR_UNKNOWN there: no error may pass for a process failure.
        assert r["classified"] == [False] * 5, r


def test_launcher_support_without_starting_mpi(tmp_path):
    assert ulfm.launcher_support(os.path.join(_bin("openmpi"), "mpiexec")) is None
    reason = ulfm.launcher_support(os.path.join(_bin("mpich"), "mpiexec"))
    assert reason.startswith("MPICH ") and "no usable ULFM" in reason and "--max-restarts" in reason, reason
    impi = os.path.join(MAIN_VENV, "mpi", "impi", "bin", "mpiexec")
    if os.access(impi, os.X_OK):
        reason = ulfm.launcher_support(impi)
        assert reason.startswith("Intel(R) MPI Library") and "--max-restarts" in reason, reason
    # An Open MPI built without ULFM (a stand-in ompi_info) and an mpiexec that is not there are refused too.
    for name, text in (("ompi_info", "#!/bin/sh\necho options:ft_mpi_support:no\n"), ("mpiexec", "#!/bin/sh\n")):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(stat.S_IRWXU)
    assert "was built without ULFM" in ulfm.launcher_support(str(tmp_path / "mpiexec"))
    assert "no usable ULFM" in ulfm.launcher_support(str(tmp_path / "absent" / "mpiexec"))


def test_classification_and_options_need_no_mpi():
    assert ulfm.is_process_failure(RuntimeError("MPI_ERR_PROC_FAILED")) is False
    assert ulfm.launcher_options() == ["--with-ft", "ulfm", "--mca", "async_mpi_finalize", "true",
                                       "--mca", "coll", "^han,cuda"]  # hierarchical collectives: not fault-tolerant
    options = ulfm.launcher_options(2.0)
    assert options[:2] == ["--with-ft", "ulfm"] and "mpi_ft_detector_thread" not in options  # its finalize hangs
    pairs = dict(zip(options[3::3], options[4::3]))
    assert pairs == {"async_mpi_finalize": "true", "coll": "^han,cuda", "mpi_ft_detector": "true",
                     "mpi_ft_detector_period": "0.5", "mpi_ft_detector_timeout": "2"}  # fmt: skip
    with pytest.raises(ValueError):
        ulfm.launcher_options(0)
    for bad in (-1, 1 << 31, True, 2.0):  # refused before any MPI call (comm is never touched)
        with pytest.raises(ValueError, match=r"bits must be an int in \[0, 2\*\*31\), got"):
            ulfm.agree_bits(None, bad)


# ------------------------------------------------------------ failures


def test_a_killed_rank_is_shrunk_away_and_the_vote_is_an_and(tmp_path):
    """(a) Rank 2 SIGKILLed in step 3: both survivors see it, vote on the old communicator (it raises for the
    unacknowledged failure, then acknowledges and votes again), shrink to 2, vote (rank 1 says no), reduce right."""
    code, records, out = run_job("openmpi", "kill", tmp_path, ulfm.launcher_options(), ["veto", "vote_first"])
    survivors = _survivors(records, out)
    assert code == 0, out[-6000:]  # Open MPI does not fail a ULFM job for the death of one of its first ranks
    for r in survivors:
        _check_recovery(r, out)
        assert r["step"] == 3 and r["new_rank"] == r["rank"], r  # the failing step; survivors keep their order
        assert r["agree_old"] is True and r["acked"] == 1, r  # the retry after acknowledging rank 2's failure
        assert r["committed"] is False and r["agree_all"] is True, r  # AND over both: one no is a no
        assert r["agree_bits"] == 2, r  # several flags in one vote, each ANDed (the replacement's spawn uses two)
        assert 0 <= r["detect_ms"] < 10_000, r  # told by the runtime (no detector runs here), not by a timeout
    assert "MPI_ERR_PROC_FAILED" in [r["error"] for r in survivors], out[-6000:]  # at least one saw the failure
    _figures("kill", survivors, ("detect_ms", "agree_old_ms", "shrink_ms", "agree_ms"))


def test_a_replacement_grows_the_world_back_with_the_live_state(tmp_path):
    """(b) After (a): spawn 1, merge, broadcast 8 MiB from rank 0; then the replacement dies too, and is shrunk away."""
    import numpy as np

    # Open MPI exits 137 here ("prterun noticed that process rank 0 ... exited on signal 9"): unlike the first
    # ranks, a spawned one that dies counts as the job's failure, though the survivors went on (later_sum).
    _, records, out = run_job("openmpi", "kill", tmp_path, ulfm.launcher_options(), ["grow", "again"])
    survivors = _survivors(records, out)
    replacements = [r for r in records if r.get("rank") is None]
    assert len(replacements) == 1, out[-6000:]
    new = replacements[0]
    assert new["is_replacement"] is True and new["env"] == "1" and new["world_size"] == 1, new
    expected = hashlib.sha256((np.arange(1 << 20, dtype=np.float64) * 0.5).tobytes()).hexdigest()
    for r in survivors:
        _check_recovery(r, out)
        assert r["committed"] is True and r["merged_rank"] == r["rank"] and r["merged_size"] == 3, r
    assert new["merged_rank"] == 2 and new["merged_size"] == 3, new  # the replacement comes last
    assert {r["state_sha"] for r in survivors + [new]} == {expected}  # all three hold rank 0's state
    assert {r["sum_grown"] for r in survivors + [new]} == {6.0}  # and reduce as one world of 3
    for r in survivors:  # the replacement killed itself: found and shrunk away on the grown communicator
        _check_recovery(r["again"], out)
        assert r["again"]["committed"] is True and r["later_sum"] == 2.0, r
    _figures("grow", survivors, ("detect_ms", "shrink_ms", "agree_ms", "spawn_merge_ms", "bcast_ms"))
    _figures("grow, 2nd failure", [dict(r["again"], rank=r["rank"]) for r in survivors], ("detect_ms", "shrink_ms"))


def test_a_frozen_rank_is_declared_failed_by_the_detector(tmp_path):
    """(c) Rank 2 SIGSTOPped: with the detector on (2 s), the survivors get the failure after about 2 s."""
    timeout = 2.0
    code, records, out = run_job("openmpi", "freeze", tmp_path, ulfm.launcher_options(timeout), ["progress"])
    survivors = _survivors(records, out)
    assert code == 0, out[-6000:]
    for r in survivors:
        _check_recovery(r, out)
        assert r["committed"] is True and r["agree_all"] is True, r
        # Not before its heartbeats are missed, and well within 3 timeouts (1.9-2.0 s measured on 2 cores).
        assert 0.5 * timeout * 1000 <= r["detect_ms"] <= 3 * timeout * 1000, r
    _figures("freeze", survivors, ("detect_ms", "shrink_ms", "agree_ms"))


def test_a_rank_computing_outside_mpi_is_not_taken_for_frozen(tmp_path):
    """With the detector on (2 s) and keep_progress(), a rank that computes 6 s without an MPI call is no failure."""
    code, records, out = run_job("openmpi", "busy", tmp_path, ulfm.launcher_options(2.0), ["progress"])
    assert code == 0 and sorted(r["rank"] for r in records) == [0, 1, 2], out[-6000:]
    assert all(r["error"] is None and r["step"] == 8 for r in records), out[-6000:]
    assert "reported dead" not in out, out[-6000:]  # Open MPI's words when its detector took a live rank for dead


def test_finalize_keeps_the_heartbeats_going_until_mpi_finalize(tmp_path):
    """A rank that finishes 6 s after another (the detector's timeout: 2 s) is not declared failed by the one
    waiting in MPI_Finalize: ulfm.finalize() stops the heartbeats only at MPI_Finalize, not at the start of the
    interpreter's exit, and the job ends."""
    code, records, out = run_job("openmpi", "late_finish", tmp_path, ulfm.launcher_options(2.0))
    assert code == 0, out[-6000:]
    assert sorted(r["rank"] for r in records if r.get("finalized")) == [0, 1, 2], out[-6000:]
    assert all(r["sum"] == 6.0 for r in records if "sum" in r), out[-6000:]
    assert "reported dead" not in out, out[-6000:]


def test_a_revoke_from_another_thread_ends_a_wait_on_its_own_rank(tmp_path):
    """A watchdog thread's Revoke of the communicator a collective waits on ends that wait on its own rank (and
    the others'); the late rank may still complete the same collective, and the vote makes the step fail on all."""
    code, records, out = run_job("openmpi", "revoke", tmp_path, ulfm.launcher_options())
    assert code == 0 and sorted(r["rank"] for r in records) == [0, 1, 2], out[-6000:]
    waiting, late = [r for r in records if r["rank"] in (0, 1)], next(r for r in records if r["rank"] == 2)
    for r in waiting:
        assert r["thread_level"] == 3 and r["result"] == "MPI_ERR_REVOKED", r  # MPI_THREAD_MULTIPLE, as polydist
        assert r["returned_ms"] < 1500, r  # revoked at 0.5 s; rank 2 comes at 2 s
    assert late["returned_ms"] >= 1900 and late["result"] in (3.0, "MPI_ERR_REVOKED"), late
    assert [r["committed"] for r in records] == [False] * 3, records  # one outcome for all, whatever each saw
    _figures("revoke", waiting, ("revoked_ms", "returned_ms"))
