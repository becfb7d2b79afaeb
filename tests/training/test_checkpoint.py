"""Checkpoints of the main job (examples/train_digits.py): atomic saves, resume on another world size, SIGKILL.

The settings are small (EPOCHS epochs of a few hundred milliseconds each); the
accuracies compared are those of the final model on the test split.
"""

import contextlib
import importlib.util
import io
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from fault import descendants, worker_pid  # noqa: E402  (the fault benchmark's: a job's processes in /proc)
from polydist import Checkpointer
from polydist.checkpoint import save_atomic

EXAMPLE = os.path.join(ROOT, "examples", "train_digits.py")
EPOCHS = 12
RUN_TIMEOUT_S = 120


def _example():
    spec = importlib.util.spec_from_file_location("train_digits_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(cmd, env):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert out.returncode == 0, f"exit code {out.returncode}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"
    return out.stdout


def _two_ranks(*args, env):
    return _run(["polydist", "run", "--nproc-per-node", "2", EXAMPLE, "--epochs", str(EPOCHS), *args], env)


def _accuracy(stdout: str) -> float:
    match = re.search(r"final test accuracy: (0\.\d{4})", stdout)
    assert match, stdout
    return float(match.group(1))


def _epoch(path) -> int:
    return torch.load(path, weights_only=True)["epoch"]


def _model(path) -> dict:
    """The model a checkpoint holds; of a sharded one (--fsdp), read back from the DCP folder its file names."""
    state = torch.load(path, weights_only=True)
    if "dcp" not in state:
        return state["model"]
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = f"{path}.whole"
    dcp_to_torch_save(os.path.join(f"{path}.dcp", state["dcp"]), whole)
    return torch.load(whole, weights_only=True)["model"]


def _max_difference(path_a, path_b) -> float:
    """Largest absolute difference between the models saved in two checkpoints."""
    a, b = (_model(p) for p in (path_a, path_b))
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


# ------------------------------------------------------------ atomic save (in process)


@pytest.mark.parametrize("crash_in", ["torch.save", "os.fsync", "os.replace"])
def test_crash_mid_save_keeps_previous_checkpoint(crash_in, tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pt")
    save_atomic(path, {"epoch": 1, "w": torch.ones(3)})

    def torn(*args, **kwargs):
        if crash_in == "torch.save":  # part of the bytes reach the file, then the process dies
            args[1].write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt

    module, name = crash_in.split(".")
    monkeypatch.setattr({"torch": torch, "os": os}[module], name, torn)
    with pytest.raises(KeyboardInterrupt):
        save_atomic(path, {"epoch": 2, "w": torch.zeros(3)})
    monkeypatch.undo()
    state = torch.load(path, weights_only=True)
    assert state["epoch"] == 1 and state["w"].tolist() == [1.0, 1.0, 1.0]
    assert os.listdir(tmp_path) == ["ckpt.pt"]  # the temporary file was removed

    # A process killed outright leaves its temporary file behind: the next resume removes it.
    (tmp_path / ".ckpt.pt.0123abcd.tmp").write_bytes(b"garbage")
    (tmp_path / ".other.pt.0123abcd.tmp").write_bytes(b"another checkpoint's: kept")
    save_atomic(path, {"epoch": 3})
    assert _epoch(path) == 3
    assert Checkpointer(path).resume() == 3
    assert sorted(os.listdir(tmp_path)) == [".other.pt.0123abcd.tmp", "ckpt.pt"]


# ------------------------------------------------------------ runs of the example


@pytest.fixture(scope="module")
def serial_hand(tmp_path_factory):
    """(stdout, final checkpoint) of an uninterrupted serial run with the hand-written averaging.

    It runs in this process (no start-up cost). The hand-written path trains
    the same model on any world size up to rounding (tests/training/test_main_job.py),
    so it is the reference for 2 ranks too.
    """
    path = str(tmp_path_factory.mktemp("serial") / "hand.pt")
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert _example().main(["--epochs", str(EPOCHS), "--checkpoint", path]) == 0
    return out.getvalue(), path


@pytest.fixture(scope="module")
def two_ranks_ddp(cli_env, tmp_path_factory):
    """(stdout, final checkpoint) of an uninterrupted 2-rank --ddp run."""
    path = str(tmp_path_factory.mktemp("ddp") / "ddp.pt")
    return _two_ranks("--ddp", "--checkpoint", path, env=cli_env), path


@pytest.fixture(scope="module")
def two_ranks_fsdp(cli_env, tmp_path_factory):
    """(stdout, final checkpoint) of an uninterrupted 2-rank --fsdp run (issue 27)."""
    path = str(tmp_path_factory.mktemp("fsdp") / "fsdp.pt")
    return _two_ranks("--fsdp", "--checkpoint", path, env=cli_env), path


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_fsdp_reaches_the_accuracy_of_ddp(two_ranks_fsdp, two_ranks_ddp):
    (fsdp_out, path), (ddp_out, ddp_path) = two_ranks_fsdp, two_ranks_ddp
    assert "FSDP2 fully_shard (--fsdp)" in fsdp_out
    assert "[rank0]: parameters identical on all 2 ranks" in fsdp_out
    assert abs(_accuracy(fsdp_out) - _accuracy(ddp_out)) <= 0.01
    # DCP's folder, named by the file, holds the same model as DDP's file up to the rounding of
    # reduce-scatter vs all-reduce (the --fsdp and --ddp runs see the same batches)
    assert sorted(os.listdir(path + ".dcp")) == [f"epoch-{EPOCHS}"] and _epoch(path) == EPOCHS
    assert _max_difference(path, ddp_path) < 1e-4


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_ddp_reaches_the_accuracy_of_hand_averaging(two_ranks_ddp, serial_hand):
    (hand_out, _), (ddp_out, _) = serial_hand, two_ranks_ddp
    hand, ddp = _accuracy(hand_out), _accuracy(ddp_out)
    assert "DistributedDataParallel (--ddp)" in ddp_out
    assert "[rank0]: parameters identical on all 2 ranks" in ddp_out
    assert hand >= 0.95 and abs(hand - ddp) <= 0.01


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_resume_serial_checkpoint_on_two_ranks(serial_hand, cli_env, tmp_path):
    path = str(tmp_path / "ckpt.pt")
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert _example().main(["--epochs", str(EPOCHS // 2), "--checkpoint", path]) == 0
    assert f"checkpoint: epoch {EPOCHS // 2} saved" in out.getvalue() and _epoch(path) == EPOCHS // 2
    out = _two_ranks("--checkpoint", path, "--resume", env=cli_env)
    assert f"resuming from {path} after epoch {EPOCHS // 2} (saved on 1 ranks)" in out
    # Same data order from epoch and seed alone: only the rounding of a 1-rank vs 2-rank sum differs
    # (measured: 1e-7 on weights of magnitude up to ~0.8).
    assert _epoch(path) == EPOCHS
    assert _max_difference(path, serial_hand[1]) < 1e-5
    assert abs(_accuracy(out) - _accuracy(serial_hand[0])) <= 0.01


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the job's processes in /proc")
@pytest.mark.timeout(3 * RUN_TIMEOUT_S + 30)
def test_sigkill_mid_epoch_then_resume(two_ranks_ddp, cli_env, tmp_path):
    """SIGKILL the launcher and its workers (as a node failure would) once epoch 2 is saved, then --resume."""
    path = str(tmp_path / "ckpt.pt")
    cmd = ["polydist", "run", "--nproc-per-node", "2", EXAMPLE, "--epochs", str(EPOCHS), "--ddp", "--checkpoint", path]
    job = subprocess.Popen(cmd, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        seen = 0
        while seen < 2:  # polling the file also checks that a reader never meets a torn checkpoint
            assert job.poll() is None and time.monotonic() < deadline, "the job ended before epoch 2 was saved"
            if os.path.exists(path):
                seen = _epoch(path)
            time.sleep(0.01)
        for pid in descendants(job.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        output = job.communicate(timeout=30)[0]
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == -signal.SIGKILL
    assert "final test accuracy" not in output
    saved = _epoch(path)
    assert seen <= saved < EPOCHS, f"killed after epoch {saved} was saved: not mid-run"

    out = _two_ranks("--ddp", "--checkpoint", path, "--resume", env=cli_env)
    assert f"resuming from {path} after epoch {saved} (saved on 2 ranks)" in out
    # Same world size: the very same model, bit for bit.
    assert _accuracy(out) == _accuracy(two_ranks_ddp[0]) and _max_difference(path, two_ranks_ddp[1]) == 0.0


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the job's processes in /proc")
@pytest.mark.parametrize("mode", ["--ddp", pytest.param("--fsdp", marks=pytest.mark.heavy)])
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 30)
def test_max_restarts_survives_a_rank_sigkilled_mid_run(mode, cli_env, tmp_path, request):
    """Issue 15's bar: `polydist run --max-restarts 3` with rank 1 SIGKILLed mid-run finishes by itself, exit 0,
    with the model of an uninterrupted run (resumed from the checkpoint after the restart, same world size).
    Issue 27: also with the model sharded (--fsdp: saved and resumed through torch.distributed.checkpoint)."""
    reference = request.getfixturevalue("two_ranks_" + mode[2:])
    path = str(tmp_path / "ckpt.pt")
    cmd = [
        "polydist", "run", "--max-restarts", "3", "--nproc-per-node", "2",
        EXAMPLE, "--epochs", str(EPOCHS), mode, "--checkpoint", path,
    ]
    job = subprocess.Popen(cmd, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (os.path.exists(path) and _epoch(path) >= 2):
            assert job.poll() is None and time.monotonic() < deadline, "the job ended before epoch 2 was saved"
            time.sleep(0.01)
        victim = worker_pid(job.pid, rank=1, run=0)
        assert victim is not None, "no worker of rank 1 found"
        os.kill(victim, signal.SIGKILL)
        killed_after = _epoch(path)
        out, err = job.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, f"--- stdout\n{out}\n--- stderr\n{err}"
    assert killed_after < EPOCHS, "the job had finished training before the kill"
    announced = re.search(
        r"polydist: restart 1 of 3: rank 1 \(local rank 1, pid \d+\) failed first, with exit code -9 "
        r"\(killed by SIGKILL\)", err
    )
    assert announced, err
    assert "(no traceback: the process was killed by SIGKILL" in err
    assert "restarting every worker (restart 1 of 3, 2 left)" in err and "restart 2 of 3" not in err
    assert "[rank0]: world size 2, backend gloo" in out and "; restart 1" in out, out
    resumed = re.search(r"resuming from .* after epoch (\d+) \(saved on 2 ranks\)", out)
    assert resumed and killed_after <= int(resumed.group(1)) < EPOCHS, out
    # Same world size: the very same model, bit for bit, as the uninterrupted run.
    assert _accuracy(out) == _accuracy(reference[0]) >= 0.95
    assert _epoch(path) == EPOCHS and _max_difference(path, reference[1]) == 0.0
