"""This process's torchft ``Manager``, made the polydist way, and the lighthouse that the launcher serves.

What differs from constructing ``torchft.Manager`` by hand, and why:

* **Servers on one address.** torchft 0.2.0 binds the manager's gRPC server
  to every interface (``"[::]:PORT"``, hard-coded in ``Manager.__init__``)
  and advertises it under the host name; polydist binds it, and advertises
  it, at ``host`` (loopback for a single-node job: "single-node jobs listen
  on loopback only"). Done by handing ``Manager.__init__`` a
  ``ManagerServer`` factory for the duration of the call
  (:func:`_servers_on`). Upstream: none yet (torchft main binds ``[::]`` too).
* **Gradients on the same address.** torchft's reconfigurable gloo group
  builds gloo's default device, which offers the other replica groups the
  address this host name resolves to (loopback on many hosts, unreachable
  from another node; a public address on others, though the job is
  single-node); polydist's :class:`_GlooOn` gives it a device on ``host``.
  Upstream: none yet (torchft's ``ProcessGroupGloo._create_pg`` takes no
  device).
* **Quorum retries.** torchft's default ``quorum_retries=0`` makes one failed
  quorum call (a lighthouse briefly away) kill every replica group after
  the quorum timeout; polydist asks for :data:`QUORUM_RETRIES`.
* **The live state travels by** :class:`~polydist.backends.torchft.transport.SafeTransport`
  (no pickle), not torchft's ``HTTPTransport``.
* **Logs.** torchft logs each failure with a traceback and a warning at each
  quorum change about NCCL's flight recorder ("Unable to reset NCCL flight
  recorder"); polydist reports faults itself, one line each
  (:mod:`polydist.launch.fault_tolerant`), so torchft's Python loggers get a
  ``NullHandler`` (a program that configures logging still sees them) and
  the launcher sets ``RUST_LOG=warn`` for torchft's Rust side unless the
  user set it.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import Any, Iterator, Optional
from unittest import mock

import torchft.manager
import torchft.process_group
from torchft import Manager
from torchft._torchft import LighthouseServer
from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

from .transport import SafeTransport

__all__ = ["QUORUM_RETRIES", "QUORUM_TIMEOUT", "HEARTBEAT_TIMEOUT_MS", "JOIN_TIMEOUT_MS", "make_manager", "serve_lighthouse", "replica_id"]

QUORUM_RETRIES = 5  # torchft's own fix for a lighthouse restart: ~20 s of disruption instead of every replica lost
HEARTBEAT_TIMEOUT_MS = 1000  # a replica group silent this long is left out of the next quorum (torchft: 5000)
JOIN_TIMEOUT_MS = 1000  # how long a new quorum waits for a live replica group that has not asked (torchft: 60000)
# The floor of a quorum call's timeout (torchft: 60 s): a call stuck on a connection that died under it (the node's
# link dropped while it was in flight) is retried (QUORUM_RETRIES) after this long, and the replica group rejoins.
QUORUM_TIMEOUT = timedelta(seconds=10)
_HEARTBEAT = timedelta(milliseconds=100)  # torchft's default beat


def replica_id(replica: int) -> str:
    """The replica id polydist gives replica group ``replica``: torchft reads its trailing digits as the index."""
    return f"replica_{replica}"


def serve_lighthouse(host: str, min_replicas: int) -> tuple[Any, str]:
    """Start torchft's lighthouse in this process, listening on ``host`` only; return it and its address.

    The lighthouse says which replica groups take part in each step. polydist
    shortens torchft's defaults so that a lost replica group costs about a
    second, not five or sixty: :data:`HEARTBEAT_TIMEOUT_MS` (a group that
    stops beating is out) and :data:`JOIN_TIMEOUT_MS` (a group that beats but
    does not ask — hung, or still starting — is not waited for longer).
    Fast quorums (every member of the last one asks again) never wait.
    """
    server = LighthouseServer(
        bind=f"{host}:0", min_replicas=min_replicas, join_timeout_ms=JOIN_TIMEOUT_MS,
        quorum_tick_ms=10, heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
    )  # fmt: skip
    port = server.address().rsplit(":", 1)[1]  # torchft advertises the host name; the replicas reach `host`
    return server, f"http://{host}:{port}"


@contextlib.contextmanager
def _servers_on(host: str) -> Iterator[None]:
    """While ``Manager.__init__`` runs: its ``ManagerServer`` listens on ``host`` instead of every interface."""
    real = torchft.manager.ManagerServer

    def on_host(*, bind: str, **kwargs: Any) -> Any:
        port = bind.rsplit(":", 1)[1]
        return real(bind=f"{host}:{port}", **kwargs)

    with mock.patch.object(torchft.manager, "ManagerServer", on_host):
        yield


class _GlooOn(ProcessGroupGloo):
    """torchft's reconfigurable gloo group, its gloo device bound to ``host`` (see the module docstring)."""

    def __init__(self, host: str, timeout: timedelta) -> None:
        super().__init__(timeout=timeout)
        self._host = host

    def _create_pg(self, store: Any, rank: int, world_size: int) -> Any:
        real = torchft.process_group.BaseProcessGroupGloo
        host = self._host

        def on_host(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
            options = real._Options()
            options._timeout = timeout
            options._devices = [real.create_device(hostname=host)]
            return real(store, rank, size, options)

        with mock.patch.object(torchft.process_group, "BaseProcessGroupGloo", on_host):
            return super()._create_pg(store, rank, world_size)


def quiet_logs() -> None:
    """torchft's Python loggers to a ``NullHandler`` (see the module docstring); once is enough."""
    log = logging.getLogger("torchft")
    if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())
    for name in ("torchft_quorums", "torchft_commits", "torchft_errors"):
        logging.getLogger(name).addHandler(logging.NullHandler())


class _LocalVote:
    """torchft's manager client for a replica group of one process: its commit vote is this process's own, so it
    is answered here instead of by a gRPC round trip to the manager's server (0.2-0.8 ms a step on 2 cores).
    Everything else goes to the client."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def should_commit(self, group_rank: int, step: int, should_commit: bool, timeout: timedelta) -> bool:
        return should_commit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def make_manager(
    *,
    replica: int,
    group_rank: int,
    group_size: int,
    store: tuple[str, int],
    lighthouse: str,
    host: str,
    timeout: timedelta,
    min_replicas: int,
    transport: SafeTransport,
    cuda: bool = False,
) -> Manager:
    """torchft's ``Manager`` for rank ``group_rank`` of replica group ``replica`` (``group_size`` ranks).

    Its gradients travel over torchft's reconfigurable gloo group (nccl's
    with ``cuda``), rebuilt for each quorum on the primary's ``store``
    (``(address, port)`` of a TCP store the replica group serves); it asks
    ``lighthouse`` for each quorum. ``timeout`` bounds its collectives, its
    commit vote and a state transfer. Quorums run beside the forward pass
    (``use_async_quorum``); on step 0 the replica groups take the state of
    the first of them (``init_sync``), so that a program whose replicas
    start differently still trains one model. A replica group of one
    process votes to commit without asking its server (:class:`_LocalVote`).
    """
    quiet_logs()
    group: Optional[Any] = ProcessGroupNCCL(timeout=timeout) if cuda else _GlooOn(host, timeout)
    with _servers_on(host):
        manager = Manager(
            pg=group,
            load_state_dict=None,
            state_dict=None,
            min_replica_size=min_replicas,
            use_async_quorum=True,
            timeout=timeout,
            quorum_timeout=max(timeout, QUORUM_TIMEOUT),
            connect_timeout=timedelta(seconds=30),
            rank=group_rank,
            world_size=group_size,
            store_addr=store[0],
            store_port=store[1],
            lighthouse_addr=lighthouse,
            replica_id=replica_id(replica),
            hostname=host,
            heartbeat_interval=_HEARTBEAT,
            checkpoint_transport=transport,
            init_sync=True,
            quorum_retries=QUORUM_RETRIES,
        )
    if group_size == 1:
        manager._client = _LocalVote(manager._client)  # torchft 0.2.0's attribute
    return manager
