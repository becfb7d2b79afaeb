"""FSDP2 under --fault-tolerant (polydist.backends.torchft.sharded), one process: the averaging of the gradient
shards across replica groups and the checks on a live state received. Whole HSDP jobs that lose a rank:
tests/launch/test_fault_tolerant.py."""

import pytest
import torch

pytest.importorskip("torchft", reason="torchft is not installed: pip install 'polydist[ft]'")

from polydist.backends.torchft import sharded  # noqa: E402
from _fakes import _Manager, _Summing  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def _params(*grads):
    params = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros(3))
        p.grad = None if g is None else torch.tensor(g, dtype=torch.float32)
        params.append(p)
    return params


def test_gradients_are_averaged_in_one_all_reduce_per_dtype():
    def others(buffer):  # the other replica group's gradients: 2 everywhere, and its flags set
        return torch.cat([torch.full((buffer.numel() - 2,), 2.0), torch.ones(2)]) if buffer.numel() == 8 else \
            torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)

    group = _Summing(others)
    a, b = _params([0.0, 2.0, 4.0], [6.0, 6.0, 6.0])
    extra = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    extra.grad = torch.tensor([1.0, 3.0], dtype=torch.float64)
    sharded.average_gradients(_Manager(group, participants=2), [a, b, extra])
    assert a.grad.tolist() == [1.0, 2.0, 3.0] and b.grad.tolist() == [4.0, 4.0, 4.0]
    assert extra.grad.tolist() == [1.0, 2.0] and extra.grad.dtype == torch.float64
    assert [t.dtype for t in group.sent] == [torch.float32, torch.float64]


def test_a_parameter_without_a_gradient_here_gets_the_others_and_one_nobody_had_keeps_none():
    # the other replica group had a gradient for the first parameter only
    group = _Summing(lambda buffer: torch.tensor([4.0, 4.0, 4.0, 0.0, 0.0, 0.0, 1.0, 0.0]))
    a, b = _params(None, None)
    sharded.average_gradients(_Manager(group, participants=2), [a, b])
    assert group.sent[0].tolist() == [0.0] * 8  # zeros and no flags from this replica group
    assert a.grad.tolist() == [2.0, 2.0, 2.0] and b.grad is None


def test_a_failed_all_reduce_leaves_the_gradients_and_reports_the_error():
    manager = _Manager(_Summing(error=RuntimeError("Connection closed by peer")))
    (a,) = _params([1.0, 2.0, 3.0])
    sharded.average_gradients(manager, [a])
    assert a.grad.tolist() == [1.0, 2.0, 3.0]
    assert [str(e) for e in manager.reported] == ["Connection closed by peer"]


def test_the_model_state_is_its_tensors_and_a_state_that_does_not_fit_is_refused():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    state, load = sharded.model_state(model)
    sent = {name: torch.full_like(t, 7.0) for name, t in state().items()}
    assert set(sent) == set(model.state_dict())
    load(sent)
    assert model[0].weight.eq(7.0).all() and model[1].running_mean.eq(7.0).all()
    with pytest.raises(ValueError, match=r"gives '0.bias' as \(4,\), this rank's shard is \(3,\)"):
        load({**sent, "0.bias": torch.zeros(4)})
    with pytest.raises(ValueError, match=r"does not match this model's: \['0.bias', 'extra'\]"):
        load({**{k: v for k, v in sent.items() if k != "0.bias"}, "extra": torch.zeros(1)})
    with pytest.raises(ValueError, match="gives '0.weight' as str"):
        load({**sent, "0.weight": "rm -rf /"})


def test_a_state_travels_with_plain_dicts_and_its_plain_values_as_they_are():
    import collections

    from polydist.backends.torchft.transport import plain

    state = collections.OrderedDict(a=torch.ones(1), b=[1, (2, 3)], c={"d": 4.0})
    got = plain(state)
    assert type(got) is dict and got["b"] == [1, (2, 3)] and got["c"] == {"d": 4.0} and got["a"] is state["a"]
