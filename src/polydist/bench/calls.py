"""What one timed call of each collective is, for ``polydist bench``: the polydist call and the raw one.

Its one job is to make the tensors of one point once (zeros of the dtype, on
the device) and return the zero-argument calls that ``--api polydist`` and
``--api torch`` time: ``polydist.<collective>`` and the ``torch.distributed``
call giving the same result on the same group, which writes into outputs made
once as nccl-tests does. The size is rounded down to whole elements, and to a
multiple of the rank count where the collective splits it
(:mod:`polydist.units` tells which buffer the size is).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import polydist as pd

from .._torch import all_gather_single, reduce_scatter_single
from ..ops import to_reduce_op
from .config import BenchConfig

__all__ = ["make_calls"]

_SPLIT = ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")  # S is split into n chunks
# Raw torch.distributed under the names of the PyTorch at hand (2.13 renamed the *_tensor forms to *_single).


def make_calls(name: str, nbytes: int, cfg: BenchConfig, rank: int, n: int, device: torch.device) -> tuple:
    """Tensors for one point, made once; returns (size in bytes, {api: zero-argument call})."""
    dtype = getattr(torch, cfg.dtype)
    item = torch.empty((), dtype=dtype).element_size()
    count = max(1, nbytes // item)
    if name in _SPLIT:
        count = n * max(1, count // n)

    def zeros(k: int) -> torch.Tensor:
        return torch.zeros(k, dtype=dtype, device=device)

    x = zeros(count // n if name in ("all_gather", "gather") else count)
    op, root, is_root = to_reduce_op(cfg.op), cfg.root, rank == cfg.root
    # The raw calls' output, made once as nccl-tests does; the in-place collectives need none.
    in_place = name in ("all_reduce", "broadcast", "reduce")
    out = x if in_place else zeros(count // n if name in ("reduce_scatter", "scatter") else count)
    chunks = list(x.view(n, -1).unbind(0)) if name in ("all_to_all", "scatter") else []
    if name == "all_reduce":
        calls = {"polydist": lambda: pd.all_reduce(x, cfg.op), "torch": lambda: dist.all_reduce(x, op)}
    elif name == "broadcast":
        calls = {"polydist": lambda: pd.broadcast(x, src=root), "torch": lambda: dist.broadcast(x, root)}
    elif name == "reduce":
        calls = {"polydist": lambda: pd.reduce(x, dst=root, op=cfg.op), "torch": lambda: dist.reduce(x, root, op)}
    elif name == "all_gather":
        calls = {"polydist": lambda: pd.all_gather(x), "torch": lambda: all_gather_single(out, x)}
    elif name == "gather":
        outs = list(out.view(n, -1).unbind(0)) if is_root else None
        calls = {"polydist": lambda: pd.gather(x, dst=root), "torch": lambda: dist.gather(x, outs, dst=root)}
    elif name == "reduce_scatter":
        calls = {"polydist": lambda: pd.reduce_scatter(x, cfg.op), "torch": lambda: reduce_scatter_single(out, x, op)}
    elif name == "scatter":
        mine = chunks if is_root else None
        calls = {"polydist": lambda: pd.scatter(mine, src=root), "torch": lambda: dist.scatter(out, mine, src=root)}
    elif name == "all_to_all":
        calls = {"polydist": lambda: pd.all_to_all(chunks), "torch": lambda: dist.all_to_all_single(out, x)}
    else:  # send_recv: to the next rank, from the previous one, at once
        nxt, prev = (rank + 1) % n, (rank - 1) % n

        def pd_sendrecv() -> None:
            incoming = pd.irecv(out, prev)
            pd.isend(x, nxt).wait()
            incoming.wait()

        def torch_sendrecv() -> None:
            for work in (dist.irecv(out, prev), dist.isend(x, nxt)):
                work.wait()

        calls = {"polydist": pd_sendrecv, "torch": torch_sendrecv}
    return count * item, calls
