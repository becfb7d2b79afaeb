"""polydist._state.World's scratch buffers (one policy: reused per name and device, kept up to 64 MiB) and
polydist._hosts' host-name rows."""

import numpy as np
import pytest
import torch

from polydist._hosts import HOST_BYTES, host_names, host_row
from polydist import _state
from polydist._state import Layout, World

pytestmark = pytest.mark.timeout(60)


class _Group:  # World reads only rank() and size() of its group
    def rank(self):
        return 0

    def size(self):
        return 1


def _world():
    return World(_Group(), owns_group=False, layout=Layout(0, 1, 1, 0), timeout=None)


def test_scratch_is_reused_per_name_and_grows_to_the_largest_size():
    w, cpu = _world(), torch.device("cpu")
    a = w.scratch("send", 100, cpu)
    assert a.dtype == torch.uint8 and a.numel() == 100
    b = w.scratch("send", 40, cpu)
    assert b.numel() == 40 and b.data_ptr() == a.data_ptr()  # the kept buffer, cut to size
    assert w.scratch("recv", 40, cpu).data_ptr() != a.data_ptr()  # another name, another buffer
    c = w.scratch("send", 200, cpu)
    assert c.numel() == 200 and w.scratch("send", 10, cpu).data_ptr() == c.data_ptr()


def test_scratch_above_the_limit_is_not_kept(monkeypatch):
    monkeypatch.setattr(_state, "SCRATCH_LIMIT", 64)
    w, cpu = _world(), torch.device("cpu")
    small = w.scratch("x", 64, cpu)
    big = w.scratch("x", 65, cpu)
    assert big.numel() == 65 and big.data_ptr() != small.data_ptr()
    assert w.scratch("x", 64, cpu).data_ptr() == small.data_ptr()  # the big one was for that call only
    assert w.scratch("y", 1000, cpu).data_ptr() != w.scratch("y", 1000, cpu).data_ptr()


def test_scratch_copy_is_a_contiguous_copy_in_the_copy_buffer():
    w = _world()
    x = torch.arange(12, dtype=torch.float64).reshape(3, 4).t()  # not contiguous
    y = w.scratch_copy(x)
    assert y.is_contiguous() and y.dtype == x.dtype and y.shape == x.shape and torch.equal(y, x)
    assert y.data_ptr() == w.scratch("copy", 1, x.device).data_ptr()


def test_host_rows_round_trip_and_hostile_bytes_decode():
    rows = np.stack([host_row("node-a"), host_row("ü" * 300)])
    assert rows.shape == (2, HOST_BYTES) and rows.dtype == np.uint8
    a, b = host_names(rows)
    assert a == "node-a" and b == "ü" * 127 + "\ufffd"  # cut at 255 bytes, mid-character
    assert host_names(np.full(HOST_BYTES, 0xFF, dtype=np.uint8)) == ["\ufffd" * HOST_BYTES]
