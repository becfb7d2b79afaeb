"""``polydist.spawn(..., fault_tolerant=True)``: the fault-tolerant job of ``polydist run --fault-tolerant``,
started from Python on a function (tests/launch/_ft_job.py's ``spawned``)."""

import importlib.util
import os
import re

import pytest

import polydist
from polydist.errors import WorkerFailedError

if importlib.util.find_spec("torchft") is None:  # not imported: the launcher sets RUST_LOG before its import
    pytest.skip("torchft is not installed: pip install 'polydist[ft]'", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def job_env(monkeypatch):
    """The workers import _ft_job from here; no launcher variables inherited."""
    monkeypatch.setenv("PYTHONPATH", HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.ft
@pytest.mark.timeout(240)
def test_a_killed_replica_group_is_replaced_and_every_one_returns_the_same_model(job_env, monkeypatch, capfd):
    import _ft_job

    monkeypatch.setenv("FT_FAULT", "kill:1:60")
    results = polydist.spawn("gloo", _ft_job.spawned, (300,), nproc_per_node=3, timeout=3, fault_tolerant=True)
    err = capfd.readouterr().err
    assert re.search(r"rank 1 \(replica group 1\) lost \(killed by SIGKILL\) at step 60; the other replica groups "
                     r"went on after [\d.]+ s, (no step|1 step) discarded", err), err  # fmt: skip
    # the replacement rejoins, or, on a machine so loaded that it had not when the others finished, is stopped
    rejoined = "replica group 1 rejoined at step" in err
    finished = "replica groups 0, 1, 2" if rejoined else "replica groups 0, 2"
    assert f"{finished} finished at step 300 with identical model and optimizer state" in err, err
    assert len(results) == 3 and results[0] is not None and results[2] == results[0], results
    assert results[1] == (results[0] if rejoined else None), results


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(nproc_per_node=2, replica_group_size=3), "--nproc-per-node 2 is not a whole number of replica groups"),
        (dict(nproc_per_node=2, min_replicas=3), "--min-replicas 3 must be between 1 and the 2 replica group(s)"),
        (dict(nproc_per_node=2, max_restarts=-1), "max_restarts must be a non-negative int, got -1"),
        (dict(nproc_per_node=2, init_method="tcp://127.0.0.1:1"), "no init_method"),
    ],
)
def test_what_cannot_run_is_refused_before_any_process_starts(job_env, kwargs, words):
    import _ft_job

    with pytest.raises(ValueError, match=re.escape(words)):
        polydist.spawn("gloo", _ft_job.spawned, (1,), fault_tolerant=True, **kwargs)


def test_a_failed_job_raises(job_env, monkeypatch):
    """Every replica group raising at step 0, with no replacements: the job fails and spawn says so."""
    import _ft_job

    monkeypatch.setenv("FT_FAULT", "raise:0:0")
    with pytest.raises(WorkerFailedError, match="the fault-tolerant job failed"):
        polydist.spawn("gloo", _ft_job.spawned, (5,), nproc_per_node=1, max_restarts=0, fault_tolerant=True)
