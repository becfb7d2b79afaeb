"""Pieces (a 64-byte header beside an item's bytes) and the width predictor, in one process."""

import pytest
import torch

from polydist.collectives import pieces, tensor_header
from polydist.collectives.pieces import HEADER, Piece, Predictor, plan_of, read, tensor_of

CPU = torch.device("cpu")


def _received(piece: Piece) -> tuple:
    """What a receiver holds: the header bytes and the body as a 16-byte-aligned uint8 tensor of exactly its length."""
    slot = torch.empty(HEADER + pieces.align(piece.length), dtype=torch.uint8)
    piece.write(slot, piece.length)
    return read(slot[:HEADER].numpy(), 3, "test"), slot[HEADER : HEADER + piece.length]


@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3), (1, 2, 3, 4), (2, 1, 3, 1, 2), (1,) * 9 + (3,)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex128, torch.bool, torch.uint16, torch.int8])
def test_tensor_round_trip_any_shape_and_dtype(shape, dtype):
    x = (torch.arange(max(1, torch.Size(shape).numel())) % 3).to(dtype)[: torch.Size(shape).numel()].reshape(shape)
    header, body = _received(Piece.tensor(x, CPU))
    got = tensor_of(header, body, "test")
    assert got.dtype == dtype and got.shape == x.shape and torch.equal(got, x)
    assert header.rank == 3


def test_non_contiguous_tensor_travels_as_its_values():
    x = torch.arange(12.0).reshape(3, 4).t()
    header, body = _received(Piece.tensor(x, CPU))
    assert torch.equal(tensor_of(header, body, "test"), x)


def test_failure_piece_carries_type_and_message_not_the_item():
    piece = Piece.failure(TypeError("cannot encode a socket"))
    header, body = _received(piece)
    err = header.error(body.numpy().tobytes(), "scatter")
    assert isinstance(err, TypeError) and "rank 3 failed before sending: cannot encode a socket" in str(err)
    assert piece.error is not None


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_unsupported_dtype_becomes_a_failure():
    q = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)
    piece = Piece.tensor(q, CPU)
    assert piece.kind == pieces.FAILURE and isinstance(piece.error, TypeError) and "qint8" in str(piece.error)


def test_header_claiming_more_dims_than_its_body_holds_is_refused():
    piece = Piece.tensor(torch.ones(1, 1, 1, 1, 2, 2), CPU)
    header, body = _received(piece)
    with pytest.raises(ValueError, match="rank 3 sent a malformed header"):
        tensor_of(header, body[:8], "test")


@pytest.mark.parametrize("shape", [(), (0,), (3, 2), (1, 2, 3, 4), (2, 1, 3, 1, 2), (1,) * 9 + (3,)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint16, torch.bool, torch.uint4])
def test_tensor_header_is_the_start_of_the_tensors_piece_and_round_trips(shape, dtype):
    x = torch.zeros(shape, dtype=torch.uint8).view(dtype) if dtype.itemsize == 1 else torch.zeros(shape, dtype=dtype)
    data = tensor_header.encode(x)
    piece = Piece.tensor(x, CPU)
    whole = piece.header() + pieces.flat_bytes(piece.body).numpy().tobytes()
    assert whole.startswith(data)  # one header format: the piece's own first bytes
    assert tensor_header.decode(data, 3, "test") == (dtype, list(shape))


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_tensor_header_of_a_dtype_without_wire_code_is_a_type_error():
    with pytest.raises(TypeError, match="qint8"):
        tensor_header.encode(torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8))


def test_tensor_header_cut_short_or_of_a_value_is_refused_by_name():
    data = tensor_header.encode(torch.ones(1, 1, 1, 1, 2, 2))
    for bad in (data[:40], data[:HEADER], Piece.value(b"x").header()):
        with pytest.raises(ValueError, match="rank 3 sent a malformed header"):
            tensor_header.decode(bad, 3, "test")


def test_plan_is_cached_by_header_bytes_and_checks_once():
    h = Piece.tensor(torch.ones(3), CPU).header()
    a = plan_of(h + h, (0, 1), "test")
    assert a is plan_of(h + h, (0, 1), "test")
    assert a.lengths == [12, 12] and a.offsets == [0, 12] and a.total == 24 and not a.failed
    assert plan_of(h + h, (0, 2), "test") is not a  # other senders: other names in messages


def test_predictor_repeats_then_follows_alternation_and_triples():
    p = Predictor()
    assert p.predict() == Predictor.FIRST
    seen = []
    for w in [4000, 8, 4000, 8, 4000, 8, 4000, 8]:
        seen.append(p.predict() == pieces.align(w))
        p.record(w)
    assert seen[-4:] == [True] * 4  # after one pass, alternating widths are predicted exactly
    q = Predictor()
    pattern = [100, 100, 5000] * 4
    hits = []
    for w in pattern:
        hits.append(q.predict() == pieces.align(w))
        q.record(w)
    assert hits[-6:] == [True] * 6  # A A B: the last two widths decide


def test_predictors_fed_alike_agree_and_stay_bounded():
    import random

    a, b = Predictor(), Predictor()
    rng = random.Random(5)
    for _ in range(1000):
        w = rng.randrange(0, 10**6)
        assert a.predict() == b.predict()
        a.record(w)
        b.record(w)
    assert len(a.after1) <= 65 and len(a.after2) <= 65
