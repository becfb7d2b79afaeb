"""Soak test: thousands of random collectives on 3 ranks, every result checked exactly, memory watched.

    polydist run --nproc-per-node 3 benchmarks/soak.py --ops 10000 --seed 0 \\
        --json benchmarks/results/soak_gloo.json
    polydist run --nproc-per-node 3 --backend mpi benchmarks/soak.py --ops 10000 --seed 0 \\
        --json benchmarks/results/soak_mpi.json

Every rank draws the same sequence of steps from one ``random.Random(--seed)``:
a kind of call (every collective polydist has, point-to-point, async variants,
several async calls in flight at once), a group (the world or one of the pairs
[0, 1], [1, 2], [0, 2], created once up front and passed as a ProcessGroup or
as a rank list), a reduce op, a dtype, a size (log-uniform from 1 byte to
--max-bytes, 1 MiB) and a root. What a rank puts in is a function of the
step's seed and its rank alone, so every rank computes locally what it must
get back and compares exactly: tensors byte for byte (or ``torch.equal``,
for -0.0), values by type and content, floats by their bits. Reduced values
are chosen so that the result is exact in any order and any dtype: small
integers for SUM and PRODUCT (stored in float16 too), multiples of the group
size for AVG, random bits for MIN/MAX/AND/OR/XOR.

Ranks outside a step's group skip it. A mismatch is recorded with its step,
kind and rank, the run goes on, and every rank exits 1 at the end.

Memory: the resident set size (VmRSS, /proc/self/status) after a garbage
collection, after the first --warmup-frac of the steps (10 %), after half and
at the end; the growth per rank is end over warm (target < 5 %), the peak
VmHWM. To tell a leak from an allocator keeping what was freed, the same
moments also record glibc's ``mallinfo2`` (memory malloc has handed out, and
freed memory it keeps) and the tensors alive between steps, when the soak
holds none: the buffers polydist keeps for reuse. Rank 0 prints progress, a
table per kind and the memory of each rank, and with --json writes all of it.

``--inject-mismatch STEP`` (not in --help) makes every rank of step STEP
treat its result as wrong: the check of the checker (tests/bench/test_soak.py).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import random
import reprlib
import struct
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from functools import reduce as fold
from typing import Any, Callable, Optional

import _common
import torch

import polydist as pd
from polydist.bench.records import run_metadata

MiB = 1 << 20
SUBGROUPS = ((0, 1), (1, 2), (0, 2))

# ------------------------------------------------------------------ dtypes, ops and the values they reduce exactly

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.int8, torch.uint8, torch.int32, torch.int64)
COMPLEX = (torch.complex64, torch.complex128)
# What both gloo and the mpi4py backend reduce (polydist.all_reduce's docstring); complex under SUM/AVG only.
REDUCE_DTYPES = {
    "SUM": FLOATS + INTS + COMPLEX,
    "PRODUCT": FLOATS + INTS,
    "MIN": FLOATS + INTS + (torch.bool,),
    "MAX": FLOATS + INTS + (torch.bool,),
    "AVG": FLOATS + COMPLEX,
    "AND": INTS + (torch.bool,),
    "OR": INTS + (torch.bool,),
    "XOR": INTS + (torch.bool,),
}
OPS = tuple(REDUCE_DTYPES)
# Everything else travels as bytes: any dtype, also those gloo cannot carry itself.
MOVE_DTYPES = FLOATS + INTS + COMPLEX + (torch.bool, torch.int16, torch.uint16, torch.uint32, torch.uint64,
                                         torch.float8_e4m3fn, torch.float8_e5m2)  # fmt: skip

# kind: (weight, variants, takes async_op)
KINDS: dict[str, tuple[float, tuple[str, ...], bool]] = {
    "all_reduce": (3.0, ("tensor", "noncontig", "tensors", "number"), True),
    "reduce": (1.5, ("tensor", "number"), True),
    "reduce_scatter": (1.0, ("tensor",), True),
    "broadcast": (1.5, ("tensor", "safe_mode", "value"), True),
    "all_gather": (1.5, ("uneven", "list", "value", "with_shapes"), True),  # with_shapes: never async
    "gather": (1.0, ("uneven", "list", "value"), True),
    "scatter": (1.0, ("tensors", "values", "mixed"), True),
    "all_to_all": (1.0, ("tensors", "values", "mixed"), True),
    "barrier": (0.5, ("-",), True),
    "send_recv": (1.5, ("tensor", "value", "exchange"), True),
    "in_flight": (0.7, ("2", "3", "4"), False),  # several async all_reduce/broadcast/reduce, waited out of order
}

TEXT = ("abcxyz 019_-", "éüßñøç", "αβγΩж", "汉字かなカナ한국어", "🌍🚀👩‍💻🇫🇷", "\u0301\u200d\ufeff", "مرحبا", "\x00\t\n")


# ------------------------------------------------------------------ the shared sequence of steps


@dataclass
class Step:
    """One call, identical on every rank: everything random about it but the data."""

    index: int
    kind: str
    variant: str
    ranks: tuple[int, ...]  # the group's global ranks, sorted (= group-rank order)
    as_list: bool  # pass the group as a rank list rather than a ProcessGroup (world: a list rather than None)
    async_op: bool
    op: str
    dtype: torch.dtype
    nbytes: int
    root: int  # src or dst; send_recv: the sender
    peer: int  # send_recv: the receiver
    tag: int
    seed: int  # what the data of every rank derives from, with the rank

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.variant}"


def draw_step(rng: random.Random, index: int, world: int, max_bytes: int) -> Step:
    """The next step of the shared sequence (draws nothing that depends on the rank)."""
    kind = rng.choices(list(KINDS), [w for w, _, _ in KINDS.values()])[0]
    _, variants, has_async = KINDS[kind]
    variant = rng.choice(variants)
    ranks = tuple(range(world)) if world < 3 or rng.random() < 0.5 else rng.choice(SUBGROUPS)
    op = rng.choice(OPS)
    dtypes = REDUCE_DTYPES[op] if kind in ("all_reduce", "reduce", "reduce_scatter") else MOVE_DTYPES
    root, peer = rng.sample(ranks, 2) if len(ranks) > 1 else (ranks[0], ranks[0])
    return Step(
        index=index, kind=kind, variant=variant, ranks=ranks, as_list=rng.random() < 0.3,
        async_op=has_async and variant != "with_shapes" and rng.random() < 0.3, op=op, dtype=rng.choice(dtypes),
        nbytes=int(round(2 ** rng.uniform(0, math.log2(max_bytes)))), root=root, peer=peer,
        tag=rng.randrange(8), seed=rng.getrandbits(48),
    )  # fmt: skip


def takes_part(s: Step, rank: int) -> bool:
    """Whether ``rank`` calls this step (send_recv: only its two ranks)."""
    return rank in ((s.root, s.peer) if s.kind == "send_recv" else s.ranks)


# ------------------------------------------------------------------ data: functions of (step seed, rank, item)


def key(s: Step, *parts: int) -> int:
    """A 63-bit seed from the step's seed and integers (no str hashing: that differs between processes)."""
    k = s.seed
    for p in parts:
        k = (k * 1_000_003 + p + 1) & ((1 << 63) - 1)
    return k


def generator(k: int) -> torch.Generator:
    return torch.Generator().manual_seed(k)


def shape_for(numel: int, rnd: random.Random, *, min_dims: int = 1) -> tuple[int, ...]:
    """A shape of about ``numel`` elements and 1-3 dims (0 dims when allowed and numel is 1)."""
    if numel == 1 and min_dims == 0 and rnd.random() < 0.5:
        return ()
    trailing = rnd.choice([(), (), (2,), (3,), (4, 2), (1, 5)])
    inner = math.prod(trailing)
    return (max(1, numel // inner), *trailing)


def numel_for(nbytes: int, dtype: torch.dtype) -> int:
    return max(1, nbytes // dtype.itemsize)


def bits_tensor(k: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Random bytes viewed as ``dtype`` (bool: 0/1): NaNs and odd payloads included, for transport checks."""
    n = math.prod(shape)
    raw = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=generator(k))
    if dtype == torch.bool:
        return (raw & 1).view(torch.bool).reshape(shape)
    return raw.view(dtype).reshape(shape)


def int_tensor(k: int, shape: tuple[int, ...], dtype: torch.dtype, lo: int, hi: int, times: int = 1) -> torch.Tensor:
    """Integers in [lo, hi] times ``times``, stored in ``dtype`` (complex: real and imaginary parts)."""
    g = generator(k)
    if dtype.is_complex:
        re, im = (torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.float64) * times for _ in range(2))
        return torch.complex(re, im).to(dtype)
    if not (dtype.is_floating_point or dtype.is_signed):
        lo = 0
    return (torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int64) * times).to(dtype)


def reduce_input(s: Step, rank: int, item: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``rank``'s tensor for op ``s.op``, chosen so that any order of reduction gives the same exact result."""
    k, n = key(s, rank, item), len(s.ranks)
    if s.op == "SUM":
        return int_tensor(k, shape, dtype, -8, 8)  # |sum of 3| <= 24: exact in every dtype
    if s.op == "PRODUCT":
        return int_tensor(k, shape, dtype, -3, 3)  # |product of 3| <= 27
    if s.op == "AVG":
        return int_tensor(k, shape, dtype, -8, 8, times=n)  # the sum divides by n exactly
    if s.op in ("MIN", "MAX") and dtype.is_floating_point:
        return (torch.randn(shape, generator=generator(k), dtype=torch.float64) * 100).to(dtype)
    return bits_tensor(k, shape, dtype)  # MIN/MAX of ints and bools, AND/OR/XOR: any bits


def reduced(tensors: list[torch.Tensor], op: str) -> torch.Tensor:
    """The expected result of reducing ``tensors`` with ``op``, computed here."""
    fns: dict[str, Callable] = {
        "SUM": torch.add, "AVG": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum, "MAX": torch.maximum,
        "AND": torch.bitwise_and, "OR": torch.bitwise_or, "XOR": torch.bitwise_xor,
    }  # fmt: skip
    out = fold(fns[op], tensors)
    return out / len(tensors) if op == "AVG" else out


NUMBER_TYPES = {"SUM": (int, float, bool, complex), "PRODUCT": (int, float), "MIN": (int, float, bool),
                "MAX": (int, float, bool), "AVG": (int, float, complex), "AND": (int, bool), "OR": (int, bool),
                "XOR": (int, bool)}  # fmt: skip


def number_input(s: Step, rank: int) -> Any:
    """``rank``'s Python number for op ``s.op``, of a type common to the step: exact whatever the order.

    Ints up to 2**90 (2**40 for PRODUCT and AVG), dyadic floats (arbitrary ones for MIN/MAX), bools,
    complex with dyadic parts; for AVG multiples of the group size, so the sum divides exactly.
    """
    kind = random.Random(s.seed).choice(NUMBER_TYPES[s.op])
    rnd, times = random.Random(key(s, rank)), len(s.ranks) if s.op == "AVG" else 1
    if kind is bool:
        return rnd.random() < 0.5
    if kind is int:
        return rnd.randint(-(2**40), 2**40) * times if s.op in ("PRODUCT", "AVG") else rnd.randint(-(2**90), 2**90)
    if kind is complex:
        return complex(rnd.randint(-99, 99) / 4, rnd.randint(-99, 99) / 4) * times
    if s.op in ("MIN", "MAX"):
        return rnd.uniform(-1e300, 1e300)
    return rnd.randint(-64, 64) / 8 if s.op == "PRODUCT" else rnd.randint(-(2**20), 2**20) / 16 * times


def reduced_numbers(values: list, op: str) -> Any:
    """The expected reduction of Python numbers: polydist documents exact folds in Python."""
    fns: dict[str, Callable] = {
        "SUM": lambda a, b: a + b, "AVG": lambda a, b: a + b, "PRODUCT": lambda a, b: a * b, "MIN": min, "MAX": max,
        "AND": lambda a, b: a & b, "OR": lambda a, b: a | b, "XOR": lambda a, b: a ^ b,
    }  # fmt: skip
    out = fold(fns[op], values)
    return out / len(values) if op == "AVG" else out


def text(rnd: random.Random, nbytes: int) -> str:
    """A string of about ``nbytes`` UTF-8 bytes mixing ASCII, accents, CJK, emoji, combining marks, RTL, NUL."""
    chunk = "".join(rnd.choice(rnd.choice(TEXT)) for _ in range(min(256, max(1, nbytes // 3))))
    return chunk * max(1, nbytes // len(chunk.encode()))


def value(k: int, nbytes: int) -> Any:
    """A Python value of about ``nbytes`` (strings, bytes and lists scale; scalars stay small)."""
    rnd = random.Random(k)
    form = rnd.choice(["int", "float", "str", "str", "bytes", "list", "dict", "nested", "tuple", "scalar", "tensor"])
    if form == "int":
        return rnd.randint(-(2 ** rnd.choice([8, 63, 64, 200])), 2**200)
    if form == "float":
        return rnd.choice([rnd.uniform(-1e300, 1e300), math.inf, -math.inf, math.nan, -0.0, 5e-324, rnd.random()])
    if form == "str":
        return text(rnd, nbytes)
    if form == "bytes":
        return rnd.randbytes(min(nbytes, 4096)) * max(1, nbytes // 4096)
    if form == "list":
        count = max(1, nbytes // 24)
        return [rnd.choice([rnd.randint(-(2**70), 2**70), rnd.random(), text(rnd, 12), None]) for _ in range(count)]
    if form == "dict":
        count = max(1, nbytes // 48)
        return {text(rnd, 8) + str(i): rnd.choice([i, -0.5 * i, text(rnd, 20), [i, (i,)]]) for i in range(count)}
    if form == "nested":
        deep = fold(lambda inner, _: [inner], range(rnd.randint(1, 200)), "bottom")  # lists 1-200 levels deep
        return {"ß": [(1, 2.5, "ü"), {3: None, (4, "x"): {b"\x00\xff", 7}}], "list": [[[]], (), {}],
                "frozen": frozenset({1, "a"}), "deep": deep, "big": -(2**130)}  # fmt: skip
    if form == "tuple":
        return (text(rnd, 16), rnd.randint(0, 9), (None, True, 1.5), [])
    if form == "tensor":
        return {"t": bits_tensor(k, shape_for(max(1, nbytes // 4), rnd), torch.float32), "n": rnd.random()}
    return rnd.choice([None, True, False, 0, "", b"", 1j, "🌍"])


def item(s: Step, sender: int, receiver: int) -> Any:
    """What ``sender`` passes for ``receiver`` in a scatter / all_to_all: tensor or value per the variant."""
    k = key(s, sender, receiver)
    rnd = random.Random(k)
    as_tensor = s.variant == "tensors" or (s.variant == "mixed" and rnd.random() < 0.5)
    if not as_tensor:
        return value(k, rnd.randint(1, s.nbytes))
    dtype = rnd.choice(MOVE_DTYPES)
    return bits_tensor(k, shape_for(numel_for(rnd.randint(0, s.nbytes), dtype), rnd, min_dims=0), dtype)


def member_tensor(s: Step, rank: int, *, uneven: bool) -> torch.Tensor:
    """``rank``'s tensor of dtype ``s.dtype`` for a gather: uneven rows and common trailing dims, or any shape."""
    common = random.Random(s.seed)
    rows_max = numel_for(s.nbytes, s.dtype)
    trailing = common.choice([(), (3,), (2, 2)])
    own = random.Random(key(s, rank))
    if uneven:
        rows = own.randint(0, max(1, rows_max // max(1, math.prod(trailing))))
        return bits_tensor(key(s, rank), (rows, *trailing), s.dtype)
    return bits_tensor(key(s, rank), shape_for(own.randint(1, rows_max), own, min_dims=0), s.dtype)


# ------------------------------------------------------------------ comparing


INJECTED = object()  # the expected result of an injected mismatch: equal to nothing


def same(got: Any, expected: Any) -> bool:
    """Exact equality: same types all the way down, tensors by dtype, shape and bytes, floats by bits."""
    if expected is INJECTED:
        return False
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.dtype != expected.dtype or got.shape != expected.shape:
            return False
        a, b = got.detach().cpu().contiguous().reshape(-1), expected.contiguous().reshape(-1)
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8)) or (a.is_floating_point() and _equal(a, b))
    if type(got) is not type(expected):
        return False
    if isinstance(expected, float):
        return struct.pack("<d", got) == struct.pack("<d", expected)
    if isinstance(expected, complex):
        return same(got.real, expected.real) and same(got.imag, expected.imag)
    if isinstance(expected, (list, tuple)):
        return len(got) == len(expected) and all(same(a, b) for a, b in zip(got, expected))
    if isinstance(expected, dict):
        return list(got) == list(expected) and all(same(got[k], expected[k]) for k in expected)
    return got == expected


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``torch.equal`` (so -0.0 == 0.0), False for a dtype it does not compare."""
    try:
        return torch.equal(a, b)
    except (RuntimeError, NotImplementedError):
        return False


def shown(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        flat = x.detach().reshape(-1)
        return f"tensor {str(x.dtype)[6:]}{list(x.shape)} {reprlib.repr(flat[:6].tolist())}"
    return "<injected>" if x is INJECTED else reprlib.repr(x)


# ------------------------------------------------------------------ one function per kind of call
# Each runs on the ranks that take part and returns checks: (what, got, expected).

Check = tuple[str, Any, Any]


class Ctx:
    """This rank, its groups, and how to pass a step's group."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank = rank
        self.world = world
        self.groups = {ranks: pd.new_group(list(ranks)) for ranks in SUBGROUPS} if world >= 3 else {}

    def group(self, s: Step) -> Any:
        if s.as_list:
            return list(s.ranks)
        return None if len(s.ranks) == self.world else self.groups[s.ranks]

    def group_rank(self, s: Step) -> int:
        return s.ranks.index(self.rank)


def finish(s: Step, out: Any) -> Any:
    """The result: ``out`` itself, or what the Work returned by an async call gives on ``wait()``."""
    if not s.async_op:
        return out
    if not isinstance(out, pd.Work):
        raise TypeError(f"async_op=True returned {type(out).__name__}, not a polydist.Work")
    return out.wait()


def do_all_reduce(s: Step, ctx: Ctx) -> list[Check]:
    if s.variant == "number":
        xs = [number_input(s, r) for r in s.ranks]
        got = finish(s, pd.all_reduce(xs[ctx.group_rank(s)], op=s.op, group=ctx.group(s), async_op=s.async_op))
        return [("number", got, reduced_numbers(xs, s.op))]
    if s.variant == "tensors":
        return _all_reduce_list(s, ctx)
    x = _all_reduce_input(s, ctx.rank)
    out = pd.all_reduce(x, op=s.op, group=ctx.group(s), async_op=s.async_op)
    want = reduced([_all_reduce_input(s, r) for r in s.ranks], s.op)  # meanwhile, when async
    got = finish(s, out)
    return [("returns its input", got is x, True), ("tensor, in place", x, want)]


def _all_reduce_input(s: Step, rank: int) -> torch.Tensor:
    """A tensor of any shape; "noncontig": the transpose of a 2-d one (reduced in place all the same)."""
    common, numel = random.Random(s.seed), numel_for(s.nbytes, s.dtype)
    if s.variant == "noncontig":
        cols = common.choice([2, 3, 5])
        return reduce_input(s, rank, 0, (cols, max(1, numel // cols)), s.dtype).t()
    return reduce_input(s, rank, 0, shape_for(numel, common, min_dims=0), s.dtype)


def _all_reduce_list(s: Step, ctx: Ctx) -> list[Check]:
    """A list of tensors of several dtypes (one coalesced call per dtype)."""
    common = random.Random(s.seed)
    count = common.randint(1, 6)
    specs = [(common.choice(REDUCE_DTYPES[s.op]), common.randint(0, s.nbytes // count)) for _ in range(count)]
    specs = [(dt, shape_for(numel_for(nb, dt), common, min_dims=0)) for dt, nb in specs]
    mine = [reduce_input(s, ctx.rank, i, shape, dt) for i, (dt, shape) in enumerate(specs)]
    out = pd.all_reduce(mine, op=s.op, group=ctx.group(s), async_op=s.async_op)
    want = [reduced([reduce_input(s, r, i, shape, dt) for r in s.ranks], s.op) for i, (dt, shape) in enumerate(specs)]
    got = finish(s, out)
    checks = [(f"tensor {i}", t, w) for i, (t, w) in enumerate(zip(mine, want))]
    return [("returns its list", got is mine, True), *checks]


def do_reduce(s: Step, ctx: Ctx) -> list[Check]:
    here = ctx.rank == s.root
    if s.variant == "number":
        xs = [number_input(s, r) for r in s.ranks]
        mine = xs[ctx.group_rank(s)]
        got = finish(s, pd.reduce(mine, dst=s.root, op=s.op, group=ctx.group(s), async_op=s.async_op))
        return [("number on dst" if here else "own number elsewhere", got, reduced_numbers(xs, s.op) if here else mine)]
    shape = shape_for(numel_for(s.nbytes, s.dtype), random.Random(s.seed), min_dims=0)
    x = reduce_input(s, ctx.rank, 0, shape, s.dtype)
    out = pd.reduce(x, dst=s.root, op=s.op, group=ctx.group(s), async_op=s.async_op)
    want = reduced([reduce_input(s, r, 0, shape, s.dtype) for r in s.ranks], s.op) if here else \
        reduce_input(s, ctx.rank, 0, shape, s.dtype)  # fmt: skip  # regenerated: x may still be in use
    got = finish(s, out)
    return [("returns its input", got is x, True), ("result on dst" if here else "input untouched elsewhere", x, want)]


def do_reduce_scatter(s: Step, ctx: Ctx) -> list[Check]:
    common = random.Random(s.seed)
    shape = shape_for(numel_for(s.nbytes, s.dtype), common)
    x = reduce_input(s, ctx.rank, 0, shape, s.dtype)
    out = pd.reduce_scatter(x, op=s.op, group=ctx.group(s), async_op=s.async_op)
    total = reduced([reduce_input(s, r, 0, shape, s.dtype) for r in s.ranks], s.op)
    got = finish(s, out)
    chunk = torch.tensor_split(total, len(s.ranks))[ctx.group_rank(s)]
    return [("chunk", got, chunk), ("input untouched", x, reduce_input(s, ctx.rank, 0, shape, s.dtype))]


def do_broadcast(s: Step, ctx: Ctx) -> list[Check]:
    here = ctx.rank == s.root
    if s.variant == "value":
        sent = value(key(s, s.root), s.nbytes)
        mine = sent if here else None
        got = finish(s, pd.broadcast(mine, src=s.root, group=ctx.group(s), async_op=s.async_op))
        return [("value", got, sent)] + ([("src gets its value back", got is sent, True)] if here else [])
    shape = shape_for(numel_for(s.nbytes, s.dtype), random.Random(s.seed), min_dims=0)
    sent = bits_tensor(key(s, s.root), shape, s.dtype)
    if s.variant == "safe_mode":  # receivers pass None or a tensor of another shape and dtype
        mine = sent if here else random.Random(key(s, ctx.rank)).choice([None, torch.zeros(3, dtype=torch.int16)])
        got = finish(s, pd.broadcast(mine, src=s.root, group=ctx.group(s), safe_mode=True, async_op=s.async_op))
        return [("safe_mode tensor", got, sent)]
    mine = sent if here else bits_tensor(key(s, ctx.rank), shape, s.dtype)
    got = finish(s, pd.broadcast(mine, src=s.root, group=ctx.group(s), async_op=s.async_op))
    return [("returns its input", got is mine, True), ("tensor, in place", mine, sent)]


def _gathered(s: Step, ctx: Ctx, fn: Callable, **kw: Any) -> tuple[Any, Any]:
    """Call all_gather or gather with this rank's input; return (the result, what gathering every input gives)."""
    if s.variant == "value":
        inputs = [value(key(s, r), s.nbytes) for r in s.ranks]
    else:  # "uneven": concatenated along dim 0; "list": concat=False, any shapes
        inputs = [member_tensor(s, r, uneven=s.variant == "uneven") for r in s.ranks]
    concat = s.variant == "uneven"
    got = finish(s, fn(inputs[ctx.group_rank(s)], group=ctx.group(s), concat=concat, async_op=s.async_op, **kw))
    return got, torch.cat(inputs) if concat else inputs


def do_all_gather(s: Step, ctx: Ctx) -> list[Check]:
    if s.variant == "with_shapes":  # ignite's all_gather_tensors_with_shapes: every shape known in advance
        inputs = [member_tensor(s, r, uneven=False) for r in s.ranks]
        got = pd.all_gather_tensors_with_shapes(inputs[ctx.group_rank(s)], [t.shape for t in inputs], ctx.group(s))
        return [("gathered", got, inputs)]
    got, want = _gathered(s, ctx, pd.all_gather)
    return [("gathered", got, want)]


def do_gather(s: Step, ctx: Ctx) -> list[Check]:
    got, want = _gathered(s, ctx, pd.gather, dst=s.root)
    return [("gathered on dst", got, want) if ctx.rank == s.root else ("None elsewhere", got, None)]


def do_scatter(s: Step, ctx: Ctx) -> list[Check]:
    here = ctx.rank == s.root
    items = [item(s, s.root, r) for r in s.ranks] if here else None
    got = finish(s, pd.scatter(items, src=s.root, group=ctx.group(s), async_op=s.async_op))
    return [("item", got, item(s, s.root, ctx.rank))]


def do_all_to_all(s: Step, ctx: Ctx) -> list[Check]:
    mine = [item(s, ctx.rank, r) for r in s.ranks]
    got = finish(s, pd.all_to_all(mine, group=ctx.group(s), async_op=s.async_op))
    return [("items", got, [item(s, r, ctx.rank) for r in s.ranks])]


def do_barrier(s: Step, ctx: Ctx) -> list[Check]:
    return [("None", finish(s, pd.barrier(group=ctx.group(s), async_op=s.async_op)), None)]


def _p2p_payload(s: Step, sender: int) -> Any:
    if s.variant == "value":
        return value(key(s, sender), s.nbytes)
    shape = shape_for(numel_for(s.nbytes, s.dtype), random.Random(s.seed), min_dims=0)
    return bits_tensor(key(s, sender), shape, s.dtype)


def _receive_into(s: Step, sender: int) -> Optional[torch.Tensor]:
    if s.variant == "value":
        return None
    return torch.empty_like(_p2p_payload(s, sender))


def do_send_recv(s: Step, ctx: Ctx) -> list[Check]:
    """send/recv (isend/irecv when async), from root to peer; "exchange": both at once, each way (async)."""
    group, other = ctx.group(s), s.peer if ctx.rank == s.root else s.root
    if s.variant == "exchange":
        buf = _receive_into(s, other)
        receiving = pd.irecv(buf, src=other, group=group, tag=s.tag)
        sending = pd.isend(_p2p_payload(s, ctx.rank), dst=other, group=group, tag=s.tag)
        got = receiving.wait()
        checks = [("isend", sending.wait(), None), ("irecv", got, _p2p_payload(s, other))]
        return checks + ([("into", got is buf, True)] if buf is not None else [])
    if ctx.rank == s.root:
        payload = _p2p_payload(s, ctx.rank)
        if s.async_op:
            return [("isend", pd.isend(payload, dst=s.peer, group=group, tag=s.tag).wait(), None)]
        return [("send", pd.send(payload, dst=s.peer, group=group, tag=s.tag), None)]
    buf = _receive_into(s, s.root)
    if s.async_op:
        got = pd.irecv(buf, src=s.root, group=group, tag=s.tag).wait()
    else:
        got = pd.recv(buf, src=s.root, group=group, tag=s.tag)
    return [("received", got, _p2p_payload(s, s.root))] + ([("into", got is buf, True)] if buf is not None else [])


def do_in_flight(s: Step, ctx: Ctx) -> list[Check]:
    """Several async calls on one group issued back to back, then waited in a shuffled order."""
    common = random.Random(s.seed)
    calls, checks = [], []
    for i in range(int(s.variant)):
        op = common.choice(["SUM", "MAX", "XOR"])
        dtype = common.choice(REDUCE_DTYPES[op])
        shape = shape_for(numel_for(common.randint(1, s.nbytes), dtype), common, min_dims=0)
        sub = replace(s, op=op, dtype=dtype, seed=key(s, 99, i))
        what = common.choice(["all_reduce", "broadcast", "reduce"])
        x = reduce_input(sub, ctx.rank, 0, shape, dtype)
        if what == "all_reduce":
            work = pd.all_reduce(x, op=op, group=ctx.group(s), async_op=True)
            want = reduced([reduce_input(sub, r, 0, shape, dtype) for r in s.ranks], op)
        elif what == "reduce":
            work = pd.reduce(x, dst=s.root, op=op, group=ctx.group(s), async_op=True)
            want = reduced([reduce_input(sub, r, 0, shape, dtype) for r in s.ranks], op) if ctx.rank == s.root else \
                reduce_input(sub, ctx.rank, 0, shape, dtype)  # fmt: skip
        else:
            work = pd.broadcast(x, src=s.root, group=ctx.group(s), async_op=True)
            want = reduce_input(sub, s.root, 0, shape, dtype)
        calls.append((f"{what} #{i} ({op}, {str(dtype)[6:]})", work, x, want))
    for label, work, x, want in random.Random(s.seed + 1).sample(calls, len(calls)):
        checks += [(label + " returns its input", work.wait() is x, True), (label, x, want)]
    return checks


RUNNERS: dict[str, Callable[[Step, Ctx], list[Check]]] = {
    "all_reduce": do_all_reduce, "reduce": do_reduce, "reduce_scatter": do_reduce_scatter, "broadcast": do_broadcast,
    "all_gather": do_all_gather, "gather": do_gather, "scatter": do_scatter, "all_to_all": do_all_to_all,
    "barrier": do_barrier, "send_recv": do_send_recv, "in_flight": do_in_flight,
}  # fmt: skip


# ------------------------------------------------------------------ memory


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip


def _mallinfo2() -> Optional[Callable[[], MallInfo2]]:
    """glibc's ``mallinfo2`` (glibc >= 2.33), or None where there is none."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = MallInfo2
    return fn


MALLINFO2 = _mallinfo2()


def proc_status_kib() -> dict[str, int]:
    """VmRSS and VmHWM (the peak) of this process in KiB, from /proc/self/status (psutil where there is none)."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "VmHWM")))
        return {"rss": int(fields["VmRSS"].split()[0]), "peak": int(fields["VmHWM"].split()[0])}
    except OSError:
        import psutil

        rss = psutil.Process().memory_info().rss // 1024
        return {"rss": rss, "peak": rss}


def memory_snapshot() -> dict[str, int]:
    """This process's memory in KiB, after a garbage collection, taken between steps.

    rss, peak; ``malloc_used`` / ``malloc_free``: what glibc's malloc has handed out (heaps and mmapped chunks)
    / what it holds freed, not returned to the system; ``buffers`` (and ``buffer_count``): the storage of the
    tensors alive between steps, when the soak itself holds none: the buffers polydist keeps for reuse.
    """
    gc.collect()
    snap = proc_status_kib()
    if MALLINFO2 is not None:
        info = MALLINFO2()
        snap.update(malloc_used=(info.uordblks + info.hblkhd) // 1024, malloc_free=info.fordblks // 1024)
    storages = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor):  # not isinstance: it reads __class__, which warns on some objects
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    snap.update(buffers=sum(storages.values()) // 1024, buffer_count=len(storages))
    return snap


# ------------------------------------------------------------------ the run


@dataclass
class Tally:
    """What one rank saw."""

    calls: int = 0
    mismatches: int = 0
    first_mismatches: list = field(default_factory=list)  # the first 20, as dicts
    memory: dict = field(default_factory=dict)  # "start", "warm", "half", "end": memory_snapshot()
    rss_samples: list = field(default_factory=list)  # (step, VmRSS KiB), every tenth of the run


def check_step(s: Step, checks: list[Check], rank: int, tally: Tally, inject: Optional[int]) -> None:
    """Compare each result with what it must be; record (and print) the mismatches."""
    for what, got, expected in checks:
        if s.index == inject:
            expected = INJECTED
        if same(got, expected):
            continue
        tally.mismatches += 1
        entry = {"step": s.index, "op": s.label, "what": what, "rank": rank, "group": list(s.ranks),
                 "async": s.async_op, "dtype": str(s.dtype), "reduce_op": s.op, "nbytes": s.nbytes,
                 "got": shown(got), "expected": shown(expected)}  # fmt: skip
        if len(tally.first_mismatches) < 20:
            tally.first_mismatches.append(entry)
        print(f"MISMATCH step {s.index} {s.label} ({what}) on rank {rank}: {entry}", flush=True)


def run_step(s: Step, ctx: Ctx) -> list[Check]:
    """Make the call; name the step when it raises, then let the error end the job."""
    try:
        return RUNNERS[s.kind](s, ctx)
    except Exception:
        print(f"step {s.index} {s.label} on group {list(s.ranks)} raised on rank {ctx.rank}: {s}", file=sys.stderr)
        raise


def soak(args: argparse.Namespace, ctx: Ctx) -> tuple[list[Step], Tally, float]:
    """Run every step; return the steps, this rank's tally and the wall time (barrier to barrier)."""
    rng = random.Random(args.seed)
    steps = [draw_step(rng, i, ctx.world, args.max_bytes) for i in range(args.ops)]
    tally = Tally()
    tally.memory["start"] = memory_snapshot()
    marks = {max(1, int(args.ops * args.warmup_frac)): "warm", args.ops // 2: "half"}
    every = max(1, args.ops // 10)
    torch.distributed.barrier()  # raw, so the harness's timing does not rest on what it tests
    start = time.perf_counter()
    for s in steps:
        if s.index in marks:
            tally.memory[marks[s.index]] = memory_snapshot()
        if s.index % every == 0:
            rss = proc_status_kib()["rss"]
            tally.rss_samples.append((s.index, rss))
            _common.log(f"step {s.index}/{args.ops}: {time.perf_counter() - start:.1f} s, rank 0 RSS {rss / 1024:.1f} MiB, "
                        f"mismatches here so far {tally.mismatches}")  # fmt: skip
        if takes_part(s, ctx.rank):
            tally.calls += 1
            check_step(s, run_step(s, ctx), ctx.rank, tally, args.inject_mismatch)
    torch.distributed.barrier()
    wall = time.perf_counter() - start
    tally.memory["end"] = memory_snapshot()
    tally.rss_samples.append((args.ops, tally.memory["end"]["rss"]))
    for mark in ("warm", "half"):  # a run too short to reach them
        tally.memory.setdefault(mark, tally.memory["start"])
    return steps, tally, wall


# ------------------------------------------------------------------ the report (rank 0)


def kind_table(steps: list[Step], world: int) -> list[dict]:
    """One row per kind/variant: ops, async ones, ones on a subgroup, MiB drawn."""
    rows: dict[str, dict] = {}
    for s in steps:
        row = rows.setdefault(s.label, {"kind": s.label, "ops": 0, "async": 0, "subgroup": 0, "MiB": 0.0})
        row["ops"] += 1
        row["async"] += s.async_op or s.kind == "in_flight" or s.variant == "exchange"
        row["subgroup"] += len(s.ranks) < world
        row["MiB"] += s.nbytes / MiB
    return [rows[k] for k in sorted(rows)]


def op_counts(steps: list[Step]) -> dict[str, dict[str, int]]:
    """Reduce ops per reduction kind (in_flight calls not broken down)."""
    out: dict[str, Counter] = {}
    for s in steps:
        if s.kind in ("all_reduce", "reduce", "reduce_scatter"):
            out.setdefault(s.kind, Counter())[s.op] += 1
    return {k: dict(sorted(c.items())) for k, c in sorted(out.items())}


def rank_rows(tallies: list[dict]) -> list[dict]:
    """Per rank: calls, RSS (MiB) at the marks, growth after the warm-up and over the second half, and what grew."""
    rows = []
    for r, t in enumerate(tallies):
        m = t["memory"]
        warm, half, end = m["warm"], m["half"], m["end"]
        row = {"rank": r, "calls": t["calls"], "mismatches": t["mismatches"],
               **{f"rss_{k}_MiB": m[k]["rss"] / 1024 for k in ("start", "warm", "half", "end")},
               "growth_pct": 100.0 * (end["rss"] - warm["rss"]) / warm["rss"],
               "second_half_growth_pct": 100.0 * (end["rss"] - half["rss"]) / half["rss"], "peak_MiB": end["peak"] / 1024,
               "buffers_warm_MiB": warm["buffers"] / 1024, "buffers_end_MiB": end["buffers"] / 1024,
               "buffer_count_end": end["buffer_count"]}  # fmt: skip
        if "malloc_free" in end:
            row.update(malloc_free_warm_MiB=warm["malloc_free"] / 1024, malloc_free_end_MiB=end["malloc_free"] / 1024,
                       malloc_used_warm_MiB=warm["malloc_used"] / 1024, malloc_used_end_MiB=end["malloc_used"] / 1024)  # fmt: skip
        rows.append(row)
    return rows


def print_report(args: argparse.Namespace, kinds: list[dict], ops: dict, ranks: list[dict], wall: float,
                 mismatches: list[dict]) -> None:  # fmt: skip
    n = sum(k["ops"] for k in kinds)
    print(f"\n# soak: {n} ops on {len(ranks)} ranks, backend {pd.backend()}, seed {args.seed}, "
          f"sizes 1 B .. {args.max_bytes} B log-uniform", flush=True)  # fmt: skip
    print(f"{'kind/variant':<26}{'ops':>7}{'async':>7}{'subgrp':>8}{'MiB':>9}")
    for k in kinds:
        print(f"{k['kind']:<26}{k['ops']:>7}{k['async']:>7}{k['subgroup']:>8}{k['MiB']:>9.1f}")
    print(f"{'total':<26}{n:>7}{sum(k['async'] for k in kinds):>7}{sum(k['subgroup'] for k in kinds):>8}"
          f"{sum(k['MiB'] for k in kinds):>9.1f}")  # fmt: skip
    for kind, counts in ops.items():
        print(f"{kind} by op: " + ", ".join(f"{o} {c}" for o, c in counts.items()))
    print(f"\nwall time {wall:.1f} s ({1e3 * wall / max(1, n):.2f} ms per op)")
    print_memory(args, ranks)
    total = sum(r["mismatches"] for r in ranks)
    print(f"mismatches: {total}" + ("" if not total else "; first ones:"), flush=True)
    for m in mismatches[:10]:
        print(f"  step {m['step']} {m['op']} ({m['what']}) rank {m['rank']} group {m['group']}: "
              f"got {m['got']}, expected {m['expected']}")  # fmt: skip


def print_memory(args: argparse.Namespace, ranks: list[dict]) -> None:
    """RSS per rank, then where the growth after the warm-up went."""
    print(f"RSS per rank, MiB (warm = after {args.warmup_frac:.0%} of the ops, half = after 50 %):")
    print(f"{'rank':<6}{'calls':>7}{'start':>8}{'warm':>8}{'half':>8}{'end':>8}{'growth':>9}{'2nd half':>10}"
          f"{'peak':>8}{'mismatch':>10}")  # fmt: skip
    for r in ranks:
        print(f"{r['rank']:<6}{r['calls']:>7}{r['rss_start_MiB']:>8.1f}{r['rss_warm_MiB']:>8.1f}{r['rss_half_MiB']:>8.1f}"
              f"{r['rss_end_MiB']:>8.1f}{r['growth_pct']:>8.2f}%{r['second_half_growth_pct']:>9.2f}%{r['peak_MiB']:>8.1f}"
              f"{r['mismatches']:>10}")  # fmt: skip
    worst = max(r["growth_pct"] for r in ranks)
    print(f"RSS growth after warm-up: max {worst:.2f} % ({'within' if worst < 5 else 'OVER'} the 5 % target)")
    if "malloc_free_end_MiB" not in ranks[0]:
        return
    print("where it went, MiB, warm -> end: freed memory malloc keeps | kept buffers (tensors alive between steps) | "
          "the rest of malloc's memory in use")  # fmt: skip
    for r in ranks:
        rest_warm = r["malloc_used_warm_MiB"] - r["buffers_warm_MiB"]
        rest_end = r["malloc_used_end_MiB"] - r["buffers_end_MiB"]
        print(f"  rank {r['rank']}: {r['malloc_free_warm_MiB']:.1f} -> {r['malloc_free_end_MiB']:.1f} | "
              f"{r['buffers_warm_MiB']:.1f} -> {r['buffers_end_MiB']:.1f} ({r['buffer_count_end']} tensors) | "
              f"{rest_warm:.1f} -> {rest_end:.1f}")  # fmt: skip


def write_json(path: str, args: argparse.Namespace, kinds: list[dict], ops: dict, ranks: list[dict], wall: float,
               mismatches: list[dict], tallies: list[dict]) -> None:  # fmt: skip
    meta = run_metadata(ops=args.ops, seed=args.seed, max_bytes=args.max_bytes, warmup_frac=args.warmup_frac,
                        subgroups=[list(g) for g in SUBGROUPS])  # fmt: skip
    doc = {"meta": meta, "wall_s": wall, "ok": not any(r["mismatches"] for r in ranks),
           "max_rss_growth_pct": max(r["growth_pct"] for r in ranks), "kinds": kinds, "reduce_ops": ops,
           "ranks": ranks, "memory_kib": [t["memory"] for t in tallies],
           "rss_samples_kib": [t["rss_samples"] for t in tallies], "mismatches": mismatches}  # fmt: skip
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}", flush=True)


# ------------------------------------------------------------------ main


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", type=int, default=10000, help="steps in the sequence (default 10000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shared sequence (default 0)")
    p.add_argument("--max-bytes", type=int, default=MiB, help="largest size drawn (default 1 MiB)")
    p.add_argument("--warmup-frac", type=float, default=0.1, help="measure RSS growth from this fraction of the ops")
    p.add_argument("--json", default=None, metavar="PATH", help="write the report here (rank 0)")
    p.add_argument("--backend", default=None, help="when polydist run sets none (default gloo on CPU)")
    p.add_argument("--inject-mismatch", type=int, default=None, metavar="STEP", help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    _common.setup(args)
    if pd.get_world_size() < 2:
        raise SystemExit("soak.py needs at least 2 ranks: polydist run --nproc-per-node 3 benchmarks/soak.py")
    ctx = Ctx(pd.get_rank(), pd.get_world_size())
    steps, tally, wall = soak(args, ctx)
    tallies = pd.gather(asdict(tally), dst=0)  # every rank's numbers and first mismatches, onto rank 0
    total = pd.all_reduce(tally.mismatches)
    if ctx.rank == 0:
        kinds, ops, ranks = kind_table(steps, ctx.world), op_counts(steps), rank_rows(tallies)
        mismatches = sorted((m for t in tallies for m in t["first_mismatches"]), key=lambda m: (m["step"], m["rank"]))
        print_report(args, kinds, ops, ranks, wall, mismatches)
        if args.json:
            write_json(args.json, args, kinds, ops, ranks, wall, mismatches, tallies)
    pd.finalize()
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
