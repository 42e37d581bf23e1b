"""The hardware profiler: shape grids, bus factors, the no-GPU exit, YAML output, and a CPU run of
every measurement path (gloo for the collectives) so the GPU run only has CUDA specifics left."""
import importlib.util
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cost_model.nouns.model_spec import load_model
from experiments.checks import collectives, measure
from experiments.checks import hardware_profile as hp
from experiments.checks import profile_shapes as ps

REPO = Path(__file__).resolve().parents[1]


def _env(**extra):
    return dict(os.environ, PYTHONPATH=str(REPO), **extra)


def test_gemm_grid_is_full_without_model():
    shapes = ps.profile_shapes(None)
    grid = [p for p in shapes["gemm"] if "label" not in p]
    assert len(grid) == 343 == len(shapes["gemm"])
    assert {(p["m"], p["n"], p["k"]) for p in grid} == set(itertools.product(ps.GEMM_M, ps.GEMM_NK, ps.GEMM_NK))
    assert ps.GEMM_M == (512, 1024, 2048, 4096, 8192, 16384, 32768)
    assert ps.GEMM_NK == (256, 512, 1024, 2048, 4096, 8192, 16384)


def test_model_shapes_are_extra_points(qwen36):
    shapes = ps.profile_shapes(qwen36)
    gemm = shapes["gemm"]
    assert gemm[:343] == ps.profile_shapes(None)["gemm"]          # the grid first, unchanged
    extras = {(p["m"], p["n"], p["k"]): p["label"] for p in gemm[343:]}
    assert len(extras) == len(gemm) - 343                            # no duplicates
    grid = set(itertools.product(ps.GEMM_M, ps.GEMM_NK, ps.GEMM_NK))
    assert not grid & set(extras)
    for tokens in (4096, 8192, 16384):
        # gated q (16x256x2) + k, v (2 x 2x256) from hidden 2048
        assert extras[(tokens, 16 * 256 * 2 + 2 * 2 * 256, 2048)] == "attn_qkv"
        assert extras[(tokens, 248320 // 8, 2048)] == "lm_head_slice"
        assert extras[(tokens, 2 * 16 * 128 + 2 * 32 * 128, 2048)] == "gdn_in"
    labels = {label for label, _, _ in ps.model_gemms(qwen36)}
    # the out projection (2048 x 4096), shared expert and router are measured too (they lie on the grid)
    assert {"attn_out", "shared_up", "shared_down", "router", "gdn_out"} <= labels


def test_grouped_gemm_points(qwen36):
    for model, (h, f) in ((None, (2048, 512)), (qwen36, (2048, 512))):
        pts = ps.profile_shapes(model)["grouped_gemm"]
        combos = [(e, r) for e in (8, 32, 128, 256) for r in (16, 64, 256, 1024, 4096) if e * r <= 262_144]
        assert len(combos) == 18 and len(pts) == 36
        assert {(p["k"], p["n"]) for p in pts} == {(h, 2 * f), (f, h)}
        assert all(p["experts"] * p["rows_per_expert"] <= 262_144 for p in pts)
        assert (256, 1024) in {(p["experts"], p["rows_per_expert"]) for p in pts}
        assert (128, 4096) not in {(p["experts"], p["rows_per_expert"]) for p in pts}
    deepseek = ps.profile_shapes(load_model("deepseek-v3"))["grouped_gemm"]
    assert {(p["k"], p["n"]) for p in deepseek} == {(7168, 4096), (2048, 7168)}


def test_attention_and_collective_points(qwen36):
    plain = ps.profile_shapes(None)
    assert {(p["heads"], p["head_dim"]) for p in plain["attention"]} == {(32, 128), (16, 256)}
    assert {p["seq"] for p in plain["attention"]} == {2048, 4096, 8192, 16384, 32768}
    assert len(plain["attention"]) == 10
    model = ps.profile_shapes(qwen36)
    assert (16, 256) in {(p["heads"], p["head_dim"]) for p in model["attention"]}
    assert len(model["attention"]) == 10                              # qwen3.6's pair is a default one
    llama = ps.profile_shapes(load_model("llama3-8b"))
    assert len(llama["attention"]) == 10 and (32, 128) in {(p["heads"], p["head_dim"]) for p in llama["attention"]}
    assert model["linear_attention"] == dict(qk_heads=16, v_heads=32, key_head_dim=128, value_head_dim=128,
                                             tokens=[4096, 8192, 16384, 32768])
    # a model without Gated DeltaNet layers skips the kernel (its first call compiles for most of a minute)
    assert llama["linear_attention"] is None and ps.quick_shapes(llama)["linear_attention"] is None
    assert plain["linear_attention"]["tokens"] == [4096, 8192, 16384, 32768]
    coll = plain["collectives"]
    assert coll["ops"] == ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"]
    assert coll["bytes"] == [64 * 2 ** 10, 256 * 2 ** 10, 2 ** 20, 4 * 2 ** 20, 16 * 2 ** 20,
                             64 * 2 ** 20, 256 * 2 ** 20, 2 ** 30]


def test_quick_shapes_shrink():
    full = ps.profile_shapes(load_model("qwen3.6-35b-a3b"))
    quick = ps.quick_shapes(full)
    assert 8 <= len(quick["gemm"]) < 20
    assert len(quick["grouped_gemm"]) == 8 and len(quick["attention"]) == 4
    assert 256 * 2 ** 20 in quick["collectives"]["bytes"]


@pytest.mark.parametrize("op,n,factor", [
    ("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75), ("all_reduce", 4, 1.5),
    ("all_gather", 2, 0.5), ("all_gather", 8, 0.875), ("reduce_scatter", 4, 0.75),
    ("all_to_all", 8, 0.875), ("p2p", 2, 1.0), ("p2p", 8, 1.0),
])
def test_bus_factor(op, n, factor):
    assert collectives.bus_factor(op, n) == pytest.approx(factor)


def test_bus_factor_unknown_op():
    with pytest.raises(ValueError):
        collectives.bus_factor("broadcast", 2)


@pytest.mark.parametrize("name,key", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA B200", "b200"),
    ("NVIDIA GB200", "gb200"), ("NVIDIA H200 NVL", "h200"), ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada-generation"),
])
def test_gpu_type_from_name(name, key):
    assert hp.gpu_type_from_name(name) == key


@pytest.mark.torch
def test_no_gpu_exits_2_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "experiments.checks.hardware_profile"], cwd=REPO,
                          env=_env(CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0], proc.stderr
    assert proc.stdout == ""


@pytest.mark.torch
def test_run_profile_raises_without_gpu(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    with pytest.raises(hp.NoGpuError, match="no CUDA GPU"):
        hp.run_profile()
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"                     # forced, not setdefault


def test_imports_without_optuna_pandas_ray():
    code = ("import sys\nfor m in ('optuna', 'pandas', 'ray'): sys.modules[m] = None\n"
            "import experiments.checks.hardware_profile\n"
            "from experiments.checks.profile_shapes import profile_shapes\n"
            "print(profile_shapes(None)['gemm'][0])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def _sample_profile():
    return dict(
        schema_version=1, gpu_type="h200", provenance="measured", device="NVIDIA H200", count=2,
        driver="580.159.04", cuda="13.0", torch="2.11.0", nccl="2.28.9", date="2026-11-29",
        wall_time_s=171.3, model="qwen3.6-35b-a3b", source="tune profile (experiments/checks/hardware_profile.py) on x",
        gemm_bf16=[dict(m=8192, n=8192, k=8192, tflops=757.1)], gemm_fp8=[],
        grouped_gemm_bf16=[dict(experts=256, rows_per_expert=256, k=2048, n=1024, fwd_tflops=581.0,
                                fwd_bwd_tflops=None)],
        attention_bf16=[dict(seq=8192, heads=16, head_dim=256, fwd_tflops=500.0, fwd_bwd_tflops=445.0)],
        linear_attention=dict(kind="estimate", efficiency=0.15, note="fla not importable"),
        memory=dict(hbm_copy_tb_s=4.19, h2d_gb_s=54.6, d2h_gb_s=55.0, h2d_256mib_gb_s=50.1, d2h_256mib_gb_s=51.0),
        cpu_adam=dict(params_per_s=1.2e9, threads=16),
        collectives=[dict(op="all_to_all", gpus=2, bytes=2 ** 30, time_us=3450.0, algbw_gb_s=311.2,
                          busbw_gb_s=155.6)],
        notes=["fp8_note: skipped"],
    )


def test_write_profile_round_trips(tmp_path):
    profile = _sample_profile()
    path = tmp_path / "sub" / "h200.yaml"
    hp.write_profile(profile, path)
    hp.write_profile(profile, path)                                  # replaces in place
    loaded = yaml.safe_load(path.read_text())
    assert loaded == profile
    assert list(loaded) == list(profile)                            # key order kept (sort_keys=False)
    assert [p.name for p in path.parent.iterdir()] == ["h200.yaml"]  # no temp file left
    assert hp.summary(loaded)[-1] == "wall time: 171.3 s"


def test_collapse_notes():
    notes = ["gemm_bf16: convention", "gemm_bf16 1x2x3: RuntimeError: boom", "gemm_bf16 4x5x6: RuntimeError: boom",
             "attention_bf16 seq=1: RuntimeError: boom"]
    out = measure.collapse_notes(notes)
    assert out == ["gemm_bf16: convention",
                   "gemm_bf16 1x2x3: RuntimeError: boom (and 1 more points with the same error)",
                   "attention_bf16 seq=1: RuntimeError: boom"]


@pytest.mark.torch
def test_fail_note_is_one_line():
    notes = []
    measure.note_failure(notes, "collectives failed", RuntimeError(
        "\n\n-- Process 1 terminated with the following error:\nTraceback (most recent call last):\n"
        "  File x\nRuntimeError: NCCL error: unhandled system error\n"))
    measure.note_failure(notes, "gemm_bf16 1x2x3", RuntimeError("CUDA out of memory. Tried to allocate 2 GiB\nmore"))
    assert notes == ["collectives failed: RuntimeError: RuntimeError: NCCL error: unhandled system error",
                     "gemm_bf16 1x2x3: RuntimeError: CUDA out of memory. Tried to allocate 2 GiB"]


@pytest.mark.torch
@pytest.mark.slow
def test_cpu_run_of_every_measurement():
    """_profile on the CPU (perf_counter timing, gloo collectives over 2 ranks): schema and plumbing."""
    torch = pytest.importorskip("torch")
    tiny = dict(gemm=[dict(m=64, n=32, k=48), dict(m=16, n=16, k=16, label="x")],
                gemm_fp8=[dict(m=32, n=32, k=32)],
                grouped_gemm=[dict(experts=4, rows_per_expert=16, k=32, n=48)],
                attention=[dict(seq=64, heads=2, head_dim=32)],
                linear_attention=dict(ps.LINEAR_ATTENTION_DEFAULT, tokens=[128]),
                collectives=dict(ops=list(ps.COLLECTIVE_OPS), bytes=[65536, 2 ** 20]))
    plan = hp.ProfilePlan(tiny, 2, 2, backend="gloo", memory_bytes=(2 ** 22, 2 ** 20), adam_numel=2 ** 16, fp8=True)
    prof = hp._profile(torch.device("cpu"), plan, model_name="m")
    assert list(prof) == ["schema_version", "gpu_type", "provenance", "device", "count", "driver", "cuda",
                          "torch", "nccl", "date", "wall_time_s", "model", "source", "gemm_bf16", "gemm_fp8",
                          "grouped_gemm_bf16", "attention_bf16", "linear_attention", "memory", "cpu_adam",
                          "collectives", "device_memory", "notes"]
    assert prof["schema_version"] == 1 and prof["provenance"] == "measured" and prof["count"] == 2
    failures = [n for n in prof["notes"] if "Error" in n or "failed" in n]
    assert not failures, failures
    assert [(r["m"], r["n"], r["k"]) for r in prof["gemm_bf16"]] == [(64, 32, 48), (16, 16, 16)]
    assert "label" not in prof["gemm_bf16"][0] and prof["gemm_bf16"][1]["label"] == "x"
    assert all(r["tflops"] > 0 for r in prof["gemm_bf16"] + prof["gemm_fp8"])
    g = prof["grouped_gemm_bf16"][0]
    assert g["fwd_tflops"] > 0 and g["fwd_bwd_tflops"] > 0
    a = prof["attention_bf16"][0]
    assert a["fwd_tflops"] > 0 and a["fwd_bwd_tflops"] > 0
    if prof["linear_attention"]["kind"] == "estimate":
        assert prof["linear_attention"]["efficiency"] == 0.15
    assert set(prof["memory"]) == {"hbm_copy_tb_s", "h2d_gb_s", "d2h_gb_s", "h2d_256mib_gb_s", "d2h_256mib_gb_s"}
    assert prof["cpu_adam"]["params_per_s"] > 0 and prof["cpu_adam"]["threads"] >= 1
    coll = prof["collectives"]
    assert [(c["op"], c["bytes"]) for c in coll] == [(op, b) for op in ps.COLLECTIVE_OPS for b in (65536, 2 ** 20)]
    for c in coll:
        assert c["gpus"] == 2 and c["time_us"] > 0
        assert c["algbw_gb_s"] == pytest.approx(c["bytes"] / (c["time_us"] * 1e-6) / 1e9, rel=2e-3)
        assert c["busbw_gb_s"] == pytest.approx(c["algbw_gb_s"] * collectives.bus_factor(c["op"], 2), rel=2e-3)
    dm = prof["device_memory"]
    assert dm["provenance"].startswith("not measured") and "visible_gib" not in dm
    assert [r["ranks"] for r in dm["nccl_cpu_plumbing"]] == [2, 1]
    assert yaml.safe_load(yaml.safe_dump(prof, sort_keys=False)) == prof


# ------------------------------------------------------------------------------ issue 12: GDN and device memory
from experiments.checks import compute as compute_mod  # noqa: E402
from experiments.checks import device_memory as dm  # noqa: E402
from experiments.checks import nccl_memory  # noqa: E402


def test_gdn_series_measures_megatrons_call_the_one_the_cost_model_reads():
    assert compute_mod.gdn_series(dict(qk_heads=16, v_heads=32)) == [(32, 32)]
    assert compute_mod.gdn_series(dict(qk_heads=8, v_heads=8)) == [(8, 8)]
    from cost_model.profile import shipped_profile
    gdn = shipped_profile("h200").gdn   # measured with both series: the cost model reads the repeated one
    assert (gdn.series_for(32).qk_heads, gdn.series_for(32).v_heads) == (32, 32)


def test_fla_tilelang_is_asked_for_on_hopper_only(monkeypatch):
    monkeypatch.delenv("FLA_TILELANG", raising=False)
    assert compute_mod.configure_fla_env((8, 0)) == "unset" and "FLA_TILELANG" not in os.environ
    assert compute_mod.configure_fla_env((9, 0)).startswith("1 (set by tune profile")
    assert os.environ["FLA_TILELANG"] == "1"
    monkeypatch.setenv("FLA_TILELANG", "0")
    assert compute_mod.configure_fla_env((9, 0)) == "0 (set by the user)"


@pytest.mark.torch
def test_gdn_timing_runs_a_kernel_as_megatron_calls_it():
    """_time_gdn on the CPU with megatron-core's torch kernel standing in for fla's."""
    torch = pytest.importorskip("torch")
    from megatron.core.ssm.gated_delta_net.common import torch_chunk_gated_delta_rule
    point = compute_mod._time_gdn(torch, torch_chunk_gated_delta_rule, compute_mod.GdnPoint(128, 2, 2, 16, 16), 2,
                                  torch.device("cpu"))
    assert point["tokens"] == 128 and (point["qk_heads"], point["v_heads"]) == (2, 2)
    # both timed (no order asserted: on a loaded CPU a cold forward can outlast a warm forward+backward)
    assert point["fwd_ms"] > 0 and point["fwd_bwd_ms"] > 0


class _FakeQueue:
    def __init__(self, messages):
        self.messages = list(messages)

    def get(self, timeout=None):
        import queue
        if not self.messages:
            raise queue.Empty
        return self.messages.pop(0)


class _FakeProc:
    exitcode = None


def test_gdn_points_survive_a_timeout_and_the_section_reads_back():
    info = dict(fla="0.6.0", triton="3.6.0", tilelang="0.1.7", capability="9.0", device="NVIDIA H200")
    msgs = [dict(info=info), dict(point=dict(tokens=8192, qk_heads=16, v_heads=32, fwd_ms=0.58, fwd_bwd_ms=2.57)),
            dict(point=dict(tokens=8192, qk_heads=32, v_heads=32, fwd_ms=0.6, fwd_bwd_ms=2.7),
                 dispatch=["[FLA Backend] common.chunk_bwd_dqkwg -> tilelang"])]
    got_info, points, dispatch, error = compute_mod._collect(_FakeQueue(msgs), _FakeProc(), 0.2)
    assert got_info == info and len(points) == 2 and error.startswith("no result within")
    shape = dict(qk_heads=16, v_heads=32, key_head_dim=128, value_head_dim=128, tokens=[8192])
    section = compute_mod._linear_section(shape, points, info, dispatch, error, "h200")
    assert section["kind"] == "measured" and section["fla"] == "0.6.0" and "backend_problem" not in section
    assert section["efficiency"] == pytest.approx(3 * 8 * 32 * 128 * 128 * 8192 / 2.7e-3 / 1e12 / 989, rel=1e-2)
    assert section["error"].startswith("stopped early")
    triton_only = compute_mod._linear_section(shape, points, info, [], None, "h200")
    assert "TileLang" in triton_only["backend_problem"]
    from tests.test_profile import synthetic_profile
    from cost_model.profile import profile_from_dict
    prof = profile_from_dict(dict(synthetic_profile(), linear_attention=section))
    assert prof.gdn.seconds(8192, 32, 128, 128) == pytest.approx(2.7e-3)   # megatron's call preferred


def test_without_fla_the_linear_section_is_the_estimate():
    if importlib.util.find_spec("fla") is not None:
        pytest.skip("fla is importable here")
    shape = dict(qk_heads=16, v_heads=32, key_head_dim=128, value_head_dim=128, tokens=[8192])
    assert compute_mod.measure_linear_attention(shape, 2, "h200") == compute_mod.linear_attention_estimate()


@pytest.mark.torch
def test_device_memory_kernel_mix_and_pattern_run_on_cpu():
    torch = pytest.importorskip("torch")
    cpu = torch.device("cpu")
    ran = []
    for label, fn in dm._kernel_mix(torch, cpu, tokens=128, hidden=64, vocab=1000):
        try:
            fn()
            ran.append(label)
        except RuntimeError:
            assert "SDPA" in label  # cuDNN / efficient SDPA have no CPU kernel
    assert len(ran) >= 8
    dm._micro_batch(torch, cpu, 64)


def test_device_memory_section_reads_back_into_the_cost_model(h200):
    early = dict(visible_gib=139.8, cuda_context_only_gib=0.52, context_gib=1.31, workspaces_gib=0.79,
                 kernel_steps=[dict(after="bf16 GEMM (cuBLAS)", outside_gib=0.6)],
                 allocator_reserve=dict(fraction=0.006, gib=0.4, expandable_segments=True))
    nccl = dict(nccl=[dict(ranks=2, groups=4, init_gib=0.05, buffers_gib=0.31),
                      dict(ranks=1, groups=4, init_gib=0.04, buffers_gib=0.5)],
                nccl_default_group=dict(init_gib=0.1, buffers_gib=0.3), nccl_how="...")
    section = dm.device_memory_section(early, nccl, cuda=True)
    assert section["provenance"].startswith("measured by tune profile") and section["visible_gib"] == 139.8
    section["date"] = "2026-12-01"
    from cost_model.device_memory import parse_device_memory
    dev = parse_device_memory(section, "p.yaml")
    assert (dev.visible_gib, dev.context_gib, dev.reserve_fraction) == (139.8, 1.31, 0.006)
    assert dev.nccl_at(2).buffers_gib == 0.31 and dev.nccl_at(1).init_gib == 0.04
    failed = dm.device_memory_section(dict(error="RuntimeError: x"), {}, cuda=True)
    assert failed["error"] == "RuntimeError: x" and parse_device_memory(failed).visible_gib is None
    cpu = dm.device_memory_section(None, nccl, cuda=False)
    assert "nccl" not in cpu and parse_device_memory(cpu).nccl == ()


def test_nccl_memory_rows_are_per_communicator():
    figures = [0.5, 0.9, 1.2, 1.4, 2.6, 2.8, 4.8]   # base, init, world use; then per size: created, used
    default, rows = nccl_memory._rows(figures, [2, 1], 4)
    assert default == dict(init_gib=0.4, buffers_gib=0.3)
    assert rows == [dict(ranks=2, groups=4, init_gib=0.05, buffers_gib=0.3),
                    dict(ranks=1, groups=4, init_gib=0.05, buffers_gib=0.5)]


def test_only_some_sections_merge_into_an_existing_profile():
    existing = _sample_profile()
    measured = dict(date="2026-12-01", device="NVIDIA H200", torch="2.11", cuda="13.0", nccl="2.28.9",
                    linear_attention=dict(kind="measured", points=[]), device_memory=dict(visible_gib=139.8))
    merged = hp.merge_sections(existing, measured)
    assert merged["linear_attention"]["kind"] == "measured" and merged["device_memory"]["visible_gib"] == 139.8
    assert merged["gemm_bf16"] == existing["gemm_bf16"]
    assert "re-measured 2026-12-01" in merged["notes"][-1] and "linear_attention, device_memory" in merged["notes"][-1]
    assert hp.main(["--only", "gemm,bogus"]) == 2


@pytest.mark.torch
def test_only_the_sections_asked_for_are_measured():
    torch = pytest.importorskip("torch")
    tiny = dict(gemm=[dict(m=64, n=32, k=48)], gemm_fp8=[], grouped_gemm=[], attention=[],
                linear_attention=dict(ps.LINEAR_ATTENTION_DEFAULT, tokens=[128]),
                collectives=dict(ops=["all_reduce"], bytes=[65536]))
    prof = hp._profile(torch.device("cpu"), hp.ProfilePlan(tiny, 2, 1, backend="gloo",
                                                           only=["linear_attention", "device_memory"]))
    assert [k for k in prof if k in hp.SECTIONS] == ["linear_attention", "device_memory"]
    assert prof["linear_attention"]["kind"] in ("estimate", "measured") and "date" in prof


def test_runner_probe_rows_from_the_runners_own_records():
    from experiments.checks import runner_memory as rm
    from experiments.runner import TrialResult
    seen = []

    class StandIn:
        def __init__(self, limit, gdn, layers):
            self.limit, self.gdn = limit, gdn

        def run(self, spec):
            seen.append((spec.case.layout.world_size, spec.case.layout.ep, spec.case.workload.global_batch,
                         spec.steps, spec.case.model.name))
            if spec.case.layout.world_size == 1:
                per_rank = {"0": {"peak_allocated": 40.0, "peak_reserved": 42.0, "device_peak": 51.1}}
                return TrialResult(status="ok", kind="measured", source="x", details={
                    "memory_gib_per_rank": per_rank, "kernels": {"linear_attention": "fla"}})
            return TrialResult(status="failed", kind="measured", source="x", failure_class="crash", detail="boom")

    from cost_model.nouns.hardware import load_gpu
    out = rm.measure_runner_outside(2, gpu=load_gpu("h200"), runner_factory=StandIn)["runner_outside"]
    assert seen == [(1, 1, 2, 3, "qwen3.6-35b-a3b"), (2, 2, 4, 3, "qwen3.6-35b-a3b")]
    assert out[0]["outside_gib"] == pytest.approx(9.1) and out[0]["linear_attention"] == "fla"
    assert out[1]["gpus"] == 2 and out[1]["error"] == "crash: boom"
    assert "first 4 layers" in out[0]["model"]
    section = dm.device_memory_section(dict(visible_gib=139.8), {}, True, {"runner_outside": out})
    from cost_model.device_memory import parse_device_memory
    assert parse_device_memory(section).runner_outside == ((1, 9.1),)


def test_a_model_profile_probes_with_the_gdn_layers_replaced(monkeypatch):
    """`tune profile --model M`: the runner probe runs Qwen3.6's layers with their Gated DeltaNet replaced (no
    kernel to run), its rows say so, and the profile read back marks its figure as without them."""
    from cost_model.device_memory import parse_device_memory
    from cost_model.nouns.hardware import load_gpu
    from experiments.checks import runner_memory as rm
    made = []
    StandIn = _probe_stand_in(made, device_peak=50.9)
    rows = rm.measure_runner_outside(1, gpu=load_gpu("h200"), runner_factory=StandIn, gdn=False)["runner_outside"]
    assert [gdn for gdn, _ in made] == [False] and rows[0]["without_gdn"] is True
    assert "replaced by full attention" in rows[0]["model"]
    section = dm.device_memory_section(dict(visible_gib=139.8), {}, True, {"runner_outside": rows})
    dev = parse_device_memory(section)
    assert dev.runner_without_gdn and dev.runner_outside == ((1, 8.9),)
    # the profile asks for it from the model it profiles
    seen = []
    monkeypatch.setattr(hp, "measure_device_memory", lambda: {})
    monkeypatch.setattr(hp, "measure_runner_outside", lambda world, gdn: seen.append(gdn) or {"runner_outside": []})
    from cost_model.nouns.model_spec import load_model
    for model in (load_model("llama3-8b"), load_model("qwen3.6-35b-a3b"), None):
        hp._early_device_memory(0.0, 1, rm.probe_with_gdn(model))
    # a model profile's probe runs no GDN kernel, GDN model or not (the cost model adds what fla's kernels hold);
    # a profile of no particular model runs them
    assert seen == [False, False, True]


def test_the_runner_probe_runs_fewer_layers_where_four_would_not_fit():
    """On 1 x H100 (80 GB) the probe's 4 layers ran out of memory (2026-12-06; predicted 99 GiB): it runs the most
    that the cost model predicts to fit, and its row says how many; on an H200, or over 2 H100s (EP2), all 4."""
    from cost_model.nouns.hardware import load_gpu
    from experiments.checks import runner_memory as rm
    made = []
    StandIn = _probe_stand_in(made, device_peak=51.0)
    rows = rm.measure_runner_outside(2, gpu=load_gpu("h100"), runner_factory=StandIn)["runner_outside"]
    assert [n for _, n in made] == [2, 4]
    assert "first 2 layers" in rows[0]["model"] and "first 4 layers" in rows[1]["model"]
    made.clear()
    rm.measure_runner_outside(1, gpu=load_gpu("h200"), runner_factory=StandIn, gdn=False)
    assert [n for _, n in made] == [4]


def _probe_stand_in(made: list, device_peak: float):
    """A runner_factory for measure_runner_outside: records (gdn, layers) of each runner made; every trial runs,
    42 GiB reserved at its peak and `device_peak` on the device."""
    from experiments.runner import TrialResult

    class StandIn:
        def __init__(self, limit, gdn, layers):
            made.append((gdn, layers))

        def run(self, spec):
            per_rank = {"0": {"peak_reserved": 42.0, "device_peak": device_peak}}
            return TrialResult(status="ok", kind="measured", source="x", details={"memory_gib_per_rank": per_rank})
    return StandIn


@pytest.mark.parametrize("bad", [0, -2, 1.5, float("inf"), "eight", True, None])
def test_a_profile_with_a_communicator_of_no_ranks_is_refused_in_one_line(bad):
    """Found by the fuzzer: an nccl row of 0 ranks reached a log2 and escaped as a traceback from tune predict."""
    from cost_model.device_memory import DeviceMemoryError, parse_device_memory
    for section in ({"nccl": [{"ranks": bad, "init_gib": 0.5, "buffers_gib": 1.0}]},
                    {"runner_outside": [{"gpus": bad, "outside_gib": 9.0}]}):
        with pytest.raises(DeviceMemoryError) as info:
            parse_device_memory(section, "p.yaml")
        assert "\n" not in str(info.value) and str(info.value).startswith("p.yaml: device_memory.")


def test_summary_says_how_fla_was_tuned():
    profile = _sample_profile()
    la = dict(kind="measured", efficiency=0.05, fla="0.6.0",
              points=[dict(tokens=8192, qk_heads=32, v_heads=32, fwd_ms=0.56, fwd_bwd_ms=2.08)])
    seeded = dict(seeded=25, of=43, **{"from": "NVIDIA_H100_80GB_HBM3.json (tuned on NVIDIA H100 80GB HBM3)"})
    line = next(x for x in hp.summary({**profile, "linear_attention": {**la, "tuning": seeded}})
                if x.startswith("linear attention"))
    assert "fla autotune: 25 of 43 shipped choices seeded from NVIDIA_H100_80GB_HBM3.json" in line
    tuned_here = dict(seeded=0, why="no shipped fla tuning for NVIDIA H200: fla tunes its kernels here")
    line = next(x for x in hp.summary({**profile, "linear_attention": {**la, "tuning": tuned_here}})
                if x.startswith("linear attention"))
    assert line.endswith("fla autotune: no shipped fla tuning for NVIDIA H200: fla tunes its kernels here")
