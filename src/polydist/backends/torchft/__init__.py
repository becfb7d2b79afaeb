"""gloo and nccl that survive a lost replica group: torchft behind polydist's backend layer.

``polydist run --fault-tolerant`` trains data-parallel replica groups that
torchft (https://github.com/pytorch/torchft, pinned at 0.2.0) keeps in
step: each step starts with a quorum of the live replica groups (torchft's
lighthouse, which the launcher serves), their gradients are averaged over a
process group that torchft rebuilds for each new quorum, and the step is
applied only when every rank of the replica group voted to commit it
(torchft's ``should_commit``). A replica group that joins late, or replaces a
lost one, receives the live state of a healthy one before it takes part.

This package is the thin adapter between the two, not a fork:

* :mod:`.engine`: the ``Manager`` of this process, made the polydist way
  (loopback-only servers for single-node jobs, polydist's timeout, quorum
  retries, torchft's logs turned into polydist's fault log);
* :mod:`.transport`: how the live state travels to a recovering replica
  group: polydist's safe codec over HTTP, never pickle;
* :mod:`.wrappers`: the DDP comm hook and the optimizer that commits.

Each place that works around a torchft 0.2.0 defect says so, with the
upstream change that removes it; the tests in ``tests/backends/torchft/`` and ``tests/launch/test_fault_tolerant.py``
check each workaround.
"""
