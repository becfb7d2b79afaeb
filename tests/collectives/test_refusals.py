"""Every value the encoder refuses on one rank is an error on every rank of the call, and the group stays usable.

Property tests (Hypothesis) on shared 3-rank worlds, gloo and MPI: a random
rank passes a value the codec refuses (nesting past its depth limit, a lone
surrogate that UTF-8 cannot encode, a type it does not take) at a random step
of a random value collective or point-to-point pair; every rank of the call
raises, naming the refusing rank and the reason, and the call after it is
correct. ``_refusal`` runs on every rank (see _world.py).
"""

import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import polydist as pd

pytestmark = pytest.mark.timeout(240)

CALLS = ["broadcast", "all_gather", "gather", "scatter", "all_to_all", "send"]
KINDS = ["depth", "surrogate", "type"]


def _bad(kind):
    if kind == "depth":
        x = 1
        for _ in range(2000):  # beyond the codec's 1024 levels
            x = [x]
        return x
    if kind == "surrogate":
        return "\udc80"  # a lone surrogate: not UTF-8 encodable
    return object()


# (the exception the refusing rank raises itself, what the others' message says the reason was)
_REASON = {"depth": (ValueError, "nested deeper"), "surrogate": (UnicodeEncodeError, "surrogates not allowed"),
           "type": (TypeError, "cannot encode an object of type builtins.object")}


def good(rank, i):
    """What rank ``rank`` passes as item ``i`` when nothing is refused (non-ASCII text too)."""
    return {"from": rank, "to": i, "text": "é" * (rank + 1)}


def _call(name, r, n, bad_rank, root, value_of):
    """One call of ``name``; ``value_of(rank, i)`` is what rank ``rank`` passes (as item ``i`` of a list)."""
    if name == "broadcast":
        return pd.broadcast(value_of(r, 0) if r == root else None, src=root, safe_mode=True)
    if name == "all_gather":
        return pd.all_gather(value_of(r, 0))
    if name == "gather":
        return pd.gather(value_of(r, 0), dst=root)
    if name == "scatter":
        return pd.scatter([value_of(r, i) for i in range(n)] if r == root else None, src=root)
    if name == "all_to_all":
        return pd.all_to_all([value_of(r, i) for i in range(n)])
    peer = (bad_rank + 1) % n  # send: bad_rank sends to the next rank; the third rank takes no part
    if r == bad_rank:
        return pd.send(value_of(r, 0), dst=peer)
    if r == peer:
        return pd.recv(None, src=bad_rank)
    return None


def _refusal(name, kind, bad_rank, step, item):
    r, n = pd.get_rank(), pd.get_world_size()
    root = bad_rank  # a root-only value (broadcast, scatter) is refused on the root

    for _ in range(step):  # the random step: good calls before the refused one
        _call(name, r, n, bad_rank, root, good)

    def refused(rank, i):
        return _bad(kind) if rank == bad_rank and i == item else good(rank, i)

    started, error = time.monotonic(), None
    try:
        _call(name, r, n, bad_rank, root, refused)
    except Exception as exc:  # noqa: BLE001 - the test checks the exact type
        error = (type(exc), str(exc))
    elapsed = time.monotonic() - started
    return r, error, elapsed, _call(name, r, n, bad_rank, root, good)


def _expected_after(name, r, n, bad_rank, root):
    if name == "broadcast":
        return good(root, 0)
    if name == "all_gather":
        return [good(k, 0) for k in range(n)]
    if name == "gather":
        return [good(k, 0) for k in range(n)] if r == root else None
    if name == "scatter":
        return good(root, r)
    if name == "all_to_all":
        return [good(k, r) for k in range(n)]
    return good(bad_rank, 0) if r == (bad_rank + 1) % n else None


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(CALLS), kind=st.sampled_from(KINDS), bad_rank=st.integers(0, 2),
       step=st.integers(0, 2), item=st.integers(0, 2))
def test_a_refused_value_is_an_error_on_every_rank_then_the_group_works(
    world3, backend_kind, name, kind, bad_rank, step, item
):
    assume(not (name == "send" and backend_kind == "horovod"))  # Horovod has no point-to-point
    if name in ("broadcast", "all_gather", "gather", "send"):
        item = 0  # one value per rank: item 0 is the value
    own_type, reason = _REASON[kind]
    involved = {bad_rank, (bad_rank + 1) % 3} if name == "send" else {0, 1, 2}
    for r, error, elapsed, after in world3.run(_refusal, name, kind, bad_rank, step, item):
        assert after == _expected_after(name, r, 3, bad_rank, bad_rank), (r, after)
        if r not in involved:
            assert error is None
            continue
        assert error is not None, f"rank {r} did not raise ({name}, {kind}, refused on rank {bad_rank})"
        kind_raised, message = error
        assert elapsed < 10, f"rank {r} took {elapsed:.1f} s to learn of the refusal"
        assert reason in message, (r, message)
        if r == bad_rank:
            assert kind_raised is own_type, (r, error)
        else:
            assert kind_raised is (TypeError if own_type is TypeError else ValueError), (r, error)
            assert f"rank {bad_rank}" in message, (r, message)


def _quantized_header(how):
    """A tensor whose dtype has no wire code (quantized: its scale would be lost) announced by rank 0's header."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)
    r = pd.get_rank()
    try:
        if how == "broadcast":
            pd.broadcast(q if r == 0 else None, src=0, safe_mode=True)
        else:
            with pd.set_debug(True):  # debug mode sends the tensor's header first
                pd.send(q, dst=1) if r == 0 else pd.recv(torch.ones(2), src=0)
        error = None
    except TypeError as exc:
        error = str(exc)
    return error, pd.all_reduce(r + 1)


@pytest.mark.parametrize("how", ["broadcast", pytest.param("send", marks=pytest.mark.p2p)])
def test_a_tensor_without_a_header_is_an_error_on_every_rank(world2, how):
    for error, after in world2.run(_quantized_header, how):
        assert error is not None and "qint8" in error, error
        assert after == 3
