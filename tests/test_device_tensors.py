"""experiments.checks.device_tensors: a released build's storage is given back whoever still holds its objects
(run here on CPU tensors, device_type="cpu"; the profile runs it on the GPU)."""
import pytest
import torch

from experiments.checks.device_tensors import held_tensors, hollow_out, reachable_tensors

pytestmark = pytest.mark.torch


class _Buffer:
    """Like megatron's DDP buffer: one flat tensor, parameters' gradients are views of it."""

    def __init__(self, params):
        self.grad_data = torch.zeros(sum(p.numel() for p in params))
        offset = 0
        for p in params:
            p.main_grad = self.grad_data[offset:offset + p.numel()].view_as(p)
            offset += p.numel()


def _build():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    model.buffers_ = [_Buffer(list(model.parameters()))]
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 64)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_hollowing_frees_the_storage_of_objects_something_else_still_holds():
    model, optimizer = _build()
    stray = {"kept": model, "state": optimizer.state}   # what megatron's globals would be
    weight = model[0].weight
    assert weight.untyped_storage().nbytes() > 0
    freed = hollow_out(model, optimizer, device_type="cpu")
    # parameters, their .grad, the flat gradient buffer and its views, Adam's moments: all reachable
    assert freed >= 4 * (64 * 64 + 64 + 64 * 8 + 8) * 4
    assert stray["kept"] is model
    for t in [weight, weight.main_grad, model.buffers_[0].grad_data, *optimizer.state[weight].values()]:
        assert t.untyped_storage().nbytes() == 0 or t.numel() <= 1   # Adam's step counter is a 1-element tensor
    assert weight.grad is None


def test_the_walk_does_not_enter_modules_functions_or_other_devices():
    import cost_model

    holder = {"module": cost_model, "fn": lambda: torch.ones(3), "t": torch.ones(2)}
    assert reachable_tensors(holder, device_type="meta") == []
    assert len(reachable_tensors(holder, device_type="cpu")) == 1


def test_held_tensors_names_what_refers_to_the_largest():
    class Keeper:
        pass

    keeper = Keeper()
    keeper.big = torch.zeros(1 << 20)
    report = held_tensors(device_type="cpu", top=50)
    mine = [r for r in report if r["shape"] == [1 << 20] and r["dtype"] == "float32"]
    assert mine and mine[0]["gib"] > 0
    assert mine[0]["held_by"][0].endswith("Keeper['big']")


def test_drop_graphs_removes_only_references_to_tensors_with_a_graph():
    from experiments.checks.device_tensors import drop_graphs

    class Dispatcher:
        pass

    w = torch.nn.Parameter(torch.ones(3))
    d = Dispatcher()
    d.probs = w * 2            # a graph: dropped
    d.routing = torch.ones(3)  # no graph: kept
    d.cache = {"last": w + 1, "plain": torch.zeros(1)}
    d.history = [w.sum(), 1]
    model = torch.nn.Linear(2, 2)
    model.dispatcher = d
    dropped = drop_graphs(model)
    assert sorted(dropped) == ["Dispatcher.probs", "dict.last", "list.0"]
    assert d.probs is None and d.cache["last"] is None and d.history == [None, 1]
    assert d.routing is not None and d.cache["plain"] is not None and model.weight is not None
