"""Host names as they cross ranks: fixed-size byte rows, not pickled objects.

The mpi:// rendezvous gathers them over MPI, the node layout
(``node_layout.layout_from_hostnames``) over the new group. Bytes from other ranks
decode safely whatever they are.
"""

from __future__ import annotations

import numpy as np

__all__ = ["HOST_BYTES", "host_row", "host_names"]

HOST_BYTES = 256  # a host name is at most 253 bytes (RFC 1035)


def host_row(name: str) -> np.ndarray:
    """``name`` as a zero-padded ``HOST_BYTES``-byte uint8 row (a longer name is cut to ``HOST_BYTES - 1`` bytes)."""
    row = np.zeros(HOST_BYTES, dtype=np.uint8)
    data = name.encode("utf-8")[: HOST_BYTES - 1]
    row[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    return row


def host_names(rows: np.ndarray) -> list:
    """The names in gathered rows (``[n, HOST_BYTES]`` uint8), in rank order; bytes from other ranks decode safely."""
    return [row.tobytes().rstrip(b"\0").decode("utf-8", "replace") for row in rows.reshape(-1, HOST_BYTES)]
