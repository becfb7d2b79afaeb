"""The slot mover: how pieces move on torch.distributed's own backends (gloo, nccl, any registered one).

One ``torch.distributed`` call moves headers and bodies together, each in a
slot of a width predicted identically on every rank that takes part
(:class:`pieces.Predictor`, on history they all saw). Bodies longer than
their slot send the rest in a second call that every rank learns about from
the headers. all_gather's width is the group's; all_to_all's is the group's
while small (every sender announces its longest body to everyone) and each
pair's above; gather's is each sender's own (point to point to the root,
which alone learns the senders' sizes); scatter's is announced by the root
in the headers of the call before. From a predicted 4 MiB on, scatter and
all_to_all send the headers first and the bodies straight from the caller's
tensors instead of copying them into slots. Buffers that no result is a view
of are reused from call to call (:func:`_scratch`).

A malformed header raises ``ValueError`` naming the sender (:func:`pieces.read`)
and forgets the predictions involved, so the honest ranks keep agreeing.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Optional

import torch
import torch.distributed as dist

from .._torch import all_gather_single
from .._state import reuse
from ..groups import Resolved
from .mover import Into, Mover, Received, as_bytes, body_of, joined
from .pieces import EVEN, HEADER, OVERFLOW, Header, Piece, Plan, Predictor, align, flat_bytes, plan_of, read

__all__ = ["SlotMover", "SLOTS"]

_EVEN_A2A = 64 * 1024  # all_to_all: equal slots up to this width, each pair's own above it
# From this predicted width on, scatter and all_to_all send headers first and then the bodies straight
# from the caller's tensors: copying megabytes into slots beside their headers (memory-bound, ~10 GB/s
# here) costs more than the extra call (0.2-0.7 ms on gloo here).
_WIDE = 4 << 20
_GATHER_TAG = 0x70646701  # point-to-point tag of gather's messages to the root ("pdg"), apart from users' tags

def _predictor(res: Resolved, key: tuple) -> Predictor:
    p = res.predictors.get(key)
    if p is None:
        p = res.predictors[key] = Predictor()
    return p


def _scratch(res: Resolved, name: str, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 buffer of ``nbytes`` that this group reuses from call to call under ``name`` (:func:`polydist._state.reuse`)."""
    return reuse(res.scratch, name, nbytes, device)


def _read_rows(rows: torch.Tensor, ranks: list, what: str, res: Resolved, keys: list) -> list[Header]:
    """Headers from the first ``HEADER`` bytes of each row (one copy to the host); on a bad one, forget ``keys``."""
    host = rows[:, :HEADER].cpu().numpy()
    try:
        return [read(host[i], r, what) for i, r in enumerate(ranks)]
    except ValueError:
        for key in keys:
            res.predictors.pop(key, None)
        raise


def _record_received(res: Resolved, keys: list, headers: list[Optional[Header]]) -> None:
    """Record each sender's body length in its pair's predictor; forget the pair whose header was malformed."""
    for k, h in zip(keys, headers):
        if h is None:
            res.predictors.pop(k, None)
        else:
            _predictor(res, k).record(h.length)


def _spliced(first: torch.Tensor, rest: Optional[torch.Tensor], length: int) -> torch.Tensor:
    """A body: ``first`` (a slot) when it holds all ``length`` bytes, else the slot and its remainder joined."""
    if length <= first.numel():
        return first[:length]
    return torch.cat([first, rest[: length - first.numel()]])


def _read_each(rows: list, ranks: list, what: str) -> tuple[list[Optional[Header]], Optional[ValueError]]:
    """Each header (None where malformed) and the first error: a rank that got one bad header still finishes the
    call with the others (who may have got good ones from the same sender) and raises after it."""
    headers: list = []
    error = None
    for row, r in zip(rows, ranks):
        try:
            headers.append(read(row, r, what))
        except ValueError as exc:
            headers.append(None)
            error = error or exc
    return headers, error

def _offsets(lengths: list[int]) -> list[int]:
    return list(accumulate(lengths, initial=0))[:-1]

# ---------------------------------------------------------------- all_gather


def _all_gather(res: Resolved, piece: Piece, what: str, views: bool) -> Received:
    dev = res.device
    key = ("all_gather",)
    pred = _predictor(res, key)
    width = pred.predict()
    stride = HEADER + width
    send = _scratch(res, "all_gather send", stride, dev)  # padding is never read
    piece.write(send, width)
    out = torch.empty(res.size * stride, dtype=torch.uint8, device=dev) if views else _scratch(res, "all_gather recv", res.size * stride, dev)
    all_gather_single(out, send, group=res.pg)
    rows = out.view(res.size, stride)
    try:
        plan = plan_of(rows[:, :HEADER].contiguous().cpu().numpy().tobytes(), res.ranks, what)
    except ValueError:
        res.predictors.pop(key, None)  # every rank saw the same bad header: all forget alike
        raise
    lengths = plan.lengths
    pred.record(max(lengths))
    rest = align(max(lengths) - width) if max(lengths) > width else 0
    rows2 = None
    if rest:  # someone's body outgrew the prediction: every rank saw it in the headers
        send2 = torch.empty(rest, dtype=torch.uint8, device=dev)
        piece.write_rest(send2, width)
        out2 = torch.empty(res.size * rest, dtype=torch.uint8, device=dev)
        all_gather_single(out2, send2, group=res.pg)
        rows2 = out2.view(res.size, rest)
    bodies = [_spliced(rows[i, HEADER:], rows2[i] if rows2 is not None else None, n) for i, n in enumerate(lengths)]
    return Received(plan, bodies=bodies)


# ---------------------------------------------------------------- gather


def _gather(res: Resolved, piece: Piece, dst: int, what: str) -> Optional[Received]:
    dev, here = res.device, res.rank == dst
    root = res.ranks.index(dst)
    if not here:  # to the root only; the width is this pair's own
        pred = _predictor(res, ("gather", dst))
        width = pred.predict()
        slot = _scratch(res, "gather send", HEADER + width, dev)
        piece.write(slot, width)
        works = [dist.isend(slot, dst, group=res.pg, tag=_GATHER_TAG)]
        if piece.length > width:
            rest = torch.empty(piece.length - width, dtype=torch.uint8, device=dev)
            piece.write_rest(rest, width)
            works.append(dist.isend(rest, dst, group=res.pg, tag=_GATHER_TAG))
        for w in works:
            w.wait()
        pred.record(piece.length)
        return None
    peers = [(i, r) for i, r in enumerate(res.ranks) if r != dst]
    keys = [("gather", dst, r) for _, r in peers]
    widths = [_predictor(res, k).predict() for k in keys]
    slots = [torch.empty(HEADER + w, dtype=torch.uint8, device=dev) for w in widths]
    for w in [dist.irecv(s, r, group=res.pg, tag=_GATHER_TAG) for s, (_, r) in zip(slots, peers)]:
        w.wait()
    heads, error = _read_each([s[:HEADER].cpu().numpy() for s in slots], [r for _, r in peers], what)
    rests = [torch.empty(h.length - w, dtype=torch.uint8, device=dev) if h is not None and h.length > w else None
             for h, w in zip(heads, widths)]  # fmt: skip
    for w in [dist.irecv(t, r, group=res.pg, tag=_GATHER_TAG) for t, (_, r) in zip(rests, peers) if t is not None]:
        w.wait()
    _record_received(res, keys, heads)
    if error is not None:
        raise error
    headers: list = [None] * res.size
    bodies: list = [None] * res.size
    headers[root] = read(piece.header(), dst, what)
    bodies[root] = flat_bytes(body_of(piece, dev)).clone()  # the result must not alias the caller's tensor
    for (i, _), h, s, t in zip(peers, heads, slots, rests):
        headers[i], bodies[i] = h, _spliced(s[HEADER:], t, h.length)
    return Received(Plan(headers), bodies=bodies)


# ---------------------------------------------------------------- scatter


def _scatter(res: Resolved, pieces: Optional[list[Piece]], src: int, what: str) -> tuple[Header, torch.Tensor]:
    dev, here = res.device, res.rank == src
    key = ("scatter", src)
    width = res.predictors.get(("scatter width", src), Predictor.FIRST)
    if width >= _WIDE:
        return _scatter_wide(res, pieces, src, what)
    if here:  # the root knows every size: it announces the remainder round and the next width
        pred = _predictor(res, key)
        longest = max(p.length for p in pieces)
        pred.record(longest)
        rest = align(longest - width) if longest > width else 0
        slots = list(_scratch(res, "scatter send", len(pieces) * (HEADER + width), dev).view(len(pieces), -1))
        for p, slot in zip(pieces, slots):
            p.aux, p.aux2 = pred.predict(), rest
            p.write(slot, width)
        mine = torch.empty(HEADER + width, dtype=torch.uint8, device=dev)
        dist.scatter(mine, slots, src=src, group=res.pg)
    else:
        mine = torch.empty(HEADER + width, dtype=torch.uint8, device=dev)
        dist.scatter(mine, None, src=src, group=res.pg)
    header = _read_rows(mine.view(1, -1), [src], what, res, [("scatter width", src)])[0]
    rest = header.aux2
    if header.length > width and header.length - width > rest:
        res.predictors.pop(("scatter width", src), None)
        raise ValueError(f"{what}: rank {src} sent a malformed header: a body of {header.length} bytes, "
                         f"{width} in the slot and {rest} announced for the rest")  # fmt: skip
    tail = None
    if rest:
        tail = torch.empty(rest, dtype=torch.uint8, device=dev)
        parts = None
        if here:
            parts = []
            for p in pieces:
                part = torch.empty(rest, dtype=torch.uint8, device=dev)
                p.write_rest(part, width)
                parts.append(part)
        dist.scatter(tail, parts, src=src, group=res.pg)
    res.predictors[("scatter width", src)] = align(header.aux)
    return header, _spliced(mine[HEADER:], tail, header.length)


def _scatter_wide(res: Resolved, pieces: Optional[list[Piece]], src: int, what: str) -> tuple[Header, torch.Tensor]:
    """scatter in two calls: the headers (announcing each length, the longest, and the next width), then the
    bodies straight from root's tensors when all have one length, padded to the longest otherwise."""
    dev, here = res.device, res.rank == src
    heads = None
    if here:
        pred = _predictor(res, ("scatter", src))
        longest = max(p.length for p in pieces)
        pred.record(longest)
        even = len({p.length for p in pieces}) == 1
        for p in pieces:
            p.aux, p.aux2, p.flags = pred.predict(), longest, EVEN if even else 0
        heads = list(as_bytes(b"".join(p.header() for p in pieces), dev).view(len(pieces), HEADER))
    mine = torch.empty(HEADER, dtype=torch.uint8, device=dev)
    dist.scatter(mine, heads, src=src, group=res.pg)
    header = _read_rows(mine.view(1, HEADER), [src], what, res, [("scatter width", src)])[0]
    if header.aux2 < header.length:
        res.predictors.pop(("scatter width", src), None)
        raise ValueError(f"{what}: rank {src} sent a malformed header: a body of {header.length} bytes, "
                         f"{header.aux2} announced as the longest")  # fmt: skip
    size = header.length if header.flags & EVEN else header.aux2
    parts = None
    if here:
        parts = [flat_bytes(body_of(p, dev)) for p in pieces]
        if not header.flags & EVEN:  # dist.scatter moves one size to every rank
            parts = [torch.nn.functional.pad(b, (0, size - b.numel())) for b in parts]
    out = torch.empty(size, dtype=torch.uint8, device=dev)
    dist.scatter(out, parts, src=src, group=res.pg)
    res.predictors[("scatter width", src)] = align(header.aux)
    return header, out[: header.length]


# ---------------------------------------------------------------- all_to_all


def _all_to_all(res: Resolved, pieces: list[Piece], what: str) -> Received:
    dev, n = res.device, res.size
    # Every sender announces its longest body in every header (aux), so every rank learns the longest
    # of the call and predicts the next one alike. While that is small, every message gets a slot of
    # that width and gloo's fixed-size all-to-all moves them (its v-form costs a few hundred µs more
    # per call here); above it, each pair's own width avoids padding to the longest (uneven
    # routing, e.g. mixture-of-experts tokens) and the v-form moves them.
    widest = _predictor(res, ("all_to_all",))
    to_keys = [("all_to_all to", r) for r in res.ranks]
    from_keys = [("all_to_all from", r) for r in res.ranks]
    if widest.predict() >= _WIDE:
        return _all_to_all_wide(res, pieces, what, widest, to_keys, from_keys)
    even = widest.predict() <= _EVEN_A2A
    if even:
        send_w = recv_w = [widest.predict()] * n
    else:
        send_w = [_predictor(res, k).predict() for k in to_keys]
        recv_w = [_predictor(res, k).predict() for k in from_keys]
    longest = max(p.length for p in pieces)
    overflow = any(p.length > w for p, w in zip(pieces, send_w))
    send = _scratch(res, "all_to_all send", sum(send_w) + n * HEADER, dev)
    at = 0
    for p, w in zip(pieces, send_w):
        p.flags, p.aux = (OVERFLOW if overflow else 0), longest
        p.write(send[at : at + HEADER + w], w)
        at += HEADER + w
    recv = torch.empty(sum(recv_w) + n * HEADER, dtype=torch.uint8, device=dev)
    recv_sizes = [HEADER + w for w in recv_w]
    if even:
        dist.all_to_all_single(recv, send, group=res.pg)
    else:
        dist.all_to_all_single(recv, send, recv_sizes, [HEADER + w for w in send_w], group=res.pg)
    slots = [recv[o : o + k] for o, k in zip(_offsets(recv_sizes), recv_sizes)]
    raw = b"".join(s[:HEADER].cpu().numpy().tobytes() for s in slots)
    headers, error = _received_headers(res, raw, pieces, what, widest, to_keys, from_keys)
    good = [h for h in headers if h is not None]
    tails: list = [None] * n
    if any(h.flags & OVERFLOW for h in good):  # each sender flagged its headers to everyone: all ranks agree
        if even:  # the rests in equal slots too, as wide as the longest rest of any sender
            rest = align(max(h.aux for h in good) - send_w[0])
            send2 = torch.empty(n * rest, dtype=torch.uint8, device=dev)
            for d, p in enumerate(pieces):
                p.write_rest(send2[d * rest : (d + 1) * rest], send_w[0])
            recv2 = torch.empty(n * rest, dtype=torch.uint8, device=dev)
            dist.all_to_all_single(recv2, send2, group=res.pg)
            tails = list(recv2.view(n, rest))
        else:
            send2_sizes = [max(0, p.length - w) for p, w in zip(pieces, send_w)]
            recv2_sizes = [max(0, h.length - w) if h is not None else 0 for h, w in zip(headers, recv_w)]
            send2 = torch.empty(sum(send2_sizes), dtype=torch.uint8, device=dev)
            for p, w, o, k in zip(pieces, send_w, _offsets(send2_sizes), send2_sizes):
                if k:
                    p.write_rest(send2[o : o + k], w)
            recv2 = torch.empty(sum(recv2_sizes), dtype=torch.uint8, device=dev)
            dist.all_to_all_single(recv2, send2, recv2_sizes, send2_sizes, group=res.pg)
            tails = [recv2[o : o + k] for o, k in zip(_offsets(recv2_sizes), recv2_sizes)]
    if error is not None:
        raise error
    return Received(Plan(headers), bodies=[_spliced(s[HEADER:], t, h.length) for s, t, h in zip(slots, tails, headers)])


def _all_to_all_wide(res: Resolved, pieces: list[Piece], what: str, widest: Predictor, to_keys: list, from_keys: list) -> Received:
    """all_to_all in two calls: the headers, then the bodies at their exact sizes straight from the caller's
    tensors (no copy when they lie back to back, as the pieces of ``x.chunk()`` do)."""
    dev, n = res.device, res.size
    longest = max(p.length for p in pieces)
    even = EVEN if len({p.length for p in pieces}) == 1 else 0
    for p in pieces:
        p.flags, p.aux = even, longest
    heads = torch.empty(n * HEADER, dtype=torch.uint8, device=dev)
    dist.all_to_all_single(heads, as_bytes(b"".join(p.header() for p in pieces), dev), group=res.pg)
    headers, error = _received_headers(res, heads.cpu().numpy().tobytes(), pieces, what, widest, to_keys, from_keys)
    send_sizes = [p.length for p in pieces]
    recv_sizes = [h.length if h is not None else 0 for h in headers]
    recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=dev)
    send = joined([body_of(p, dev) for p in pieces])
    if error is None and Plan(headers).even:  # every sender's bodies one length, the same for all: the plain form
        dist.all_to_all_single(recv, send, group=res.pg)
    else:
        dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=res.pg)
    if error is not None:
        raise error
    return Received(Plan(headers), bodies=[recv[o : o + k] for o, k in zip(_offsets(recv_sizes), recv_sizes)])


def _received_headers(
    res: Resolved, raw: bytes, pieces: list[Piece], what: str, widest: Predictor, to_keys: list, from_keys: list
) -> tuple[list[Optional[Header]], Optional[ValueError]]:
    """all_to_all's received headers (None where malformed) and the first error; every prediction recorded.

    The common case, headers seen before, is one cached lookup; a bad header
    still lets this rank finish the call with the others before raising.
    """
    n = res.size
    try:
        headers, error = plan_of(raw, res.ranks, what).headers, None
    except ValueError:
        headers, error = _read_each([raw[i * HEADER : (i + 1) * HEADER] for i in range(n)], res.ranks, what)
    for k, p in zip(to_keys, pieces):
        _predictor(res, k).record(p.length)
    _record_received(res, from_keys, headers)
    widest.record(max((h.aux for h in headers if h is not None), default=0))
    return headers, error


class SlotMover(Mover):
    """Pieces in predicted slots over torch.distributed's calls (``into`` is not used: bodies land in slots)."""

    __slots__ = ()

    def all_gather(self, res: Resolved, piece: Piece, what: str, views: bool, into: Optional[Into]) -> Received:
        return _all_gather(res, piece, what, views)

    def gather(self, res: Resolved, piece: Piece, dst: int, what: str, into: Optional[Into]) -> Optional[Received]:
        return _gather(res, piece, dst, what)

    def scatter(self, res: Resolved, pieces: Optional[list[Piece]], src: int, what: str) -> tuple[Header, torch.Tensor]:
        return _scatter(res, pieces, src, what)

    def all_to_all(self, res: Resolved, pieces: list[Piece], what: str) -> Received:
        return _all_to_all(res, pieces, what)


SLOTS = SlotMover()
