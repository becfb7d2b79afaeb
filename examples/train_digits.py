"""Synchronous distributed SGD on scikit-learn's digits data set, with polydist.

This follows the "Distributed Training" section of PyTorch's *Writing
Distributed Applications* tutorial: every rank trains a copy of the same model
on its own part of the data and, after each backward pass, the gradients are
averaged across ranks so that every copy takes the same optimizer step.

* Data: ``sklearn.datasets.load_digits`` (1797 8x8 images, bundled, no
  download), split 80/20 (stratified, fixed seed); features standardized with
  statistics of the training split only.
* Partitioning: each epoch all ranks draw the same permutation of the training
  split (a generator seeded with ``seed + epoch``) and rank ``r`` takes
  ``perm[r::world_size]``. The shards are disjoint and cover the split exactly.
* Batches: the *global* batch size is fixed; each rank uses
  ``batch_size // world_size`` samples per step (``ValueError`` if it does not
  divide). Because of the strided shards, step ``s`` trains on exactly
  ``perm[s*B:(s+1)*B]`` whatever the world size, so 1, 2 or 4 processes train
  the same model up to floating-point rounding. The last, smaller batch of an
  epoch is kept (not dropped); every rank runs ``ceil(n_train / B)`` steps.
* Gradients: each rank back-propagates the *sum* of its per-sample losses; one
  ``all_reduce(SUM)`` over all gradients flattened together, then a division by
  the number of samples in the global batch, gives the global-batch mean
  gradient — also for the uneven last batch, where ranks hold different counts.
* Evaluation: rank ``r`` scores ``test[r::world_size]``; the correct counts are
  summed with ``all_reduce``. Finally all ranks check that they hold
  bit-identical parameters (exit status 1 otherwise).

* ``--ddp``: the same training with polydist's helpers instead of the
  hand-written averaging: ``auto_model`` (DistributedDataParallel averages
  the gradients), ``auto_optim`` and ``auto_dataloader`` (a DistributedSampler
  with the same permutation ``seed + epoch``, so rank ``r`` again gets
  ``perm[r::world_size]``; its epoch advances by itself with each pass). The
  loss is the per-rank mean and DDP averages over ranks, which equals the
  global-batch mean for full batches; in the last, uneven batch the sampler
  pads the shorter ranks with a repeated sample, so ``--ddp`` reaches the same
  accuracy up to that one sample, not bit for bit.
* ``--fsdp``: as ``--ddp``, with the model sharded by FSDP2 instead
  (``auto_model(model, use_fsdp=True)``: ``fully_shard`` per layer and on
  the root, over every rank); gradients are averaged by its reduce-scatter.
  Same accuracy as ``--ddp`` (up to rounding). With ``--checkpoint``, the
  model and optimizer are saved with ``torch.distributed.checkpoint`` (each
  rank its shards, into ``PATH.dcp/``) and ``PATH`` names the folder.
* ``--checkpoint PATH``: a :class:`polydist.Checkpointer` saves the model,
  the optimizer (momentum), the number of finished epochs, torch's RNG state
  and the settings that must not change on resume after each epoch. The file
  is replaced atomically (temporary file, fsync, ``os.replace``, fsync of the
  directory), so a crash at any moment leaves the previous checkpoint or the
  new one, never a torn file; a killed run loses at most the epoch it was in.
  Each node keeps its own copy (local rank 0 writes it).
* ``--resume`` (with ``--checkpoint``): continue from the newest checkpoint
  (or start afresh if there is none yet) on any world size: the rank that
  holds it broadcasts it. After a restart by the launcher
  (``polydist run --max-restarts N``: ``polydist.restart_count()`` > 0) the
  run resumes without being asked. As the data order is a function of
  ``seed + epoch`` only, the resumed run trains the same model as an
  uninterrupted one: bit for bit on the same world size, up to rounding on
  another. ``--epochs`` is the total.

Run it with any launcher, or none::

    polydist run --nproc-per-node 2 examples/train_digits.py
    torchrun --nproc-per-node 2 examples/train_digits.py
    python examples/train_digits.py            # serial: world size 1
    polydist run --nproc-per-node 2 examples/train_digits.py --ddp --checkpoint ckpt.pt --resume
    polydist run --max-restarts 3 --nproc-per-node 2 examples/train_digits.py --checkpoint ckpt.pt
    polydist run --backend mpi --nproc-per-node 2 examples/train_digits.py --fsdp --checkpoint ckpt.pt
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

import polydist as pdist


# Settings a resumed run must share with the checkpoint for the same result (--epochs may grow).
RESUME_SETTINGS = ("batch_size", "lr", "seed", "hidden")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size, split evenly over the ranks")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=128, help="width of the hidden layer")
    parser.add_argument("--backend", default=None, help="gloo, nccl, ... (default: polydist picks)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--ddp", action="store_true", help="train with auto_model/auto_optim/auto_dataloader (DDP)")
    mode.add_argument("--fsdp", action="store_true", help="as --ddp, with the model sharded by FSDP2 (use_fsdp=True)")
    parser.add_argument(
        "--checkpoint", metavar="PATH", help="save a checkpoint to PATH after each epoch (local rank 0 of each node)"
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue from --checkpoint PATH if it exists (implied after a restart)"
    )
    args = parser.parse_args(argv)
    args.helpers = args.ddp or args.fsdp  # polydist's auto_* helpers instead of the hand-written averaging
    if args.resume and not args.checkpoint:
        parser.error("--resume needs --checkpoint PATH")
    return args


def load_data(seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The digits split into standardized train/test tensors; identical on every rank."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, stratify=y, random_state=seed)
    scaler = StandardScaler().fit(x_train)  # training statistics only: no test leakage
    x_train, x_test = scaler.transform(x_train), scaler.transform(x_test)

    def as_tensors(xs: np.ndarray, ys: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.as_tensor(xs, dtype=torch.float32, device=device),
            torch.as_tensor(ys, dtype=torch.long, device=device),
        )

    return (*as_tensors(x_train, y_train), *as_tensors(x_test, y_test))


def average_gradients(model: nn.Module, global_count: int) -> None:
    """Replace each rank's summed gradients by the mean over the global batch.

    One collective for the whole model: flatten every gradient into a single
    buffer, all-reduce it, and copy the slices back.
    """
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    pdist.all_reduce(flat, op="SUM")
    flat.div_(global_count)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    global_batch: int,
    seed: int,
) -> float:
    """One epoch of synchronous SGD; returns the mean training loss over all ranks."""
    rank, world = pdist.get_rank(), pdist.get_world_size()
    n = len(x)
    local_batch = global_batch // world
    # Same seed on every rank -> same permutation, so the strided shards are
    # disjoint and together cover the whole training split.
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    shard = perm[rank::world].to(x.device)

    model.train()
    loss_sum = 0.0
    # Derived from n and global_batch only, so equal on all ranks: a rank that
    # ran one step fewer would leave the others blocked in all_reduce forever.
    for step in range(math.ceil(n / global_batch)):
        idx = shard[step * local_batch : (step + 1) * local_batch]  # may be short (even empty) in the last step
        global_count = min(global_batch, n - step * global_batch)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx], reduction="sum")
        loss.backward()
        average_gradients(model, global_count)
        optimizer.step()
        loss_sum += loss.item()
    return pdist.all_reduce(loss_sum, op="SUM") / n


def train_epoch_ddp(model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader) -> float:
    """One epoch with DDP doing the averaging; returns the mean training loss over all ranks.

    ``loader`` is an ``auto_dataloader``: each pass is the next epoch of its sampler.
    """
    dev = pdist.device()
    model.train()
    loss_sum, count = 0.0, 0
    for xb, yb in loader:
        xb, yb = xb.to(dev), yb.to(dev)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)  # this rank's mean; DDP's backward averages over the ranks
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * len(yb)
        count += len(yb)
    return pdist.all_reduce(loss_sum, op="SUM") / pdist.all_reduce(count, op="SUM")


def train_fault_tolerant(
    ft: pdist.FaultTolerance, model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
    args: argparse.Namespace, bar: tqdm,
) -> float:
    """Every epoch under ``polydist run --fault-tolerant``, step by step; returns the last epoch's mean loss
    on this replica group.

    Each replica group trains on its strided shard of the epoch's permutation
    (``perm[rank::ranks]``, as the ranks of the plain loop do), and the batch
    of a step is a function of the job's committed step ``ft.step``: a step
    discarded after a fault is redone with the same data, and a replacement,
    which receives the step with the live state, goes on with the others.
    ``auto_model``'s DDP averages the gradients over the replica groups that
    take part in the step (fewer while one is down: the global batch shrinks).
    """
    n, ranks = len(x), ft.world_size
    steps_per_epoch, local = math.ceil(n / args.batch_size), args.batch_size // ranks
    total, shard_epoch, shard = args.epochs * steps_per_epoch, -1, x[:0]
    loss_sum, seen, last = 0.0, 0, float("nan")
    model.train()
    while ft.step < total:
        epoch, step = divmod(ft.step, steps_per_epoch)
        if epoch != shard_epoch:
            if seen:  # an epoch ended on this replica group: its mean loss, for the bar
                last, loss_sum, seen = loss_sum / seen, 0.0, 0
                bar.update(epoch - max(shard_epoch, 0))
                bar.set_postfix(loss=f"{last:.4f}")
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed + epoch))
            shard_epoch, shard = epoch, perm[ft.rank :: ranks]
        idx = shard[step * local : (step + 1) * local]
        optimizer.zero_grad()  # starts the step's quorum
        loss = F.cross_entropy(model(x[idx]), y[idx], reduction="sum") / max(len(idx), 1)
        loss.backward()  # gradients averaged over the replica groups of the quorum
        optimizer.step()  # applied only when every live replica group committed the step
        loss_sum, seen = loss_sum + loss.item() * len(idx), seen + len(idx)
    bar.update(args.epochs - bar.n)
    return loss_sum / seen if seen else last


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Accuracy on (x, y), each rank scoring its strided shard of the samples."""
    rank, world = pdist.get_rank(), pdist.get_world_size()
    model.eval()
    pred = model(x[rank::world]).argmax(dim=1)
    correct = int((pred == y[rank::world]).sum())
    return pdist.all_reduce(correct, op="SUM") / len(x)  # Python int: exact sum


def parameters_identical(model: nn.Module) -> tuple[bool, float]:
    """Whether every rank holds bit-identical parameters (of a sharded model: its gathered parameters), and
    the largest difference."""
    flat = torch.cat([getattr(p, "full_tensor", p.detach)().detach().reshape(-1) for p in model.parameters()])
    everyone = pdist.all_gather(flat.unsqueeze(0))  # (world_size, n_params), same on all ranks
    diff = (everyone - everyone[0]).abs().max().item()
    return bool((everyone == everyone[0]).all()), diff


def resume_or_start(
    args: argparse.Namespace, net: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[Optional[pdist.Checkpointer], int, int]:
    """``--checkpoint``'s Checkpointer (None without one), the finished epochs to go on from, the restart count.

    Resumes on ``--resume`` and after any restart by the launcher. Each
    node's agent counts its own restarts (a node that joined later says 0),
    so the ranks agree on the count first: resuming is a collective that
    every rank must call alike.
    """
    restarts = pdist.all_reduce(pdist.restart_count(), op="MAX")
    if not args.checkpoint:
        return None, 0, restarts
    settings = {name: getattr(args, name) for name in RESUME_SETTINGS}
    checkpointer = pdist.Checkpointer(args.checkpoint, model=net, optimizer=optimizer, settings=settings)
    return checkpointer, checkpointer.resume() if args.resume or restarts > 0 else 0, restarts


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    pdist.initialize(args.backend)
    ft = pdist.fault_tolerance()  # under polydist run --fault-tolerant: this replica group's part, else None
    if ft is not None and args.checkpoint:
        raise ValueError("under --fault-tolerant a replacement receives the live state: no --checkpoint")
    args.helpers = args.helpers or ft is not None
    world, main_rank = pdist.get_world_size(), pdist.is_main_process() and (ft is None or ft.replica_group == 0)
    ranks = world if ft is None else ft.world_size  # the global batch is split over every rank of the job
    if args.batch_size % ranks:
        raise ValueError(
            f"--batch-size {args.batch_size} is not divisible by the world size {ranks}: "
            "the global batch is split evenly over the ranks"
        )
    device = pdist.device()
    # --ddp/--fsdp: the DataLoader batches CPU tensors (pinned memory, when on CUDA) and the loop moves them.
    x_train, y_train, x_test, y_test = load_data(args.seed, torch.device("cpu") if args.helpers else device)
    x_test, y_test = x_test.to(device), y_test.to(device)

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10)).to(device)
    # The fixed seed already gives equal weights; the broadcast makes that a
    # guarantee (e.g. should initialization ever depend on the rank).
    with torch.no_grad():
        for p in model.parameters():
            pdist.broadcast(p, src=0)
    if args.helpers:
        model = pdist.auto_model(model, use_fsdp=args.fsdp)  # --fsdp: sharded in place
    net = getattr(model, "module", model)  # without DDP's wrapper: evaluated, compared and saved in every mode
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if args.helpers:
        optimizer = pdist.auto_optim(optimizer)
    checkpointer, start_epoch, restarts = resume_or_start(args, net, optimizer)
    resume = checkpointer is not None and (args.resume or restarts > 0)
    if args.helpers and ft is None:
        loader = pdist.auto_dataloader(
            TensorDataset(x_train, y_train), batch_size=args.batch_size, shuffle=True, seed=args.seed
        )
        loader.sampler.set_epoch(start_epoch)  # the passes after this one are epochs start_epoch + 1, ...

    if main_rank:
        print(
            (f"world size {world}" if ft is None else f"{ft.num_replica_groups} fault-tolerant replica groups")
            + f", backend {pdist.backend() or 'none (serial)'}, device {device}; "
            f"{len(x_train)} train / {len(x_test)} test samples, "
            f"batch {args.batch_size} global = {args.batch_size // ranks} per rank"
            + ("; DistributedDataParallel (--ddp)" if args.ddp else "; FSDP2 fully_shard (--fsdp)" if args.fsdp else "")
            + (f"; restart {restarts}" if restarts else "")
        )
        if resume:
            saved = checkpointer.resumed_from
            print(
                f"resuming from {args.checkpoint} after epoch {start_epoch} (saved on {saved['world_size']} ranks)"
                if saved is not None
                else f"no checkpoint at {args.checkpoint} yet: starting at epoch 0"
            )
    start = time.perf_counter()
    # Rank 0 only, on stdout like its other lines (the launcher keeps them in order). disable=None: tqdm's own
    # terminal test; a rank's output under a launcher is a pipe, where each redraw would be a line of its own,
    # so there the bar is drawn once, when the loop ends (format_meter, tqdm's own line).
    bar = tqdm(
        range(start_epoch, args.epochs), desc="epochs", initial=start_epoch, total=args.epochs,
        disable=None if main_rank else True, file=sys.stdout,
    )
    loss = float("nan")
    if ft is not None:
        loss = train_fault_tolerant(ft, model, optimizer, x_train, y_train, args, bar)
    for epoch in bar if ft is None else ():
        if args.helpers:
            loss = train_epoch_ddp(model, optimizer, loader)
        else:
            loss = train_epoch(model, optimizer, x_train, y_train, args.batch_size, args.seed + epoch)
        bar.set_postfix(loss=f"{loss:.4f}")
        if checkpointer is not None and checkpointer.save(epoch + 1) and main_rank:  # finished epochs
            bar.write(f"checkpoint: epoch {epoch + 1} saved to {args.checkpoint}", file=sys.stdout)
    bar.close()
    wall = time.perf_counter() - start
    if main_rank and bar.disable:
        print(tqdm.format_meter(args.epochs, args.epochs, wall, prefix="epochs", postfix=f"loss={loss:.4f}",
                                initial=start_epoch))

    accuracy = evaluate(net, x_test, y_test)
    identical, diff = parameters_identical(net)
    if pdist.is_main_process():  # under --fault-tolerant, each replica group's (replica group 0 may be replaced)
        print(f"wall time: {wall:.1f} s")
        print(f"final test accuracy: {accuracy:.4f}")
        if ft is not None:  # polydist run compares the replica groups' states
            print(f"replica group {ft.replica_group}: step {ft.step} reached; polydist run compares the "
                  f"{ft.num_replica_groups} replica groups' states")
        elif identical:
            print(f"parameters identical on all {world} ranks")
        else:
            print(f"ERROR: parameters differ across the {world} ranks (max abs difference {diff:.3g})", file=sys.stderr)
    pdist.finalize()
    return 0 if identical else 1  # every rank computed the same verdict, so all exit alike


if __name__ == "__main__":
    sys.exit(main())
