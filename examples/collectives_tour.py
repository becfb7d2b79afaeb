"""A tour of every collective of the classic tutorials, run through polydist, that checks its own results.

Each section replays the examples of one primitive from those tutorials, in their
order — point-to-point (blocking ``send``/``recv``, then ``isend``/``irecv``),
``all_reduce``, ``reduce``, ``broadcast``, ``all_gather``, ``gather``,
``scatter``, ``reduce_scatter``, ``all_to_all``, ``barrier``, groups
(``new_group`` and rank lists), and finally ignite.distributed's value
examples (numbers, floats, strings). Every rank's results are labelled with
its rank; at the end of each section rank 0 gathers and prints them in rank
order (``--no-collect``: each rank prints its own)::

    rank 2: reduce(ones(1), dst=0) -> tensor([1.])   (untouched off dst)

Lines marked ``[polydist]`` show what polydist adds to torch.distributed:
tensors of different shapes per rank, Python values in scatter/all_to_all/
send/recv, results returned instead of filled-in lists, ``Work.wait()``
returning the result, reduce leaving non-root inputs untouched.

The expected results are generalized from the tutorials' 4-rank outputs to any
world size n (e.g. all_reduce of ``rank + 1`` gives n(n+1)/2, 10 for n=4).
A wrong result is printed with ``<-- WRONG, expected ...``; at the end the
ranks add up their failures and all exit 1 if there was any, 0 otherwise.

Sources: PyTorch-Ignite's "Collective Communication with Ignite" and PyTorch's
"Writing Distributed Applications" (send/recv, isend/irecv, the all_reduce,
broadcast, scatter and gather of ``rank + 1``, async all_reduce,
``new_group([0, 1])``).

Run it with any world size n >= 2 (4 reproduces the tutorials' printed outputs)::

    polydist run --nproc-per-node 4 --backend gloo examples/collectives_tour.py
    torchrun --nproc-per-node 4 examples/collectives_tour.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from typing import Any, Callable, Optional, Sequence

import torch

import polydist as pdist

_NO_CHECK = object()


class Tour:
    """Prints labelled per-rank results section by section and counts the wrong ones."""

    def __init__(self, collect: bool = True) -> None:
        self.collect = collect
        self.rank = pdist.get_rank()
        self.n = pdist.get_world_size()
        self.failures = 0
        self.lines: list[str] = []

    # -------------------------------------------------------- output

    def section(self, title: str) -> None:
        """Start a section: every rank flushes the previous one, rank 0 prints the title."""
        self.flush()
        if self.rank == 0:
            print(f"\n== {title} ==", flush=True)
        pdist.barrier()

    def show(self, label: str, got: Any, expected: Any = _NO_CHECK, note: str = "") -> Any:
        """Record ``rank r: label -> got``; compare with ``expected`` unless it is omitted."""
        line = f"rank {self.rank}: {label} -> {_fmt(got)}"
        if note:
            line += f"   ({note})"
        if expected is not _NO_CHECK and not _same(got, expected):
            self.failures += 1
            line += f"   <-- WRONG, expected {_fmt(expected)}"
        self.lines.append(line)
        return got

    def flush(self) -> None:
        """Print this section's lines of every rank, in rank order.

        By default rank 0 gathers them (a ``gather`` of lists of strings) and
        prints them all: the launcher reads each rank's output on its own, so
        lines printed by different ranks interleave unpredictably, barrier or
        not. With ``collect=False`` each rank prints its own lines in turn.
        """
        if self.collect:
            everyone = pdist.gather(self.lines, dst=0)
            if self.rank == 0 and any(everyone):
                print("\n".join(line for lines in everyone for line in lines), flush=True)
        else:
            for r in range(self.n):
                if r == self.rank and self.lines:
                    print("\n".join(self.lines), flush=True)
                pdist.barrier()
        self.lines = []


def _fmt(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return " ".join(repr(x).split())  # one line
    if isinstance(x, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in x):
        inner = ", ".join(_fmt(t) for t in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner})"
    return repr(x)


def _same(a: Any, b: Any) -> bool:
    """Equality that also compares tensors (dtype, shape, values) and containers of them."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a.cpu(), b.cpu()))
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def f32(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


# ------------------------------------------------------------ sections


def point_to_point(t: Tour) -> None:
    r, n = t.rank, t.n
    t.section("point-to-point, blocking: send / recv")
    # PyTorch's tutorial: rank 0 increments a zero tensor and sends it; the receiver
    # allocated its own tensor. With n > 2, rank 0 sends to every other rank.
    tensor = torch.zeros(1)
    if r == 0:
        tensor += 1
        for dst in range(1, n):
            pdist.send(tensor, dst=dst)
        t.show(f"send(zeros(1) + 1, dst=1..{n - 1})", tensor, f32(1.0))
    else:
        pdist.recv(tensor, src=0)
        t.show("recv(zeros(1), src=0)", tensor, f32(1.0))

    # [polydist] a Python value: recv(None, src) returns it, no buffer to preallocate.
    if r == 0:
        for dst in range(1, n):
            pdist.send({"to": dst, "msg": "hello", "shape": (2, 3), "weights": torch.arange(3)}, dst=dst)
        t.show(f"[polydist] send(dict, dst=1..{n - 1})", "sent")
    else:
        got = pdist.recv(None, src=0)
        want = {"to": r, "msg": "hello", "shape": (2, 3), "weights": torch.arange(3)}
        t.show("[polydist] recv(None, src=0)", got, want)

    t.section("point-to-point, non-blocking: isend / irecv + wait()")
    tensor = torch.zeros(1)
    if r == 0:
        tensor += 1
        reqs = [pdist.isend(tensor, dst=dst) for dst in range(1, n)]
        for req in reqs:
            req.wait()  # do not write to tensor before this
        t.show(f"isend(zeros(1) + 1, dst=1..{n - 1}).wait()", tensor, f32(1.0))
    else:
        req = pdist.irecv(tensor, src=0)
        got = req.wait()  # do not read tensor before this; polydist's wait() returns it
        t.show("irecv(zeros(1), src=0).wait()", tensor, f32(1.0))
        t.show("[polydist] irecv(...).wait() returns the filled tensor", got is tensor, True)

    # A ring of isend/recv pairs (the pattern of PyTorch's ring all-reduce tutorial): every
    # rank sends its rank to the right neighbour and receives the left one's.
    right, left = (r + 1) % n, (r - 1) % n
    send_buf, recv_buf = f32(float(r)), torch.zeros(1)
    req = pdist.isend(send_buf, dst=right)
    pdist.recv(recv_buf, src=left)
    req.wait()
    t.show(f"ring: isend(tensor([{r}.]), dst={right}); recv(src={left})", recv_buf, f32(float(left)))


def all_reduce(t: Tour) -> None:
    r, n = t.rank, t.n
    t.section("all_reduce")
    # The classic example: ones on every rank, SUM -> n everywhere.
    t.show("all_reduce(ones(1), op=SUM)", pdist.all_reduce(torch.ones(1), op="SUM"), f32(float(n)))
    # The classic example: rank + 1 -> 1 + 2 + ... + n (10 for 4 ranks).
    tensor = f32(r + 1.0)
    pdist.all_reduce(tensor, op="SUM")
    t.show(f"all_reduce(tensor([{r + 1}.]), op=SUM)", tensor, f32(n * (n + 1) / 2))
    # ignite's example: arange(2) + 1 + 2 * rank, int64 -> [n^2, n^2 + n] ([9, 12] for 3 ranks).
    tensor = torch.arange(2, dtype=torch.int64) + 1 + 2 * r
    shown = f"all_reduce({tensor.tolist()}, op='SUM')"
    t.show(shown, pdist.all_reduce(tensor, op="SUM"), torch.tensor([n * n, n * n + n]))
    # The other ops: PRODUCT, MAX and MIN.
    t.show(f"all_reduce(tensor([{r + 1}.]), op=PRODUCT)", pdist.all_reduce(f32(r + 1.0), op="PRODUCT"),
           f32(float(torch.arange(1, n + 1).prod())))
    t.show(f"all_reduce(tensor([{r}.]), op=MAX)", pdist.all_reduce(f32(float(r)), op="MAX"), f32(n - 1.0))
    t.show(f"all_reduce(tensor([{r}.]), op=MIN)", pdist.all_reduce(f32(float(r)), op="MIN"), f32(0.0))
    # The classic example: non-blocking all_reduce of ones * rank.
    tensor = torch.ones(1) * r
    work = pdist.all_reduce(tensor, op="SUM", async_op=True)
    # ... other computations could run here ...
    got = work.wait()
    t.show(f"all_reduce(ones(1) * {r}, async_op=True).wait()", tensor, f32(n * (n - 1) / 2))
    t.show("[polydist] async wait() returns the reduced tensor", got is tensor, True)
    # [polydist] AVG on gloo (which has no native AVG) and a list of tensors in one coalesced call.
    t.show(f"[polydist] all_reduce(tensor([{r}.]), op=AVG)", pdist.all_reduce(f32(float(r)), op="AVG"),
           f32((n - 1) / 2))
    grads = [torch.full((2,), float(r)), torch.full((3,), 1.0)]
    pdist.all_reduce(grads)
    t.show("[polydist] all_reduce([full((2,), rank), ones(3)]) (coalesced)", grads,
           [torch.full((2,), n * (n - 1) / 2), torch.full((3,), float(n))])


def reduce(t: Tour) -> None:
    r, n = t.rank, t.n
    t.section("reduce")
    tensor = torch.ones(1)
    pdist.reduce(tensor, dst=0, op="SUM")
    if r == 0:
        t.show("reduce(ones(1), dst=0)", tensor, f32(float(n)), note="only rank 0 has the sum")
    else:
        # Plain gloo prints partial sums (3, 2, 1) here: gloo's reduce overwrites
        # non-root inputs. polydist leaves them untouched.
        t.show("reduce(ones(1), dst=0)", tensor, f32(1.0), note="[polydist] input untouched off dst")
    dst = n - 1
    got = pdist.reduce(f32(float(r)), dst=dst, op="MAX")
    t.show(f"reduce(tensor([{r}.]), dst={dst}, op=MAX)", got, f32(float(n - 1) if r == dst else float(r)))


def broadcast(t: Tour) -> None:
    r, n = t.rank, t.n
    t.section("broadcast")
    # The classic example: rank 0 holds tensor([0.]), the others torch.empty(1).
    tensor = f32(float(r)) if r == 0 else torch.empty(1)
    pdist.broadcast(tensor, src=0)
    t.show("broadcast(tensor([0.]) on rank 0 / empty(1), src=0)", tensor, f32(0.0))
    # The classic example: zeros(1), + 1 on rank 0.
    tensor = torch.zeros(1)
    if r == 0:
        tensor += 1
    pdist.broadcast(tensor, src=0)
    t.show("broadcast(zeros(1) (+1 on rank 0), src=0)", tensor, f32(1.0))
    # [polydist] safe_mode: non-source ranks pass None and get a new tensor of src's shape.
    src = n - 1
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3) if r == src else None
    got = pdist.broadcast(x, src=src, safe_mode=True)
    t.show(f"[polydist] broadcast({'arange(6).reshape(2, 3)' if r == src else 'None'}, src={src}, safe_mode=True)",
           got, torch.arange(6, dtype=torch.float64).reshape(2, 3))


def all_gather(t: Tour) -> None:
    r, n = t.rank, t.n
    everyone = f32(*map(float, range(n)))
    t.section("all_gather")
    # The classic example: tensor([rank]) -> [0, 1, ..., n-1] on every rank. polydist returns the
    # result (concatenated along dim 0) instead of filling a preallocated list.
    t.show(f"all_gather(tensor([{r}.]))", pdist.all_gather(f32(float(r))), everyone)
    t.show(f"all_gather(tensor([{r}.]), concat=False)", pdist.all_gather(f32(float(r)), concat=False),
           [f32(float(i)) for i in range(n)])
    # [polydist] different shapes per rank: rank r contributes r + 1 rows.
    mine = torch.full((r + 1, 2), r, dtype=torch.int64)
    want = torch.cat([torch.full((i + 1, 2), i, dtype=torch.int64) for i in range(n)])
    got = pdist.all_gather(mine)
    t.show(f"[polydist] all_gather(full(({r + 1}, 2), {r})).shape (uneven)", tuple(got.shape), tuple(want.shape))
    t.show("[polydist] ... values equal to concatenating every rank's", _same(got, want), True)
    got = pdist.all_gather(torch.arange(r + 1), concat=False)
    t.show(f"[polydist] all_gather(arange({r + 1}), concat=False)", got, [torch.arange(i + 1) for i in range(n)])


def gather(t: Tour) -> None:
    r, n = t.rank, t.n
    t.section("gather")
    # The classic example: tensor([rank]) to dst 0 -> [0, ..., n-1] there, None elsewhere.
    got = pdist.gather(f32(float(r)), dst=0)
    t.show(f"gather(tensor([{r}.]), dst=0)", got, f32(*map(float, range(n))) if r == 0 else None)
    # The classic example: rank + 1.0 -> [1.0, ..., n] on rank 0, as a list.
    got = pdist.gather(f32(r + 1.0), dst=0, concat=False)
    t.show(f"gather(tensor([{r + 1}.]), dst=0, concat=False)", got,
           [f32(i + 1.0) for i in range(n)] if r == 0 else None)
    # [polydist] values and uneven shapes, to another root.
    dst = n - 1
    got = pdist.gather(f"rank {r} was here", dst=dst)
    t.show(f"[polydist] gather('rank {r} was here', dst={dst})", got,
           [f"rank {i} was here" for i in range(n)] if r == dst else None)


def scatter(t: Tour) -> None:
    r, n = t.rank, t.n
    t.section("scatter")
    # The classic example: [1, 2, ..., n] on rank 0 -> rank + 1; the others pass None (no receive buffer).
    xs = [f32(i + 1.0) for i in range(n)] if r == 0 else None
    label = f"[tensor([1.]), ..., tensor([{n}.])]" if r == 0 else "None"
    t.show(f"scatter({label}, src=0)", pdist.scatter(xs, src=0), f32(r + 1.0))
    # [polydist] a different shape for each rank, and Python values.
    xs = [torch.arange(i + 1) for i in range(n)] if r == 0 else None
    t.show("[polydist] scatter([arange(1), ..., arange(n)], src=0)", pdist.scatter(xs, src=0), torch.arange(r + 1))
    src = n - 1
    xs = [{"rank": i, "task": f"part {i} of {n}"} for i in range(n)] if r == src else None
    t.show(f"[polydist] scatter([dict per rank], src={src})", pdist.scatter(xs, src=src),
           {"rank": r, "task": f"part {r} of {n}"})


def reduce_scatter(t: Tour) -> None:
    r, n = t.rank, t.n
    t.section("reduce_scatter (as torch.distributed.reduce_scatter_tensor)")
    # Every rank holds arange(2n) + rank; rank i gets chunk i of the sum, rows 2i and 2i+1.
    x = torch.arange(2 * n, dtype=torch.float32) + r
    total = torch.arange(2 * n, dtype=torch.float32) * n + n * (n - 1) / 2
    t.show(f"reduce_scatter(arange({2 * n}) + {r})", pdist.reduce_scatter(x), total[2 * r : 2 * r + 2])
    # [polydist] a length that does not divide: torch.tensor_split's chunks.
    x = torch.ones(2 * n + 1, dtype=torch.int64)
    want = torch.tensor_split(torch.full((2 * n + 1,), n, dtype=torch.int64), n)[r]
    t.show(f"[polydist] reduce_scatter(ones({2 * n + 1})) (uneven chunks)", pdist.reduce_scatter(x), want)


def all_to_all(t: Tour) -> None:
    r, n = t.rank, t.n
    t.section("all_to_all (as torch.distributed.all_to_all)")
    # xs[i] goes to rank i: rank r sends 10r + i to rank i, receives 10j + r from rank j.
    xs = [torch.tensor([10 * r + i]) for i in range(n)]
    t.show(f"all_to_all([tensor([{10 * r}]), ..., tensor([{10 * r + n - 1}])])", pdist.all_to_all(xs),
           [torch.tensor([10 * j + r]) for j in range(n)])
    # [polydist] shapes that differ per destination, and Python values.
    xs = [torch.full((i + 1,), r) for i in range(n)]
    t.show(f"[polydist] all_to_all([full((i + 1,), {r}) for i])", pdist.all_to_all(xs),
           [torch.full((r + 1,), j) for j in range(n)])
    xs = [f"{r}->{i}" for i in range(n)]
    t.show(f"[polydist] all_to_all(['{r}->0', ..., '{r}->{n - 1}'])", pdist.all_to_all(xs),
           [f"{j}->{r}" for j in range(n)])


def barrier(t: Tour) -> None:
    r = t.rank
    t.section("barrier (the main process prepares data first, the others wait)")
    # One file per job and node; rank 0 chooses the name and broadcasts it (a string).
    token = pdist.broadcast(uuid.uuid4().hex if r == 0 else None, src=0)
    path = os.path.join(tempfile.gettempdir(), f"polydist-tour-{token}.txt")
    local = pdist.get_local_rank()
    if local > 0:
        pdist.barrier()  # wait until local rank 0 has "downloaded" the data
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write("dataset downloaded by local rank 0")
    with open(path, encoding="utf-8") as f:
        data = f.read()
    if local == 0:
        pdist.barrier()  # let the others in
    t.show(f"barrier(); read the data of local rank 0 (local rank {local})", data,
           "dataset downloaded by local rank 0")
    pdist.barrier()  # everyone has read it
    if local == 0:
        os.remove(path)
    work = pdist.barrier(async_op=True)
    t.show("barrier(async_op=True).wait()", work.wait(), None)


def groups(t: Tour) -> None:
    r, n = t.rank, t.n
    t.section("groups: new_group and rank lists")
    # PyTorch's tutorial: new_group([0, 1]); all_reduce of ones inside it -> 2 on ranks 0 and 1.
    # polydist: here only the members create and use it (with torch's rules every rank may call
    # new_group([0, 1]); the others get GroupMember.NON_GROUP_MEMBER).
    # [polydist] groups are named from their ranks alone, so a group that only
    # some ranks created does not upset the ones created after it (torch's own
    # use_local_synchronization naming hangs there, pytorch/pytorch#189073).
    if r in (0, 1):
        group = pdist.new_group([0, 1])
        t.show("all_reduce(ones(1), group=new_group([0, 1]))", pdist.all_reduce(torch.ones(1), group=group),
               f32(2.0))
        t.show("[polydist] new_group([1, 0]) again is the same cached group", pdist.new_group([1, 0]) is group, True)
    else:
        t.show("all_reduce(..., group=new_group([0, 1]))", "skipped: not a member")
    # A common form: new_group(list(range(size))) everywhere: the same ranks as the world.
    group = pdist.new_group(list(range(n)))
    t.show("reduce(ones(1), dst=0, group=new_group(range(n)))", pdist.reduce(torch.ones(1), dst=0, group=group),
           f32(float(n) if r == 0 else 1.0))
    # [polydist] a rank list as `group`: even and odd ranks reduce separately;
    # src/dst are global ranks.
    members = list(range(r % 2, n, 2))
    got = pdist.all_reduce(f32(float(r)), group=members)
    t.show(f"[polydist] all_reduce(tensor([{r}.]), group={members})", got, f32(float(sum(members))))
    src = members[-1]
    got = pdist.broadcast(f"from global rank {src}" if r == src else None, src=src, group=members)
    t.show(f"[polydist] broadcast(str, src={src}, group={members})", got, f"from global rank {src}")


def idist_values(t: Tour) -> None:
    r, n = t.rank, t.n
    t.section("ignite.distributed value examples, as `import polydist as idist`")
    idist = pdist
    # Numbers: all_reduce of a Python int stays an exact int.
    t.show(f"all_reduce({r + 1})", idist.all_reduce(r + 1), n * (n + 1) // 2)
    # all_gather of floats: num = 2.0 * rank.
    num = 2.0 * idist.get_rank()
    t.show(f"all_gather({num})", idist.all_gather(num), [2.0 * i for i in range(n)])
    # broadcast of a string.
    message = f"hello from rank {idist.get_rank()}"
    t.show(f"broadcast({message!r}, src=0)", idist.broadcast(message, src=0), "hello from rank 0")
    # compute_metric: all_gather the predictions, compute on rank 0, broadcast the result.
    predictions = torch.tensor([r % 2, 1])
    targets = torch.tensor([1, 1])
    predictions, targets = idist.all_gather(predictions), idist.all_gather(targets)
    result = 0.0
    if idist.get_rank() == 0:
        result = (predictions == targets).sum().item() / targets.numel()
    result = idist.broadcast(result, src=0)
    t.show("compute_metric: accuracy via all_gather + broadcast(result, src=0)", result,
           (n + n // 2) / (2 * n))
    # [polydist] where idist gets it wrong: non-ASCII strings, numbers through float32.
    t.show("[polydist] broadcast('naïve café, 東京 ✓', src=0)",
           idist.broadcast("naïve café, 東京 ✓" if r == 0 else None, src=0), "naïve café, 東京 ✓")
    t.show("[polydist] broadcast(16777217, src=0) (idist: 16777216.0)",
           idist.broadcast(16777217 if r == 0 else 0, src=0), 16777217)
    t.show(f"[polydist] all_gather({'{'}'rank': {r}{'}'})", idist.all_gather({"rank": r}),
           [{"rank": i} for i in range(n)])


SECTIONS: Sequence[Callable[[Tour], None]] = (
    point_to_point,
    all_reduce,
    reduce,
    broadcast,
    all_gather,
    gather,
    scatter,
    reduce_scatter,
    all_to_all,
    barrier,
    groups,
    idist_values,
)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--backend", default=None, help="if the launcher did not set one (default: gloo on CPU)")
    parser.add_argument("--no-collect", action="store_true",
                        help="each rank prints its own lines (interleaved by the launcher) instead of rank 0 all")
    args = parser.parse_args(argv)
    pdist.initialize(args.backend)
    n = pdist.get_world_size()
    if n < 2:
        print("collectives_tour needs at least 2 ranks, e.g.: polydist run --nproc-per-node 4 "
              "examples/collectives_tour.py", file=sys.stderr)
        pdist.finalize()
        return 2
    tour = Tour(collect=not args.no_collect)
    if tour.rank == 0:
        print(f"collectives tour: world size {n}, backend {pdist.backend()}", flush=True)
    for section in SECTIONS:
        section(tour)
    tour.flush()
    failures = pdist.all_reduce(tour.failures)  # every rank learns the total and exits alike
    if tour.rank == 0:
        if failures:
            print(f"\nFAILED: {failures} wrong result(s) over {n} ranks (see the lines marked WRONG)", flush=True)
        else:
            print(f"\nall results as expected on {n} ranks", flush=True)
    pdist.barrier()  # no rank exits (and gets the job stopped) before rank 0 has printed the verdict
    pdist.finalize()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
