"""The Gated DeltaNet term: the profile's measured kernel times (issue 12), sharding, and the estimate."""
import copy

import pytest

from cost_model.constants import default_constants
from cost_model.layer_time import LayerTime, gdn_kernel_seconds, linear_attention
from cost_model.nouns.layout import Layout
from cost_model.predict import predict
from cost_model.profile import profile_from_dict, shipped_profile
from cost_model.rates import rates_for
from cost_model.nouns.workload import Workload

# Measured on one H200 with fla-core 0.6.0 (TileLang backend), Qwen3.6's GDN shapes, bf16 (issue 12).
ISSUE_FWD_BWD_MS = {8192: 2.57, 16384: 4.51, 32768: 9.02}
ISSUE_FWD_MS = {8192: 0.58, 16384: 1.12, 32768: 2.25}


def issue_profile() -> dict:
    """The synthetic profile with the issue's measured kernel times as its linear_attention entry."""
    from tests.test_profile import synthetic_profile
    points = [{"tokens": t, "qk_heads": 16, "v_heads": 32, "fwd_ms": ISSUE_FWD_MS[t], "fwd_bwd_ms": ms}
              for t, ms in ISSUE_FWD_BWD_MS.items()]
    return dict(synthetic_profile(), linear_attention={"kind": "measured", "key_head_dim": 128,
                                                        "value_head_dim": 128, "points": points,
                                                        "source": "issue 12"})


@pytest.fixture(scope="module")
def h200_rates(h200):
    return rates_for(h200, default_constants(), "bf16", profile_from_dict(issue_profile()))


@pytest.mark.parametrize("tokens", [8192, 32768])
def test_gdn_term_matches_the_measured_kernel_within_15_percent(qwen36, h200_rates, tokens):
    seconds = gdn_kernel_seconds(qwen36, Layout(1), h200_rates, tokens)
    assert seconds * 1e3 == pytest.approx(ISSUE_FWD_BWD_MS[tokens], rel=0.15)


@pytest.mark.parametrize("tokens", [8192, 32768])
def test_with_the_shipped_profile_the_term_matches_its_measured_kernel(qwen36, h200, tokens):
    """Whatever the shipped H200 profile holds (the issue's provisional figures, or tune profile's), the
    term at 8k and 32k tokens is within 15% of its measured forward+backward time for the series used."""
    p = shipped_profile("h200")
    rates = rates_for(h200, default_constants(), "bf16", p)
    series = p.gdn.series_for(qwen36.linear_num_value_heads)
    measured = {pt["tokens"]: pt["fwd_bwd_ms"] for pt in p.raw["linear_attention"]["points"]
                if pt.get("qk_heads", p.raw["linear_attention"].get("qk_heads")) == series.qk_heads
                and pt.get("v_heads", p.raw["linear_attention"].get("v_heads")) == series.v_heads}
    assert gdn_kernel_seconds(qwen36, Layout(1), rates, tokens) * 1e3 == pytest.approx(measured[tokens], rel=0.15)


def test_the_shipped_entry_is_measured_and_says_where_from():
    p = shipped_profile("h200")
    raw = p.raw["linear_attention"]
    assert raw["kind"] == "measured" and p.gdn is not None
    if raw.get("provisional"):      # until tune profile's measurement replaces it
        assert "issue 12" in raw["source"] and raw["fla"] == "0.6.0"
        assert {pt["tokens"]: pt["fwd_bwd_ms"] for pt in raw["points"]} == ISSUE_FWD_BWD_MS
        assert {pt["tokens"]: pt["fwd_ms"] for pt in raw["points"]} == ISSUE_FWD_MS
    else:
        assert raw["fla"] and raw["points"] and "tune profile" in raw["source"]


def test_interpolation_by_tokens_and_scaling_by_heads(qwen36, h200_rates):
    assert h200_rates.gdn_source == "measured: issue 12"
    assert h200_rates.profile.gdn.seconds(16384, 32, 128, 128, backward=False) * 1e3 == pytest.approx(1.12)
    one = gdn_kernel_seconds(qwen36, Layout(1), h200_rates, 16384)
    assert one * 1e3 == pytest.approx(4.51)
    between = gdn_kernel_seconds(qwen36, Layout(1), h200_rates, 12000)
    assert 2.57e-3 < between < 4.51e-3
    assert gdn_kernel_seconds(qwen36, Layout(1), h200_rates, 65536) == pytest.approx(2 * 9.02e-3)  # linear beyond
    # megatron-core's GatedDeltaNet: heads over TP; CP gathers the row and splits the heads
    assert gdn_kernel_seconds(qwen36, Layout(2, tp=2, etp=1), h200_rates, 16384, sharded=True) == pytest.approx(one / 2)
    assert gdn_kernel_seconds(qwen36, Layout(2, cp=2), h200_rates, 8192, sharded=True) == pytest.approx(one / 2)
    # slime's HF module: the whole row and every head on each rank
    assert gdn_kernel_seconds(qwen36, Layout(2, tp=2, etp=1), h200_rates, 16384) == pytest.approx(one)
    assert gdn_kernel_seconds(qwen36, Layout(2, cp=2), h200_rates, 8192) == pytest.approx(one)


def test_without_measured_points_the_term_is_an_estimate_and_says_so(qwen36, h200):
    from tests.test_profile import synthetic_profile
    rates = rates_for(h200, default_constants(), "bf16", profile_from_dict(synthetic_profile()))
    assert rates.gdn_kernel(8192, 32, 128, 128) is None and rates.gdn_source.startswith("estimate")
    est = gdn_kernel_seconds(qwen36, Layout(1), rates, 8192)
    assert est * 1e3 == pytest.approx(0.70, abs=0.02)           # efficiency 0.15: 3.7x too fast (issue 12)
    p = predict(qwen36, h200, Workload(), Layout(8, ep=8), profile=profile_from_dict(synthetic_profile()))
    assert "GDN kernel estimate" in p.source
    measured = predict(qwen36, h200, Workload(), Layout(8, ep=8))
    assert "GDN kernel measured: " in measured.source


def test_the_layer_term_holds_the_kernel(qwen36, h200, h200_rates):
    """The layer's linear-attention time is the kernel plus the projections and the conv: with the issue's
    measured kernel in place of the estimate it grows by exactly their difference."""
    from tests.test_profile import synthetic_profile
    estimate_rates = rates_for(h200, default_constants(), "bf16", profile_from_dict(synthetic_profile()))
    measured, estimated = LayerTime(), LayerTime()
    linear_attention(measured, qwen36, Layout(1), h200_rates, default_constants(), 8192)
    linear_attention(estimated, qwen36, Layout(1), estimate_rates, default_constants(), 8192)
    kernel_gap = 2.57e-3 - gdn_kernel_seconds(qwen36, Layout(1), estimate_rates, 8192)
    assert measured.linear_attention - estimated.linear_attention == pytest.approx(kernel_gap, rel=1e-6)


def test_a_profile_prefers_the_series_measured_as_megatron_calls_the_kernel(qwen36, h200):
    from tests.test_profile import synthetic_profile
    data = synthetic_profile()
    data["linear_attention"] = {"kind": "measured", "key_head_dim": 128, "value_head_dim": 128, "points": [
        {"tokens": 8192, "qk_heads": 16, "v_heads": 32, "fwd_ms": 0.6, "fwd_bwd_ms": 2.6},
        {"tokens": 8192, "qk_heads": 32, "v_heads": 32, "fwd_ms": 0.7, "fwd_bwd_ms": 3.0}]}
    rates = rates_for(h200, default_constants(), "bf16", profile_from_dict(copy.deepcopy(data)))
    assert gdn_kernel_seconds(qwen36, Layout(1), rates, 8192) * 1e3 == pytest.approx(3.0)


def test_a_derived_profile_scales_the_kernel_times_and_drops_the_capacity():
    from cost_model.derive_profile import derive_profile
    from cost_model.nouns.hardware import load_gpu
    raw = dict(issue_profile(), device_memory={"visible_gib": 139.8, "context_gib": 1.0})
    out = derive_profile(raw, load_gpu("h200"), load_gpu("b200"))
    ratio = load_gpu("b200").bf16_tflops / load_gpu("h200").bf16_tflops
    p = profile_from_dict(out)
    assert p.gdn.seconds(8192, 32, 128, 128) == pytest.approx(2.57e-3 / ratio, rel=1e-3)
    assert p.device_memory.visible_gib is None and p.device_memory.context_gib == 1.0
    assert "derived for" in p.gdn.source
    assert raw["device_memory"]["visible_gib"] == 139.8                   # the measured profile is untouched


# ------------------------------------------------------------------------------------------ saved activations
def test_the_gdn_block_count_matches_the_runners_layer_builds():
    """The runner's Gated DeltaNet block, counted from megatron-core's and fla's source, against the saved bytes per
    token the host-floor layer builds measured (hidden 256: the block is nearly all of the layer), for both GDN head
    shapes built (Qwen3.6's 16/32 heads, Qwen3.5-27B's 16/48): each within 2%. A dense Qwen3.5 model's layers are
    counted tensor by tensor (the GDN block plus the dense MLP's runner count), no factor on either."""
    from benchmarks.activation_builds import DEFAULT, counted_per_token, measured_per_token, pairs
    from cost_model.activations import activation_bytes_per_microbatch, runner_dense_layer_bytes, unfused_constants
    from cost_model.nouns.model_spec import load_model
    from cost_model.nouns.units import BF16
    from cost_model.stages import layout_rank_layers

    checked = 0
    for small, large in pairs(DEFAULT):
        if small["kind"][0] != "linear_attention" or "host-floor" not in small["model"]:
            continue
        measured, _ = measured_per_token(small, large)
        counted, used = counted_per_token(small)
        assert abs(counted / measured - 1) < 0.02, (small["model"], counted, measured)
        assert abs(used / measured - 1) < 0.02, (small["model"], used, measured)
        checked += 1
    assert checked == 2

    model = load_model("qwen3.5-4b")
    layout, c = Layout(1), default_constants()
    unfused = unfused_constants(c)
    rank = layout_rank_layers(model, layout)[0]
    saved, _ = activation_bytes_per_microbatch(rank, model, layout, 4096.0, 0.0, True, unfused)
    assert sum(n for a, _, n in rank.kinds if a == "linear_attention") > 0
    counted = sum(n * runner_dense_layer_bytes(a, model, layout, set(), 4096.0) for a, _, n in rank.kinds)
    counted += BF16 * model.hidden_size * 4096.0 if rank.has_embedding else 0.0
    assert saved == pytest.approx(counted, rel=1e-9)
    doubled = activation_bytes_per_microbatch(rank, model, layout, 4096.0, 0.0, True, (2.0,) + unfused[1:])[0]
    assert doubled == saved                          # no dense factor left to scale
