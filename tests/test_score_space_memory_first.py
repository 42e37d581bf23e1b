"""Scoring a space asks the memory verdict first and prices the step only of the layouts that may fit: the
kept layouts, their predictions and the refusal for a space where nothing fits are those of pricing each
layout in full."""
import pytest

from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.workload import Workload
from experiments.predicted_runner import PredictedRunner
from tuner.options import CliError
from tuner.study import StudyConfig
from tuner.study_commands import score_space


class FullPricing(PredictedRunner):
    """The same runner without the cheap memory verdict: every layout priced in full."""

    def memory_verdict(self, case, profile=None):
        return None


class EachTemplateAlone(PredictedRunner):
    """The same runner, not declared the cost model's own: scoring then rules out by memory only within a template's
    own siblings (no sharing between templates of the same memory or a lighter optimizer choice), and prunes nothing."""

    def scores_shipped_cost_model(self, profile=None) -> bool:
        return False


@pytest.mark.parametrize("model,gpu,gpus", [("qwen3-30b-a3b", "h200", 2), ("llama3-8b", "h100", 4)])
def test_templates_sharing_what_memory_rules_out_keep_what_each_template_alone_keeps(model, gpu, gpus):
    config = StudyConfig(load_model(model), load_gpu(gpu), gpus, Workload(seq_len=8192, global_batch=64))
    shared, alone = score_space(config, PredictedRunner()), score_space(config, EachTemplateAlone())
    assert [l for l, _ in shared] == [l for l, _ in alone] and len(shared) > 0
    assert [p.tokens_per_s_per_gpu for _, p in shared] == [p.tokens_per_s_per_gpu for _, p in alone]


@pytest.mark.parametrize("model,gpu,gpus", [("qwen3-30b-a3b", "h200", 2), ("llama3-8b", "h100", 4)])
def test_memory_first_scoring_keeps_exactly_what_full_pricing_keeps(model, gpu, gpus):
    config = StudyConfig(load_model(model), load_gpu(gpu), gpus, Workload(seq_len=8192, global_batch=64))
    fast = score_space(config, PredictedRunner())
    full = score_space(config, FullPricing())
    assert len(fast) == len(full) > 0
    for (lf, pf), (lu, pu) in zip(fast, full):
        assert lf == lu
        assert (pf.tokens_per_s_per_gpu, pf.peak_memory_gib, pf.fit_verdict) == \
            (pu.tokens_per_s_per_gpu, pu.peak_memory_gib, pu.fit_verdict)


def test_a_space_where_nothing_fits_names_the_same_nearest_layout():
    config = StudyConfig(load_model("qwen3-235b-a22b"), load_gpu("h100"), 2, Workload(seq_len=4096, global_batch=8))
    errors = []
    for runner in (PredictedRunner(), FullPricing(), EachTemplateAlone()):
        with pytest.raises(CliError) as info:
            score_space(config, runner)
        errors.append(str(info.value))
    assert errors[0] == errors[1] == errors[2] and "the nearest, " in errors[0] and "predicted peak" in errors[0]


def _each_alone(config, runner):
    """Every layout of the space priced in full on its own, in enumeration order: those that may fit."""
    from cost_model.nouns.layout import InvalidLayout
    from search_space.enumerate import enumerate_layouts

    out = []
    for layout in enumerate_layouts(config.model, config.world_size, config.workload, config.stack, config.options):
        try:
            p = runner.predict(config.case(layout), config.profile)
        except InvalidLayout:
            continue
        if p.may_fit:
            out.append((layout, p))
    return out


CATALOG = ["deepseek-v3", "gpt-oss-120b", "gpt-oss-20b", "llama3-70b", "llama3-8b", "llama3.1-405b", "moonlight-16b-a3b",
           "qwen3-235b-a22b", "qwen3-30b-a3b", "qwen3-next-80b-a3b", "qwen3.5-35b-a3b", "qwen3.5-397b-a17b",
           "qwen3.6-35b-a3b"]


# the models whose comparison takes more than a few seconds (pricing every layout of the space alone) run in the full
# suite only (`make test`; `make test-fast` leaves out the slow ones)
SLOW_SPACES = {"deepseek-v3", "gpt-oss-120b", "llama3.1-405b", "moonlight-16b-a3b", "qwen3-235b-a22b", "qwen3-30b-a3b",
               "qwen3.5-397b-a17b", "qwen3.6-35b-a3b"}


@pytest.mark.parametrize("model", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW_SPACES else m for m in CATALOG])
def test_ruling_out_larger_micro_batches_keeps_what_scoring_each_layout_alone_keeps(model):
    """A layout ruled out by memory rules out its siblings with more tokens per micro-batch without scoring them:
    on every catalog model the kept layouts and their figures are those of pricing each layout alone."""
    from search_space.enumerate import SpaceOptions

    # the default space where it is small; elsewhere a narrower one (one recompute depth, whole or no offload, no
    # virtual stages, no context parallelism, one dispatcher and moment type) on the fewest GPUs that hold the model:
    # micro-batch sizes, parallel shapes and recompute kinds vary as in any space (CP varies in the default spaces;
    # with it DeepSeek-V3's space on 64 GPUs took about 70 s to compare)
    narrow = SpaceOptions(full_recompute_layers=(1,), offload_fractions=(0.0, 1.0), max_vpp=1,
                          dispatchers=("alltoall",), exp_avg_dtypes=("bf16",), max_cp=1)
    gpus = {"gpt-oss-120b": 16, "llama3.1-405b": 64, "qwen3-235b-a22b": 32, "qwen3.5-397b-a17b": 32,
            "deepseek-v3": 64}.get(model, 4)
    options = SpaceOptions() if model in ("llama3-8b", "qwen3-30b-a3b", "qwen3.6-35b-a3b", "llama3-70b") else narrow
    rows = 64 if model == "deepseek-v3" else 128
    config = StudyConfig(load_model(model), load_gpu("h200"), gpus, Workload(seq_len=4096, global_batch=rows),
                         options=options)
    try:
        fast = score_space(config, PredictedRunner())
    except CliError:
        fast = []
    alone = _each_alone(config, FullPricing())
    assert alone, "nothing fits: the comparison would be empty"
    assert [l for l, _ in fast] == [l for l, _ in alone]
    for (_, pf), (_, pa) in zip(fast, alone):
        assert (pf.tokens_per_s_per_gpu, pf.peak_memory_gib, pf.fit_verdict) == \
            (pa.tokens_per_s_per_gpu, pa.peak_memory_gib, pa.fit_verdict)


def test_a_larger_micro_batch_that_holds_less_memory_is_not_ruled_out_unscored():
    """Memory need not grow with max_tokens_per_gpu: at 12 rows a step over PP 4, one micro-batch of 6 rows fills one
    pipeline slot where two of 4 rows fill two (Llama3-70B on 32 x H200: TP4 PP4 at 4 rows a micro-batch does not fit,
    at 6 it does). Scoring keeps what pricing each layout alone keeps."""
    from search_space.enumerate import SpaceOptions

    config = StudyConfig(load_model("llama3-70b"), load_gpu("h200"), 32, Workload(global_batch=12),
                         options=SpaceOptions(max_cp=1, dispatchers=("alltoall",)))
    fast, alone = score_space(config, PredictedRunner()), _each_alone(config, FullPricing())
    assert [l for l, _ in fast] == [l for l, _ in alone] and len(alone) > 0
    kept = {l.key() for l, _ in fast}
    six = [l for l, _ in alone if (l.tp, l.pp, l.rows_per_microbatch, l.exp_avg_dtype) == (4, 4, 6, "fp32")
           and not l.recompute_granularity and not l.offloaded]
    assert six and all(l.key() in kept for l in six)


def test_memory_scales_are_what_prediction_reads_of_the_micro_batch():
    from cost_model.activations import in_flight_microbatches
    from cost_model.nouns.stack import Stack
    from cost_model.predict import in_flight_share, microbatches
    from search_space.enumerate import ShapeRuns, SpaceOptions, space_plan
    from tuner.space_scoring import memory_scales

    model, workload = load_model("qwen3.6-35b-a3b"), Workload()
    shapes, options, _ = space_plan(model, 32, workload, Stack())
    checked = 0
    for shape in [s for s in shapes if s["pp"] > 1][:6]:
        runs = ShapeRuns(shape, model, 32, workload, Stack(), options)
        for ri, scale in enumerate(memory_scales(runs)):
            layout = runs.layout(ri, 0)
            if layout is None:
                continue
            _, n_mb, largest = microbatches(layout, workload)
            share = in_flight_share(layout.max_tokens_per_gpu, layout.dp, layout.pp, layout.vpp, layout.cp, workload,
                                    in_flight_microbatches(layout, n_mb))
            assert scale == (largest, largest * share)
            checked += 1
    assert checked > 10
