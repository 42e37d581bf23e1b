import dataclasses

import pytest

from cost_model.nouns.hardware import load_gpu
from cost_model.predict import predict
from cost_model.nouns.workload import Workload
from cost_model.nouns.layout import Layout

FULL1 = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
REFERENCE = Layout(8, ep=8, **FULL1)
REFERENCE_OFFLOAD = Layout(8, ep=8, max_tokens_per_gpu=16384, rows_per_microbatch=2, optimizer_offload_fraction=1.0,
                           overlap_d2h_h2d=True, **FULL1)


def test_reference_recipes_fit_below_h200_memory(qwen36, h200, workload):
    for layout in (REFERENCE, REFERENCE_OFFLOAD):
        p = predict(qwen36, h200, workload, layout)
        assert p.fits, p.reasons
        assert p.peak_memory_gib * 1024 ** 3 < 141e9
        assert p.host_memory_gib_per_node < h200.host_memory_gib_per_node


def test_obviously_unfitting_layout_is_declared_with_reason(qwen36, h200, workload):
    p = predict(qwen36, h200, workload, Layout(8))  # TP1 PP1 EP1: every GPU holds all 256 experts
    assert not p.fits
    assert "GPU memory" in p.reasons[0] and "exceeds" in p.reasons[0]
    assert p.peak_memory_gib > 2 * h200.memory_gib


def test_static_memory_matches_hand_count(qwen36, h200, workload):
    # TP1 EP8 DP8 EDP1: bf16 weights + fp32 grads on local params, 10 B per sharded param.
    p = predict(qwen36, h200, workload, REFERENCE)
    pc = qwen36.params
    experts_local = pc.routed_experts / 8
    dense_local = pc.total - pc.routed_experts
    gib = 1024 ** 3
    assert p.memory.weights == pytest.approx((experts_local + dense_local) * 2 / gib, rel=1e-6)
    assert p.memory.grads == pytest.approx((experts_local + dense_local) * 4 / gib, rel=1e-6)
    assert p.memory.optimizer == pytest.approx((experts_local + dense_local / 8) * 10 / gib, rel=1e-6)


def test_breakdown_sums_to_step_time_and_throughput_follows(qwen36, h200, workload):
    for layout in (REFERENCE, REFERENCE_OFFLOAD, Layout(8, tp=2, etp=1, pp=2, vpp=2, ep=2, dispatcher="flex"),
                   Layout(16, cp=2, ep=8, max_tokens_per_gpu=4096)):
        p = predict(qwen36, h200, workload, layout)
        assert sum(p.breakdown.values()) == pytest.approx(p.step_time_s, rel=1e-9)
        assert all(v >= 0 for v in p.breakdown.values())
        assert p.tokens_per_s_per_gpu == pytest.approx(
            workload.global_batch * workload.seq_len / p.step_time_s / layout.world_size)


def test_mfu_and_price_use_the_recipe_definitions(qwen36, h200, workload):
    p = predict(qwen36, h200, workload, REFERENCE)
    assert p.mfu == pytest.approx(6 * qwen36.params.active_non_embedding * p.tokens_per_s_per_gpu / 989e12)
    assert p.usd_per_million_tokens == pytest.approx(h200.usd_per_gpu_hour / (p.tokens_per_s_per_gpu * 3600) * 1e6)
    cheaper = predict(qwen36, h200.with_price(3.0), workload, REFERENCE)
    assert cheaper.usd_per_million_tokens < p.usd_per_million_tokens


def test_recompute_trades_time_for_memory(qwen36, h200, workload):
    none = predict(qwen36, h200, workload, Layout(8, ep=8))
    full = predict(qwen36, h200, workload, REFERENCE)
    assert full.step_time_s > none.step_time_s
    assert full.memory.activations < none.memory.activations
    selective = predict(qwen36, h200, workload, Layout(8, ep=8, recompute_granularity="selective",
                                                       recompute_modules=("moe_act", "layernorm")))
    assert none.memory.activations > selective.memory.activations > full.memory.activations


def test_offload_moves_optimizer_to_host(qwen36, h200, workload):
    on = predict(qwen36, h200, workload, dataclasses.replace(REFERENCE, optimizer_offload_fraction=1.0))
    off = predict(qwen36, h200, workload, REFERENCE)
    assert on.memory.optimizer == 0 and off.memory.optimizer > 30
    assert on.host_memory_gib_per_node > off.host_memory_gib_per_node + 400
    assert on.breakdown["offload"] > 0 and off.breakdown["offload"] == 0
    overlap = predict(qwen36, h200, workload, dataclasses.replace(REFERENCE, optimizer_offload_fraction=1.0,
                                                                  overlap_d2h_h2d=True))
    assert overlap.step_time_s < on.step_time_s


def test_host_memory_is_checked_against_the_node(qwen36, workload):
    small_host = dataclasses.replace(load_gpu("h200"), host_memory_gib_per_node=512)
    p = predict(qwen36, small_host, workload, dataclasses.replace(REFERENCE, optimizer_offload_fraction=1.0))
    assert not p.fits and any("host memory" in r for r in p.reasons)


def test_communication_terms_appear_where_the_layout_needs_them(qwen36, h200, workload):
    assert predict(qwen36, h200, workload, Layout(8, tp=2, etp=1, ep=4)).breakdown["tp_comm"] > 0
    assert predict(qwen36, h200, workload, REFERENCE).breakdown["tp_comm"] == 0
    assert predict(qwen36, h200, workload, REFERENCE).breakdown["ep_comm"] > 0
    pp = predict(qwen36, h200, workload, Layout(8, pp=2, ep=4))
    assert pp.breakdown["pp_bubble"] > 0 and pp.breakdown["pp_p2p"] > 0
    assert predict(qwen36, h200, workload, Layout(8, cp=2, ep=8, max_tokens_per_gpu=4096)).breakdown["cp_comm"] > 0
    # Crossing nodes costs more than staying inside the NVLink domain.
    inside = predict(qwen36, h200, workload, Layout(16, ep=8, **FULL1)).breakdown["ep_comm"]
    across = predict(qwen36, h200, workload, Layout(16, ep=16, **FULL1)).breakdown["ep_comm"]
    assert across > inside


def test_balanced_routing_is_faster_than_natural(qwen36, h200):
    natural = predict(qwen36, h200, Workload(routing="natural"), REFERENCE)
    balanced = predict(qwen36, h200, Workload(routing="balanced"), REFERENCE)
    assert balanced.step_time_s < natural.step_time_s


def test_fp8_uses_the_fp8_peak(qwen36, h200):
    bf16 = predict(qwen36, h200, Workload(precision="bf16"), REFERENCE)
    fp8 = predict(qwen36, h200, Workload(precision="fp8"), REFERENCE)
    assert fp8.breakdown["compute_experts"] < bf16.breakdown["compute_experts"]


def test_every_catalog_model_predicts_on_a_default_node(h200, workload):
    from cost_model.nouns.model_spec import catalog_names, load_model
    from search_space.enumerate import enumerate_layouts
    from cost_model.nouns.stack import Stack

    for name in catalog_names():
        model = load_model(name)
        first = next(enumerate_layouts(model, 64, workload, Stack()))
        p = predict(model, h200, workload, first)
        assert p.step_time_s > 0 and p.memory.total > 0, name


def test_standard_optimizer_needs_more_memory_than_precision_aware(qwen36, h200, workload):
    aware = predict(qwen36, h200, workload, REFERENCE)
    standard = predict(qwen36, h200, workload, REFERENCE, precision_aware_optimizer=False)
    assert standard.memory.optimizer == pytest.approx(aware.memory.optimizer * 12 / 10)
    assert standard.memory.weights == aware.memory.weights
