"""A rank that sends hostile or corrupt frames: the receivers raise a ValueError naming it, and the group stays usable.

Rank 1 plays the hostile peer: it takes part in the collective's first round
with raw ``torch.distributed`` calls carrying a crafted slot (a memory bomb,
a payload that is not msgpack, a declared size no machine holds, an unknown
failure code), exactly as a corrupted or malicious process could. Runs on gloo
and on the mpi4py backend (the ``world2`` fixture).
"""

import struct

import msgpack
import pytest
import torch
import torch.distributed as dist

import polydist as pd
from polydist import context
from polydist._torch import all_gather_single
from polydist.groups import resolve
from polydist.collectives import frames

pytestmark = pytest.mark.timeout(240)

SLOT = frames.slot_size(2)
_VALUE_MAGIC = 0x70645631  # polydist.collectives.p2p's value frame

# The 21-byte memory bomb: a float32 tensor of shape [32768, 32768] with no data (4 GiB if believed).
BOMB = msgpack.packb(
    msgpack.ExtType(7, msgpack.packb(["float32", [32768, 32768], b""], use_bin_type=True)), use_bin_type=True
)
HOSTILE = {
    "bomb": (BOMB, None),
    "garbage": (b"\xc1\xc1\xc1", None),  # 0xc1 is never valid msgpack
    "old_nested_tuples": (None, None),  # filled below
    "huge_length": (b"", 2**62),
    "unknown_failure_code": (b"", -7),
}
_nested = msgpack.packb(1)
for _ in range(300):  # the crash: 300 tuple extensions nested in each other
    _nested = msgpack.packb(msgpack.ExtType(1, _nested))
HOSTILE["old_nested_tuples"] = (_nested, None)


def _slot(kind: str, aux: int = 0) -> torch.Tensor:
    payload, length = HOSTILE[kind]
    slot = frames.make_slot(payload, aux=aux, size=SLOT)
    if length is not None:
        slot[:8] = length.to_bytes(8, "little", signed=True)
    return torch.frombuffer(slot, dtype=torch.uint8).clone()


def _error_of(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test reports the type
        return type(exc).__name__, str(exc)
    return None


def _usable() -> float:
    return pd.all_reduce(torch.ones(1)).item()


def _hostile_all_gather(kind):
    if pd.get_rank() == 1:
        all_gather_single(torch.empty(2 * SLOT, dtype=torch.uint8), _slot(kind))
        return None, _usable()
    return _error_of(lambda: pd.all_gather({"metrics": 1.0})), _usable()


def _hostile_broadcast(kind):
    if pd.get_rank() == 1:
        dist.broadcast(_slot(kind), src=1)
        return None, _usable()
    return _error_of(lambda: pd.broadcast(None, src=1)), _usable()


def _hostile_send(kind):
    if pd.get_rank() == 1:
        dist.send(_slot(kind, aux=_VALUE_MAGIC), dst=0)
        return None, _usable()
    return _error_of(lambda: pd.recv(None, src=1)), _usable()


def _hostile_all_reduce_number(kind):
    if pd.get_rank() == 1:
        all_gather_single(torch.empty(2 * SLOT, dtype=torch.uint8), _slot(kind))
        return None, _usable()
    return _error_of(lambda: pd.all_reduce(3)), _usable()


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize(
    "scenario",
    [_hostile_all_gather, _hostile_broadcast, pytest.param(_hostile_send, marks=pytest.mark.p2p), _hostile_all_reduce_number],
    ids=lambda f: f.__name__[9:],
)
def test_receiver_names_the_hostile_rank_and_the_group_survives(world2, scenario, kind):
    (error, after), (_, after_hostile) = world2.run(scenario, kind)
    assert error is not None, f"rank 0 accepted a {kind} frame"
    name, message = error
    assert name == "ValueError", error
    assert "rank 1" in message, message
    assert after == after_hostile == 2.0


# ------------------------------------------------------------ piece headers (all_gather, gather, scatter, all_to_all)

_PIECE = struct.Struct("<4sBBBBqqq4q")  # polydist.collectives.pieces' header
PIECE_LIES = {
    "bad_magic": dict(magic=b"XXXX"),
    "huge_length": dict(length=2**62),
    "unknown_dtype_code": dict(code=200),
    "too_many_dims": dict(ndim=65),
    "negative_dim": dict(dims=(-1, 0, 0, 0), ndim=1, length=0),
    "length_not_the_shape": dict(dims=(10, 0, 0, 0), ndim=1, length=8),  # 10 float32 are 40 bytes
    "unknown_kind": dict(kind=9),
}


def _piece_header(lie: str) -> bytes:
    fields = dict(magic=b"PDX1", kind=1, code=1, ndim=1, flags=0, length=8, aux=0, aux2=0, dims=(2, 0, 0, 0))
    fields.update(PIECE_LIES[lie])
    f = fields
    return _PIECE.pack(f["magic"], f["kind"], f["code"], f["ndim"], f["flags"], f["length"], f["aux"], f["aux2"], *f["dims"])


def _hostile_piece(lie):
    """Rank 1 takes part in all_gather's first call with a lying piece header; rank 0 must refuse it by name."""
    res = resolve(context.require_group(), None)
    if pd.get_rank() == 1:
        header = torch.frombuffer(bytearray(_piece_header(lie)), dtype=torch.uint8)
        if res.direct is not None:  # MPI: the 64-byte headers travel alone first
            all_gather_single(torch.empty(2 * 64, dtype=torch.uint8), header)
        else:  # gloo: the header and a slot of the width both ranks predict
            width = res.predictors[("all_gather",)].predict() if ("all_gather",) in res.predictors else 256
            slot = torch.zeros(64 + width, dtype=torch.uint8)
            slot[:64] = header
            all_gather_single(torch.empty(2 * (64 + width), dtype=torch.uint8), slot)
            res.predictors.pop(("all_gather",), None)  # as the honest rank does on a bad header
        return None, _usable()
    return _error_of(lambda: pd.all_gather(torch.ones(2))), _usable()


@pytest.mark.parametrize("lie", sorted(PIECE_LIES))
def test_lying_piece_header_is_refused_by_name(world2, lie):
    (error, after), (_, after_hostile) = world2.run(_hostile_piece, lie)
    assert error is not None and error[0] == "ValueError", (lie, error)
    assert "rank 1 sent a malformed header" in error[1], error
    assert after == after_hostile == 2.0


# ------------------------------------------------------------ tensor headers (broadcast's safe mode, point-to-point)

TENSOR_HEADER_LIES = {
    **PIECE_LIES,
    "beyond_memory": dict(ndim=2, dims=(2**40, 2**20, 0, 0), length=2**62),  # consistent, but no machine holds it
    "not_a_tensor": dict(kind=2),
    "dims_past_four_missing": dict(ndim=6, length=16 + 8),  # declares 2 more dims that never follow
}
_TENSOR_MAGIC = 0x70645431  # polydist.collectives.p2p's tensor-header frame


def _lying_tensor_header(lie: str) -> bytes:
    fields = dict(magic=b"PDX1", kind=1, code=1, ndim=1, flags=0, length=8, aux=0, aux2=0, dims=(2, 0, 0, 0))
    fields.update(TENSOR_HEADER_LIES[lie])
    f = fields
    return _PIECE.pack(f["magic"], f["kind"], f["code"], f["ndim"], f["flags"], f["length"], f["aux"], f["aux2"], *f["dims"])


def _hostile_tensor_header(lie, how):
    """Rank 1 announces a tensor by a lying header; rank 0 must refuse it by name before allocating anything."""
    header = _lying_tensor_header(lie)
    if pd.get_rank() == 1:
        if how == "send":
            slot = frames.make_slot(header, aux=_TENSOR_MAGIC, size=frames.PAIR_SLOT)
            dist.send(torch.frombuffer(slot, dtype=torch.uint8).clone(), dst=0)
        else:  # broadcast's safe mode: a tensor frame, "T" then the header
            dist.broadcast(torch.frombuffer(frames.make_slot(b"T" + header, size=SLOT), dtype=torch.uint8).clone(), src=1)
        return None, _usable()
    if how == "send":
        return _error_of(lambda: pd.recv(None, src=1)), _usable()
    return _error_of(lambda: pd.broadcast(None, src=1, safe_mode=True)), _usable()


@pytest.mark.parametrize("how", ["broadcast", pytest.param("send", marks=pytest.mark.p2p)])
@pytest.mark.parametrize("lie", sorted(TENSOR_HEADER_LIES))
def test_lying_tensor_header_is_refused_by_name(world2, lie, how):
    (error, after), (_, after_hostile) = world2.run(_hostile_tensor_header, lie, how)
    assert error is not None and error[0] == "ValueError", (lie, error)
    assert "rank 1 sent a malformed header" in error[1], error
    assert after == after_hostile == 2.0
