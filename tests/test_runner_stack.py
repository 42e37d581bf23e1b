"""The megatron runner's own stack priced from its measured components (cost_model.runner_components,
step_time.runner_step_breakdown), and `term_sources`: where each term of a prediction comes from."""
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import load_model
from cost_model.predict import predict
from cost_model.profile import shipped_profile
from cost_model.runner_components import Curve, layer_signature, parse_runner_components
from cost_model.step_time import RUNNER_FALLBACK_TERMS, TERMS
from cost_model.term_sources import term_sources
from cost_model.nouns.workload import Workload
from experiments.megatron.model_run import trial_model
from experiments.megatron.backend_support import unsupported
from tuner.cli import main
from tuner.what_if import explain

H200 = load_gpu("h200")
MEGATRON = Workload(framework="megatron", seq_len=4096, global_batch=16)
FULL = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
SOURCE_START = re.compile(r"^(measured|modelled|fitted): ")


def runner(model, layout, workload=MEGATRON):
    """A prediction for the megatron runner's stack (no Transformer Engine: no precision-aware optimizer)."""
    return predict(model, H200, workload, layout, precision_aware_optimizer=False)


def qwen3_moe(layers=6):
    return trial_model(load_model("qwen3-30b-a3b"), layers)


@pytest.mark.parametrize("name", ["llama3-8b", "qwen3-30b-a3b", "qwen3.6-35b-a3b", "qwen3-next-80b-a3b"])
def test_shipped_h200_profile_measures_the_layer_kinds(name):
    comps = shipped_profile("h200").runner
    assert comps is not None
    model = load_model(name)
    for attn_kind, mlp_kind in set(zip(model.layer_types, model.mlp_types)):
        curves = comps.layer(layer_signature(model, attn_kind, mlp_kind))
        assert curves is not None, (name, attn_kind, mlp_kind)
        assert curves.none(8192) > 0 and curves.full is not None
    assert (model.hidden_size, model.vocab_size) in comps.ends
    assert comps.optimizer_s_per_param > 0 and comps.cpu_adam


def test_runner_prediction_uses_the_measured_layers_not_the_fitted_terms():
    p = runner(qwen3_moe(), Layout(1, max_tokens_per_gpu=8192))
    b = p.breakdown
    assert b["layers"] > 0 and b["microbatch_ends"] > 0 and b["optimizer"] > 0
    for fitted in ("launch_overhead", "expert_calls", "step_overhead", "compute_attention", "compute_experts"):
        assert b[fitted] == 0, fitted
    assert p.step_time_s == pytest.approx(sum(b.values()))
    assert p.term_sources["layers"].startswith("measured: runner components on NVIDIA H200")


def test_runner_step_follows_recompute_microbatches_and_offload():
    model = qwen3_moe()
    base = runner(model, Layout(1, max_tokens_per_gpu=8192))
    full = runner(model, Layout(1, max_tokens_per_gpu=8192, **FULL))
    assert full.breakdown["recompute"] > 0 and full.step_time_s > base.step_time_s
    # the same global batch in more, smaller micro-batches
    small = runner(model, Layout(1, max_tokens_per_gpu=4096))
    assert small.num_microbatches == 2 * base.num_microbatches
    assert small.step_time_s != pytest.approx(base.step_time_s, rel=1e-3)
    offload = runner(model, Layout(1, max_tokens_per_gpu=8192, optimizer_offload_fraction=0.5))
    assert base.breakdown["offload"] == 0 and offload.breakdown["offload"] > 0
    assert offload.breakdown["optimizer"] < base.breakdown["optimizer"]
    assert offload.term_sources["offload"].startswith("measured: the offloaded optimizer step")
    # the profile's offload builds: the step's extra time per parameter moved to the CPU; the optimizer moves whole
    # tensors, so 0.5 moves at least half of them
    whole = runner(model, Layout(1, max_tokens_per_gpu=8192, optimizer_offload_fraction=1.0))
    assert offload.breakdown["offload"] < whole.breakdown["offload"] <= 2 * offload.breakdown["offload"]


def test_a_layer_the_profile_did_not_run_is_timed_from_the_nearest_measured_layer_of_its_kind():
    from cost_model.runner_components import signature_dims, signature_model
    big = load_model("llama3.1-405b")     # its layer is not in the profile; llama3-8b's and llama3-70b's are
    comps = shipped_profile("h200").runner
    sig, curves = comps.same_kind("full_attention", "dense", big)
    assert curves.model == "llama3-70b" and signature_dims(sig)["hidden_size"] == 8192
    assert signature_model(big, sig).intermediate_size == 28672
    p = runner(trial_model(big, 2), Layout(1, max_tokens_per_gpu=8192))
    assert p.breakdown["compute_mlp"] == 0 and p.breakdown["layers"] > 0
    assert "llama3-70b's measured full_attention+dense layer" in p.term_sources["layers"]


def test_a_layer_timed_as_another_models_keeps_the_measured_curves_shape_over_tokens():
    # the synthetic 32-expert MoE is timed from Mixtral-8x7B's measured layer, whose per-token time falls with
    # tokens; a ratio taken at each token count bent it up at 16k (the grouped GEMM table's bumps between the two
    # models' rows per expert), a ratio taken at one token count keeps it falling
    syn = trial_model(load_model(str(Path(__file__).resolve().parents[1]
                                     / "benchmarks/models/synthetic-moe-32x4/config.json")), 3)
    workload = Workload(seq_len=4096, global_batch=96, framework="megatron")
    per_token = []
    for rows in (1, 2, 3, 4, 6, 8, 12, 16):
        p = runner(syn, Layout(1, max_tokens_per_gpu=4096 * rows, rows_per_microbatch=rows), workload)
        assert "mixtral-8x7b's measured full_attention+moe layer" in p.term_sources["layers"]
        per_token.append(p.breakdown["layers"] / (96 * 4096))
    assert all(b <= a * 1.0001 for a, b in zip(per_token, per_token[1:])), per_token


def test_the_nearest_measured_layer_is_nearest_in_every_size_and_keeps_the_lowest_host_floor():
    from cost_model.runner_components import Curve, LayerCurves, RunnerComponents, layer_signature
    comps = shipped_profile("h200").runner
    # a Mixtral-like model of another hidden size: the 8-expert top-2 layer is nearer than any 128-expert one
    mixtral = load_model("benchmarks/models/mixtral-8x7b/config.json")
    odd = replace(mixtral, name="mixtral-odd", hidden_size=5120, num_attention_heads=40)
    assert comps.layer(layer_signature(odd, "full_attention", "moe")) is None
    _, near = comps.same_kind("full_attention", "moe", odd)
    assert near.model.startswith("mixtral")
    # the donor's first point may be GPU work: the floor carried over is the kind's lowest
    big, small = (LayerCurves(name, Curve((4096.0, 8192.0), (f, 2 * f), floor=f, line=(0.0, f / 4096)), None)
                  for name, f in (("big", 0.040), ("small", 0.010)))
    two = RunnerComponents({layer_signature(mixtral, "full_attention", "moe"): big,
                            layer_signature(load_model("qwen3-30b-a3b"), "full_attention", "moe"): small},
                           {}, 0.0, 0.0, (), 4096, "test")
    _, chosen = two.same_kind("full_attention", "moe", odd)
    assert chosen.model == "big" and chosen.none.floor == 0.010


def test_a_kind_measured_on_one_model_takes_the_kinds_host_floor_not_its_first_point():
    """A profile that ran one MoE model (`tune profile --model qwen3-30b-a3b`): the floor another MoE layer gets from
    that donor is no higher than the kind's host floor (its host-floor builds): the donor's own first point is its
    GPU work (Granite's 40-expert layer priced from Qwen3-30B's 128-expert one on an H100 profile: -40% at 4k tokens
    on v46's r1 with the donor's 12.9 ms, -1% with the kind's 5.8 ms; looked at)."""
    from cost_model.runner_components import Curve, HostFloor, LayerCurves, RunnerComponents, layer_signature
    donor = load_model("qwen3-30b-a3b")
    granite = load_model("benchmarks/models/granite-moe-shape-3b/config.json")
    curves = LayerCurves("qwen3-30b-a3b", Curve((4096.0, 8192.0, 16384.0), (0.0129, 0.0184, 0.032), floor=0.0129,
                                                line=(0.0047, 1.67e-6)), None)
    sig = layer_signature(donor, "full_attention", "moe")
    alone = RunnerComponents({sig: curves}, {}, 0.0, 0.0, (), 4096, "test")
    assert alone.same_kind("full_attention", "moe", granite)[1].none.floor == 0.0129   # no host floor measured
    floor = HostFloor(layer_s=0.0058, layer_full_s=0.0081, ends_s=0.0047, models=("qwen3-30b-a3b-host-floor",),
                      points=3)
    with_floor = replace(alone, host_floors={"full_attention+moe": floor})
    _, priced = with_floor.same_kind("full_attention", "moe", granite)
    assert priced.none.floor == 0.0058 and priced.none.line == curves.none.line
    assert with_floor.layer_for(donor, "full_attention", "moe")[1].none.floor == 0.0129   # its own layer: as measured


def test_te_stack_is_priced_by_the_fitted_terms():
    p = predict(qwen3_moe(), H200, MEGATRON, Layout(1, max_tokens_per_gpu=8192), precision_aware_optimizer=True)
    assert p.breakdown["layers"] == 0 and p.breakdown["microbatch_ends"] == 0
    assert p.breakdown["compute_experts"] > 0 and p.breakdown["step_overhead"] > 0
    assert "layers" not in p.term_sources
    assert p.term_sources["step_overhead"].startswith("fitted: megatron_step_overhead_s = ")


def test_unmeasured_layer_kinds_fall_back_to_the_fitted_terms():
    # A Qwen3-235B-A22B with larger experts is not in the profile: its MoE layer is timed from Qwen3-235B-A22B's
    # measured one. Moonlight's MLA layers have no measured layer of their kind.
    full = replace(load_model("qwen3-235b-a22b"), name="q235-big-experts", moe_intermediate_size=2048)
    assert unsupported(full, "torch-native") == []
    model = trial_model(full, 4)
    comps = shipped_profile("h200").runner
    assert comps.layer(layer_signature(model, model.layer_types[0], model.mlp_types[0])) is None
    p = runner(model, Layout(1, max_tokens_per_gpu=8192))
    assert p.breakdown["layers"] > 0 and p.breakdown["compute_experts"] == 0
    assert "qwen3-235b-a22b's measured full_attention+moe layer" in p.term_sources["layers"]
    # Moonlight's MLA layers have no measured layer of their kind, and the transfer across attention kinds was tried
    # only between softmax and Gated DeltaNet layers: the fitted terms price them
    mla = trial_model(load_model("moonlight-16b-a3b"), 4)
    p = runner(mla, Layout(1, max_tokens_per_gpu=8192))
    assert p.step_time_s > 0 and p.breakdown["compute_attention"] > 0
    assert "modelled: fitted Megatron terms (no measurement of mla+" in p.term_sources["layers"]
    assert "did not measure" in p.term_sources["compute_attention"]
    assert shipped_profile("h200").runner.unmeasured_kinds(mla) == ([], ["mla+dense", "mla+moe"])
    # its ends: another model's measurement scaled to this hidden size and vocabulary
    assert p.term_sources["microbatch_ends"].startswith("modelled: ")


def _without_builds(marker: str):
    """The shipped H200 profile with the runner builds whose signature holds `marker` taken out."""
    import yaml

    shipped = shipped_profile("h200")
    section = yaml.safe_load((Path(__file__).resolve().parents[1] / "cost_model/data/profiles/h200.yaml").read_text())
    section = section["runner_components"]
    comps = parse_runner_components({**section, "builds": [b for b in section["builds"] if marker not in b["signature"]]},
                                    shipped.hbm_copy_tb_s * 1e12)
    return replace(shipped, runner=comps)


def _points(layer: dict, ends: dict, full_layer: dict | None, n: int, mb: int, step_s: float) -> list[dict]:
    out = []
    for full, per_layer in ((False, layer), (True, full_layer)):
        if per_layer is None:
            continue
        for t in per_layer:
            out.append({"tokens": t, "full_recompute": full, "fwd_bwd_s": mb * (n * per_layer[t] + ends[t]),
                        "zero_grad_s": step_s / 4, "optimizer_s": step_s * 3 / 4})
    return out


def test_parse_runner_components_takes_differences_of_builds():
    mb = 2
    layer = {4096: 0.010, 8192: 0.020}            # one layer's seconds per micro-batch
    full_layer = {4096: 0.013, 8192: 0.026}       # with full recompute
    small_ends = {4096: 0.002, 8192: 0.003}       # ends with the 1,024-token vocabulary
    real_ends = {4096: 0.005, 8192: 0.009}        # ends with the model's vocabulary
    step = lambda params: 0.001 + 1e-9 * params   # per-step work: zero grads + optimizer
    common = {"model": "tiny", "signature": "SIG", "hidden_size": 256}
    section = {
        "microbatches": mb, "seq_len": 4096, "device": "NVIDIA H200", "date": "2026-12-02", "megatron_core": "0.19.2",
        "torch": "2.11", "cpu_adam_ranks": [{"ranks": 1, "params_per_s_per_rank": 4e8},
                                            {"ranks": 4, "params_per_s_per_rank": 3e8}],
        "builds": [
            {**common, "layers": 1, "vocab": 1024, "params": 1e6,
             "points": _points(layer, small_ends, full_layer, 1, mb, step(1e6))},
            {**common, "layers": 2, "vocab": 1024, "params": 2e6,
             "points": _points(layer, small_ends, full_layer, 2, mb, step(2e6))},
            {**common, "layers": 1, "vocab": 32000, "params": 9e6,
             "points": _points(layer, real_ends, None, 1, mb, step(9e6))},
        ]}
    comps = parse_runner_components(section)
    curves = comps.layer("SIG")
    assert curves.model == "tiny"
    for t in (4096, 8192):
        assert curves.none(t) == pytest.approx(layer[t])
        assert curves.full(t) == pytest.approx(full_layer[t])
    assert curves.none(6144) == pytest.approx(0.015)
    name, ends = comps.ends[(256, 32000)]
    assert name == "tiny" and (256, 1024) not in comps.ends
    for t in (4096, 8192):
        assert ends(t) == pytest.approx(real_ends[t])
    assert comps.optimizer_s_per_param == pytest.approx(1e-9)
    assert comps.optimizer_s_per_step == pytest.approx(0.001)
    assert comps.cpu_adam_rate(1) == 4e8 and comps.cpu_adam_rate(2) == 3e8 and comps.cpu_adam_rate(8) == 1.5e8
    assert comps.seq_len == 4096 and "NVIDIA H200" in comps.source and "2026-12-02" in comps.source


def test_curve_interpolates_and_extrapolates_from_the_last_two_points():
    c = Curve((1.0, 2.0, 4.0), (1.0, 3.0, 4.0))
    assert c(1) == 1 and c(2) == 3 and c(4) == 4
    assert c(1.5) == pytest.approx(2.0) and c(3) == pytest.approx(3.5)
    assert c(8) == pytest.approx(6.0)           # beyond the last point: the line through the last two
    assert c(0.75) == pytest.approx(0.5)        # before the first: the line through the first two
    assert c(0.25) == 0.0                       # never negative
    assert Curve((2.0,), (4.0,))(3) == pytest.approx(6.0)   # one point: proportional to tokens
    assert c.span == "1-4 tokens"


def _cases():
    moe, gdn = qwen3_moe(), trial_model(load_model("qwen3.6-35b-a3b"), 8)
    yield runner(moe, Layout(1, max_tokens_per_gpu=8192, **FULL))
    yield runner(gdn, Layout(8, tp=2, ep=4, max_tokens_per_gpu=16384, optimizer_offload_fraction=0.5))
    yield runner(gdn, Layout(4, pp=2, ep=2, max_tokens_per_gpu=8192, recompute_granularity="selective"))
    yield runner(trial_model(load_model("qwen3-235b-a22b"), 4), Layout(1, max_tokens_per_gpu=8192))
    yield predict(load_model("qwen3.6-35b-a3b"), H200, Workload(), Layout(8, ep=8, max_tokens_per_gpu=16384,
                                                                            optimizer_offload_fraction=0.5))
    yield predict(load_model("qwen3-30b-a3b"), H200, Workload(framework="megatron"),
                  Layout(16, pp=2, ep=8, max_tokens_per_gpu=16384, dispatcher="flex"))
    yield predict(load_model("llama3-8b"), load_gpu("h100"), Workload(seq_len=4096),
                  Layout(8, tp=2, cp=2, max_tokens_per_gpu=4096, **FULL))


def test_term_sources_cover_every_nonzero_term():
    for p in _cases():
        sources = p.term_sources
        for term, seconds in p.breakdown.items():
            if seconds > 0:
                assert term in sources, (p.source, term)
        for term, line in sources.items():
            assert SOURCE_START.match(line), (term, line)
        assert p.to_dict()["term_sources"] == sources
        # without a breakdown: a line for every term the stack can produce
        every = term_sources(p.context)
        assert set(TERMS) - {"layers", "microbatch_ends"} <= set(every)
        assert all(SOURCE_START.match(line) for line in every.values())


def test_a_prediction_without_its_context_has_no_sources():
    import dataclasses

    p = runner(qwen3_moe(), Layout(1, max_tokens_per_gpu=8192))
    assert dataclasses.replace(p, context=None).term_sources == {}
    # a hypothesis's own term (cost_model.hypotheses) is named too
    extra = dataclasses.replace(p, breakdown={**p.breakdown, "unexplained": 0.5})
    assert extra.term_sources["unexplained"].startswith("fitted: ")


def test_explain_prints_each_terms_source(capsys):
    model = qwen3_moe()
    layout = Layout(1, max_tokens_per_gpu=8192, **FULL)
    text = explain(model, H200, layout, runner(model, layout))
    assert "measured: runner components on NVIDIA H200" in text
    layers = next(line for line in text.splitlines() if line.strip().startswith("layers "))
    assert "measured: runner components" in layers
    # unmeasured layer kinds: the layers row says they were priced by the fitted terms
    other = trial_model(load_model("moonlight-16b-a3b"), 4)
    text = explain(other, H200, Layout(1), runner(other, Layout(1)))
    assert "modelled: fitted Megatron terms (no measurement of" in text
    # `tune predict --explain` prices the TE stack (tuner.predict_request.answer): fitted and modelled
    # terms, and the Gated DeltaNet kernel measured in the profile
    assert main(["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--gpus", "8", "--layout", "ep=8",
                 "--explain"]) == 0
    out = capsys.readouterr().out
    assert "measured:" in out and "fitted: layer_launch_overhead_s = " in out and "modelled: FLOPs" in out
    assert main(["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--gpus", "8", "--layout", "ep=8",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["term_sources"]) == {k for k, v in data["breakdown"].items() if v > 0}


def test_tune_predict_prices_the_megatron_runner_stack_from_its_measured_components(capsys):
    argv = ["predict", "--model", "llama3-8b", "--gpu", "h200", "--gpus", "1", "--seq-len", "4096", "--global-batch",
            "16", "--layout", "max_tokens_per_gpu=16384", "rows_per_microbatch=4", "--json"]
    assert main(argv + ["--framework", "megatron", "--stack", "megatron-runner"]) == 0
    runner = json.loads(capsys.readouterr().out)
    assert main(argv + ["--framework", "megatron"]) == 0
    image = json.loads(capsys.readouterr().out)
    assert runner["breakdown"]["layers"] > 0 and image["breakdown"]["layers"] == 0
    assert runner["term_sources"]["layers"].startswith("measured:")
    assert runner["tokens_per_s_per_gpu"] != image["tokens_per_s_per_gpu"]
    # its interval is the runner stack's own (the band a study of the runner prints), not the TE stack's hypotheses
    from cost_model.nouns.hardware import load_gpu
    from cost_model.nouns.model_spec import load_model
    from tuner.intervals import runner_stack_sd

    assert runner["interval"]["hypotheses"] == 1 and image["interval"]["hypotheses"] > 1
    assert runner["interval"]["error_sd"] == runner_stack_sd(load_model("llama3-8b"), load_gpu("h200"))
    assert runner["interval"]["error_sd"] < image["interval"]["error_sd"]


def test_naming_the_runner_stack_implies_megatrons_step_and_asking_for_slimes_is_one_line(capsys):
    argv = ["predict", "--model", "llama3-8b", "--gpu", "h200", "--gpus", "1", "--stack", "megatron-runner",
            "--layout", "max_tokens_per_gpu=8192", "--json"]
    assert main(argv) == 0
    implied = json.loads(capsys.readouterr().out)
    assert main(argv + ["--framework", "megatron"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens_per_s_per_gpu"] == implied["tokens_per_s_per_gpu"]
    code = main(argv + ["--framework", "slime"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "framework megatron" in err[0]


def test_the_runner_stack_offloads_its_optimizer_without_te_in_predict_and_in_its_space(capsys):
    """The runner offloads through megatron's HybridDeviceOptimizer, which runs precision-aware without TE's
    FusedAdam (train_loop.build_optimizer): `tune predict --stack megatron-runner` prices an offload layout, and the
    runner's search space holds offload layouts, while a stack that never sets --use-precision-aware-optimizer is
    still refused as Megatron refuses it."""
    from cost_model.nouns.stack import Stack
    from search_space.enumerate import enumerate_layouts
    from search_space.rules import violations

    argv = ["predict", "--model", "llama3-8b", "--gpu", "h200", "--gpus", "1", "--seq-len", "4096", "--global-batch",
            "16", "--stack", "megatron-runner", "--layout", "max_tokens_per_gpu=8192", "rows_per_microbatch=2",
            "optimizer_offload_fraction=0.5", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["breakdown"]["offload"] > 0 and out["tokens_per_s_per_gpu"] > 0
    model, work = trial_model(load_model("llama3-8b"), 4), Workload(framework="megatron", seq_len=4096, global_batch=16)
    layouts = list(enumerate_layouts(model, 1, work, Stack.named("megatron-runner")))
    assert any(l.offloaded for l in layouts) and any(not l.offloaded for l in layouts)
    offloaded = next(l for l in layouts if l.offloaded)
    never = Stack(precision_aware_optimizer=False, offload_precision_aware=False)
    assert [v.rule for v in violations(offloaded, model, work, never)] == ["offload_needs_precision_aware"]


def test_a_runner_priced_prediction_carries_the_runner_residual_not_the_te_stacks():
    from types import SimpleNamespace

    from cost_model.constants import default_constants
    from tuner.intervals import prediction_interval

    model = qwen3_moe()
    layout = Layout(1, max_tokens_per_gpu=8192)
    p = runner(model, layout)
    config = SimpleNamespace(workload=MEGATRON, model=model, gpu=H200, profile=None)
    iv = prediction_interval(config, SimpleNamespace(prices_own_run=True), layout, p).to_dict()
    c = default_constants()
    sd = c.runner_prediction_error_sd
    assert iv["error_sd"] == sd < c.runner_scaled_layer_error_sd < c.prediction_error_sd
    assert iv["high"] / iv["low"] == pytest.approx(math.exp(2 * 1.645 * sd), rel=1e-6) and iv["high"] / iv["low"] < 1.5
    assert "measured components" in iv["basis"]
    # a model whose layer the profile did not measure (timed as another's, scaled) carries the larger residual
    other = trial_model(load_model("llama3.1-405b"), 1)
    scaled = SimpleNamespace(workload=MEGATRON, model=other, gpu=H200, profile=None)
    assert prediction_interval(scaled, SimpleNamespace(prices_own_run=True), layout, runner(other, layout)).error_sd == \
        c.runner_scaled_layer_error_sd
    # a stack priced by the fitted terms keeps the model's residual
    te = predict(model, H200, MEGATRON, layout, precision_aware_optimizer=True)
    assert prediction_interval(config, SimpleNamespace(prices_own_run=True), layout, te).error_sd == \
        default_constants().prediction_error_sd


def test_layer_time_memo_gives_what_a_fresh_computation_gives():
    from cost_model import layer_time as lt_mod
    from cost_model import step_time as st_mod

    model = load_model("qwen3.6-35b-a3b")
    layouts = [Layout(8, ep=8, max_tokens_per_gpu=16384), Layout(8, tp=2, ep=4, max_tokens_per_gpu=8192),
               Layout(8, pp=2, ep=4, max_tokens_per_gpu=16384, dispatcher="flex")]
    overlapped = Layout(8, pp=2, vpp=2, ep=4, max_tokens_per_gpu=16384, dispatcher="flex",
                        overlap_moe_expert_parallel_comm=True)
    # an overlapped layout (its exposed all-to-all differs from the shared layer's) priced in between
    warm = [predict(model, H200, Workload(), l) for l in layouts + [overlapped] + layouts]
    lt_mod._MEMO.clear()
    st_mod._RANK_MEMO.clear()
    st_mod._BASE_MEMO.clear()   # a rank's terms without the launch term (cost_model.micro_batch_constants)
    st_mod._PIPELINE_MEMO.clear()
    cold = [predict(model, H200, Workload(), l) for l in layouts + layouts]
    for a, b in zip(warm[:3] + warm[4:], cold):
        assert a.breakdown == b.breakdown and a.step_time_s == b.step_time_s
    assert warm[3].breakdown["ep_comm"] != predict(model, H200, Workload(), replace(
        overlapped, overlap_moe_expert_parallel_comm=False)).breakdown["ep_comm"]


def test_a_component_is_a_host_floor_then_a_line_and_scaled_work_keeps_the_floor():
    from cost_model.runner_components import _point_curve
    # host-bound at 4k tokens (as much as 8k), then 1 ms per 1k tokens on the GPU
    c = _point_curve({4096: 0.0125, 8192: 0.0123, 16384: 0.0206, 32768: 0.0369})
    assert c.floor == pytest.approx(0.0125) and c.line is not None
    assert c(8192) == pytest.approx(0.0123 + 0.0, abs=6e-4)        # the line, not pulled up by the floor point
    assert c(2048) == pytest.approx(0.0125)                        # fewer tokens: still the host's time
    assert c(2048, work=8.0) == pytest.approx(c(16384))            # 8x the work per token: the GPU's time
    # points on one line: no floor
    line = _point_curve({4096: 0.004, 8192: 0.008, 16384: 0.016})
    assert line.floor == 0 and line(32768) == pytest.approx(0.032)


def test_a_components_fixed_cost_per_micro_batch_is_at_least_its_gradient_accumulation():
    from cost_model.runner_components import _point_curve
    points = {8192: 0.0100, 16384: 0.0190, 32768: 0.0370}      # a line with a 1 ms fixed part
    free = _point_curve(points)
    assert free.line[0] == pytest.approx(0.001, abs=1e-4)
    floored = _point_curve(points, min_fixed=0.003)             # its parameters' accumulation costs 3 ms per micro-batch
    assert floored.line[0] == pytest.approx(0.003)
    # the slope is refitted through the points with that fixed part: still close at the measured tokens
    assert all(floored(t) == pytest.approx(s, rel=0.15) for t, s in points.items())
    assert floored(2048) > free(2048)                          # fewer tokens keep the per-micro-batch cost
    assert _point_curve(points, min_fixed=0.0005).line == free.line   # a floor under the fit changes nothing


def test_parse_runner_components_floors_a_layers_fixed_cost_at_the_measured_copy_rate():
    mb, layer, ends = 2, {4096: 0.004, 8192: 0.008, 16384: 0.016}, {4096: 0.002, 8192: 0.003, 16384: 0.005}
    step = lambda params: 0.001 + 1e-9 * params
    common = {"model": "tiny", "signature": "SIG", "hidden_size": 256}
    section = {"microbatches": mb, "seq_len": 4096, "device": "H200", "date": "2026-12-04", "builds": [
        {**common, "layers": 1, "vocab": 1024, "params": 1e8, "points": _points(layer, ends, None, 1, mb, step(1e8))},
        {**common, "layers": 2, "vocab": 1024, "params": 2e8, "points": _points(layer, ends, None, 2, mb, step(2e8))}]}
    hbm = 4e12
    assert parse_runner_components(section).layer("SIG").none.line[0] == pytest.approx(0.0, abs=1e-6)
    floored = parse_runner_components(section, hbm).layer("SIG").none
    assert floored.line[0] == pytest.approx(1e8 * 10 / hbm)    # 1e8 parameters x 10 bytes at 4 TB/s = 0.25 ms


def test_ends_of_an_unprofiled_hidden_size_swap_the_lm_head_gemms_and_keep_the_loss_path():
    from cost_model.predict import runner_components  # noqa: F401  (the profile holds llama3-8b's ends, hidden 4096)
    big = trial_model(load_model("llama3-70b"), 1)
    small = trial_model(load_model("llama3-8b"), 1)
    layout = Layout(1, max_tokens_per_gpu=8192)
    ends_big = runner(big, layout).breakdown["microbatch_ends"]
    ends_small = runner(small, layout).breakdown["microbatch_ends"]
    # twice the hidden size doubles the LM head's GEMMs, not the cross-entropy over the same vocabulary
    assert ends_small < ends_big < 2 * ends_small
    assert "LM head GEMMs replaced" in runner(big, layout).term_sources["microbatch_ends"]


def test_builds_of_a_config_json_model_make_a_profile_section():
    """`tune profile --model PATH`: the build records name the model by its folder, not a catalog key."""
    from experiments.checks.runner_components import section_from_builds
    mixtral = load_model("benchmarks/models/mixtral-8x7b/config.json")
    point = {"tokens": 4096, "full_recompute": False, "zero_grad_s": 0.001, "fwd_bwd_s": 0.1, "optimizer_s": 0.04}
    build = {"model": mixtral.name, "signature": layer_signature(mixtral, "full_attention", "moe"),
             "kind": ["full_attention", "moe"], "layers": 1, "vocab": 1024, "params": 1, "points": [point]}
    [record] = section_from_builds([build], {"microbatches": 4})["builds"]
    assert record["hidden_size"] == 4096 and record["microbatches"] == 4 and record["points"] == [point]


def test_the_runner_stack_refuses_micro_batches_that_do_not_split_the_global_batch(capsys):
    """Megatron's fixed micro-batch needs the global batch a multiple of DP x rows per micro-batch (the runner
    refuses the trial at set-up); slime's dynamic batching does not, so only the runner stack says no."""
    from experiments.megatron.backend_support import microbatch_refusal

    base = ["predict", "--model", "llama3-8b", "--gpu", "h200", "--gpus", "1", "--seq-len", "4096",
            "--global-batch", "16", "--framework", "megatron"]
    five = ["--layout", "max_tokens_per_gpu=20480", "rows_per_microbatch=5"]
    assert main([*base, "--stack", "megatron-runner", *five]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not divisible by DP 1 x 5 rows per micro-batch" in err[0], err
    assert main([*base, *five]) == 0                     # the image stack (slime's bins) prices it
    capsys.readouterr()
    assert microbatch_refusal(Layout(1, max_tokens_per_gpu=16384, rows_per_microbatch=4), 16) is None
    vpp = Layout(8, pp=2, vpp=2, max_tokens_per_gpu=4096,
                 rows_per_microbatch=1)
    assert "multiple of PP 2" in microbatch_refusal(vpp, 12) and microbatch_refusal(vpp, 16) is None


def test_a_layer_is_read_from_its_1_layer_and_deepest_builds_and_a_later_build_replaces_an_earlier():
    """A 4-layer build beside the 1- and 2-layer ones gives the marginal layer over 3 extra layers, and a
    re-timed build of a kind and depth (appended later: benchmarks/append_runner_builds.py) replaces the first."""
    mb = 4
    stale = {4096: 0.030, 8192: 0.030}            # an early build's marginal layer (host-bound at 2 micro-batches)
    layer = {4096: 0.012, 8192: 0.020}
    ends = {4096: 0.002, 8192: 0.003}
    common = {"model": "tiny", "signature": "SIG", "hidden_size": 256}
    build = lambda n, per_layer, params: {**common, "layers": n, "vocab": 1024, "params": params, "microbatches": mb,
                                          "points": _points(per_layer, ends, None, n, mb, 0.001)}
    section = {"microbatches": 2, "seq_len": 4096, "builds": [
        build(1, stale, 1e6), build(2, stale, 2e6),                    # the first profile run
        build(1, layer, 1e6), build(2, {4096: 0.5, 8192: 0.5}, 2e6),    # re-timed: the 2-layer build is not read
        build(4, layer, 4e6)]}
    curves = parse_runner_components(section).layer("SIG")
    for t in (4096, 8192):
        assert curves.none(t) == pytest.approx(layer[t])


def test_appended_builds_keep_the_profile_readable_and_say_which_run(tmp_path):
    """benchmarks/append_runner_builds.py: a build record appended to a copy of the shipped H200 profile is read
    back (its layer now the latest of its kind and depth) and the section's source names the run."""
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    from cost_model.profile import load_profile

    root = Path(__file__).resolve().parents[1]
    profile = tmp_path / "h200.yaml"
    shutil.copy(root / "cost_model/data/profiles/h200.yaml", profile)
    sig = next(iter(load_profile(profile).runner.layers))
    per_layer = {4096: 0.007, 8192: 0.011}
    records = [{"model": "tiny", "signature": sig, "kind": sig.split("|")[0].split("+"), "layers": n, "vocab": 1024,
                "params": n * 1e6, "microbatches": 4,
                "points": _points(per_layer, {4096: 0.002, 8192: 0.003}, None, n, 4, 0.001)} for n in (1, 3)]
    builds = tmp_path / "builds.jsonl"
    builds.write_text("".join(json.dumps(r) + "\n" for r in records))
    done = subprocess.run([sys.executable, str(root / "benchmarks/append_runner_builds.py"), str(profile), str(builds),
                           "runT", "a test run"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    curves = load_profile(profile).runner.layer(sig)
    assert curves.model == "tiny" and curves.none(4096) == pytest.approx(0.007)
    assert yaml.safe_load(profile.read_text())["runner_components"]["source"].endswith("runT: a test run")


def test_a_recomputed_forward_runs_its_collectives_again(monkeypatch):
    """The measured full-recompute time is one GPU's; on EP/TP/CP ranks the recomputed forward also repeats its
    collectives (half of the layer's: the forward ones). With the expert all-to-all priced at 1 s a layer, full
    recompute adds half a second per layer and micro-batch."""
    import cost_model.step_time as st
    monkeypatch.setattr(st, "exposed_ep_comm", lambda lt, share: 1.0)
    model = qwen3_moe(4)
    layout = Layout(2, ep=2, max_tokens_per_gpu=12288, **FULL)
    p = runner(model, layout)
    assert p.breakdown["ep_comm"] == pytest.approx(4 * p.num_microbatches, rel=1e-6)
    plain = runner(model, Layout(2, ep=2, max_tokens_per_gpu=12288))
    assert p.breakdown["recompute"] >= 0.5 * p.breakdown["ep_comm"]
    assert plain.breakdown["recompute"] == 0


def test_host_floor_builds_give_the_kinds_host_time_and_price_no_layer():
    mb = 4
    common = {"signature": "full_attention+dense|hidden_size=256", "kind": ["full_attention", "dense"],
              "hidden_size": 256, "vocab": 1024, "host_floor": True, "microbatches": mb}
    floor, full, ends = 0.0035, 0.0058, 0.0030    # seconds per micro-batch: whatever the tokens (host-bound)

    def points(layers):
        return [{"tokens": t, "full_recompute": f, "zero_grad_s": 1e-4, "optimizer_s": 2e-3,
                 "fwd_bwd_s": mb * (layers * (full if f else floor) + ends)} for t in (4096, 8192) for f in (False, True)]

    builds = [{**common, "model": m, "layers": n, "params": n * 1e6, "points": points(n)}
              for m in ("tiny-a", "tiny-b") for n in (1, 4)]
    comps = parse_runner_components({"microbatches": 2, "seq_len": 4096, "builds": builds})
    got = comps.host_floors["full_attention+dense"]
    assert got.layer_s == pytest.approx(floor) and got.layer_full_s == pytest.approx(full)
    assert got.ends_s == pytest.approx(ends) and got.models == ("tiny-a", "tiny-b") and got.points == 4
    assert comps.layers == {} and comps.ends == {}        # nobody's nearest layer, no model's ends


def test_a_small_dense_layer_at_few_tokens_takes_the_hosts_time():
    """Qwen3-0.6B at 4k tokens: its layers' GPU work is shorter than the host's time to issue them (the shipped
    dense host floor), so the micro-batch takes the host's time; at 32k tokens, and for Llama3-8B at 4k, the
    GPU's work is longer and nothing is added."""
    comps = shipped_profile("h200").runner
    floor = comps.host_floors["full_attention+dense"]
    small = load_model("benchmarks/models/qwen3-0.6b/config.json")
    work = Workload(framework="megatron", seq_len=4096, global_batch=64)
    few = runner(small, Layout(1, max_tokens_per_gpu=4096), work)
    micro = few.step_time_s - few.breakdown["optimizer"]
    host = small.num_hidden_layers * floor.layer_s + floor.ends_s
    # the host's time, and a little more where the GPU's work is not far below it (host_and_gpu_s)
    assert host <= micro / 64 <= host * 1.002
    assert few.breakdown["launch_overhead"] > 0
    assert few.term_sources["launch_overhead"].startswith("measured: the host's time to issue")
    many = runner(small, Layout(1, max_tokens_per_gpu=32768, rows_per_microbatch=8), work)
    assert many.breakdown["launch_overhead"] == 0
    big = runner(trial_model(load_model("llama3-8b"), 8), Layout(1, max_tokens_per_gpu=4096))
    assert big.breakdown["launch_overhead"] == 0
    # full recompute issues the forward again: a higher floor
    again = runner(small, Layout(1, max_tokens_per_gpu=4096, **FULL), work)
    assert again.step_time_s > few.step_time_s


def test_selective_recompute_of_the_mlp_relaunches_a_share_of_a_softmax_layers_kernels_not_a_gdn_layers():
    """The selective shares are of a softmax-attention layer's kernels: recomputing a Gated DeltaNet layer's norms
    and MLP relaunches them, not the delta rule's many more launches (whole Qwen3.5-0.8B, v26: predicted 28% slower
    than without recompute when the share was of the GDN layer's floor; measured 6%)."""
    from types import SimpleNamespace

    from cost_model.step_time import layer_host_s, selective_launch_share
    comps = shipped_profile("h200").runner
    gdn = comps.host_floor("linear_attention", "dense")
    softmax = comps.host_floor("full_attention", "dense")
    assert gdn.layer_s > 2 * softmax.layer_s   # the premise: a GDN layer issues many more kernels
    sel = Layout(1, max_tokens_per_gpu=16384, recompute_granularity="selective", recompute_modules=("layernorm", "mlp"))
    ctx = SimpleNamespace(layout=sel, runner=comps)
    share = selective_launch_share({"layernorm", "mlp"}, "linear_attention", "dense")
    assert layer_host_s(ctx, gdn, "linear_attention", "dense", 0.0) == pytest.approx(gdn.layer_s + share * softmax.layer_s)
    # a softmax layer's own floor, and core_attn's share of its own layer
    assert layer_host_s(ctx, softmax, "full_attention", "dense", 0.0) == pytest.approx(softmax.layer_s * (1 + share))
    attn = SimpleNamespace(layout=replace(sel, recompute_modules=("core_attn",)), runner=comps)
    assert layer_host_s(attn, softmax, "full_attention", "dense", 0.0) == pytest.approx(softmax.layer_s * 1.1)
    assert layer_host_s(attn, gdn, "linear_attention", "dense", 0.0) == pytest.approx(gdn.layer_s)


def test_host_and_gpu_overlap_fully_apart_and_imperfectly_where_they_are_close():
    from cost_model.constants import default_constants
    from cost_model.step_time import host_and_gpu_s

    p = default_constants().runner_host_overlap_exponent
    assert host_and_gpu_s(1.0, 0.4, p) == 1.0 and host_and_gpu_s(0.4, 1.0, p) == 1.0   # far apart: the larger
    assert host_and_gpu_s(1.0, 1.0, p) == pytest.approx(2 ** (1 / p))                  # equal: the most added
    near = [host_and_gpu_s(1.0, g, p) for g in (0.6, 0.8, 0.9, 1.0)]
    assert near == sorted(near) and all(x > 1.0 for x in near[1:])
    assert host_and_gpu_s(0.0, 0.0, p) == 0.0


def test_host_floor_shape_keeps_the_layers_kernels_and_shrinks_its_work():
    from experiments.checks.runner_components import HOST_FLOOR_DIMS, host_floor_model

    model = load_model("benchmarks/models/qwen3-0.6b/config.json")
    tiny = host_floor_model(model)
    assert {k: getattr(tiny, k) for k in HOST_FLOOR_DIMS} == HOST_FLOOR_DIMS
    assert tiny.qk_norm == model.qk_norm and tiny.layer_types == model.layer_types
    assert tiny.name == "qwen3-0.6b-host-floor"
    shipped = load_model("benchmarks/models/host-floor-qwen3/config.json")   # what the shipped floor measured
    assert layer_signature(tiny, "full_attention", "dense") == layer_signature(shipped, "full_attention", "dense")


@pytest.mark.torch
@pytest.mark.parametrize("name", ["qwen3.6-35b-a3b", "qwen3-30b-a3b", "qwen3-next-80b-a3b",
                                  "benchmarks/models/mixtral-8x7b/config.json", "llama3-8b"])
def test_host_floor_shape_is_a_model_megatron_builds(name):
    """Every layer kind's host-floor shape is one megatron-core's TransformerConfig accepts, with the kernels'
    counts of the model's own layer (experts, top-k, linear-attention heads) and a few percent of its work."""
    pytest.importorskip("megatron.core")
    from experiments.checks.runner_components import host_floor_model, kind_model, layer_kinds
    from experiments.megatron.config import build_transformer_config

    model = load_model(name)
    tiny = host_floor_model(model)
    assert (tiny.num_experts, tiny.num_experts_per_tok) == (model.num_experts, model.num_experts_per_tok)
    assert (tiny.linear_num_value_heads, tiny.linear_key_head_dim) == (model.linear_num_value_heads,
                                                                       model.linear_key_head_dim)
    for kind in layer_kinds(model):
        build = kind_model(tiny, kind, 1, 1024)
        cfg = build_transformer_config(build, Layout(1, max_tokens_per_gpu=4096), MEGATRON,
                                       use_cpu_initialization=True)
        assert cfg.hidden_size == 256 and cfg.num_layers == 1
        full = kind_model(model, kind, 1, 1024)
        assert build.layer_params(*kind).total < 0.05 * full.layer_params(*kind).total


def test_profile_plans_a_host_floor_for_every_layer_kind_the_runner_prices():
    """`tune profile --model M` builds each layer kind at 1 and 2 layers, the first with the real vocabulary and
    offloaded, and a host floor (1 and 4 layers) of every kind the shipped profile measures one for: dense, MoE and
    Gated DeltaNet MoE."""
    from experiments.checks.runner_components import build_plan

    qwen36 = build_plan(load_model("qwen3.6-35b-a3b"))
    floors = [(k, n) for k, n, extra in qwen36 if extra == "--host-floor"]
    assert floors == [(("linear_attention", "moe"), 1), (("linear_attention", "moe"), 4),
                      (("full_attention", "moe"), 1), (("full_attention", "moe"), 4)]
    assert len(qwen36) == 2 * 2 + 2 + 4
    dense = build_plan(load_model("llama3-8b"))
    assert [(n, e) for _, n, e in dense] == [(1, ""), (2, ""), (1, "--real-vocab"), (2, "--offload"),
                                             (1, "--host-floor"), (4, "--host-floor")]


def test_every_kind_profile_plans_a_floor_for_has_one_shipped():
    from cost_model.profile import load_profile
    from experiments.checks.runner_components import HOST_FLOOR_KINDS

    shipped = load_profile(Path(__file__).resolve().parents[1] / "cost_model/data/profiles/h200.yaml").runner
    assert {"+".join(k) for k in HOST_FLOOR_KINDS} == set(shipped.host_floors)


def test_profile_runs_its_builds_in_one_process_while_the_gpu_has_room(tmp_path, monkeypatch):
    """run_plan starts one process for the whole plan; a process that exits EXIT_LEAKED (the GPU memory megatron
    holds of earlier builds) leaves the rest to a fresh one, and a build a process crashed on is skipped and said
    so, not retried forever."""
    import json as _json
    import subprocess

    from experiments.checks import runner_components as rc

    behaviour = iter([(2, rc.EXIT_LEAKED), (0, 1), (10, 0)])   # (builds it finishes, exit code) per process
    started = []

    class FakeProcess:
        def __init__(self, argv, **_kw):
            plan = _json.loads(argv[argv.index("--plan") + 1])
            out = Path(argv[argv.index("--out") + 1])
            started.append([tuple(b) for b in plan])
            n, self.returncode = next(behaviour)
            with open(out, "a") as f:
                for b in plan[:n]:
                    f.write(_json.dumps({"kind": b[0], "layers": b[1]}) + "\n")

        def poll(self):
            return self.returncode

    monkeypatch.setattr(subprocess, "Popen", FakeProcess)
    plan = [(("full_attention", "moe"), 1, ""), (("full_attention", "moe"), 2, ""),
            (("full_attention", "moe"), 1, "--real-vocab"), (("full_attention", "moe"), 2, "--offload")]
    out, logged = tmp_path / "builds.jsonl", []
    rc.run_plan("m", plan, out, [], {}, 60.0, logged.append)
    assert [len(p) for p in started] == [4, 2, 1]          # whole plan, the rest after the leak, the rest after the crash
    assert [_json.loads(line)["layers"] for line in out.read_text().splitlines()] == [1, 2, 2]
    assert any("the 2 builds left run in a fresh process" in s for s in logged)
    assert any("x1 --real-vocab not measured: its process ended (1)" in s for s in logged)


def test_a_builds_process_started_ahead_runs_the_first_plan_and_a_fresh_one_the_rest(tmp_path, monkeypatch):
    """`tune profile --model` starts its builds' process during the microbenchmarks (BuildsAhead): run_plan hands
    it the plan on its stdin instead of starting one; after it hands over (EXIT_LEAKED) a fresh process runs the
    rest with the plan on its command line."""
    import io
    import json as _json
    import subprocess

    from experiments.checks import runner_components as rc

    behaviour = iter([(1, rc.EXIT_LEAKED), (10, 0)])
    started = []

    class FakeProcess:
        def __init__(self, argv, stdin=None, **_kw):
            self.argv, self.out, self.returncode = argv, Path(argv[argv.index("--out") + 1]), None
            self.stdin = io.StringIO() if stdin is not None else None
            if self.stdin is not None:      # started ahead: the plan comes on stdin
                self.stdin.close = lambda: self._run(_json.loads(self.stdin.getvalue()))
            else:
                self._run(_json.loads(argv[argv.index("--plan") + 1]))

        def _run(self, plan):
            started.append(("stdin" if self.stdin is not None else "argv", len(plan)))
            n, self.returncode = next(behaviour)
            for b in plan[:n]:
                rc._append(self.out, {"kind": b[0], "layers": b[1]})

        def poll(self):
            return self.returncode

        def wait(self):
            return self.returncode

    monkeypatch.setattr(subprocess, "Popen", FakeProcess)
    out, kind = tmp_path / "builds.jsonl", ("full_attention", "moe")
    ahead = rc.BuildsAhead("m", out, ["--seq-len", "4096"], {})
    assert ahead.proc.argv[ahead.proc.argv.index("--plan") + 1] == "-" and started == []   # waiting, no plan yet
    plan = [(kind, 1, ""), (kind, 2, ""), (kind, 1, "--real-vocab")]
    rc.run_plan("m", plan, out, ["--seq-len", "4096"], {}, 60.0, lambda s: None, ahead=ahead)
    assert started == [("stdin", 3), ("argv", 2)]
    assert [b["layers"] for b in rc.read_builds(out)] == [1, 2, 1]
    ahead.close()   # after its process ended: nothing to stop, no error


def test_a_builds_process_started_ahead_imports_without_a_gpu_and_ends_on_an_empty_plan(tmp_path):
    """The real process: started ahead it imports (no CUDA context: it waits beside the microbenchmarks) and
    reads its plan from stdin; a profile that ends before its builds closes stdin and it exits 0, writing nothing."""
    import subprocess
    import sys as _sys

    out = tmp_path / "builds.jsonl"
    proc = subprocess.run([_sys.executable, "-m", "experiments.checks.runner_components", "--model", "llama3-8b",
                           "--out", str(out), "--plan", "-"], input="", capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-500:]
    assert not out.exists()
    assert "CUDA was initialised" not in proc.stderr


def test_a_profile_process_hands_over_when_held_memory_fills_half_the_gpu_or_costs_a_point(tmp_path, monkeypatch):
    """run_builds (the child of run_plan) with megatron's held memory simulated on a 200-GiB device: builds share
    the process until more than HELD_FRACTION of it is held; a build that runs out of memory beside held memory is
    not recorded (the parent measures it again in a fresh process); one that runs out of memory alone is."""
    import argparse
    import json as _json
    from types import SimpleNamespace

    from experiments.checks import runner_components as rc

    gib = 2 ** 30
    state = {"allocated": 0}

    class FakeBench:
        device = "fake"

        def __init__(self, *a, **k):
            cuda = SimpleNamespace(memory_allocated=lambda: state["allocated"],
                                   get_device_properties=lambda i: SimpleNamespace(total_memory=200 * gib))
            self.torch = SimpleNamespace(cuda=cuda)
            self.dist = SimpleNamespace(destroy_process_group=lambda: None)

    def fake_measure(bench, model, kind, layers, vocab, rows, recompute, offload=False):
        if layers == 5:
            return {"kind": list(kind), "layers": 5, "error": "build: AcceleratorError: CUDA error: an illegal "
                                                              "memory access was encountered", "points": []}
        need = {1: 30, 2: 40, 3: 150, 4: 250}[layers] * gib
        oom = state["allocated"] + need > 200 * gib
        if not oom:
            state["allocated"] += need          # megatron keeps it
        return {"kind": list(kind), "layers": layers, "points": [{"error": "out of memory"} if oom else {}]}

    monkeypatch.setattr(rc, "Bench", FakeBench)
    monkeypatch.setattr(rc, "measure_build", fake_measure)
    out = tmp_path / "b.jsonl"
    args = argparse.Namespace(model=["qwen3-30b-a3b"], seq_len=4096, microbatches=4, repeats=3, out=str(out))
    kind = ("full_attention", "moe")
    recorded = lambda: [_json.loads(x)["layers"] for x in out.read_text().splitlines()]  # noqa: E731
    rows = lambda extra: (1,)  # noqa: E731
    # 70 GiB held after two builds; the third (150) does not fit beside them: not recorded, handed over
    assert rc.run_builds(args, [(kind, 1, ""), (kind, 2, ""), (kind, 3, "")], rows) == rc.EXIT_LEAKED
    assert recorded() == [1, 2]
    # a fresh process measures it; 150 GiB held is past half the device, so the next build gets a fresh one
    state["allocated"] = 0
    assert rc.run_builds(args, [(kind, 3, ""), (kind, 1, "")], rows) == rc.EXIT_LEAKED
    assert recorded() == [1, 2, 3]
    # running out of memory with nothing held is a measurement: recorded
    state["allocated"] = 0
    assert rc.run_builds(args, [(kind, 4, "")], rows) == 0
    assert recorded() == [1, 2, 3, 4]
    assert _json.loads(out.read_text().splitlines()[-1])["points"] == [{"error": "out of memory"}]
    # another failure may have broken the process's CUDA context: recorded, then the rest go to a fresh process
    assert rc.run_builds(args, [(kind, 5, ""), (kind, 1, "")], rows) == rc.EXIT_LEAKED
    assert recorded() == [1, 2, 3, 4, 5]
    # memory that stays is named by what holds it; a diagnosis that fails costs no build
    state["allocated"] = 0
    monkeypatch.setattr(rc, "held_tensors", lambda top: 1 / 0)
    assert rc.run_builds(args, [(kind, 1, "")], rows) == 0
    last = _json.loads(out.read_text().splitlines()[-1])
    assert last["held_after_gib"] == 30 and last["held_by"][0]["error"].startswith("ZeroDivisionError")


def test_profile_processes_that_record_nothing_or_half_a_line_are_not_retried_forever(tmp_path, monkeypatch):
    """A process that asks for a fresh one having recorded nothing is a crash (its build skipped, not retried);
    a line a killed process left half written is not a build, and the next record still reads whole."""
    import json as _json
    import subprocess

    from experiments.checks import runner_components as rc

    out = tmp_path / "builds.jsonl"
    behaviour = iter(["half", (0, rc.EXIT_LEAKED), (9, 0)])
    started = []

    class FakeProcess:
        def __init__(self, argv, **_kw):
            plan = _json.loads(argv[argv.index("--plan") + 1])
            started.append(len(plan))
            step = next(behaviour)
            if step == "half":                       # killed while writing its first record
                out.write_text('{"kind": "full_attention+moe", "lay')
                self.returncode = -9
                return
            n, self.returncode = step
            for b in plan[:n]:
                rc._append(out, {"kind": b[0], "layers": b[1]})

        def poll(self):
            return self.returncode

    monkeypatch.setattr(subprocess, "Popen", FakeProcess)
    kind = ("full_attention", "moe")
    plan = [(kind, 1, ""), (kind, 2, ""), (kind, 3, ""), (kind, 4, "--offload")]
    logged = []
    rc.run_plan("m", plan, out, [], {}, 60.0, logged.append)
    assert started == [4, 3, 2]
    assert [b["layers"] for b in rc.read_builds(out)] == [3, 4]
    assert any("x1 not measured: its process ended (-9)" in s for s in logged)
    assert any("x2 not measured: its process ended (75)" in s for s in logged)


def test_a_runner_prediction_near_its_host_gpu_crossing_gets_the_wider_band():
    """Qwen3.6 at 4 layers, seq 1k: at 4k tokens a micro-batch's host time is about 0.9 of its GPU time (the band
    carries runner_host_crossing_error_sd), at 16k a third (the plain runner band)."""
    from cost_model.constants import default_constants
    from cost_model.step_time import runner_host_to_gpu
    from tuner.intervals import (CROSSING_RATIO, crossing_extra_sd, host_launch_extra_sd, own_prediction_interval,
                                 runner_stack_sd)

    model, work = trial_model(load_model("qwen3.6-35b-a3b"), 4), Workload(framework="megatron", seq_len=1024,
                                                                          global_batch=48)
    near = runner(model, Layout(1, max_tokens_per_gpu=4096, rows_per_microbatch=4), work)
    far = runner(model, Layout(1, max_tokens_per_gpu=16384, rows_per_microbatch=16), work)
    assert runner_host_to_gpu(near.context) >= CROSSING_RATIO > runner_host_to_gpu(far.context) > 0
    c = default_constants()
    assert crossing_extra_sd(far) == 0.0
    # from the shipped profile each also carries the unmeasured host's speed at issuing kernels, more near the crossing
    launch_near, launch_far = host_launch_extra_sd(near), host_launch_extra_sd(far)
    assert launch_near > 10 * launch_far
    assert runner_stack_sd(model, H200, None, near) == pytest.approx(math.hypot(c.runner_host_crossing_error_sd,
                                                                                launch_near))
    assert runner_stack_sd(model, H200, None, far) == pytest.approx(math.hypot(c.runner_prediction_error_sd,
                                                                               launch_far))
    wide, narrow = (own_prediction_interval(model, H200, work, p) for p in (near, far))
    assert wide.high / wide.low > narrow.high / narrow.low


def test_a_host_bound_prediction_from_a_shipped_profile_carries_the_spread_of_hosts():
    """A shipped profile's host floors are one machine's; the user's host issues kernels faster or slower
    (runner_host_launch_error_sd, their spread over machines). Qwen3-0.6B at 4k tokens, where the host sets the
    micro-batch, carries nearly all of it; at 32k tokens, GPU-bound, next to none; from a profile `tune profile`
    made on the user's machine (its host measured), none."""
    from cost_model.constants import default_constants
    from tuner.intervals import crossing_extra_sd, host_launch_extra_sd, runner_stack_sd

    sd = default_constants().runner_host_launch_error_sd
    small = load_model("benchmarks/models/qwen3-0.6b/config.json")
    work = Workload(framework="megatron", seq_len=4096, global_batch=64)
    few = runner(small, Layout(1, max_tokens_per_gpu=4096), work)
    many = runner(small, Layout(1, max_tokens_per_gpu=32768, rows_per_microbatch=8), work)
    assert 0.8 * sd < host_launch_extra_sd(few) <= sd
    assert host_launch_extra_sd(many) < 0.01 * sd
    assert runner_stack_sd(small, H200, None, few) == pytest.approx(math.hypot(
        runner_stack_sd(small, H200), crossing_extra_sd(few), host_launch_extra_sd(few)))
    # the same components as a profile of the user's own machine (not the shipped object): its host was measured
    mine = replace(shipped_profile("h200"), source="tune profile on the user's machine")
    assert runner_stack_sd(small, H200, mine, few) == pytest.approx(math.hypot(runner_stack_sd(small, H200, mine),
                                                                               crossing_extra_sd(few)))


def test_the_runners_pipeline_fill_and_drain_is_the_other_stages_micro_batches():
    """1F1B: each stage but the slowest runs one micro-batch nothing overlaps (over VPP when interleaved); equal
    stages give the familiar (PP - 1) / VPP of one."""
    from cost_model.step_time import pipeline_bubble_s, runner_rank_terms

    assert pipeline_bubble_s([1.0, 1.0, 1.0, 1.0], 1) == pytest.approx(3.0)
    assert pipeline_bubble_s([1.0, 1.0, 1.0, 1.0], 2) == pytest.approx(1.5)
    assert pipeline_bubble_s([0.5, 2.0], 1) == pytest.approx(0.5)
    # Qwen3.6 on 2 GPUs, PP2: the last stage carries the 248k-vocabulary head, the bubble is the first stage's
    model = trial_model(load_model("qwen3.6-35b-a3b"), 12)
    p = predict(model, H200, Workload(framework="megatron", seq_len=4096, global_batch=4),
                Layout(2, pp=2, max_tokens_per_gpu=8192, rows_per_microbatch=2), precision_aware_optimizer=False)
    per = [sum(runner_rank_terms(p.context, r, 0.0).values()) for r in p.context.ranks]
    assert per[1] > per[0] and p.breakdown["pp_bubble"] == pytest.approx(per[0])


def test_a_layer_kind_no_profile_measured_is_priced_across_kinds_or_by_the_fitted_terms_with_their_error():
    """Dense Qwen3.5's Gated DeltaNet + dense MLP layers, in a profile without a measured layer of their kind: a
    measured dense layer of another attention kind prices them (its GPU work ratio modelled across the kinds) and the
    band carries runner_cross_kind_layer_error_sd. A profile without any dense layer leaves them to the fitted terms:
    the band then carries runner_modelled_layer_error_sd times the share of the step those terms price; --explain says
    so. The shipped profile measures the kind (run10), so there it is the model's own layer."""
    from cost_model.constants import default_constants
    from tuner.intervals import modelled_extra_sd, runner_stack_sd

    c = default_constants()
    layout = Layout(1, max_tokens_per_gpu=16384)
    dense35 = trial_model(load_model("qwen3.5-27b"), 4)
    assert shipped_profile("h200").runner.unmeasured_kinds(dense35) == ([], [])
    shipped = _without_builds("linear_attention+dense|")
    assert shipped.runner.unmeasured_kinds(dense35) == (["linear_attention+dense"], [])
    p = predict(dense35, H200, MEGATRON, layout, profile=shipped, precision_aware_optimizer=False)
    assert p.breakdown["compute_linear_attention"] == p.breakdown["compute_mlp"] == 0.0
    assert "another attention kind" in term_sources(p.context)["layers"]
    assert runner_stack_sd(dense35, H200, shipped, p) == pytest.approx(c.runner_cross_kind_layer_error_sd)
    assert c.runner_scaled_layer_error_sd < c.runner_cross_kind_layer_error_sd < c.runner_modelled_layer_error_sd

    profile = _without_builds("+dense|")
    moe_only = profile.runner
    assert moe_only.unmeasured_kinds(dense35) == ([], ["linear_attention+dense", "full_attention+dense"])
    q = predict(dense35, H200, MEGATRON, layout, profile=profile, precision_aware_optimizer=False)
    extra = modelled_extra_sd(dense35, H200, profile, q)
    share = sum(q.breakdown[k] for k in RUNNER_FALLBACK_TERMS)
    assert extra == pytest.approx(c.runner_modelled_layer_error_sd * share / q.step_time_s) and 0 < extra
    assert modelled_extra_sd(dense35, H200, profile) == pytest.approx(c.runner_modelled_layer_error_sd)


def test_a_runner_prediction_on_two_gpus_carries_the_multi_gpu_error():
    """Over one GPU the runner's communication and its overlap are modelled: its prediction's sd is
    runner_multi_gpu_error_sd (from the stored 2-GPU runs), as the band and the agent's per-candidate variance say."""
    from types import SimpleNamespace

    from cost_model.constants import default_constants
    from tuner.intervals import candidate_extra_sd, multi_gpu_extra_sd, runner_stack_sd

    c = default_constants()
    model = qwen3_moe()
    one = runner(model, Layout(1, max_tokens_per_gpu=8192))
    two = runner(model, Layout(2, ep=2, max_tokens_per_gpu=8192))
    assert multi_gpu_extra_sd(one) == 0.0 and runner_stack_sd(model, H200, None, one) == c.runner_prediction_error_sd
    assert runner_stack_sd(model, H200, None, two) == pytest.approx(c.runner_multi_gpu_error_sd)
    extra = candidate_extra_sd(SimpleNamespace(profile=None, gpu=H200), SimpleNamespace(prices_own_run=True))
    assert multi_gpu_extra_sd(two) > 0 and extra(SimpleNamespace(prediction=two)) == pytest.approx(multi_gpu_extra_sd(two))
    assert extra(SimpleNamespace(prediction=one)) == 0.0


def test_an_offloaded_step_from_a_shipped_profile_carries_the_host_cpus_spread():
    """The CPU optimizer runs on a host the shipped profile never measured: a runner prediction with an offloaded
    optimizer carries runner_host_cpu_error_sd times the offloaded step's share of the step; none without offload, and
    none from a profile `tune profile` made on the user's machine (its host measured)."""
    from types import SimpleNamespace

    from cost_model.constants import default_constants
    from cost_model.profile import load_profile
    from tuner.intervals import (candidate_extra_sd, host_cpu_extra_sd, host_launch_extra_sd, runner_stack_sd,
                                 unmeasured_host_sd)

    c = default_constants()
    model = qwen3_moe()
    plain = runner(model, Layout(1, max_tokens_per_gpu=8192))
    off = runner(model, Layout(1, max_tokens_per_gpu=8192, optimizer_offload_fraction=0.5))
    share = off.breakdown["offload"] / off.step_time_s
    assert 0 < share < 1 and host_cpu_extra_sd(plain) == 0.0
    assert host_cpu_extra_sd(off) == pytest.approx(c.runner_host_cpu_error_sd * share)
    assert runner_stack_sd(model, H200, None, off) == pytest.approx(math.hypot(c.runner_prediction_error_sd,
                                                                               unmeasured_host_sd(off)))
    extra = candidate_extra_sd(SimpleNamespace(profile=None, gpu=H200), SimpleNamespace(prices_own_run=True))
    assert extra(SimpleNamespace(prediction=off)) == pytest.approx(unmeasured_host_sd(off))
    assert unmeasured_host_sd(off) == pytest.approx(math.hypot(host_cpu_extra_sd(off), host_launch_extra_sd(off)))
    mine = load_profile(Path(__file__).resolve().parents[1] / "benchmarks/results/profile-h100-llama3-8b-2026-12-06.yaml")
    h100 = load_gpu("h100")
    llama = trial_model(load_model("llama3-8b"), 2)
    own = predict(llama, h100, MEGATRON, Layout(1, max_tokens_per_gpu=8192, optimizer_offload_fraction=0.5),
                  precision_aware_optimizer=False, profile=mine)
    assert own.breakdown["offload"] > 0 and runner_stack_sd(llama, h100, mine, own) == pytest.approx(
        runner_stack_sd(llama, h100, mine, replace(own, breakdown={**own.breakdown, "offload": 0.0})))


def test_a_kind_without_host_floor_builds_adds_up_the_measured_kinds_launches():
    """In a profile without host-floor builds of dense Gated DeltaNet layers, their floor is the dense softmax layer's
    plus what the Gated DeltaNet MoE layer takes over the softmax MoE one (launches add up by part), said so in
    --explain; a kind that three measured kinds do not compose has none. The shipped profile measures it (run10)."""
    measured = shipped_profile("h200").runner.host_floor("linear_attention", "dense")
    assert measured is not None and not measured.composed
    profile = _without_builds("linear_attention+dense|")
    comps = profile.runner
    f = {k: comps.host_floor(*k.split("+")) for k in ("full_attention+dense", "linear_attention+moe",
                                                       "full_attention+moe", "linear_attention+dense")}
    composed = f["linear_attention+dense"]
    assert composed.composed and not f["full_attention+dense"].composed
    assert composed.layer_s == pytest.approx(f["full_attention+dense"].layer_s + f["linear_attention+moe"].layer_s
                                             - f["full_attention+moe"].layer_s)
    assert composed.ends_s == f["full_attention+dense"].ends_s
    assert comps.host_floor("mla", "moe") is None
    small = trial_model(load_model("qwen3.5-27b"), 4)
    p = predict(small, H200, Workload(framework="megatron", seq_len=2048, global_batch=8),
                Layout(1, max_tokens_per_gpu=2048), profile=profile, precision_aware_optimizer=False)
    assert "composed, modelled: launches add up by part" in p.term_sources["launch_overhead"]


def test_cpu_adam_ranks_start_their_processes_once_and_time_each_rank_count():
    """The CPU Adam processes start once (each start imports torch) and step r at a time: one rate per rank count,
    positive, in the order asked (small tensors: a smoke run of the real measurement on this CPU)."""
    from experiments.checks.runner_components import cpu_adam_ranks

    out = cpu_adam_ranks(1, ranks=(1, 2), n_params=2 ** 16, steps=2)
    assert [r["ranks"] for r in out] == [1, 2]
    assert all(r["params_per_s_per_rank"] > 0 and r["threads_per_rank"] == 1 for r in out)


def test_cpu_adam_processes_started_ahead_are_the_ones_timed_and_end_with_them():
    """`tune profile --model` starts the CPU Adam processes with its builds' (at the lowest CPU priority, beside the
    microbenchmarks): the rates come from those processes, which end after them; ones never used end at once."""
    from experiments.checks.runner_components import CpuAdamWorkers, cpu_adam_ranks

    workers = CpuAdamWorkers(1, count=2, n_params=2 ** 16, steps=2, nice=True)
    pids = {p.pid for p in workers.procs}
    workers.wait_ready()
    procs = list(workers.procs)
    out = cpu_adam_ranks(1, ranks=(1, 2), workers=workers)
    assert [r["ranks"] for r in out] == [1, 2] and all(r["params_per_s_per_rank"] > 0 for r in out)
    assert {p.pid for p in procs} == pids and not any(p.is_alive() for p in procs) and workers.procs == []
    unused = CpuAdamWorkers(1, count=2, n_params=2 ** 16, steps=2, nice=True)
    procs = list(unused.procs)
    unused.close()   # still setting up: stopped, not waited for
    assert not any(p.is_alive() for p in procs)


def test_measure_models_times_cpu_adam_with_the_processes_started_ahead(tmp_path, monkeypatch):
    """The builds wait until the CPU Adam processes started ahead are set up (none then takes the host's cores from
    a build), and the rates come from those processes, which end with the section; a build's plan goes to the
    builds' process started ahead."""
    import torch

    from experiments.checks import runner_components as rc

    events = []

    class Workers:
        procs = [object()]

        def wait_ready(self):
            events.append("cpu adam ready")

        def rates(self, ranks):
            events.append(("cpu adam timed", tuple(ranks)))
            return [{"ranks": r, "threads_per_rank": 4, "params_per_s_per_rank": 1e9 / r} for r in ranks]

        def close(self):
            events.append("cpu adam closed")

    class Ahead:
        name, argv_tail, out, cpu_adam = "llama3-8b", rc.builds_argv_tail(), tmp_path / "builds.jsonl", Workers()

        def close(self):
            events.append("ahead closed")

    monkeypatch.setattr(rc, "run_plan", lambda name, plan, out, tail, env, timeout_s, log, ahead=None:
                        events.append(("builds", name, type(ahead).__name__)))
    monkeypatch.setattr(rc, "read_builds", lambda out: [])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H100 80GB HBM3")
    section = rc.measure_models(["llama3-8b"], log=lambda _s: None, ahead=Ahead())
    assert events == ["cpu adam ready", ("builds", "llama3-8b", "Ahead"), ("cpu adam timed", (1, 2, 4)),
                      "cpu adam closed"]
    assert [r["ranks"] for r in section["cpu_adam_ranks"]] == [1, 2, 4]


def test_tune_profile_starts_its_builds_process_once_the_gpu_is_shared_and_stops_it_after(tmp_path, monkeypatch):
    """`tune profile --model M`: the builds' process starts when run_profile says the device-level readings are
    done (gpu_shared), is handed to measure_models, and is stopped when the profile ends, whatever happened."""
    from experiments.checks import hardware_profile as hp
    from experiments.checks import runner_components as rc

    events = []

    def fake_run_profile(model, quick=False, gpu_shared=None, kernel_batches=(1,)):
        assert kernel_batches == (1,)   # no Gated DeltaNet builds: the kernel section's batch only
        events.append("early parts")
        gpu_shared()
        events.append("timed sections")
        return {"gpu_type": "h200"}

    def fake_measure(models, log=print, ahead=None):
        events.append(("builds", models, type(ahead).__name__, ahead.proc.poll()))   # still waiting for its plan
        raise RuntimeError("a build failed")

    monkeypatch.setattr(hp, "run_profile", fake_run_profile)
    monkeypatch.setattr(rc, "measure_models", fake_measure)
    started = []
    real = rc.start_builds_ahead
    monkeypatch.setattr(rc, "start_builds_ahead", lambda m, out: started.append(real(m, out)) or started[-1])
    with pytest.raises(RuntimeError):
        main(["profile", "--model", "llama3-8b", "--out", str(tmp_path / "p.yaml")])
    assert events == ["early parts", "timed sections", ("builds", ["llama3-8b"], "BuildsAhead", None)]
    assert started[0].proc.poll() is not None   # stopped, not left waiting
    assert started[0].cpu_adam is not None and started[0].cpu_adam.procs == []   # its CPU Adam processes too


def test_a_default_image_size_is_no_difference():
    """A study without images asked again with images: the images are the difference, not the default image size
    their record carries."""
    from tuner.study import _differences

    recorded = {"model": "m", "workload": {"seq_len": 4096}}
    asked = {"model": "m", "workload": {"seq_len": 4096, "images_per_row": 1, "image_size": 448}}
    assert _differences(recorded, asked) == ["workload.images_per_row: default recorded, 1 asked"]
    bigger = {"model": "m", "workload": {"seq_len": 4096, "images_per_row": 1, "image_size": 896}}
    assert "workload.image_size: default recorded, 896 asked" in _differences(recorded, bigger)


def test_a_gdn_layer_scaled_from_another_models_takes_the_gdn_power_and_says_so():
    """Qwen3.5-4B's Gated DeltaNet layer is timed as Qwen3.5-27B's measured one, scaled by the modelled work ratio to
    runner_scaled_linear_work_exponent (a smaller GDN layer's kernels lose more than its GEMMs); the dense exponent
    leaves it alone, and a dense model's scaled layer the other way round."""
    from cost_model.constants import default_constants
    from tuner.intervals import scales_linear_layers

    small = trial_model(load_model("qwen3.5-4b"), 8)
    dense = trial_model(load_model(str(Path(__file__).resolve().parents[1] / "benchmarks/models/yi-6b/config.json")), 8)
    assert scales_linear_layers(small, H200) and not scales_linear_layers(dense, H200)
    assert not scales_linear_layers(load_model("qwen3.6-35b-a3b"), H200)   # its own layers are measured
    c = default_constants()
    layout = Layout(1, max_tokens_per_gpu=16384)

    def seconds(model, **changed):
        p = predict(model, H200, MEGATRON, layout, constants=replace(c, **changed), precision_aware_optimizer=False)
        return p.breakdown["layers"], p.term_sources["layers"]

    base, source = seconds(small)
    assert "runner_scaled_linear_work_exponent" in source and f"power {c.runner_scaled_linear_work_exponent:g}" in source
    lower = c.runner_scaled_linear_work_exponent - 0.1   # a smaller layer's ratio (< 1) to a lower power: more time
    assert seconds(small, runner_scaled_linear_work_exponent=lower)[0] > base
    assert seconds(small, runner_scaled_work_exponent=c.runner_scaled_work_exponent - 0.1)[0] != base  # attention
    dense_base, dense_source = seconds(dense)
    assert "runner_scaled_work_exponent" in dense_source and "linear_work" not in dense_source
    assert seconds(dense, runner_scaled_linear_work_exponent=lower)[0] == dense_base


def test_tune_profile_says_how_fast_this_host_issued_kernels_against_the_shipped_profiles_host():
    """experiments.checks.hardware_profile.host_vs_shipped: a `tune profile` of an H100 whose host issued the dense
    layer's kernels in half the time of the host behind the shipped H100 profile says so, per kind; a profile without
    runner components, or of a GPU type with no shipped profile, says nothing."""
    import yaml

    from experiments.checks.hardware_profile import host_vs_shipped
    root = Path(__file__).resolve().parents[1]
    mine = yaml.safe_load((root / "benchmarks/results/profile-h100-synthetic-gdn-dense-2b-2026-12-07.yaml").read_text())
    line = host_vs_shipped(mine)
    shipped = shipped_profile("h100").runner.host_floors
    assert line.startswith("host: issued a layer's kernels in x0.55 the time of the host behind the shipped h100")
    assert f"linear_attention+dense 5.65 vs {1e3 * shipped['linear_attention+dense'].layer_s:.2f} ms" in line
    assert host_vs_shipped({k: v for k, v in mine.items() if k != "runner_components"}) is None
    assert host_vs_shipped({**mine, "gpu_type": "a100"}) is None


def test_a_users_profile_without_builds_prices_the_runner_with_its_gpus_shipped_builds(tmp_path):
    """`tune profile` without --model writes no runner_components: the runner stack was then priced with the image
    stack's fitted constants (+61% on Qwen3-30B-A3B); it takes the GPU type's shipped builds, as it does the layer
    kinds a profile did not build."""
    import yaml

    from cost_model.profile import load_profile, shipped_profile

    data = yaml.safe_load(yaml.safe_dump(shipped_profile("h200").raw))
    data.pop("runner_components")
    path = tmp_path / "no-builds.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_profile(path).runner is shipped_profile("h200").runner
