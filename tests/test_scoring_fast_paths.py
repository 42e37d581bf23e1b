"""The scoring's fast paths give what the slow ones give: the memos keyed on what a term reads (a key missing a field
the term reads would hand one layout another's figures), the cheaper bounds below the exact floors they stand in
for, and the shapes taken from the heap in the order sorting their ceilings gives."""
import random
from dataclasses import replace

import pytest

from cost_model import memory, step_time
from cost_model.bounds import floors_below, launch_floor_s, launch_parts, step_floor_s
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.workload import Workload
from cost_model.predict import _step_context
from cost_model.profile import shipped_profile
from cost_model.nouns.runtime import default_runtime
from experiments.predicted_runner import PredictedRunner
from search_space.enumerate import SpaceOptions, shape_layouts, space_plan
from tuner.space_pruning import Bars, bounds_of, highest_first, judges, shape_bounds
from tuner.study import StudyConfig

NARROW = SpaceOptions(rows_per_microbatch=(1, 2), full_recompute_layers=(1, 2), offload_fractions=(0.0, 1.0),
                      max_vpp=2)
CASES = [   # MoE with MTP, hybrid linear attention, dense, a VLM's encoder, megatron with LoRA
    ("deepseek-v3", "b200", 64, Workload()),
    ("qwen3.6-35b-a3b", "h200", 32, Workload()),
    ("llama3-8b", "h100", 16, Workload(framework="megatron")),
    ("qwen3.5-35b-a3b", "h100", 16, Workload(images_per_row=1)),
    ("gpt-oss-20b", "h100", 16, Workload(framework="megatron", peft="lora")),
]
MEMOS = (step_time._RANK_MEMO, step_time._BASE_MEMO, step_time._PIPELINE_MEMO, memory._SHARD_MEMO)


def config_of(model, gpu, gpus, workload):
    return replace(StudyConfig(load_model(model), load_gpu(gpu), gpus, workload), options=NARROW)


def sampled_layouts(config, n_shapes: int, per_shape: int, seed: int = 7):
    shapes, opts, _ = space_plan(config.model, config.world_size, config.workload, config.stack, config.options)
    rng = random.Random(seed)
    out = []
    for shape in rng.sample(shapes, min(n_shapes, len(shapes))):
        layouts = list(shape_layouts(shape, config.model, config.world_size, config.workload, config.stack, opts))
        out += rng.sample(layouts, min(per_shape, len(layouts)))
    return out


def breakdown(config, layout, constants):
    ctx = _step_context(config.model, config.gpu, config.workload, layout, constants, shipped_profile(config.gpu.name),
                        default_runtime(config.workload.framework, True))
    return step_time.step_breakdown(ctx)


def clear_memos():
    for memo in MEMOS:
        memo.clear()


@pytest.mark.parametrize("model,gpu,gpus,workload", CASES, ids=[c[0] for c in CASES])
def test_memoized_step_terms_are_those_priced_afresh(model, gpu, gpus, workload):
    """Each layout priced with memos warmed by the others (PP, VPP, recompute, embedding splits that share a rank's
    key) is priced to the bit as it is with the memos emptied first."""
    config = config_of(model, gpu, gpus, workload)
    layouts = sampled_layouts(config, 12, 10)
    c = judges(config, PredictedRunner())[0][0].constants
    clear_memos()
    warm = [breakdown(config, layout, c) for layout in layouts]
    for layout, seen in zip(layouts, warm):
        clear_memos()
        assert breakdown(config, layout, c) == seen, layout.long_label
    assert len({(l.pp, l.vpp, l.recompute_granularity, l.recompute_num_layers) for l in layouts}) > 3


def test_a_shard_split_memoized_is_the_walk():
    rng = random.Random(3)
    for _ in range(200):
        tensors = tuple(float(rng.randrange(1, 10 ** 7)) for _ in range(rng.randrange(1, 40)))
        rest, fraction, shards = float(rng.randrange(0, 10 ** 5)), rng.choice((0.5, 1.0, 0.3)), rng.choice((1, 3, 64))
        assert memory._shard_split(tensors, rest, fraction, shards) == memory._walk_shards(tensors, rest, fraction,
                                                                                             shards)
        assert memory._shard_split(tensors, rest, fraction, shards) == memory._walk_shards(tensors, rest, fraction,
                                                                                             shards)


@pytest.mark.parametrize("model,gpu,gpus,workload", CASES, ids=[c[0] for c in CASES])
def test_cheap_bounds_are_below_the_floors_they_stand_in_for(model, gpu, gpus, workload):
    """floors_below under every shape's floors; launch_floor_s under each judge's floor; the heap's order is the
    sort's (a bar of 0: every shape comes out)."""
    config = config_of(model, gpu, gpus, workload)
    shapes, opts, _ = space_plan(config.model, gpus, workload, config.stack, config.options)
    every, predict_h = judges(config, PredictedRunner())
    bounds, ceilings = shape_bounds(shapes, config, opts, every)
    checked, memo = 0, {}
    for b in bounds:
        if not b.fastest:
            continue
        floors = floors_below(b.fastest, config.model, config.gpu, workload, b.optimistic, config.profile, memo)
        for r, layout in enumerate(b.fastest):
            if floors is not None:
                assert floors[r] <= b.opt[r], layout.long_label
            parts = launch_parts(config.model, config.gpu, workload, layout, b.optimistic, config.profile)
            for judge in every[1:]:
                exact = step_floor_s(config.model, config.gpu, workload, layout, judge.constants, config.profile)
                assert launch_floor_s(b.opt[r], parts, judge.constants, layout, workload) <= exact, layout.long_label
                checked += 1
    assert checked > 0
    fresh = bounds_of(shapes, config, opts, every)
    skipped = []
    order = list(highest_first(fresh, Bars(every, predict_h, keep=10 ** 9), skipped))
    assert order == sorted(range(len(shapes)), key=lambda i: -ceilings[i]) and not skipped
