"""Accelerate's multi-CPU path under ``mpiexec``: ``python _accelerate_train.py BACKEND OUT_DIR`` on every rank.

``Accelerator(cpu=True)`` sees the MPI job through ``PMI_SIZE``/``PMI_RANK``
(MPICH; Open MPI's ``OMPI_COMM_WORLD_*`` too) and creates the process group
itself, with "mpi" when ``torch.distributed.is_mpi_available()`` and "gloo"
otherwise; any other name is refused (see test_accelerate_mpi.py). So:

- "gloo": the reference, stock Accelerate without polydist: Accelerate's own choice.
- "mpi": after ``import polydist`` torch has an "mpi" backend on stock wheels, and
  Accelerate takes it by name (``InitProcessGroupKwargs(backend="mpi")``; it is
  also its default then).
- "mpi4py": refused by name; the process group is created first, with plain
  torch.distributed, and Accelerate adopts it.
"""

import sys

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

import _mpi_train as common

backend, out_dir = sys.argv[1], sys.argv[2]
handlers = []
if backend != "gloo":
    import polydist  # noqa: F401 - registers "mpi4py" and mpi://, and provides torch's "mpi" on stock wheels
if backend == "mpi":
    handlers = [InitProcessGroupKwargs(backend="mpi")]
elif backend == "mpi4py":
    dist.init_process_group("mpi4py", init_method="mpi://")  # rank and world size from MPI
accelerator = Accelerator(cpu=True, kwargs_handlers=handlers)  # cpu=True (or ACCELERATE_USE_CPU=1): the multi-CPU path

model = common.make_model()
loader = torch.utils.data.DataLoader(common.digits(), batch_size=common.BATCH, shuffle=False)
model, optimizer, loader = accelerator.prepare(model, common.make_optimizer(model), loader)
losses = []
for _ in range(common.EPOCHS):
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
accelerator.wait_for_everyone()
common.report(
    out_dir, accelerator.unwrap_model(model), losses,
    distributed_type=str(accelerator.distributed_type),
    num_processes=accelerator.num_processes,
    process_index=accelerator.process_index,
    state_backend=accelerator.state.backend,
    gathered=accelerator.gather(torch.tensor([accelerator.process_index])).tolist(),
    is_ddp=isinstance(model, torch.nn.parallel.DistributedDataParallel),
)
del model, optimizer, loader
accelerator.free_memory()  # Accelerate's own references to them
common.close(accelerator.end_training)  # end_training destroys the process group
