"""Every private or version-dependent API of torch's elastic agent (torchrun's machinery) polydist's launchers touch.

The elastic agent runs only in polydist's launchers (:mod:`polydist.launch.elastic`), so what they need of
its internals is here, apart from :mod:`polydist._torch` (the process groups' private API, which every
process uses), with the same rule: a PyTorch upgrade that moves them breaks this module only, and each use
says why it is needed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from datetime import timedelta
from typing import Any, Iterator

from ._torch import loopback_store_server

__all__ = ["launch_config", "restart_hook", "fresh_worker_store", "register_loopback_rendezvous"]


def launch_config(**kwargs: Any) -> Any:
    """``torch.distributed.launcher.api.LaunchConfig(**kwargs)``, without the fields this PyTorch lacks.

    ``shutdown_timeout`` (the SIGTERM-to-SIGKILL grace for the survivors of a
    failed job) is newer than PyTorch 2.11: older agents keep their own
    default (30 s), so a failed job there ends more slowly, not wrongly.
    """
    from torch.distributed.launcher.api import LaunchConfig  # the elastic agent: only launchers need it

    known = {f.name for f in dataclasses.fields(LaunchConfig)}
    return LaunchConfig(**{k: v for k, v in kwargs.items() if k in known})


@contextlib.contextmanager
def restart_hook(on_restart: Any, watch: Any = None) -> Iterator[None]:
    """Call ``on_restart(failures, restarts_done, max_restarts)`` each time an elastic agent started inside
    the block restarts its workers, and ``watch({global rank: pid})`` each time it finds them all running
    (every monitor interval: polydist's liveness watch, :mod:`polydist.launch.liveness`).

    ``failures`` is ``{global rank: ProcessFailure}`` when failed workers
    caused the restart (it counts against ``max_restarts``), None when nodes
    joined the rendezvous (a membership change, which does not count). torch
    logs only "will restart worker group" at INFO, without the failure, and
    ``launch_agent`` builds its ``LocalElasticAgent`` itself, so a subclass
    that sees each monitoring result stands in for it during the block.
    """
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.launcher import api

    base = api.LocalElasticAgent

    class ReportingAgent(base):  # type: ignore[misc, valid-type]
        _polydist_last: Any = None

        def _monitor_workers(self, worker_group: Any) -> Any:
            result = super()._monitor_workers(worker_group)
            if watch is not None and result.state == WorkerState.HEALTHY:
                watch({w.global_rank: w.id for w in worker_group.workers})  # a worker's id is its pid
            self._polydist_last = result
            return result

        def _restart_workers(self, worker_group: Any) -> None:
            last = self._polydist_last
            failed = last is not None and last.state in (WorkerState.FAILED, WorkerState.UNHEALTHY)
            spec = worker_group.spec
            # torch counts the restart (remaining - 1) before it calls this
            on_restart(last.failures if failed else None, spec.max_restarts - self._remaining_restarts, spec.max_restarts)
            super()._restart_workers(worker_group)

    api.LocalElasticAgent = ReportingAgent
    try:
        yield
    finally:
        api.LocalElasticAgent = base


@contextlib.contextmanager
def fresh_worker_store(enabled: bool) -> Iterator[None]:
    """Inside the block (when ``enabled``), each start of an elastic agent's workers meets on a new store.

    torch's c10d rendezvous shares one TCP store, served by the agent, with
    every generation of workers, and torch's env:// rendezvous no longer
    prefixes keys by attempt ("a new TCPStore for every retry"). Restarted
    workers then read their predecessors' gloo addresses and fail with
    "Connection refused". ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (read by
    the handler at each rendezvous) makes rank 0 of each generation serve a
    store of its own on a fresh port (:mod:`polydist.rendezvous` keeps it on
    loopback for single-node jobs).
    """
    name = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
    previous = os.environ.get(name)
    if enabled:
        os.environ[name] = "1"
    try:
        yield
    finally:
        if enabled:
            if previous is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = previous


LOOPBACK_RENDEZVOUS = "polydist-loopback"


def _loopback_rendezvous(params: Any) -> Any:
    """torch elastic's c10d rendezvous (its dynamic handler and backend) over stores that listen on loopback only.

    Two listeners are replaced: the rendezvous store (torch's c10d backend
    binds every interface) and the store the agent shares with its workers
    (``_create_tcp_store_server``, likewise).
    """
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    class Backend(C10dRendezvousBackend):
        name = LOOPBACK_RENDEZVOUS  # torch checks the handler's backend name against the requested one

    port = int(params.endpoint.rsplit(":", 1)[1])
    store = loopback_store_server(None, timedelta(seconds=60), port)  # 60 s: the c10d backend's read timeout
    handler = create_handler(store, Backend(store, params.run_id), params)
    handler._create_tcp_store_server = lambda addr, port: loopback_store_server(None, timedelta(minutes=5), port)
    return handler


def register_loopback_rendezvous() -> str:
    """Register :func:`_loopback_rendezvous` with torch elastic (once) and return its name."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(LOOPBACK_RENDEZVOUS, _loopback_rendezvous)  # the same creator again: a no-op
    return LOOPBACK_RENDEZVOUS
