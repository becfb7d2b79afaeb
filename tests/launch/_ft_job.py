"""A small fault-tolerant training job, and the faults the tests inject into it.

    FT_FAULT=KIND:REPLICA:STEP polydist run --fault-tolerant --nproc-per-node N tests/launch/_ft_job.py STEPS

(or ``polydist.spawn(..., fault_tolerant=True)`` of :func:`spawned`, tests/launch/test_ft_spawn.py).

Replica group REPLICA, on its first start only, meets its fault at step
STEP: ``kill`` (SIGKILL to itself), ``stop`` (SIGSTOP to itself: frozen) and
``hang`` (sleeps, alive and heartbeating, for ever) and ``drop`` (sets this host's link, ``$FT_LINK``, down
for ``$FT_DROP_S`` seconds: a multi-node job in network namespaces) just before backward, so
that the others wait for it in the step's gradient all-reduce; ``raise`` (a
RuntimeError) after backward, between the all-reduce and the commit vote. Each start prints ``start: replica R incarnation I
pid P threads T`` (T: its intra-op threads), so a test can tell that the survivors were never restarted; each
discarded step prints ``discarded: step S`` on that replica group. In replica groups of several ranks
(``--replica-group-size``) the model is sharded with FSDP2 inside each (HSDP); a fault then hits the group's rank 0.
"""

import os
import socket
import signal
import subprocess
import sys
import time

import torch

import polydist as pdist


def fire(kind: str) -> None:
    print(f"fault: {kind}", flush=True)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "raise":
        raise RuntimeError("injected fault")
    elif kind == "hang":
        time.sleep(3600)
    elif kind == "drop":  # this host's link down for FT_DROP_S seconds, then up again (a namespace of its own)
        ifname, seconds = os.environ["FT_LINK"], float(os.environ.get("FT_DROP_S", "4"))
        subprocess.run(["ip", "link", "set", ifname, "down"], check=True)  # down before this step's all-reduce
        subprocess.Popen(["sh", "-c", f"sleep {seconds}; ip link set {ifname} up"],
                         start_new_session=True)  # outlives this rank if the drop ends it


def main() -> None:
    pdist.initialize()
    train(int(sys.argv[1]))
    pdist.finalize()


def spawned(local_rank: int, steps: int) -> float:
    """The job as polydist.spawn(fault_tolerant=True) runs it: ``train``, inside the job spawn joined."""
    return train(steps)


def train(steps: int) -> float:
    """Train ``steps`` steps in the fault-tolerant job (joined); the sum of this rank's parameters at the end."""
    ft = pdist.fault_tolerance()
    incarnation = pdist.restart_count()
    print(f"start: replica {ft.replica_group} incarnation {incarnation} pid {os.getpid()} "
          f"threads {torch.get_num_threads()} host {socket.gethostname()}", flush=True)
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.ReLU(), torch.nn.Linear(33, 4))  # 33: uneven shards
    model = pdist.auto_model(layers, use_fsdp=pdist.get_world_size() > 1)  # replica groups of several ranks: HSDP
    optimizer = pdist.auto_optim(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    kind, replica, at = (os.environ.get("FT_FAULT") or "none:-1:-1").split(":")
    fired = False  # once: a fault the rank survives (drop) must not fire again when its step is redone
    while ft.step < steps:
        step = ft.step
        data = torch.Generator().manual_seed(step * 1000 + ft.rank)  # the batch of a step: redone when discarded
        x, y = torch.randn(8, 16, generator=data), torch.randint(0, 4, (8,), generator=data)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        mine = incarnation == 0 and ft.replica_group == int(replica) and step == int(at) and pdist.get_rank() == 0
        mine, fired = mine and not fired, fired or mine
        if mine and kind != "raise":
            fire(kind)
        loss.backward()
        if mine and kind == "raise":
            fire(kind)
        optimizer.step()
        if ft.step == step:
            print(f"discarded: step {step}", flush=True)
        time.sleep(0.02)  # a step of some 20 ms, as a small real model's
    return float(sum(p.detach().sum() for p in model.parameters()))


if __name__ == "__main__":
    main()
