"""The megatron runner's components on a GPU type nobody measured: the H200's measured builds priced there by the
datasheet ratios (cost_model.runner_components.Derivation), said to be derived, with a wider interval."""
import copy
import json
import math
from pathlib import Path

import pytest

from cost_model.derive_profile import derive_profile
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.workload import Workload
from cost_model.predict import predict
from cost_model.profile import ProfileError, profile_from_dict, shipped_profile
from cost_model.runner_components import Derivation
from experiments.megatron.model_run import trial_model
from tuner.cli import main
from tuner.intervals import runner_stack_sd

H100, H200 = load_gpu("h100"), load_gpu("h200")
MEGATRON = Workload(framework="megatron", seq_len=8192, global_batch=8)
RUNNER_TERMS = ("layers", "microbatch_ends", "optimizer")


def runner(model, gpu, layout, profile=None):
    return predict(model, gpu, MEGATRON, layout, precision_aware_optimizer=False, profile=profile)


def test_the_derivation_prices_compute_at_the_compute_ratio_and_the_rest_at_the_hbm_ratio():
    d = Derivation(compute=2.0, hbm=0.5, basis="test")
    assert d.seconds(10.0, 4.0) == pytest.approx(4.0 / 2.0 + 6.0 / 0.5)
    assert d.seconds(10.0, 25.0) == pytest.approx(10.0 / 2.0)       # modelled compute above the measured: capped
    assert d.seconds(10.0, -1.0) == pytest.approx(10.0 / 0.5)
    # the truth anywhere between all-compute and all-memory, uniform in log
    assert d.error_sd == pytest.approx(math.log(4.0) / math.sqrt(12))
    assert Derivation(1.0, 1.0, "same").error_sd == 0.0
    with pytest.raises(ValueError, match="hbm"):
        Derivation(1.0, 0.0, "x")
    # calibrated: the rest of a layer at its own ratio, the error left on the calibration builds added
    c = Derivation(compute=2.0, hbm=0.5, basis="test", rest=0.8, calibration="x builds", calibration_sd=0.05)
    assert c.seconds(10.0, 4.0) == pytest.approx(4.0 / 2.0 + 6.0 / 0.8)
    assert c.error_sd == pytest.approx(math.hypot(math.log(2.0 / 0.8) / math.sqrt(12), 0.05))
    assert "fitted to x builds" in c.note
    with pytest.raises(ValueError, match="rest"):
        Derivation(1.0, 1.0, "x", rest=-1.0)
    # a Gated DeltaNet layer's rest at its own ratio where one was fitted, every other part at `rest`
    g = Derivation(compute=2.0, hbm=0.5, basis="test", rest=0.8, rest_linear=0.4, calibration_linear="gdn builds")
    assert g.seconds(10.0, 4.0, linear=True) == pytest.approx(4.0 / 2.0 + 6.0 / 0.4)
    assert g.seconds(10.0, 4.0) == pytest.approx(c.seconds(10.0, 4.0))
    assert "Gated DeltaNet layer's rest at x0.400 (fitted to gdn builds)" in g.note
    with pytest.raises(ValueError, match="rest_linear"):
        Derivation(1.0, 1.0, "x", rest_linear=0.0)
    with pytest.raises(ValueError, match="cpu"):
        Derivation(1.0, 1.0, "x", cpu=0.0)


def test_a_derived_hosts_cpu_ratio_prices_the_offloaded_step_and_cpu_adam_only():
    import dataclasses

    comps = shipped_profile("h200").runner
    faster = dataclasses.replace(comps, derived=Derivation(1.0, 1.0, "host", cpu=2.0))
    assert faster.offload_s_per_param_here == pytest.approx(comps.offload_s_per_param / 2)
    assert faster.cpu_adam_rate(4) == pytest.approx(comps.cpu_adam_rate(4) * 2)
    assert faster.cpu_adam_rate(16) == pytest.approx(comps.cpu_adam_rate(16) * 2)
    assert faster.optimizer_s_per_param_here == comps.optimizer_s_per_param   # the GPU's passes: not the host's
    assert "CPU optimizer at x2.000" in faster.derived.note


def test_shipped_derived_profiles_carry_the_h200_runner_builds_marked_derived():
    measured = shipped_profile("h200").runner
    for gpu in ("h100", "b200", "gb200"):
        comps = shipped_profile(gpu).runner
        assert comps is not None and comps.derived is not None, gpu
        target, source = load_gpu(gpu), H200
        assert comps.derived.compute == pytest.approx(target.bf16_tflops / source.bf16_tflops, rel=1e-3)
        if gpu != "h100":    # by datasheets; the H100's is calibrated (test below)
            assert comps.derived.hbm == pytest.approx(target.hbm_tb_s / source.hbm_tb_s, rel=1e-3)
            assert comps.derived.rest is None and not comps.derived.calibration
        assert set(comps.layers) == set(measured.layers)
        # the builds and the host's figures as measured there; Adam's passes at the HBM ratio
        assert comps.host_floors == measured.host_floors and comps.cpu_adam == measured.cpu_adam
        assert comps.optimizer_s_per_param_here == pytest.approx(measured.optimizer_s_per_param / comps.derived.hbm)
    assert shipped_profile("h200").runner.derived is None


@pytest.mark.parametrize("name, layers", [("qwen3-30b-a3b", 6), ("qwen3.6-35b-a3b", 4), ("llama3-8b", 8)])
def test_an_h100_runner_step_is_priced_from_the_h200_builds_between_the_two_ratios(name, layers):
    model = trial_model(load_model(name), layers)
    layout = Layout(1, max_tokens_per_gpu=16384)
    h200, h100 = runner(model, H200, layout), runner(model, H100, layout)
    assert h100.breakdown["layers"] > 0          # the runner's stack, not the tuned Megatron terms
    for fitted in ("compute_attention", "compute_experts", "step_overhead", "expert_calls"):
        assert h100.breakdown[fitted] == 0, fitted
    # H100 has the H200's compute; the rest of a layer and the optimizer slow by the derivation's other ratios
    d = shipped_profile("h100").runner.derived
    for term in RUNNER_TERMS:
        slowest = min(d.hbm, d.rest_ratio)
        assert h200.breakdown[term] <= h100.breakdown[term] <= h200.breakdown[term] / slowest * 1.0001, term
    assert h100.breakdown["layers"] > h200.breakdown["layers"] * 1.001     # not all of a runner layer is GEMM work
    assert h100.breakdown["optimizer"] == pytest.approx(h200.breakdown["optimizer"] / d.hbm, rel=0.02)
    assert h100.tokens_per_s_per_gpu < h200.tokens_per_s_per_gpu


def test_the_h100_derivation_is_what_derivation_check_fits_to_the_stored_h100_builds():
    """The shipped H100 ratios are reproducible: calibrate() on the stored `tune profile` of an H100 (qwen3-30b-a3b
    builds, 2026-12-06) gives them back, and leaves less error on those builds than the datasheet ratios."""
    import dataclasses

    from benchmarks.derivation_check import _with, calibrate, compare
    from cost_model.profile import load_profile

    measured = load_profile(Path(__file__).resolve().parents[1]
                            / "benchmarks/results/profile-h100-qwen3-30b-a3b-2026-12-06.yaml")
    shipped = shipped_profile("h100")
    fitted, rows = calibrate(measured, shipped, H100)
    d = shipped.runner.derived
    assert (fitted.hbm, fitted.rest, fitted.cpu, fitted.calibration_sd) == (d.hbm, d.rest, d.cpu, d.calibration_sd)
    # no host ratio: the CPU optimizer is priced as the H200's host ran it, though this H100 host ran it faster
    # (a host is not the GPU type's: another H100 host's profile measured it slower than the H200's)
    assert d.cpu is None and shipped.runner.offload_s_per_param_here == shipped.runner.offload_s_per_param
    other = load_profile(Path(__file__).resolve().parents[1]
                         / "benchmarks/results/profile-h100-llama3-8b-2026-12-06.yaml")
    hosts = sorted(p.runner.offload_s_per_param for p in (measured, other))
    assert hosts[0] < shipped_profile("h200").runner.offload_s_per_param < hosts[1]
    assert "qwen3-30b-a3b builds measured on NVIDIA H100" in d.calibration
    datasheet = dataclasses.replace(d, hbm=H100.hbm_tb_s / H200.hbm_tb_s, rest=None, calibration_sd=0.0)
    before = compare(measured, _with(shipped, datasheet), H100)
    rms = lambda rs: math.sqrt(sum(math.log(r["step_ratio"]) ** 2 for r in rs) / len(rs))  # noqa: E731
    assert rms(rows) == pytest.approx(d.calibration_sd, abs=1e-4) and rms(rows) < rms(before) / 2


def test_the_h100_gdn_rest_ratio_is_what_derivation_check_fits_to_the_stored_qwen36_builds():
    """The shipped H100 derivation's Gated DeltaNet rest ratio is reproducible: calibrate_linear() on the stored
    `tune profile --model qwen3.6-35b-a3b` of an H100 (2026-12-06) gives it back with every other ratio held; it
    prices Qwen3.6's layers closer to those builds than the attention kinds' ratio did, and leaves a model without
    GDN layers (Qwen3-30B-A3B) as it was."""
    import dataclasses

    from benchmarks.derivation_check import _with, calibrate_linear, compare
    from cost_model.profile import load_profile

    measured = load_profile(Path(__file__).resolve().parents[1]
                            / "benchmarks/results/profile-h100-qwen3.6-35b-a3b-2026-12-06.yaml")
    shipped = shipped_profile("h100")
    d = shipped.runner.derived
    fitted, rows = calibrate_linear(measured, shipped, H100)
    assert fitted.rest_linear == d.rest_linear and (fitted.hbm, fitted.rest) == (d.hbm, d.rest)
    assert "qwen3.6-35b-a3b builds measured on NVIDIA H100" in d.calibration_linear
    without = _with(shipped, dataclasses.replace(d, rest_linear=None))
    rms = lambda rs: math.sqrt(sum(math.log(r["layers_ratio"]) ** 2 for r in rs) / len(rs))  # noqa: E731
    assert rms(rows) < rms(compare(measured, without, H100)) / 2
    layout = Layout(1, max_tokens_per_gpu=16384, rows_per_microbatch=2)
    q36, q30 = trial_model(load_model("qwen3.6-35b-a3b"), 2), trial_model(load_model("qwen3-30b-a3b"), 2)
    assert runner(q36, H100, layout).step_time_s > runner(q36, H100, layout, without).step_time_s
    assert runner(q30, H100, layout).step_time_s == runner(q30, H100, layout, without).step_time_s


def test_a_profile_measured_on_one_gpu_takes_its_collectives_from_the_shipped_profile_and_says_so():
    from cost_model.profile import load_profile

    one = load_profile(Path(__file__).resolve().parents[1]
                       / "benchmarks/results/profile-h100-qwen3-30b-a3b-2026-12-06.yaml")
    assert one.count == 1 and not one.raw["collectives"]
    assert one.collectives == shipped_profile("h100").collectives
    assert "this profile measured 1 GPU" in one.collectives_source
    raw = copy.deepcopy(one.raw)
    raw["gpu_type"] = "a100"      # nothing shipped to borrow from: one line naming the way out
    with pytest.raises(ProfileError, match="measured on 1 GPU, so it has no collectives.*2 or more GPUs"):
        profile_from_dict(raw, "one-gpu")


def test_an_identity_derivation_changes_no_runner_prediction():
    raw = copy.deepcopy(shipped_profile("h200").raw)
    raw["runner_components"]["derived"] = {"compute": 1.0, "hbm": 1.0, "basis": "identity"}
    same = profile_from_dict(raw, "identity")
    model = trial_model(load_model("qwen3.6-35b-a3b"), 4)
    for layout in (Layout(1, max_tokens_per_gpu=8192),
                   Layout(1, max_tokens_per_gpu=16384, recompute_granularity="full", recompute_method="uniform",
                          recompute_num_layers=1)):
        a, b = runner(model, H200, layout), runner(model, H200, layout, profile=same)
        assert b.step_time_s == pytest.approx(a.step_time_s, rel=1e-9)


def test_a_derivation_of_the_runner_section_is_checked_when_the_profile_loads():
    raw = copy.deepcopy(shipped_profile("h200").raw)
    raw["runner_components"]["derived"] = {"compute": 1.0, "hbm": -2.0, "basis": "bad"}
    with pytest.raises(ProfileError, match="hbm"):
        profile_from_dict(raw, "bad")
    for bad in ({"compute": 1.0}, "yes"):
        raw["runner_components"]["derived"] = bad
        with pytest.raises(ProfileError, match="derived must be a mapping of compute, hbm and basis"):
            profile_from_dict(raw, "bad")


def test_tune_profile_derive_marks_the_runner_builds_derived():
    out = derive_profile(shipped_profile("h200").raw, H200, load_gpu("b200"))
    assert out["runner_components"]["derived"]["compute"] == pytest.approx(2250 / 989, rel=1e-3)
    assert "runner_components" in out["derivation"]
    # the source's builds are kept as measured (the parser prices them)
    assert out["runner_components"]["builds"] == shipped_profile("h200").raw["runner_components"]["builds"]


def test_the_derived_interval_is_wider_and_explain_says_derived(capsys):
    model = trial_model(load_model("qwen3-30b-a3b"), 6)
    layout = Layout(1, max_tokens_per_gpu=16384)
    p100, p200 = runner(model, H100, layout), runner(model, H200, layout)
    sd100, sd200 = runner_stack_sd(model, H100, None, p100), runner_stack_sd(model, H200, None, p200)
    assert sd100 == pytest.approx(math.hypot(sd200, shipped_profile("h100").runner.derived.error_sd), rel=1e-6)
    for term in RUNNER_TERMS:
        assert p100.term_sources[term].startswith("modelled: "), term
        assert p200.term_sources[term].startswith("measured: "), term
    assert "derived from the measured H200 profile" in p100.term_sources["layers"]
    assert main(["predict", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--gpus", "1", "--framework", "megatron",
                 "--stack", "megatron-runner", "--seq-len", "8192", "--global-batch", "8",
                 "--layout", "max_tokens_per_gpu=16384", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "the runner's measured error and the derivation's" in out
    assert "from its derived components" in out and "modelled: derived from the measured H200 profile" in out


def test_h100_usable_memory_is_what_torch_reports_not_nvidia_smi():
    # torch reports 79.18-79.33 GiB total on an H100 SXM 80GB; nvidia-smi's 81,559 MiB (79.6 GiB) is not all usable
    assert H100.memory_gib <= 79.33
    model = trial_model(load_model("qwen3-30b-a3b"), 6)
    p = runner(model, H100, Layout(1, max_tokens_per_gpu=8192))
    assert p.gpu_memory_gib == pytest.approx(H100.memory_gib)


def test_a_measured_line_says_its_gpu_type_and_a_suite_the_one_it_was_predicted_for():
    from benchmarks.measured_runs import measured_gpu
    from experiments.megatron.suite import parse_suite
    line = {"source": "megatron-core 0.19.2 runner on NVIDIA H100 80GB HBM3 x1, backend torch-native, kernels ..."}
    assert measured_gpu(line, "h200") == "h100"
    assert measured_gpu({"source": "megatron-core 0.19.2 runner on NVIDIA H200 x2, backend torch-native"}, "h100") == "h200"
    assert measured_gpu({"status": "failed"}, "h100") == "h100"
    root = Path(__file__).resolve().parents[1] / "benchmarks"
    assert parse_suite(root / "runner_grids_h100_v27_suite.json")[1]["gpu"] == "h100"
    assert parse_suite(root / "runner_grids_h200_v25_suite.json")[1]["gpu"] == "h200"
    with pytest.raises(ValueError, match="'gpu'"):
        parse_suite({"gpu": 3, "trials": [{"name": "a", "model": "llama3-8b", "gpus": 1, "layout": {}}]})


def test_the_derivation_check_prices_both_profiles_and_an_identity_derivation_has_no_error(tmp_path, capsys):
    from benchmarks.derivation_check import main as check
    out = tmp_path / "h200-from-h200.yaml"
    assert main(["profile", "--derive", "h200", "--from", "h200", "--out", str(out)]) == 0
    measured = Path(__file__).resolve().parents[1] / "cost_model" / "data" / "profiles" / "h200.yaml"
    capsys.readouterr()
    assert check([str(measured), "--derived", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] >= 8 and summary["rms_log_error"] < 1e-9 and summary["derivation_sd"] == 0
    # a derived profile is not a measurement to judge against
    assert check([str(out)]) == 2
    assert "no runner builds measured on its GPU" in capsys.readouterr().err


def test_the_derivation_check_judges_a_config_json_models_builds_too():
    """A profile of benchmarks/models/granite-moe-shape-3b (its builds name the folder, not a catalog model) is judged:
    the shipped H100 profile prices Granite's layer from Qwen3-30B-A3B's, and the check compares that with its own."""
    from benchmarks.derivation_check import compare
    from cost_model.profile import load_profile

    root = Path(__file__).resolve().parents[1]
    measured = load_profile(root / "benchmarks/results/profile-h100-granite-moe-shape-3b-2026-12-07.yaml")
    rows = compare(measured, shipped_profile("h100"), load_gpu("h100"))
    assert {r["model"] for r in rows} == {"granite-moe-shape-3b"} and len(rows) == 8
    assert all(r["layers_ratio"] > 0 for r in rows)


def test_tune_gpus_says_where_each_profiles_runner_components_come_from(capsys):
    assert main(["gpus"]) == 0
    lines = {ln.split(":", 1)[0]: ln for ln in capsys.readouterr().out.splitlines()}
    assert "megatron runner's components: measured: runner components on NVIDIA H200" in lines["h200"]
    assert "megatron runner's components: derived from the measured H200 profile" in lines["h100"]


def test_a_users_profile_of_one_model_prices_another_models_kinds_from_the_shipped_builds():
    """`tune profile --model llama3-8b` on an H100 (stored, 2026-12-06) measured only dense layers. Mixtral-8x7B's
    MoE layer then comes from the shipped H100 profile's builds (the H200's, derived), marked as borrowed, with the
    derivation's error in its band: not from the fitted terms, 30-47% over on v28's H100 runs. The profile's own
    builds still price what it measured."""
    from cost_model.profile import load_profile
    from tuner.intervals import runner_stack_sd

    user = load_profile(Path(__file__).resolve().parents[1] / "benchmarks/results/profile-h100-llama3-8b-2026-12-06.yaml")
    own = {sig for sig, c in user.runner.layers.items() if not c.borrowed}
    assert own and all(sig.startswith("full_attention+dense|") for sig in own)
    moe = [c for sig, c in user.runner.layers.items() if sig.startswith("full_attention+moe|")]
    assert moe and all(c.borrowed.startswith("the shipped h100 profile (derived") and c.derived is not None
                       for c in moe)
    assert user.runner.host_floors["full_attention+moe"].borrowed and not user.runner.host_floors[
        "full_attention+dense"].borrowed
    mixtral = trial_model(load_model(str(Path(__file__).resolve().parents[1]
                                         / "benchmarks/models/mixtral-8x7b/config.json")), 1)
    layout = Layout(1, max_tokens_per_gpu=16384, rows_per_microbatch=2)
    mine, shipped = runner(mixtral, H100, layout, user), runner(mixtral, H100, layout)
    assert "from the shipped h100 profile (derived" in mine.term_sources["layers"]
    assert "fitted Megatron terms" not in mine.term_sources["layers"]
    # the same builds and derivation: the layer term within the two profiles' GEMM rates of each other
    assert mine.breakdown["layers"] == pytest.approx(shipped.breakdown["layers"], rel=0.1)
    assert runner_stack_sd(mixtral, H100, user) == pytest.approx(runner_stack_sd(mixtral, H100), rel=1e-6)
    llama = trial_model(load_model("llama3-8b"), 2)
    assert "from the shipped" not in runner(llama, H100, layout, user).term_sources["layers"]
    assert runner_stack_sd(llama, H100, user) < runner_stack_sd(llama, H100)   # measured here: no derivation


def test_a_users_profile_prices_a_model_the_shipped_profile_ran_from_its_own_builds_not_another_models():
    """`tune profile --model qwen3.6-35b-a3b` on an H100 (stored, 2026-12-06) measured Qwen3.6's MoE kinds; Mixtral-8x7B,
    whose own layer the shipped H100 profile holds (the H200's build, derived), is priced from that build, borrowed,
    not from Qwen3.6's layer scaled to it (12.9% off Mixtral's v28 H100 runs, 3.1% from its own); a model neither
    profile ran still takes the user's measured layer of its kind."""
    from cost_model.profile import load_profile

    user = load_profile(Path(__file__).resolve().parents[1]
                        / "benchmarks/results/profile-h100-qwen3.6-35b-a3b-2026-12-06.yaml")
    layout = Layout(1, max_tokens_per_gpu=16384, rows_per_microbatch=2)
    mixtral = trial_model(load_model(str(Path(__file__).resolve().parents[1]
                                         / "benchmarks/models/mixtral-8x7b/config.json")), 1)
    found = user.runner.layer_for(mixtral, "full_attention", "moe")
    assert found[0] is None and found[1].borrowed.startswith("the shipped h100 profile (derived")
    assert "from the shipped h100 profile (derived" in runner(mixtral, H100, layout, user).term_sources["layers"]
    synthetic = trial_model(load_model(str(Path(__file__).resolve().parents[1]
                                           / "benchmarks/models/synthetic-moe-32x4/config.json")), 1)
    sig, curves = user.runner.layer_for(synthetic, "full_attention", "moe")
    assert sig.startswith("full_attention+moe|") and not curves.borrowed   # the user's measurement of the kind
    q36 = trial_model(load_model("qwen3.6-35b-a3b"), 2)
    assert all(not user.runner.layer_for(q36, a, m)[1].borrowed for a, m in set(zip(q36.layer_types, q36.mlp_types)))


def test_a_derived_h100_profile_keeps_the_shipped_calibration_of_the_runner_builds(tmp_path):
    """`tune profile --derive h100` wrote the datasheet-ratio derivation the H100 check judged and failed (14% off),
    under the shipped profile's label: it now prices the builds with the shipped calibration, as the shipped one."""
    from cost_model.profile import load_profile, shipped_profile
    from tuner.cli import main

    out = tmp_path / "h100.yaml"
    assert main(["profile", "--derive", "h100", "--out", str(out)]) == 0
    derived, shipped = load_profile(out).runner.derived, shipped_profile("h100").runner.derived
    assert shipped.calibration and derived == shipped


def test_a_layers_term_of_borrowed_derived_builds_alone_leads_with_modelled(capsys):
    """Llama3-8B priced from an H100 profile that built Qwen3-30B-A3B only: every layer kind is the shipped (derived)
    H100 profile's build, so the layers term says modelled, not "measured: runner components on" the user's H100."""
    from pathlib import Path

    from tuner.cli import main

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    profile = results / "profile-h100-qwen3-30b-a3b-2026-12-06.yaml"
    assert main(["predict", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "1", "--stack", "megatron-runner",
                 "--layout", "optimizer_offload_fraction=1", "--profile", str(profile), "--explain"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.strip().startswith("layers "))
    assert "modelled: derived builds of the GPU type's shipped profile" in line and "measured: runner" not in line
