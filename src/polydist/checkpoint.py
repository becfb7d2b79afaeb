"""``Checkpointer``: atomic checkpoints that a restarted job resumes from, on any world size.

The common case of a job that must survive restarts (``polydist run
--max-restarts``, torchrun's, Slurm's requeue): save the training state every
few epochs; after a restart, load the newest complete checkpoint and go on.

* **Atomic.** A save writes a temporary file in the checkpoint's directory,
  fsyncs it, renames it over the checkpoint (``os.replace``: atomic within a
  file system) and fsyncs the directory. A process killed at any moment leaves
  the previous checkpoint or the new one, never a torn file.
* **No shared file system needed.** Local rank 0 of *every* node writes the
  checkpoint to its own disk (the state is replicated: the same on every
  rank). On resume, each node's local rank 0 reads its copy, the ranks agree
  on the newest (by the number of finished epochs, then the lowest rank), and
  that rank broadcasts its bytes. So a job whose nodes changed between
  restarts (elastic membership) resumes from whichever node saved last, and
  rank 0 need not be where it was.
* **Safe to load.** ``torch.load(weights_only=True)``: bytes from a disk or
  another rank run no code; a file that does not load is skipped (with a
  warning) rather than trusted.
* **Replicated state: plain ``torch.save``.** Replicated state (DDP,
  hand-averaged gradients, Horovod) is the same on every rank, so one file
  per node is all there is to write, and it needs no shared storage.
* **Sharded state: ``torch.distributed.checkpoint``.** A model whose
  parameters are DTensors (``auto_model(model, use_fsdp=True)``, any
  ``fully_shard``) and its optimizer are saved with DCP, which writes each
  rank's shards in parallel and loads them back on any world size
  (resharding). Every rank writes into ``PATH.dcp/epoch-N/`` (a folder all
  ranks see: one node, or a shared file system, as DCP requires); once DCP
  has finished, rank 0 writes ``PATH`` atomically, naming that folder, with
  the epoch, settings, RNG state and the other objects' state; then removes
  older folders. A save killed at any moment leaves ``PATH`` naming the
  previous complete folder.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
import uuid
import warnings
from typing import Any, Mapping, Optional

import torch

from . import context
from .collectives.broadcast import barrier, broadcast
from .collectives.gather import all_gather

__all__ = ["Checkpointer", "save_atomic"]

_TMP_SUFFIX = ".tmp"
_DCP_KEYS = ("model", "optimizer")  # what goes through torch.distributed.checkpoint when the model is sharded


def save_atomic(path: str, state: Any) -> None:
    """``torch.save(state)`` to ``path`` atomically: readers see the old file or the new one, never a torn one.

    The temporary file (a unique name beside ``path``: ``os.replace`` is
    atomic within one file system only) is flushed and fsynced before the
    rename; the directory is fsynced after it, so that the rename itself
    survives a power loss. On an error the temporary file is removed and the
    error re-raised; a process killed outright leaves it behind, which
    :meth:`Checkpointer.resume` removes.
    """
    path = os.path.abspath(path)
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}{_TMP_SUFFIX}")  # unique: nodes may share the folder
    try:
        with open(tmp, "xb") as f:  # created with the umask's permissions, as the checkpoint should be
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    if hasattr(os, "O_DIRECTORY"):  # POSIX: persist the directory entry
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _remove_leftovers(path: str) -> None:
    """Temporary files of saves that were killed (this checkpoint's only)."""
    folder, name = os.path.split(os.path.abspath(path))
    with contextlib.suppress(OSError):
        for entry in os.listdir(folder):
            if entry.startswith(f".{name}.") and entry.endswith(_TMP_SUFFIX):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(folder, entry))


def _load(data: bytes) -> dict:
    """A checkpoint's bytes as its state: ``weights_only``, so bytes from a disk or a peer run no code."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def _unwrap(model: Any) -> Any:
    """The module inside DistributedDataParallel (and the like): its state has no ``module.`` prefix."""
    return getattr(model, "module", model) if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def _is_sharded(model: Any) -> bool:
    """True when ``model`` holds DTensor parameters (FSDP2, tensor parallel): its state is saved with DCP."""
    from torch.distributed.tensor import DTensor

    return isinstance(model, torch.nn.Module) and any(isinstance(p, DTensor) for p in model.parameters())


def _check_replicated(state: Mapping[str, Any], what: str) -> None:
    for key, value in state.items():
        if type(value).__name__ in ("DTensor", "ShardedTensor"):
            raise TypeError(
                f"Checkpointer: {what} entry {key!r} is a {type(value).__name__} (sharded state); Checkpointer "
                "saves replicated state with torch.save, and a model= whose parameters are DTensors (with its "
                "optimizer=) through torch.distributed.checkpoint; for other sharded state, use torch.distributed.checkpoint"
            )


class Checkpointer:
    """Save the training state atomically and resume from the newest complete checkpoint.

    Every rank constructs it alike and calls :meth:`resume` once (a collective)
    and :meth:`save` after each epoch (no communication)::

        ckpt = pdist.Checkpointer("ckpt.pt", model=model, optimizer=optimizer, every=1)
        start = ckpt.resume()               # finished epochs: 0 on a fresh start
        for epoch in range(start, epochs):
            train_one_epoch(...)
            ckpt.save(epoch + 1)

    Args:
        path: the checkpoint file. Written by local rank 0 of every node (its
            directory must exist there); read on resume by the same ranks.
        model: an ``nn.Module`` (a DistributedDataParallel's inner module is
            saved, so a checkpoint loads with or without the wrapper).
        optimizer: a ``torch.optim.Optimizer`` (its ``state_dict``: momentum etc.).
        every: save each ``every``-th epoch (``save(n)`` writes when ``n % every == 0``).
        settings: values a resumed run must share with the checkpoint (e.g.
            learning rate, batch size, seed); :meth:`resume` raises
            ``ValueError`` naming those that differ.
        **stateful: more objects with ``state_dict``/``load_state_dict``
            (an LR scheduler, a sampler...), saved under their keyword.

    The state must be replicated (the same on every rank), except a sharded
    ``model`` (DTensor parameters, e.g. ``auto_model(..., use_fsdp=True)``)
    and its ``optimizer``, which go through ``torch.distributed.checkpoint``
    (module docstring): :meth:`save` is then a collective and the folder of
    ``path`` must be one that every rank sees. torch's CPU RNG state is
    saved and restored too. Source: the pattern torchrun's
    documentation asks of a train script that may be restarted (load the
    latest checkpoint at start, save periodically), with atomic saves and
    without a shared file system.
    """

    def __init__(
        self,
        path: str,
        *,
        model: Optional[torch.nn.Module] = None,
        optimizer: Optional[torch.optim.Optimizer] = None,
        every: int = 1,
        settings: Optional[Mapping[str, Any]] = None,
        **stateful: Any,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ValueError(f"Checkpointer: path must be a file path, got {path!r}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"Checkpointer: every must be a positive int, got {every!r}")
        objects = {"model": model, "optimizer": optimizer, **stateful}
        for key, obj in objects.items():
            if obj is not None and not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(f"Checkpointer: {key}={obj!r} has no state_dict/load_state_dict")
        self.path = os.path.abspath(os.fspath(path))
        self.every = every
        self.settings = dict(settings or {})
        self._objects = {key: obj for key, obj in objects.items() if obj is not None}
        self._sharded = _is_sharded(model)  # then the model and its optimizer go through DCP, the rest into the file
        self.resumed_from: Optional[dict] = None  # {"epoch", "world_size", "rank"} of the checkpoint resumed from

    # ------------------------------------------------------------------ saving

    def state(self, epoch: int) -> dict:
        """The state :meth:`save` writes for ``epoch`` finished epochs."""
        state: dict = {"epoch": epoch, "world_size": context.get_world_size(), "time": time.time()}
        for key, obj in self._objects.items():
            if self._sharded and key in _DCP_KEYS:
                continue
            sd = _unwrap(obj).state_dict()
            _check_replicated(sd, key)
            state[key] = sd
        state["rng"] = torch.get_rng_state()
        state["settings"] = dict(self.settings)
        if self._sharded:
            state["dcp"] = os.path.basename(self._folder(epoch))
        return state

    def _folder(self, epoch: int) -> str:
        return os.path.join(f"{self.path}.dcp", f"epoch-{epoch}")

    def _dcp_state(self) -> dict:
        """The sharded model's and optimizer's state dicts, as DCP saves and loads them (DTensor values)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = _unwrap(self._objects["model"]), self._objects.get("optimizer")
        model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else ())
        return {"model": model_sd, "optimizer": optim_sd} if optimizer is not None else {"model": model_sd}

    def _save_sharded(self, epoch: int) -> None:
        """Every rank: DCP into a fresh folder; then rank 0: the file naming it, and older folders removed."""
        import shutil

        import torch.distributed.checkpoint as dcp

        folder = self._folder(epoch)
        if context.get_rank() == 0:
            shutil.rmtree(folder, ignore_errors=True)  # a save of this epoch killed before: never named by PATH
        barrier()
        dcp.save(self._dcp_state(), checkpoint_id=folder)  # returns once the metadata is written
        if context.get_rank() == 0:
            save_atomic(self.path, self.state(epoch))
            for name in os.listdir(os.path.dirname(folder)):
                if name != os.path.basename(folder):
                    shutil.rmtree(os.path.join(os.path.dirname(folder), name), ignore_errors=True)

    def _load_sharded(self, state: Mapping[str, Any]) -> None:
        """Every rank: the DCP folder the file names, resharded onto this world, into the model and optimizer."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        name = state.get("dcp")
        if not isinstance(name, str) or os.path.basename(name) != name:
            raise ValueError(f"Checkpointer: {self.path} names no sharded state folder (dcp={name!r})")
        loaded = self._dcp_state()
        with warnings.catch_warnings():  # serial: loading in one process is the intent, not a fallback to warn of
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(loaded, checkpoint_id=os.path.join(f"{self.path}.dcp", name), no_dist=context.get_world_size() == 1)
        optimizer = self._objects.get("optimizer")
        set_state_dict(_unwrap(self._objects["model"]), optimizer if optimizer is not None else (),
                       model_state_dict=loaded["model"], optim_state_dict=loaded.get("optimizer", {}))

    def save(self, epoch: int, *, force: bool = False) -> bool:
        """Checkpoint after ``epoch`` finished epochs, when ``epoch % every == 0`` (or ``force``).

        Call it on every rank; local rank 0 of each node writes (atomically,
        see the module docstring), the others return at once. No
        communication, except with a sharded model: then every rank writes
        its shards (DCP, a collective) and rank 0 the file. Returns whether a
        checkpoint was due (on every rank alike).

        Raises:
            ValueError: ``epoch`` is not a non-negative int.
            TypeError: sharded state (see the class docstring).
            OSError: the file could not be written (the previous checkpoint is intact).
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"Checkpointer.save: epoch must be a non-negative int, got {epoch!r}")
        if not force and epoch % self.every:
            return False
        if self._sharded:
            self._save_sharded(epoch)
        elif context.get_local_rank() == 0:
            save_atomic(self.path, self.state(epoch))
        return True

    # ----------------------------------------------------------------- resuming

    def _read_local(self) -> tuple[int, Optional[bytes], Optional[dict]]:
        """(finished epochs, bytes, state) of this node's copy; (-1, None, None) when there is none or it
        does not load."""
        _remove_leftovers(self.path)
        if not os.path.exists(self.path):
            return -1, None, None
        try:
            with open(self.path, "rb") as f:
                data = f.read()
            state = _load(data)
            epoch = state["epoch"]
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise ValueError(f"bad epoch {epoch!r}")
        except Exception as exc:  # unreadable, not a checkpoint, or not loadable without running code
            warnings.warn(f"Checkpointer: ignoring {self.path}: it does not load ({exc})", RuntimeWarning, stacklevel=3)
            return -1, None, None
        return epoch, data, state

    def resume(self) -> int:
        """Load the newest complete checkpoint into the objects; the number of finished epochs (0: none).

        A collective: every rank calls it. Local rank 0 of each node reads its
        copy; the newest (most finished epochs, then the lowest rank) is
        broadcast from the rank that holds it and loaded on every rank, on
        any world size. Serial (not initialized): this process's copy.

        Raises:
            ValueError: the checkpoint was saved with other ``settings`` (names
                each one and both values), or lacks an object this
                Checkpointer was given.
        """
        epoch, data, state = self._read_local() if context.get_local_rank() == 0 else (-1, None, None)
        holder = 0
        if context.get_world_size() > 1:
            epochs = all_gather(epoch)
            if max(epochs) < 0:
                return 0
            holder = epochs.index(max(epochs))
            data = broadcast(data if context.get_rank() == holder else None, src=holder)
            if context.get_rank() != holder:  # the holder has it loaded already
                state = _load(data)
        if state is None:
            return 0
        through_dcp = _DCP_KEYS if "dcp" in state else ()  # saved sharded: loaded resharded, onto any model
        if self._sharded and not through_dcp:
            raise ValueError(f"Checkpointer: {self.path} holds a replicated model; this Checkpointer's model is sharded "
                             "(DTensor parameters): resume it unsharded, then shard it")
        self._check_settings(state, skip=through_dcp)
        for key, obj in self._objects.items():
            if key not in through_dcp:
                _unwrap(obj).load_state_dict(state[key])
        if through_dcp and "model" in self._objects:
            self._load_sharded(state)
        if isinstance(state.get("rng"), torch.Tensor):
            torch.set_rng_state(state["rng"])
        self.resumed_from = {"epoch": state["epoch"], "world_size": state.get("world_size"), "rank": holder}
        return state["epoch"]

    def _check_settings(self, state: Mapping[str, Any], skip: tuple = ()) -> None:
        missing = [key for key in self._objects if key not in state and key not in skip]
        if missing:
            raise ValueError(f"Checkpointer: {self.path} holds no {', '.join(missing)} (it has {sorted(state)})")
        saved = state.get("settings") or {}
        changed = [
            f"{name} {saved.get(name)!r} (now {value!r})" for name, value in self.settings.items() if saved.get(name) != value
        ]
        if changed:
            raise ValueError(f"Checkpointer: {self.path} was saved with other settings: {', '.join(changed)}")
