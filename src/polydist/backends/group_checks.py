"""The argument checks of polydist's Python groups: each call's, raised by the call before anything is queued or sent.

Argument errors are :class:`~polydist.errors.InvalidArgumentError`, both
the ``RuntimeError`` torch's own backends raise for the same mistakes and
the ``ValueError`` these groups raised before (``TypeError`` for an op
undefined on a dtype), raised by the call on the rank that made it, before
anything is sent. The list forms follow torch's rule (``ProcessGroupMPI``'s
``checkSameSizeAndType``): one tensor per group rank, each of the other
side's dtype and number of elements; gloo also asks for the same shape.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..errors import InvalidArgumentError
from .tensors import bytes_of

__all__ = ["GroupChecks", "opt", "check_cpu"]


def opt(opts: Any, name: str, default: Any) -> Any:
    """Field ``name`` of torch's options object (``AllreduceOptions``, ...), or ``default`` without one."""
    return default if opts is None else getattr(opts, name, default)


def check_cpu(t: torch.Tensor, backend: str, why: str = "") -> None:
    """Raise :class:`~polydist.errors.InvalidArgumentError` (a ``ValueError`` and a ``RuntimeError``) naming ``t``'s device unless it is the CPU (``why``: the backend's reason, if any)."""
    if not t.is_cpu:  # not t.device.type: a device object per check
        raise InvalidArgumentError(
            f"the {backend} backend moves CPU tensors only{why}, got a tensor on {t.device}; "
            "use nccl for CUDA tensors or copy to the CPU"
        )



class GroupChecks:
    """The checks of :class:`~polydist.backends.python_group.PythonProcessGroup`'s operations (``_backend``: the
    group's name in the errors; ``_size``: its number of ranks). Where a group's tensors are not plain CPU memory
    (XLA), it overrides ``_cpu`` (the device rule) and ``_bytes`` (a tensor's bytes as the transport sends them)."""

    CPU_ONLY_WHY = ""  # a group's reason for moving CPU tensors only, said in the error
    _backend: str
    _size: int

    def _cpu(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            check_cpu(t, self._backend, self.CPU_ONLY_WHY)

    def _bytes(self, t: torch.Tensor) -> torch.Tensor:
        """``t``'s memory as a flat uint8 tensor the transport can send (a view of a contiguous CPU tensor)."""
        return bytes_of(t.contiguous())

    def _like(self, what: str, name: str, index: int, t: torch.Tensor, like: torch.Tensor, like_name: str) -> None:
        """``t`` must have ``like``'s dtype and number of elements (torch's rule for the list forms); on the CPU."""
        if t.dtype != like.dtype or t.numel() != like.numel():
            raise InvalidArgumentError(
                f"{what}: invalid {name} tensor at index {index} (expected {like.dtype} of {like.numel()} elements "
                f"as the {like_name}, got {t.dtype} of {t.numel()})"
            )
        self._cpu(t)

    def _per_rank(self, what: str, name: str, tensors: Sequence[torch.Tensor]) -> None:
        """``tensors``: one per group rank."""
        if len(tensors) != self._size:
            raise InvalidArgumentError(
                f"{what}: invalid {name} tensor list (expected length {self._size}, one per group rank, got {len(tensors)})"
            )

    def _one_per_rank(self, what: str, name: str, tensors: Sequence[torch.Tensor], like: torch.Tensor, like_name: str) -> None:
        """``tensors``: one per group rank, each like ``like``."""
        self._per_rank(what, name, tensors)
        for i, t in enumerate(tensors):
            self._like(what, name, i, t, like, like_name)

    def _plans(self, tensors: Sequence[torch.Tensor], op: Any) -> list:
        """The group's reduction plan of each tensor; the op x dtype and device checks."""
        plans = [self._reduce_plan(t, op) for t in tensors]
        self._cpu(*tensors)
        return plans

    def _pairs(self, what: str, outputs: list, inputs: list) -> None:
        if len(outputs) != len(inputs):
            raise InvalidArgumentError(f"{what}: {len(outputs)} output tensors for {len(inputs)} input tensors")
