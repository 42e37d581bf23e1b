"""What the search space says when no parallel shape passes its rules."""
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.stack import Stack
from cost_model.nouns.workload import Workload
from search_space.enumerate import SpaceOptions, parallel_shapes, smallest_global_batch


def test_the_smallest_global_batch_is_named_only_where_the_batch_stands_in_the_way():
    model, stack = load_model("qwen3.6-35b-a3b"), Stack()
    small = Workload(global_batch=128)
    assert not list(parallel_shapes(model, 1000, small, stack, SpaceOptions()))
    gbs = smallest_global_batch(model, 1000, small, stack, SpaceOptions())
    assert gbs is not None and list(parallel_shapes(model, 1000, Workload(global_batch=gbs), stack, SpaceOptions()))
    assert not any(list(parallel_shapes(model, 1000, Workload(global_batch=g), stack, SpaceOptions()))
                   for g in range(129, gbs))
    assert smallest_global_batch(load_model("deepseek-v3"), 3, small, stack, SpaceOptions()) is None
