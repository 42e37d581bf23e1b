"""The host time of the per-expert GEMM calls (issue 16): Transformer Engine's GroupedLinear issues one cuBLAS
GEMM per local expert and linear, so a GPU holding 32 experts spends 8x the host time of one holding 4; the
calls hide behind the expert GEMMs' own GPU time, behind the whole layer's under EP all-to-all overlap, and
not at all when the step runs eagerly with tiny GEMMs."""
from __future__ import annotations

import dataclasses

import pytest

from cost_model.constants import constants_sources, default_constants
from cost_model.nouns.hardware import load_gpu
from cost_model.layer_time import LayerTime
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import load_model
from cost_model.predict import predict
from cost_model.nouns.runtime import MEGATRON, MEGATRON_RUNNER
from cost_model.step_time import exposed_expert_calls
from cost_model.nouns.workload import Workload

QWEN36, H200 = load_model("qwen3.6-35b-a3b"), load_gpu("h200")
C = dataclasses.replace(default_constants(), expert_gemm_call_s=5e-5)


def test_host_time_scales_with_the_local_experts_and_the_passes():
    idle = LayerTime(weight_passes=3)             # no GPU expert work to hide behind
    ep8 = exposed_expert_calls(idle, QWEN36, Layout(8, ep=8), C, 0.0, set())
    ep4 = exposed_expert_calls(idle, QWEN36, Layout(8, ep=4), C, 0.0, set())
    # 256 experts over EP 8: 32 local experts x 2 linears x 3 passes (forward, input and weight gradients)
    assert ep8 == pytest.approx(5e-5 * 32 * 2 * 3)
    assert ep4 == pytest.approx(2 * ep8)
    frozen = exposed_expert_calls(LayerTime(weight_passes=2), QWEN36, Layout(8, ep=8), C, 0.0, set())
    assert frozen == pytest.approx(ep8 * 2 / 3)   # LoRA's frozen experts: no weight-gradient GEMMs
    recomputed = exposed_expert_calls(idle, QWEN36, Layout(8, ep=8), C, 1.0, set())
    assert recomputed == pytest.approx(ep8 * 4 / 3)   # full recompute reruns the forward's calls


def test_the_expert_gemms_hide_the_calls_and_ep_overlap_hides_them_behind_the_layer():
    host = 5e-5 * 32 * 2 * 3
    busy = LayerTime(weight_passes=3, experts=2 * host)
    assert exposed_expert_calls(busy, QWEN36, Layout(8, ep=8), C, 0.0, set()) == 0.0
    small_experts = LayerTime(weight_passes=3, experts=host / 4, attention=2 * host)
    alone = exposed_expert_calls(small_experts, QWEN36, Layout(8, ep=8), C, 0.0, set())
    assert alone == pytest.approx(host * 3 / 4)
    assert exposed_expert_calls(small_experts, QWEN36, Layout(8, ep=8), C, 0.0, set(), ep_overlap=1.0) == 0.0
    half = exposed_expert_calls(small_experts, QWEN36, Layout(8, ep=8), C, 0.0, set(), ep_overlap=0.5)
    assert half == pytest.approx(alone / 2)


def test_prediction_many_local_experts_cost_more_host_time_and_full_graphs_remove_it():
    wl = Workload(seq_len=4096, global_batch=256, framework="megatron")
    p8 = predict(QWEN36, H200, wl, Layout(8, ep=8, max_tokens_per_gpu=4096), C)
    p8_off = predict(QWEN36, H200, wl, Layout(8, ep=8, max_tokens_per_gpu=4096),
                     dataclasses.replace(C, expert_gemm_call_s=0.0))
    assert p8.breakdown["expert_calls"] > 0 == p8_off.breakdown["expert_calls"]
    assert p8.breakdown["launch_overhead"] == pytest.approx(p8_off.breakdown["launch_overhead"])
    assert p8.tokens_per_s_per_gpu < p8_off.tokens_per_s_per_gpu
    graphed = dataclasses.replace(wl, cuda_graphs="full")
    graphs = predict(QWEN36, H200, graphed, Layout(8, ep=8, max_tokens_per_gpu=4096), C)
    assert graphs.breakdown["launch_overhead"] == graphs.breakdown["expert_calls"] == 0.0


def test_the_shipped_value_is_fitted_and_says_so():
    c = default_constants()
    assert 0 < c.expert_gemm_call_s < 1e-3
    assert constants_sources()["expert_gemm_call_s"].startswith("fitted (benchmarks/calibrate.py")


def test_the_megatron_runner_runs_one_grouped_gemm_per_linear_so_has_no_expert_calls():
    wl = Workload(seq_len=4096, global_batch=256, framework="megatron")
    layout = Layout(8, ep=8, max_tokens_per_gpu=4096)
    te = predict(QWEN36, H200, wl, layout, C, runtime=MEGATRON)
    runner = predict(QWEN36, H200, wl, layout, C, runtime=MEGATRON_RUNNER)
    no_calls = predict(QWEN36, H200, wl, layout, dataclasses.replace(C, expert_gemm_call_s=0.0), runtime=MEGATRON)
    assert runner.breakdown["expert_calls"] == no_calls.breakdown["expert_calls"] == 0.0
    assert te.breakdown["expert_calls"] > 0
