"""The live state of a healthy replica group, sent to one that recovers: HTTP and polydist's codec, no pickle.

torchft 0.2.0's ``HTTPTransport`` serves the state on every interface of
the host, to anyone who asks, and the receiver unpickles what it gets
(``_streaming_load(..., weights_only=False)``): any process that can answer
on the sender's address can run code in the recovering trainer. polydist
replaces it (torchft's ``Manager`` takes any ``CheckpointTransport``):

* the server listens on ``host`` only (loopback for a single-node job) and
  serves a step's state under a random token that only the quorum's members
  learn (through torchft's manager), for as long as torchft allows it;
* the state travels as :func:`polydist.codec.encode` bytes, encoded once
  when torchft hands it over (so it cannot change while it is served);
* the receiver reads at most :attr:`SafeTransport.limit` bytes, decodes
  with :func:`polydist.codec.decode` (which never runs code) and checks the
  shape of what it got before torchft loads it.

Upstream: no torchft release changes ``HTTPTransport``'s bind or its
``weights_only=False``; this transport is polydist's for as long as that holds.
"""

from __future__ import annotations

import collections
import hmac
import http.server
import secrets
import threading
import time
import urllib.request
from datetime import timedelta
from typing import Any, Callable, Optional

from torch.distributed.tensor import DTensor
from torchft.checkpointing.transport import CheckpointTransport

from ... import codec

__all__ = ["SafeTransport", "plain"]

_DEFAULT_LIMIT = 1 << 34  # 16 GiB: far above this project's models, far below a runaway allocation


def plain(obj: Any) -> Any:
    """``obj`` (a registered state) as it travels: every mapping a plain dict, order kept, and every DTensor its
    local shard (a sharded model's optimizer holds DTensors: each rank sends its own shards, and
    :func:`~polydist.backends.torchft.sharded.load_optimizer` makes them DTensors again)."""
    if isinstance(obj, DTensor):
        return obj.to_local()
    if isinstance(obj, collections.abc.Mapping):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(plain(v) for v in obj)
    return obj


class SafeTransport(CheckpointTransport):
    """torchft's ``CheckpointTransport``, over HTTP on ``host``, with polydist's codec.

    Args:
        host: the address to listen on and to give the receivers (``127.0.0.1``
            for a single-node job).
        timeout: how long a receiver waits for the state (torchft's manager timeout).
        on_received: called with ``(bytes, seconds)`` after a state was received and decoded.
        limit: the largest state accepted, in bytes.
    """

    def __init__(
        self,
        host: str,
        timeout: timedelta,
        on_received: Optional[Callable[[int, float], None]] = None,
        limit: int = _DEFAULT_LIMIT,
    ) -> None:
        self.host, self.timeout, self.limit = host, timeout, limit
        self.required: frozenset = frozenset()  # the names of the states the receiver loads (set by its session)
        self._on_received = on_received
        self._token = secrets.token_hex(16)
        self._served: Optional[tuple[int, bytes]] = None  # (step, encoded state) while torchft allows it
        self._changed = threading.Condition()
        self._server = http.server.ThreadingHTTPServer((host, 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="polydist-ft-state", daemon=True).start()

    def _handler(self) -> type:
        transport = self

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = transport.timeout.total_seconds()  # a client that stalls cannot hold a thread for ever

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                payload = transport._payload_for(self.path)
                if payload is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:  # no line per request on stderr
                pass

        return Handler

    def _payload_for(self, path: str) -> Optional[bytes]:
        """The encoded state asked for by ``/TOKEN/STEP``, waiting up to the timeout for that step; else None."""
        parts = path.split("/")
        if len(parts) != 3 or not hmac.compare_digest(parts[1], self._token) or not parts[2].isdigit():
            return None
        step = int(parts[2])
        with self._changed:
            self._changed.wait_for(lambda: self._served is not None and self._served[0] == step,
                                   timeout=self.timeout.total_seconds())
            served = self._served
        return served[1] if served is not None and served[0] == step else None

    def address(self) -> str:
        return f"http://{self.host}:{self._server.server_address[1]}"

    # ---------------------------------------------------------------- torchft's CheckpointTransport

    def metadata(self) -> str:
        return f"{self.address()}/{self._token}"

    def send_checkpoint(self, dst_ranks: list, step: int, state_dict: Any, timeout: timedelta) -> None:
        payload = codec.encode(plain(state_dict))
        with self._changed:
            self._served = (step, payload)
            self._changed.notify_all()

    def disallow_checkpoint(self) -> None:
        with self._changed:
            self._served = None

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        if not isinstance(metadata, str) or not metadata.startswith("http://"):
            raise ValueError(f"the live replica gave no state address polydist can read: {metadata!r}")
        start = time.perf_counter()
        with urllib.request.urlopen(f"{metadata}/{int(step)}", timeout=timeout.total_seconds()) as response:
            size = int(response.headers.get("Content-Length") or -1)
            if not 0 < size <= self.limit:
                raise ValueError(
                    f"the live replica (rank {src_rank}) offered a state of {size} bytes; accepted: 1 to {self.limit}"
                )
            payload = response.read(size)
        if len(payload) != size:
            raise ValueError(f"the state from replica rank {src_rank} ended after {len(payload)} of {size} bytes")
        state = check_state(codec.decode(payload), src_rank, self.required)
        if self._on_received is not None:
            self._on_received(size, time.perf_counter() - start)
        return state

    def shutdown(self, wait: bool = True) -> None:
        self._server.shutdown()
        self._server.server_close()


def check_state(state: Any, src_rank: int, required: frozenset = frozenset()) -> dict:
    """``state`` when it has the shape torchft's manager loads (``{"user": {NAME: ...}, "torchft": {"step": int,
    "batches_committed": int}}``, with every name in ``required``); ``ValueError`` naming the sender otherwise."""
    ok = isinstance(state, dict) and set(state) == {"user", "torchft"} and isinstance(state["user"], dict)
    missing = sorted(required - set(state["user"])) if ok else []
    if missing:
        raise ValueError(f"the state from replica rank {src_rank} lacks {missing}: its program registered other states")
    meta = state.get("torchft") if ok else None
    ok = ok and isinstance(meta, dict) and all(
        isinstance(meta.get(k), int) and not isinstance(meta.get(k), bool) and meta[k] >= 0
        for k in ("step", "batches_committed")
    )
    if not ok:
        raise ValueError(f"the state from replica rank {src_rank} is not a torchft state: {type(state).__name__}")
    return state
