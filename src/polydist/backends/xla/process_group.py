"""The ``xla-tpu`` backend's ProcessGroup: torch.distributed over torch_xla's collectives.

:class:`XlaProcessGroup` is a ``torch.distributed.ProcessGroup`` written in
Python whose operations are torch_xla's (``torch_xla.core.xla_model``, 2.9):
its ranks are the XLA runtime's (``torch_xla.runtime.global_ordinal()`` of
``world_size()``), as ``ignite.distributed``'s ``xla-tpu`` model has them.
Tensors may be on the XLA device or the CPU; CPU tensors are moved to the
XLA device for the exchange and the results copied back in place.

How torch.distributed's operations map onto torch_xla's:

* **all_reduce**: ``xm.all_reduce`` (in place) for SUM, PRODUCT, MIN, MAX
  and AVG (a SUM scaled by ``1 / world size``) on numeric dtypes; AND, OR,
  XOR and bool tensors are gathered (``xm.all_gather``) and reduced in rank
  order on every rank, exactly.
* **reduce**: the all-reduce of a copy, kept on the root (other inputs untouched).
* **reduce_scatter**: the all-reduce of a copy, this rank's chunk kept.
* **broadcast**: ``xm.collective_broadcast``.
* **all_gather**, **gather**: ``xm.all_gather`` (gather keeps it on the root).
* **scatter**, **all_to_all**: every rank's buffer gathered, each rank
  keeping its part (traffic grows with the world size; torch_xla's own
  ``xm.all_to_all`` takes equal splits only).
* **barrier**: ``xm.rendezvous``.
* **send/recv** and **subgroups** raise ``NotImplementedError`` before
  anything is sent: torch_xla's collectives are called by every replica.

Operations run on the caller's thread when called (XLA traces them into the
current graph); ``async_op=True`` returns a completed handle.
World size 1 is tested (``PJRT_DEVICE=CPU``, ``make test-xla``); larger
worlds follow torch_xla's documented API and are untested here (see the
"Choosing a backend" guide).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import torch

from ...ops import check_op_dtype, resolve_op
from ..group_checks import opt
from ..python_group import NoPointToPoint, PythonProcessGroup
from ..tensors import bytes_of, reduce_rows, unflatten
from ..work import LaneWork

__all__ = ["XlaProcessGroup", "BACKEND_NAME", "xm", "xla_device"]

BACKEND_NAME = "xla-tpu"  # ignite.distributed's name

_XM_OPS = {"SUM": "sum", "AVG": "sum", "PRODUCT": "mul", "MIN": "min", "MAX": "max"}


@functools.lru_cache(maxsize=None)
def xm() -> Any:
    """``torch_xla.core.xla_model``, imported on first use."""
    import torch_xla.core.xla_model as module

    return module


def xla_device() -> torch.device:
    """This process's XLA device (``torch_xla.device()``)."""
    import torch_xla

    return torch.device(torch_xla.device())


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor's memory as a flat uint8 tensor (``t`` made contiguous first)."""
    return bytes_of(t.detach().cpu().contiguous())


class XlaProcessGroup(NoPointToPoint, PythonProcessGroup):
    """A ``torch.distributed`` process group over every replica of the XLA runtime.

    Created by torch.distributed (``init_process_group("xla-tpu", init_method="xla-tpu://")``,
    which ``polydist.initialize("xla-tpu")`` calls), not by hand. Errors:
    ``TypeError``/``InvalidArgumentError`` (a ``ValueError`` and a ``RuntimeError``) for an op undefined on a dtype or mismatched
    sizes, ``NotImplementedError`` for point-to-point, all before anything is sent.
    """

    no_p2p_reason = ("(torch_xla's collectives are called by every replica); use all_gather or broadcast, or the gloo "
                     "backend for send/recv")

    def __init__(self, rank: int, size: int) -> None:
        super().__init__(rank, size, BACKEND_NAME)

    def __repr__(self) -> str:
        return f"<XlaProcessGroup rank={self._rank} size={self._size}>"

    def _run(
        self, op: str, body: Callable[[], None], result: Any, opts: Any, inputs: Sequence[torch.Tensor],
        root: Any = None, red: Any = None,
    ) -> LaneWork:  # fmt: skip
        """Run ``body`` now, on the caller's thread (XLA traces into the caller's graph): a completed handle.

        Recorded and watched as every Python group's operation is (``root``, ``red``: see the base class)."""
        record, owned = self._begin(op, inputs, root, red, False)
        self._lane.inline(body, record, owned)
        if opt(opts, "asyncOp", True):  # a handle the program keeps: its own (result(), get_future())
            return LaneWork(result, backend=BACKEND_NAME)
        return self._lane.done.completed(result)

    def _cpu(self, *tensors: torch.Tensor) -> None:
        """No device rule: XLA moves tensors on the XLA device and on the CPU alike (the template's check)."""

    # ------------------------------------------------------------ the two primitives everything else uses

    def _rows(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's flat uint8 ``flat`` (any length, any device), in rank order, as CPU tensors."""
        dev = xla_device()
        sizes = xm().all_gather(torch.tensor([flat.numel()], dtype=torch.int64, device=dev)).cpu().tolist()
        padded = torch.zeros(max(sizes), dtype=torch.uint8)
        padded[: flat.numel()] = flat.cpu()
        every = xm().all_gather(padded.to(dev)).cpu().reshape(len(sizes), -1)
        return [every[r, :n] for r, n in enumerate(sizes)]

    def _reduce_now(self, t: torch.Tensor, name: str) -> None:
        """All-reduce ``t`` in place under canonical op ``name`` (checked)."""
        if t.numel() == 0:
            return
        if name in _XM_OPS and t.dtype != torch.bool and not t.dtype.is_complex:
            work = t if t.device.type == "xla" else t.to(xla_device())
            xm().all_reduce(_XM_OPS[name], [work], scale=1.0 / self._size if name == "AVG" else 1.0)
            if work is not t:
                t.copy_(work.to(t.device))
            return
        rows = torch.stack([r.view(t.dtype) for r in self._rows(_bytes_of(t))])
        t.copy_(reduce_rows(rows, name, t.dtype).view(t.shape).to(t.device))

    # ------------------------------------------------------------ the transport the template calls

    def _bytes(self, t: torch.Tensor) -> torch.Tensor:
        return _bytes_of(t)  # on the CPU: an XLA tensor's memory is not addressable

    def _reduce_plan(self, t: torch.Tensor, op: Any) -> str:
        return _checked(t, op)

    def _broadcast_now(self, c: torch.Tensor, root: int) -> None:
        if c.numel():
            work = c if c.device.type == "xla" else c.to(xla_device())
            xm().collective_broadcast([work], root_ordinal=root)
            if work is not c:
                c.copy_(work.to(c.device))

    def _allgather_into(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        unflatten(torch.cat(self._rows(_bytes_of(src))), [dst], by_bytes=True)

    def _gather_into(self, dst: Any, src: torch.Tensor, root: int) -> None:
        rows = self._rows(_bytes_of(src))  # every rank gathers, the root keeps
        if dst is not None:
            unflatten(torch.cat(rows), [dst], by_bytes=True)

    def _scatter_from(self, src: Any, dst: torch.Tensor, root: int) -> None:
        sent = src if src is not None else torch.empty(0, dtype=torch.uint8)  # every rank gathers the root's buffer
        mine = self._rows(sent)[root].reshape(self._size, -1)[self._rank]
        unflatten(mine, [dst], by_bytes=True)

    def _all_to_all_bytes(self, flat: torch.Tensor, splits: list[int]) -> torch.Tensor:
        """Every rank's buffer and byte counts gathered; each rank keeps what the others sent it (torch_xla's
        ``xm.all_to_all`` takes equal splits only)."""
        counts = self._rows(torch.tensor(list(splits), dtype=torch.int64).view(torch.uint8))
        rows = self._rows(flat)
        me = self._rank
        got = []
        for row, raw in zip(rows, counts):
            split = raw.view(torch.int64).tolist()
            start = sum(split[:me])
            got.append(row[start : start + split[me]])
        return torch.cat(got) if got else torch.empty(0, dtype=torch.uint8)

    def _barrier_now(self) -> None:
        xm().rendezvous("polydist.barrier")

    # ------------------------------------------------------------ polydist's direct calls (blocking)

    def allgather_pieces(self, header: bytes, body: torch.Tensor, plan: Callable[[bytes], Any]) -> tuple[Any, torch.Tensor]:
        heads = self._rows(torch.frombuffer(bytearray(header), dtype=torch.uint8))
        p, out = plan(b"".join(h.numpy().tobytes() for h in heads))
        self._land(torch.cat(self._rows(_bytes_of(body))), out, p.total)
        return p, out


def _checked(t: torch.Tensor, op: Any) -> str:
    """The canonical name of ``op``, checked against ``t``'s dtype (``ValueError``/``TypeError`` before sending)."""
    name = resolve_op(op)
    check_op_dtype(name, t.dtype)
    return name
