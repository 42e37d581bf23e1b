"""Hardware profiles: parsing, interpolation, and how predictions respond to them."""
import copy
import dataclasses
import math

import pytest
import yaml

from cost_model.nouns.hardware import load_gpu
from cost_model.predict import predict
from cost_model.profile import ProfileError, parse_profile, profile_from_dict
from cost_model.nouns.layout import Layout

GRID = (512, 2048, 8192, 32768)


def synthetic_profile(a2a_scale: float = 1.0) -> dict:
    def tf(m, n, k):
        return 800 * m / (m + 1500) * n / (n + 400) * k / (k + 400)

    sizes = [4 ** i * 65536 for i in range(8)]
    collectives = []
    for op, peak in (("all_reduce", 330), ("all_gather", 300), ("reduce_scatter", 300), ("all_to_all", 320),
                     ("p2p", 350)):
        for b in sizes:
            bw = peak * b / (b + 8e6) * (a2a_scale if op == "all_to_all" else 1.0)
            collectives.append({"op": op, "gpus": 2, "bytes": b, "time_us": b / bw / 1e3, "busbw_gb_s": bw})
    return {
        "schema_version": 1, "gpu_type": "h200", "provenance": "measured", "device": "synthetic", "count": 2,
        "date": "2026-11-29", "source": "test",
        "gemm_bf16": [{"m": m, "n": n, "k": k, "tflops": tf(m, n, k)} for m in GRID for n in GRID for k in GRID],
        "gemm_fp8": [{"m": 8192, "n": 8192, "k": 8192, "tflops": 2 * tf(8192, 8192, 8192)}],
        "grouped_gemm_bf16": [{"experts": 256, "rows_per_expert": r, "k": 2048, "n": 1024, "fwd_tflops": 600 * r / (r + 50),
                               "fwd_bwd_tflops": 500 * r / (r + 50)} for r in (16, 64, 256, 1024)],
        "attention_bf16": [{"seq": s, "heads": 16, "head_dim": 256, "fwd_tflops": 600, "fwd_bwd_tflops": 450}
                           for s in (2048, 8192, 32768)],
        "linear_attention": {"kind": "estimate", "efficiency": 0.15},
        "memory": {"hbm_copy_tb_s": 4.2, "h2d_gb_s": 54.6, "d2h_gb_s": 54.8},
        "cpu_adam": {"params_per_s": 1.07e9, "threads": 32},
        "collectives": collectives,
    }


def test_gemm_interpolation_is_exact_on_the_grid_and_between_its_points():
    p = profile_from_dict(synthetic_profile())
    raw = {(g["m"], g["n"], g["k"]): g["tflops"] for g in synthetic_profile()["gemm_bf16"]}
    for key in ((512, 2048, 8192), (32768, 32768, 32768), (2048, 512, 512)):
        assert p.gemm_tflops(*key) == pytest.approx(raw[key])
    mid = p.gemm_tflops(4096, 2048, 2048)  # log2-midpoint of 2048 and 8192 in m
    assert mid == pytest.approx((raw[(2048, 2048, 2048)] + raw[(8192, 2048, 2048)]) / 2)
    assert p.gemm_tflops(10 ** 6, 10 ** 6, 10 ** 6) == pytest.approx(raw[(32768, 32768, 32768)])  # clamped
    assert p.gemm_tflops(8192, 8192, 8192, "fp8") == pytest.approx(2 * raw[(8192, 8192, 8192)])


def test_collective_curves_interpolate_in_log_bytes():
    p = profile_from_dict(synthetic_profile())
    small, big = p.busbw_gb_s("all_to_all", 1e6), p.busbw_gb_s("all_to_all", 256 * 2 ** 20)
    assert small < big < 320
    assert p.summary()["all_to_all_busbw_gb_s_at_256MB"] == pytest.approx(big, abs=0.1)


def test_halving_all_to_all_bandwidth_raises_ep_step_time_by_its_comm_term(qwen36, h200, workload):
    layout = Layout(8, ep=8)  # no recompute: the all-to-all appears once, in ep_comm
    base = predict(qwen36, h200, workload, layout, profile=profile_from_dict(synthetic_profile()))
    slow = predict(qwen36, h200, workload, layout, profile=profile_from_dict(synthetic_profile(a2a_scale=0.5)))
    assert slow.breakdown["ep_comm"] == pytest.approx(2 * base.breakdown["ep_comm"])
    assert slow.step_time_s - base.step_time_s == pytest.approx(base.breakdown["ep_comm"])
    assert base.breakdown["ep_comm"] > 0.1


def test_predictions_follow_the_profile_compute_rates(qwen36, h200, workload):
    fast = synthetic_profile()
    slow = copy.deepcopy(fast)
    for g in slow["gemm_bf16"]:
        g["tflops"] /= 2
    layout = Layout(8, ep=8, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    a = predict(qwen36, h200, workload, layout, profile=profile_from_dict(fast))
    b = predict(qwen36, h200, workload, layout, profile=profile_from_dict(slow))
    assert b.breakdown["compute_logits"] == pytest.approx(2 * a.breakdown["compute_logits"])
    assert "measured profile of synthetic" in a.source


def test_gpus_without_a_profile_use_datasheet_rates(qwen36, workload):
    gpu = dataclasses.replace(load_gpu("h200"), name="nonexistent")
    p = predict(qwen36, gpu, workload, Layout(8, ep=8))
    assert "datasheet" in p.source


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.pop("gemm_bf16"), "the gemm_bf16 section is missing"),
    (lambda d: d.update(schema_version=7), "unknown schema_version"),
    (lambda d: d["gemm_bf16"].pop(5), "not a full m x n x k grid"),
])
def test_malformed_profiles_raise_one_line(mutate, needle):
    data = synthetic_profile()
    mutate(data)
    with pytest.raises(ProfileError) as e:
        parse_profile(yaml.safe_dump(data), "p.yaml")
    assert needle in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ProfileError, match="malformed YAML at line 1"):
        parse_profile("a: [", "p.yaml")


def test_fp8_speed_follows_the_gemm_shape():
    """Issue 16: fp8's gain is read at the nearest measured fp8 GEMM shape, not the largest ratio for every GEMM."""
    from cost_model.constants import default_constants
    from cost_model.predict import shipped_profile
    from cost_model.rates import rates_for

    profile = shipped_profile("h200")
    ratios = [p[3] for p in profile.fp8_points]
    assert len(ratios) == 9 and profile.fp8_speedup == max(ratios) and min(ratios) < 0.8 * max(ratios)
    small, large = profile.fp8_ratio(2048, 1024, 2048), profile.fp8_ratio(8192, 16384, 16384)
    at_4096 = next(p[3] for p in profile.fp8_points if p[:3] == (4096, 4096, 4096))
    assert small == at_4096 < large                       # never extrapolated below the smallest measured shape
    gpu, c = load_gpu("h200"), default_constants()
    bf16, fp8 = rates_for(gpu, c, "bf16", profile), rates_for(gpu, c, "fp8", profile)
    assert fp8.gemm(2048, 1024, 2048) / bf16.gemm(2048, 1024, 2048) == pytest.approx(small)
    assert fp8.grouped(512, 2048, 768) / bf16.grouped(512, 2048, 768) == pytest.approx(profile.fp8_ratio(512, 768, 2048))
    from pathlib import Path
    data = yaml.safe_load((Path(__file__).resolve().parents[1] / "cost_model/data/profiles/h200.yaml").read_text())
    data.pop("gemm_fp8")
    data["fp8_speedup"] = 1.7
    assert profile_from_dict(data).fp8_ratio(2048, 1024, 2048) == 1.7   # no grid: the profile's one figure
