"""The MPI programs of test_ulfm.py: ``python _ulfm_job.py SCENARIO DIR [OPTION...]``, run by every rank.

Each rank prints one line ``ULFM {json}``: what it saw, and times in
milliseconds (``time.time``: one host, so comparable across ranks). DIR is a
scratch folder of the job. The ulfm module is loaded from its file rather
than through ``polydist``, whose import brings torch (about 2 s a rank on 2
cores); that it loads so also shows it needs nothing but mpi4py.

Scenarios (3 ranks; rank 2 is the victim, in step 3 of a loop of Allreduces):
    support: ``support()`` on COMM_WORLD and on a split, and how errors classify.
    kill: the victim SIGKILLs itself; the survivors detect, shrink, vote (rank 1
        votes no with ``veto``; ``vote_first``: a vote on the old communicator
        first) and reduce again. ``grow``: then they spawn a
        replacement, merge, broadcast an 8 MiB state from rank 0 and reduce;
        ``again``: then the replacement SIGKILLs itself and they recover once more.
    freeze: the victim SIGSTOPs itself (the failure detector must declare it);
        rank 0 SIGKILLs it at the end.
    busy: the victim computes 6 s without calling MPI; nobody may fail.
    revoke: a Revoke from a thread while its own rank waits in an Allreduce (see scenario_revoke).
    late_finish: every rank runs ``Heartbeats``; rank 0 calls ``finalize()`` at once, the others
        after computing 6 s outside MPI; nobody may be declared failed.
``progress``: every rank runs ``keep_progress()``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import sys
import time

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), *[".."] * 3, "src/polydist/backends/mpi4py/ulfm.py")
VICTIM, FAIL_STEP, STEPS = 2, 3, 8
BUSY_S = 6.0
STATE_SIZE = 1 << 20  # float64: the 8 MiB "weights" a replacement receives


def _load_ulfm():
    spec = importlib.util.spec_from_file_location("ulfm_under_test", os.path.abspath(SOURCE))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ulfm = _load_ulfm()


def now_ms() -> float:
    return time.time() * 1000.0


def report(**fields) -> None:
    print("ULFM " + json.dumps(fields), flush=True)


def state(np):
    return np.arange(STATE_SIZE, dtype=np.float64) * 0.5


def scenario_support(MPI) -> None:
    world = MPI.COMM_WORLD
    t0 = now_ms()
    fields = dict(rank=world.Get_rank(), reason=ulfm.support(), ms=now_ms() - t0)
    if fields["reason"] is None:  # also on a communicator other than COMM_WORLD
        half = world.Split(world.Get_rank() % 2, world.Get_rank())
        fields["split_reason"] = ulfm.support(half)
        half.Free()
    codes = [MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED, MPI.ERR_OTHER, MPI.ERR_TRUNCATE]
    fields["classified"] = [ulfm.is_process_failure(MPI.Exception(code)) for code in codes]
    fields["plain_error"] = ulfm.is_process_failure(RuntimeError("MPI_ERR_PROC_FAILED"))
    report(**fields)


def allreduce(MPI, np, comm, value: float) -> float:
    recv = np.empty(4)
    comm.Allreduce(np.full(4, value), recv, op=MPI.SUM)
    return float(recv[0])


def fail(folder: str, how: str, mark: str) -> None:
    with open(os.path.join(folder, mark), "w") as f:
        f.write(repr(now_ms()))
    os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    time.sleep(60)  # never reached (stopped: until killed)


def loop(MPI, np, comm, folder: str, how: str, victim: int, fields: dict, mark: str = "failed_at"):
    """Allreduces until one fails (returns the error and its time) or STEPS pass (returns None)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    for step in range(STEPS):
        if rank == victim and step == FAIL_STEP:
            if how == "busy":
                end = time.monotonic() + BUSY_S
                while time.monotonic() < end:  # pure Python: no MPI call, the GIL mostly held
                    sum(range(1000))
            else:
                fail(folder, how, mark)
        try:
            total = allreduce(MPI, np, comm, rank + 1.0)
        except MPI.Exception as exc:
            fields["step"] = step
            return exc, now_ms()
        if total != size * (size + 1) / 2:
            raise AssertionError(f"step {step}: sum {total}")
    fields["step"] = STEPS
    return None, now_ms()


def recover(MPI, np, comm, error, t_error: float, folder: str, veto: bool, mark: str = "failed_at",
            vote_first: bool = False) -> tuple:  # fmt: skip
    """What the survivors do on a failure: classify, shrink, vote, reduce on the new communicator."""
    with open(os.path.join(folder, mark)) as f:
        failed_at = float(f.read())
    fields = dict(error=MPI.Get_error_string(error.Get_error_class()).split(":")[0],
                  failure=ulfm.is_process_failure(error), detect_ms=t_error - failed_at)  # fmt: skip
    if vote_first:  # a vote on the communicator with the failed rank in it: raises, acknowledges, votes again
        t0 = now_ms()
        fields.update(agree_old=ulfm.agree(comm, True), agree_old_ms=now_ms() - t0, acked=comm.Ack_failed(0))
    t0 = now_ms()
    new, lost = ulfm.shrink(comm)
    t1 = now_ms()
    committed = ulfm.agree(new, not veto)
    t2 = now_ms()
    fields.update(shrink_ms=t1 - t0, agree_ms=t2 - t1, lost=lost, new_rank=new.Get_rank(), new_size=new.Get_size(),
                  committed=committed, sum_after=allreduce(MPI, np, new, new.Get_rank() + 1.0))  # fmt: skip
    return new, fields


def scenario_fail(MPI, np, folder: str, options: list, how: str) -> None:
    comm = MPI.COMM_WORLD.Dup()
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    rank = comm.Get_rank()
    pids = comm.allgather(os.getpid())
    fields: dict = dict(rank=rank)
    t_start = now_ms()
    error, t_error = loop(MPI, np, comm, folder, how, VICTIM, fields)
    if error is None:
        return report(**fields, error=None, seconds=(t_error - t_start) / 1000)
    new, found = recover(MPI, np, comm, error, t_error, folder, "veto" in options and rank == 1,
                         vote_first="vote_first" in options)  # fmt: skip
    # agree_bits: the bitwise AND of each live rank's flags (rank 0 says 0b110, rank 1 0b011: 0b010)
    fields.update(found, agree_all=ulfm.agree(new, True), agree_bits=ulfm.agree_bits(new, 6 if rank == 0 else 3))
    if how == "freeze" and rank == 0:
        os.kill(pids[VICTIM], signal.SIGKILL)  # else the stopped rank keeps mpiexec waiting
    if "grow" in options:
        t0 = now_ms()
        merged = ulfm.grow(new, 1, sys.executable, [os.path.abspath(__file__), "replacement", folder, *options],
                           env={"ULFM_TEST_REPLACEMENT": "1"}, info={"map_by": "slot:oversubscribe"})  # fmt: skip
        t1 = now_ms()
        weights = state(np) if merged.Get_rank() == 0 else np.zeros(STATE_SIZE)
        merged.Bcast(weights, root=0)
        fields.update(spawn_merge_ms=t1 - t0, bcast_ms=now_ms() - t1, **grown(MPI, np, merged, weights))
        if "again" in options:  # a second failure, of the replacement, on the grown communicator
            error, t_error = loop(MPI, np, merged, folder, "kill", merged.Get_size() - 1, {}, "failed_again_at")
            again, fields["again"] = recover(MPI, np, merged, error, t_error, folder, False, "failed_again_at")
            time.sleep(3)  # the job outlives its replacement's death (which Open MPI reports as fatal, see the test)
            fields["later_sum"] = allreduce(MPI, np, again, 1.0)
    report(**fields)


def grown(MPI, np, merged, weights) -> dict:
    return dict(merged_rank=merged.Get_rank(), merged_size=merged.Get_size(),
                state_sha=hashlib.sha256(weights.tobytes()).hexdigest(),
                sum_grown=allreduce(MPI, np, merged, merged.Get_rank() + 1.0))  # fmt: skip


def scenario_revoke(MPI, np) -> None:
    """Rank 0's watchdog thread revokes the communicator while rank 0 and 1 wait in an Allreduce for rank 2,
    which comes 2 s late; then all three vote on whether the step went through."""
    import threading

    comm = MPI.COMM_WORLD.Dup()
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    rank = comm.Get_rank()
    comm.Barrier()
    t0 = now_ms()
    fields: dict = dict(rank=rank, thread_level=MPI.Query_thread())
    if rank == 0:
        threading.Timer(0.5, lambda: (comm.Revoke(), fields.update(revoked_ms=now_ms() - t0))).start()
    if rank == 2:
        time.sleep(2.0)  # not in MPI meanwhile: it learns of the revoke only when it calls MPI again
        fields["revoked_on_arrival"] = comm.Is_revoked()
    try:
        fields["result"] = allreduce(MPI, np, comm, 1.0)
    except MPI.Exception as exc:
        fields["result"] = MPI.Get_error_string(exc.Get_error_class()).split(":")[0]
    fields["returned_ms"] = now_ms() - t0
    fields["committed"] = ulfm.agree(comm, isinstance(fields["result"], float))  # works on the revoked one
    report(**fields)


def scenario_replacement(MPI, np, folder: str, options: list) -> None:
    fields = dict(rank=None, is_replacement=ulfm.is_replacement(), env=os.environ.get("ULFM_TEST_REPLACEMENT"),
                  world_size=MPI.COMM_WORLD.Get_size())  # fmt: skip
    merged = ulfm.join_parent()
    weights = np.zeros(STATE_SIZE)
    merged.Bcast(weights, root=0)
    fields.update(grown(MPI, np, merged, weights))
    if "again" in options:
        report(**fields)  # before it dies
        loop(MPI, np, merged, folder, "kill", merged.Get_rank(), {}, "failed_again_at")
    report(**fields)


def scenario_late_finish(MPI, np) -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    ulfm.Heartbeats()
    fields = dict(rank=rank, sum=allreduce(MPI, np, comm, rank + 1.0))
    if rank != 0:
        end = time.monotonic() + BUSY_S  # the slow part of a rank's end (evaluating, writing, the interpreter's exit)
        while time.monotonic() < end:
            sum(range(10000))
    report(**fields)
    ulfm.finalize()
    ulfm.finalize()  # idempotent
    report(rank=rank, finalized=MPI.Is_finalized())


def main() -> None:
    scenario, folder, options = sys.argv[1], sys.argv[2], sys.argv[3:]
    from mpi4py import MPI

    if scenario == "support":
        return scenario_support(MPI)
    import numpy as np

    if "progress" in options:
        ulfm.keep_progress()
    if scenario == "revoke":
        scenario_revoke(MPI, np)
    elif scenario == "replacement":
        scenario_replacement(MPI, np, folder, options)
    elif scenario == "late_finish":
        scenario_late_finish(MPI, np)
    elif scenario in ("kill", "freeze", "busy"):
        scenario_fail(MPI, np, folder, options, scenario)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    main()
