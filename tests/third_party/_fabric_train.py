"""Lightning Fabric under ``mpiexec``: ``python _fabric_train.py BACKEND OUT_DIR`` on every rank.

Fabric finds the job through its ``MPIEnvironment`` (mpi4py's COMM_WORLD) and
hands ``DDPStrategy(process_group_backend=BACKEND)`` unchanged to
``torch.distributed.init_process_group``; importing polydist is all it takes
for BACKEND to be "mpi4py" or "mpi" on a stock wheel. BACKEND "gloo" is the
reference: stock Fabric, without polydist.
"""

import sys

import torch

from lightning.fabric import Fabric
from lightning.fabric.strategies import DDPStrategy

import _mpi_train as common

backend, out_dir = sys.argv[1], sys.argv[2]
if backend != "gloo":
    import polydist  # noqa: F401 - registers "mpi4py", and provides torch's "mpi" on stock wheels
fabric = Fabric(
    accelerator="cpu", devices=common.WORLD, num_nodes=1, strategy=DDPStrategy(process_group_backend=backend)
)
fabric.launch()  # MPIEnvironment creates processes externally: this only joins the process group

model = common.make_model()
model, optimizer = fabric.setup(model, common.make_optimizer(model))
loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(common.digits(), batch_size=common.BATCH, shuffle=False))
losses = []
for _ in range(common.EPOCHS):
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        fabric.backward(loss)
        optimizer.step()
        losses.append(fabric.all_reduce(loss.detach(), reduce_op="mean").item())
fabric.barrier()
try:  # Fabric's idiom for "download on rank 0 first": a barrier on a new gloo group with an endless timeout
    with fabric.rank_zero_first():
        pass
    rank_zero_first = "ok"
except RuntimeError as exc:
    rank_zero_first = f"{type(exc).__name__}: {exc}"
common.report(
    out_dir, model, losses, probes={"rank_zero_first": rank_zero_first},
    cluster_environment=type(fabric.strategy.cluster_environment).__name__,
    strategy=type(fabric.strategy).__name__,
    process_group_backend=fabric.strategy.process_group_backend,
    fabric_world_size=fabric.world_size,
    fabric_rank=fabric.global_rank,
)
del model, optimizer, loader
common.close()
