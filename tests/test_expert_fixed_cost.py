"""A layer priced from another model's measured MoE layer moves its fixed cost with the expert count
(cost_model.step_time.fixed_cost_shift: the slope of the measured MoE layers' fixed costs against their experts,
step_time.expert_fixed_line; with one expert count measured, the donor's own cost per expert); a dense layer moves
its gradient accumulation alone."""
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

from cost_model import step_time
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.workload import Workload
from cost_model.predict import predict
from cost_model.profile import shipped_profile
from cost_model.runner_components import signature_model
from experiments.megatron.model_run import trial_model

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = Workload(seq_len=4096, global_batch=48, framework="megatron")


def layers_s(model, gpu="h200", gpus=1, **layout):
    p = predict(model, load_gpu(gpu), WORKLOAD, Layout(gpus, **layout), precision_aware_optimizer=False)
    return p.breakdown["layers"], p.term_sources["layers"]


def without_per_expert():
    """The shift as it was before the per-expert part: gradient accumulation alone."""
    return mock.patch.object(step_time, "layer_experts", lambda *a: 0)


def test_the_shipped_dense_layers_fixed_cost_is_their_gradient_accumulation_and_moe_layers_add_one_per_expert():
    profile = shipped_profile("h200")
    hbm = profile.hbm_copy_tb_s * 1e12
    rest = {}
    for sig, curves in profile.runner.layers.items():
        attn, mlp = sig.split("|")[0].split("+")
        if curves.model.startswith("mixtral") or curves.none.line is None:
            continue
        model = signature_model(load_model(curves.model), sig)
        rest[(curves.model, attn, mlp)] = (step_time.fixed_beyond_accumulation(curves, model, attn, mlp, hbm),
                                           step_time.layer_experts(model, mlp))
    for (name, _, mlp), (left, experts) in rest.items():
        if mlp == "dense" and name.startswith("llama"):
            assert abs(left) < 0.2e-3, (name, left)       # within 0.2 ms of gradient accumulation alone
        elif mlp == "moe":
            assert 15e-6 < left / experts < 50e-6, (name, left / experts)
    # the same expert shape at 256 and 512 experts: the fixed cost per expert agrees within 5%
    a, b = (rest[(m, "full_attention", "moe")] for m in ("qwen3.6-35b-a3b", "qwen3-next-80b-a3b"))
    assert a[0] / a[1] == pytest.approx(b[0] / b[1], rel=0.05)


def test_a_layer_with_fewer_experts_than_its_donor_sheds_their_fixed_cost():
    granite = trial_model(load_model(str(ROOT / "benchmarks/models/granite-moe-shape-3b/config.json")), 8)
    shifted, source = layers_s(granite, "h100", max_tokens_per_gpu=4096, rows_per_microbatch=1)
    with without_per_expert():
        before, _ = layers_s(granite, "h100", max_tokens_per_gpu=4096, rows_per_microbatch=1)
    assert "qwen3-30b-a3b's measured" in source and "us an expert" in source and "40 experts, not 128" in source
    assert shifted < before * 0.95


def test_a_dense_layer_priced_from_another_moves_its_gradient_accumulation_only():
    yi = trial_model(load_model(str(ROOT / "benchmarks/models/yi-6b/config.json")), 8)
    shifted, source = layers_s(yi, max_tokens_per_gpu=8192, rows_per_microbatch=2)
    with without_per_expert():
        before, _ = layers_s(yi, max_tokens_per_gpu=8192, rows_per_microbatch=2)
    assert shifted == before and "us an expert" not in source


def test_an_expert_parallel_shard_keeps_the_whole_layers_fixed_cost_per_expert():
    # the stored two-GPU runs: priced with half the experts' fixed cost, an EP 2 shard came out over-predicted
    q30 = trial_model(load_model("qwen3-30b-a3b"), 4)
    ep2, source = layers_s(q30, gpus=2, ep=2, max_tokens_per_gpu=8192, rows_per_microbatch=2)
    with without_per_expert():
        ep2_before, _ = layers_s(q30, gpus=2, ep=2, max_tokens_per_gpu=8192, rows_per_microbatch=2)
    assert "us an expert" not in source and ep2 == ep2_before


def _line_context(runner, model):
    """What step_time.expert_fixed_line reads of a step's context: the profile's components, the model, the copy rate."""
    profile = shipped_profile("h200")
    return SimpleNamespace(runner=runner, model=model, rates=SimpleNamespace(hbm=profile.hbm_copy_tb_s * 1e12))


def test_the_cost_an_expert_is_the_slope_through_the_measured_moe_layers_not_one_layers_average():
    runner = shipped_profile("h200").runner
    sig, curves = next((s, c) for s, c in runner.layers.items()
                       if c.model == "qwen3.6-35b-a3b" and s.startswith("full_attention+moe|"))
    fixed, slope = step_time.expert_fixed_line(_line_context(runner, load_model("qwen3.6-35b-a3b")), curves,
                                               "full_attention", "moe")
    # 5.3-5.5 ms at 128 experts, 7.0 at 256, 13.8 at 512: a line with a fixed part, its slope below 256's average
    assert 15e-6 < slope < 27e-6 and 1e-3 < fixed < 4e-3, (fixed, slope)


def test_one_measured_expert_count_leaves_the_donors_own_cost_per_expert():
    runner = shipped_profile("h200").runner
    only = {s: c for s, c in runner.layers.items() if not s.startswith("full_attention+moe|")
            or c.model == "qwen3.6-35b-a3b"}
    one = replace(runner, layers=only)
    curves = next(c for s, c in only.items() if s.startswith("full_attention+moe|"))
    assert step_time.expert_fixed_line(_line_context(one, load_model("qwen3.6-35b-a3b")), curves,
                                       "full_attention", "moe") is None


def test_a_layer_priced_from_mixtrals_floored_intercept_takes_the_measured_layers_slope():
    # Mixtral's intercepts sit at their gradient accumulation (the parser's floor): no cost an expert of their own
    phi = trial_model(load_model(str(ROOT / "benchmarks/models/phi3.5-moe/config.json")), 3)
    shifted, source = layers_s(phi, max_tokens_per_gpu=8192, rows_per_microbatch=2)
    with mock.patch.object(step_time, "expert_fixed_line", lambda *_: None):
        donor_own, _ = layers_s(phi, max_tokens_per_gpu=8192, rows_per_microbatch=2)
    assert "mixtral" in source and "the slope of the measured" in source and "16 experts, not 8" in source
    assert shifted > donor_own
