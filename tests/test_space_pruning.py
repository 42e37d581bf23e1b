"""Pruning a very large space (tuner.space_pruning, cost_model.bounds): the ceilings hold for every layout under the
shipped model and every hypothesis, and a pruned scoring keeps what scoring the whole space would rank highest."""
import random
from dataclasses import replace

import pytest

from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.model_spec import load_model
from cost_model.bounds import memory_floor_gib
from cost_model.constants import default_constants
from cost_model.predict import memory_verdict, predict
from cost_model.nouns.workload import Workload
from experiments.predicted_runner import PredictedRunner
from search_space.enumerate import (MAX_PLANNED_LAYOUTS, SpaceOptions, SpaceTooLarge, shape_layouts, space_plan,
                                    space_size)
from tuner import space_pruning, space_scoring
from tuner.space_pruning import Bars, judges, shape_bounds
from tuner.space_scoring import score_space
from tuner.study import StudyConfig

pytestmark = pytest.mark.slow   # scores whole spaces: make test runs it, make test-fast does not

NARROW = SpaceOptions(rows_per_microbatch=(1, 2, 4), full_recompute_layers=(1,), offload_fractions=(0.0, 0.5),
                      max_vpp=2)
CASES = [
    ("qwen3.6-35b-a3b", "h200", 8, Workload(), SpaceOptions()),
    ("deepseek-v3", "b200", 64, Workload(), replace(NARROW, max_cp=2)),
    ("llama3-8b", "h100", 64, Workload(framework="megatron"), NARROW),
]


def config_of(model, gpu, gpus, workload, options):
    return replace(StudyConfig(load_model(model), load_gpu(gpu), gpus, workload), options=options)


@pytest.mark.parametrize("model,gpu,gpus,workload,options", CASES, ids=[c[0] for c in CASES])
def test_a_shape_ceiling_is_above_each_layout_under_each_judge(model, gpu, gpus, workload, options):
    config = config_of(model, gpu, gpus, workload, options)
    shapes, opts, _ = space_plan(config.model, gpus, workload, config.stack, options)
    every, predict_h = judges(config, PredictedRunner())
    rng = random.Random(27)
    picked = rng.sample(range(len(shapes)), min(6, len(shapes)))
    bounds, ceilings = shape_bounds([shapes[i] for i in picked], config, opts, every)
    zero = Bars(every, predict_h, keep=1)   # bars of 0: every judge's exact ceiling is asked
    checked = 0
    for shape_index, b, top in zip(picked, bounds, ceilings):
        layouts = list(shape_layouts(shapes[shape_index], config.model, gpus, workload, config.stack, opts))
        for layout in rng.sample(layouts, min(12, len(layouts))):
            r = b.rep[(layout.max_tokens_per_gpu, layout.dispatcher)]
            shipped = predict(config.model, config.gpu, workload, layout).tokens_per_s_per_gpu
            figures = [shipped] + [predict_h(j.hypothesis, layout) for j in every[1:]]
            assert max(figures) <= top, layout.long_label
            for k, (judge, figure) in enumerate(zip(every, figures)):
                assert figure <= b._cheap(k, judge)[r], (judge.name, layout.long_label)
                assert figure <= b._exact(k, judge)[r], (judge.name, layout.long_label)
                assert b.above(k, judge, r, figure) and b.live(every, zero)   # a rep reaching its own layout
            floor, _ = memory_floor_gib(config.model, config.gpu, workload, layout, default_constants(), None)
            assert memory_verdict(config.model, config.gpu, workload, layout).memory.total >= floor
            checked += 1
    assert checked >= 30


def test_a_shape_whose_memory_floor_does_not_fit_has_no_layout_that_may_fit():
    config = config_of("deepseek-v3", "b200", 64, Workload(), replace(NARROW, max_cp=2))
    shapes, opts, _ = space_plan(config.model, 64, config.workload, config.stack, config.options)
    every, _ = judges(config, PredictedRunner())
    bounds, _ = shape_bounds(shapes, config, opts, every)
    rng = random.Random(27)
    out = [i for i, b in enumerate(bounds) if b.cannot_fit()]
    assert 0 < len(out) < len(shapes)
    for i in rng.sample(out, 5):
        for layout in shape_layouts(shapes[i], config.model, 64, config.workload, config.stack, opts):
            assert not memory_verdict(config.model, config.gpu, config.workload, layout).may_fit, layout.long_label


@pytest.fixture(scope="module")
def deepseek_64():
    """DeepSeek-V3 on 64 x B200 (narrowed) and its whole scoring (more layouts than PRUNE_ABOVE: not pruned here)."""
    config = config_of("deepseek-v3", "b200", 64, Workload(), replace(NARROW, max_cp=2))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(space_scoring, "PRUNE_ABOVE", 10 ** 9)
        return config, score_space(config, PredictedRunner())


def test_a_pruned_scoring_keeps_what_each_judge_ranks_best(monkeypatch, deepseek_64):
    """Pruned with a small KEEP: the kept layouts are those of the whole scoring (same figures, same order); every
    layout left out is slower than KEEP plain fits kept, under the shipped model (all of them checked) and under
    each hypothesis (a sample); the summary counts what was left out."""
    config, whole = deepseek_64
    assert whole.pruned is None
    keep = 20
    monkeypatch.setattr(space_scoring, "PRUNE_ABOVE", 0)
    monkeypatch.setattr(space_pruning, "KEEP", keep)
    pruned = score_space(config, PredictedRunner())
    info = pruned.pruned
    assert info is not None and info.keep == keep and info.shapes > 0 and info.layouts > 0
    assert f"{info.layouts:,} layouts left unscored" in info.line()
    kept = {l.key() for l, _ in pruned}
    assert len(kept) < len(whole) / 2
    # the same layouts and figures, in the enumeration's order
    assert [(l.key(), p) for l, p in whole if l.key() in kept] == [(l.key(), p) for l, p in pruned]
    best = sorted((p.tokens_per_s_per_gpu for _, p in whole), reverse=True)[:keep]
    assert sorted((p.tokens_per_s_per_gpu for _, p in pruned), reverse=True)[:keep] == best
    every, predict_h = judges(config, PredictedRunner())
    fits = [l for l, p in pruned if p.fits]
    left = [(l, p) for l, p in whole if l.key() not in kept]
    shipped_bar = sorted((p.tokens_per_s_per_gpu for l, p in pruned if p.fits), reverse=True)[keep - 1]
    assert all(p.tokens_per_s_per_gpu < shipped_bar for _, p in left)
    for judge in every[1:]:
        bar = sorted((predict_h(judge.hypothesis, l) for l in fits), reverse=True)[keep - 1]
        for layout, _ in random.Random(judge.name).sample(left, 15):
            assert predict_h(judge.hypothesis, layout) < bar, (judge.name, layout.long_label)


def test_a_space_over_the_cap_is_planned_where_its_scoring_prunes():
    """Qwen3-235B-A22B on 1,024 GPUs: 5.6 million layouts, more than one study scores whole (refused), planned when
    the scoring prunes it (at most MAX_SPACE_LAYOUTS of it scored)."""
    model, workload = load_model("qwen3-235b-a22b"), Workload()
    config = StudyConfig(model, load_gpu("h100"), 1024, workload)
    with pytest.raises(SpaceTooLarge):
        space_plan(model, 1024, workload, config.stack, config.options)
    shapes, options, size = space_plan(model, 1024, workload, config.stack, config.options, limit=MAX_PLANNED_LAYOUTS)
    assert size == space_size(shapes, model, 1024, workload, config.stack, options) > 4_000_000


def test_only_the_cost_models_own_figures_are_pruned():
    config = StudyConfig(load_model("llama3-8b"), load_gpu("h100"), 8, Workload())
    assert space_pruning.prunable(config, None) and space_pruning.prunable(config, PredictedRunner())
    assert not space_pruning.prunable(config, PredictedRunner(constants=object()))
    assert not space_pruning.prunable(config, PredictedRunner(profile=object()))
    from experiments.megatron.runner import MegatronRunner
    assert not space_pruning.prunable(config, MegatronRunner())   # its own model run, priced on its own stack


def test_the_agent_proposes_first_what_it_would_over_the_whole_space(monkeypatch, deepseek_64):
    """On this space the agent's first proposal over the pruned candidates is the one over all of them, from a
    table of fewer layouts."""
    from types import SimpleNamespace

    from tuner.study_commands import make_proposer

    config, whole = deepseek_64
    monkeypatch.setattr(space_scoring, "PRUNE_ABOVE", 0)
    pruned = score_space(config, PredictedRunner())
    assert len(pruned) < len(whole) / 2
    nothing = SimpleNamespace(tried=set(), measured_layouts=[], failed=[])
    agents = [make_proposer("agent", c, config, PredictedRunner()) for c in (whole, pruned)]
    assert len(agents[1].table.candidates) < len(agents[0].table.candidates)
    assert agents[0].propose(nothing).params == agents[1].propose(nothing).params


def test_a_pruned_space_named_for_ray_is_scored_here_with_the_local_result(monkeypatch, deepseek_64):
    """Pruning reads the bars the shapes scored before raised: a space that is pruned is scored here, whatever
    --ray-address names (no Ray cluster is started), with the local result, and the summary says so."""
    config, _ = deepseek_64
    monkeypatch.setattr(space_scoring, "PRUNE_ABOVE", 0)
    monkeypatch.setattr(space_scoring, "_on_ray", lambda *a, **k: pytest.fail("a pruned space went to Ray"))
    here = score_space(config, PredictedRunner())
    named = score_space(config, PredictedRunner(), ray_address="local")
    assert [(l.key(), p) for l, p in here] == [(l.key(), p) for l, p in named]
    assert here.pruned.ray_address is None and "--ray-address local" in named.pruned.line()
