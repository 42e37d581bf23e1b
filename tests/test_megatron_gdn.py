"""CPU tests of the megatron runner's Gated DeltaNet layers (experiments/megatron/gdn.py), its memory
figures (memory.py), its workers' environment, and the GDN suite.

Everything runs on the CPU: megatron's GatedDeltaNet with its torch gated delta rule (fla is not
importable here; on the H200 fla's chunk_gated_delta_rule runs, with its TileLang backend, which only the
GPU suite benchmarks/gdn_h200_suite.json exercises). The layout-equivalence of a GDN model (TP 2, PP 2,
EP 2) is in tests/test_layout_equivalence.py.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from megatron_cpu import CpuAdam, one_rank, tiny_qwen36_gdn

from cost_model.nouns.case import Case
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import FULL_ATTENTION, LINEAR_ATTENTION, load_model
from cost_model.nouns.workload import Workload
from experiments.megatron import config, gdn, memory, model_run, suite, train_loop
from experiments.megatron import runner as mr
from experiments.megatron import torch_native as tnb
from experiments.runner import TrialSpec

pytestmark = [pytest.mark.torch]

ROOT = Path(__file__).resolve().parent.parent
GDN_SUITE = ROOT / "benchmarks" / "gdn_h200_suite.json"
# The issue 12 OOM (2 x H200, 32k tokens per micro-batch), as PyTorch words it.
OOM_MESSAGE = ("CUDA out of memory. Tried to allocate 30.31 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
               "2.31 GiB is free. Including non-PyTorch memory, this process has 137.49 GiB memory in use. Of the "
               "allocated memory 126.60 GiB is allocated by PyTorch, and 1.50 GiB is reserved by PyTorch but "
               "unallocated. If reserved but unallocated memory is large try setting "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


class _Group:
    def __init__(self, size: int, rank: int = 0):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def _config(model, layout: Layout, **extra):
    from megatron.core.transformer.transformer_config import TransformerConfig

    kw = config.transformer_config_kwargs(model, layout, Workload(seq_len=32, global_batch=2),
                                          use_cpu_initialization=True)
    kw.update(bf16=False, params_dtype=torch.float32, pipeline_dtype=torch.float32,
              moe_token_dispatcher_type="allgather", **extra)
    return TransformerConfig(**kw)


# ------------------------------------------------------------------------------ the model's GDN layers
def test_config_places_gdn_layers_by_the_models_own_pattern(qwen36):
    """Qwen3.6: 3 GDN then 1 full attention, repeated (linear_attention_freq as a per-layer list), with
    its GDN shapes (16 q/k heads, 32 value heads, head dims 128, conv kernel 4)."""
    cfg = config.build_transformer_config(model_run.trial_model(qwen36, 8), Layout(2, tp=2, etp=1), Workload(),
                                          use_cpu_initialization=True)  # TP 2 validates (heads divisible)
    assert cfg.experimental_attention_variant == "gated_delta_net"
    assert cfg.linear_attention_freq == [1, 1, 1, 0, 1, 1, 1, 0]
    assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
            cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim) == (16, 32, 128, 128, 4)
    full = config.transformer_config_kwargs(qwen36, Layout(1), Workload())
    assert full["linear_attention_freq"] == [1 if t == LINEAR_ATTENTION else 0 for t in qwen36.layer_types]
    assert sum(full["linear_attention_freq"]) == 30
    replaced = config.transformer_config_kwargs(model_run.trial_model(qwen36, 4, replace_gdn=True), Layout(1), Workload())
    assert "experimental_attention_variant" not in replaced and "linear_attention_freq" not in replaced
    assert "experimental_attention_variant" not in config.transformer_config_kwargs(load_model("llama3-8b"), Layout(1),
                                                                                   Workload())


def test_block_spec_builds_megatrons_gdn_where_the_model_has_it():
    """torch-native and local: GatedDeltaNet (AttuneGatedDeltaNet) from megatron's
    get_gated_delta_net_module_spec with the backend's ColumnParallelLinear as in_proj (no fused norm,
    so the layer keeps its input norm), the backend's norm as the gated output norm; full attention on
    every 4th layer; a PP 2 stage slices the pattern by global layer."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.attention import SelfAttention

    tiny = tiny_qwen36_gdn(8)
    with one_rank():
        cfg = _config(tiny, Layout(1))
        spec, info = tnb.block_spec(tiny, cfg, "torch-native")
        attn = [ls.submodules.self_attention for ls in spec.layer_specs]
        assert [a.module is gdn.gdn_class() for a in attn] == [True, True, True, False] * 2
        assert attn[3].module is SelfAttention
        sub = attn[0].submodules
        assert (sub.in_proj, sub.out_norm, sub.out_proj) == (ColumnParallelLinear, tnb.TorchNorm, RowParallelLinear)
        assert attn[0].metainfo["fuse_input_layernorm"] is False
        assert spec.layer_specs[0].submodules.input_layernorm is tnb.TorchNorm
        assert "torch_chunk_gated_delta_rule" in info["attune_kernels"]["linear_attention"]
        local, local_info = tnb.block_spec(tiny, cfg, "local")
        assert local.layer_specs[0].submodules.self_attention.module is gdn.gdn_class()
        assert local_info["attune_kernels"]["linear_attention"] == info["attune_kernels"]["linear_attention"]
        cfg_pp = _config(tiny, Layout(2, pp=2))
        stage2, _ = tnb.block_spec(tiny, cfg_pp, "torch-native", pp_rank=1)
        assert [ls.submodules.self_attention.module is gdn.gdn_class() for ls in stage2.layer_specs] == [
            True, True, True, False]
        plain, plain_info = tnb.block_spec(model_run.trial_model(tiny, 4, replace_gdn=True), _config(
            model_run.trial_model(tiny, 4, replace_gdn=True), Layout(1)), "torch-native")
        assert all(ls.submodules.self_attention.module is SelfAttention for ls in plain.layer_specs)
        assert "linear_attention" not in plain_info["attune_kernels"]


def test_torch_stand_ins_for_flas_conv_and_l2norm():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 9, 6, generator=g)
    torch.testing.assert_close(gdn.torch_l2norm(x), x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6))
    assert gdn.torch_l2norm(x.bfloat16()).dtype == torch.bfloat16
    w, bias = torch.randn(6, 4, generator=g), torch.randn(6, generator=g)
    y, state = gdn.torch_causal_conv1d(x, w, bias, activation="silu")
    # Causal depthwise convolution: y[t] = silu(bias + sum_j w[:, j] * x[t - 3 + j]).
    pad = torch.cat([torch.zeros(2, 3, 6), x], dim=1)
    ref = torch.stack([torch.nn.functional.silu(bias + (pad[:, t:t + 4] * w.t()).sum(1)) for t in range(9)], dim=1)
    torch.testing.assert_close(y, ref)
    assert state is None and y.shape == x.shape
    with pytest.raises(NotImplementedError):
        gdn.torch_causal_conv1d(x, w, cu_seqlens=torch.tensor([0, 9]))


def _naive_gated_delta_rule(q, k, v, g, beta):
    """The gated delta rule one token at a time (float64): S <- S exp(g); S += k (beta (v - S^T k))^T;
    o = S^T q / sqrt(d_k)."""
    b, s, h, kd = q.shape
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    state = torch.zeros(b, h, kd, v.shape[-1], dtype=torch.float64)
    out = torch.zeros(*v.shape, dtype=torch.float64)
    for t in range(s):
        state = state * g[:, t].exp()[..., None, None]
        pred = torch.einsum("bhkv,bhk->bhv", state, k[:, t])
        state = state + torch.einsum("bhk,bhv->bhkv", k[:, t], beta[:, t][..., None] * (v[:, t] - pred))
        out[:, t] = torch.einsum("bhkv,bhk->bhv", state, q[:, t] / kd ** 0.5)
    return out


def test_megatrons_torch_gated_delta_rule_is_the_recurrence():
    """The kernel the CPU runs (megatron's torch_chunk_gated_delta_rule; 70 tokens: two 64-token
    chunks, the second padded) against the token-by-token recurrence."""
    from megatron.core.ssm.gated_delta_net import torch_chunk_gated_delta_rule

    g = torch.Generator().manual_seed(0)
    q, k = (torch.nn.functional.normalize(torch.randn(2, 70, 3, 8, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(2, 70, 3, 6, generator=g)
    decay, beta = -0.5 * torch.rand(2, 70, 3, generator=g), torch.rand(2, 70, 3, generator=g)
    out, _ = torch_chunk_gated_delta_rule(q, k, v, decay, beta)
    torch.testing.assert_close(out.double(), _naive_gated_delta_rule(q, k, v, decay, beta), atol=1e-5, rtol=1e-5)


def _gdn_module(cfg, tp: int = 1, rank: int = 0, seed: int = 7):
    from megatron.core.transformer.spec_utils import build_module

    torch.manual_seed(seed)
    spec = gdn.gdn_attention_spec(cfg, tnb.TorchNativeSpecProvider())
    module = build_module(spec, config=cfg, layer_number=1, pg_collection=SimpleNamespace(tp=_Group(tp, rank),
                                                                                         cp=_Group(1)))
    return module, torch.randn(3)  # the process generator's state after the layer


def test_gdn_module_runs_the_chosen_kernel_and_matches_megatrons_deterministic_path():
    """AttuneGatedDeltaNet's forward (torch causal_conv1d stand-in + the chosen kernel) equals megatron's
    deterministic-mode forward (its own F.conv1d path) with the same weights, forward and backward."""
    tiny = tiny_qwen36_gdn()
    with one_rank():
        ours, _ = _gdn_module(_config(tiny, Layout(1)))
        det, _ = _gdn_module(_config(tiny, Layout(1), deterministic_mode=True))
        det.load_state_dict(ours.state_dict())
        x = torch.randn(32, 2, 64, generator=torch.Generator().manual_seed(1))
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        tnb.reset_kernel_report()
        out, _ = ours(x1, None)
        ref, _ = det(x2, None)
        assert tnb.kernel_report() == {gdn.TORCH_KERNEL: 1}  # megatron's deterministic path calls it directly
        torch.testing.assert_close(out, ref)
        out.square().sum().backward()
        ref.square().sum().backward()
        torch.testing.assert_close(x1.grad, x2.grad)
        for (name, p), q in zip(ours.named_parameters(), det.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)


def _sections(shards: list[torch.Tensor], sections: list[int], dim: int = 0) -> torch.Tensor:
    """The whole tensor from TP shards that hold each section's slice (megatron's GDN sharding)."""
    size = len(shards)
    parts = [torch.split(s, [n // size for n in sections], dim=dim) for s in shards]
    return torch.cat([torch.cat([p[i] for p in parts], dim=dim) for i in range(len(sections))], dim=dim)


def test_cpu_initialised_gdn_shards_are_the_tp1_layer():
    """Same weights: a TP 2 rank's in_proj is its slice of each section (q, k, v, z, beta, alpha) of the
    TP 1 weight, conv1d its slice of q, k, v channels, A_log/dt_bias its value heads, out_proj its
    input columns; and every rank leaves the process generator where TP 1 does (later layers match)."""
    tiny = tiny_qwen36_gdn()
    with one_rank():
        whole, state = _gdn_module(_config(tiny, Layout(1)))
        shards = [_gdn_module(_config(tiny, Layout(2, tp=2, etp=1)), tp=2, rank=r) for r in range(2)]
    mods = [m for m, _ in shards]
    assert all(torch.equal(s, state) for _, s in shards)
    qk, v, nv = whole.qk_dim, whole.v_dim, whole.num_value_heads
    assert mods[0].in_proj.weight.shape[0] == whole.in_proj.weight.shape[0] // 2
    assert torch.equal(_sections([m.in_proj.weight for m in mods], [qk, qk, v, v, nv, nv]), whole.in_proj.weight)
    assert not torch.equal(mods[0].in_proj.weight, whole.in_proj.weight[:whole.in_proj.weight.shape[0] // 2])
    assert torch.equal(_sections([m.conv1d.weight for m in mods], [qk, qk, v]), whole.conv1d.weight)
    assert torch.equal(torch.cat([m.A_log for m in mods]), whole.A_log)
    assert torch.equal(torch.cat([m.dt_bias for m in mods]), whole.dt_bias) and bool((whole.dt_bias == 1).all())
    assert torch.equal(torch.cat([m.out_proj.weight for m in mods], dim=1), whole.out_proj.weight)
    assert torch.equal(mods[0].out_norm.weight, whole.out_norm.weight)
    # megatron's draws: A_log = log U(1, 16); conv1d as nn.Conv1d's default (|w| <= 1 / sqrt(kernel)).
    assert bool(((whole.A_log.detach().exp() >= 1) & (whole.A_log.detach().exp() <= 16)).all())
    assert float(whole.conv1d.weight.detach().abs().max()) <= 0.5 + 1e-6


# ------------------------------------------------------------------------------ fla on the GPU
def _fake_fla(monkeypatch, *, triton: str, backends: dict, hopper: bool = True):
    monkeypatch.setitem(sys.modules, "fla", SimpleNamespace(__version__="0.6.0"))
    monkeypatch.setitem(sys.modules, "triton", SimpleNamespace(__version__=triton))
    monkeypatch.setattr(gdn.importlib.util, "find_spec", lambda name, *a: object() if name == "fla" else None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0) if hopper else (10, 0))
    monkeypatch.setattr(gdn, "fla_backends", lambda: backends)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    from experiments.megatron import fla_tuning
    monkeypatch.setattr(fla_tuning, "seed_for_megatron", lambda gpu: {"seeded": 0, "gpu": gpu})


def test_configure_fla_enables_tilelang_on_hopper_and_refuses_a_wrong_kernel(monkeypatch):
    """fla 0.6.0 on Hopper with Triton 3.4-3.7.0 must run TileLang's chunk_bwd_dqkwg (or FlashQLA): the
    runner sets FLA_TILELANG=1 unless the user set it, and refuses before the first step otherwise."""
    monkeypatch.setenv("FLA_TILELANG", "recorded")  # so that monkeypatch restores the original afterwards
    monkeypatch.delenv("FLA_TILELANG")
    _fake_fla(monkeypatch, triton="3.6.0", backends={"gated_delta_rule": ["none (triton)"], "common": ["tilelang"]})
    status = gdn.configure_fla(0)
    assert status["FLA_TILELANG"].startswith("1 (set by the runner") and gdn.os.environ["FLA_TILELANG"] == "1"
    assert status["hopper"] is True and status["triton"] == "3.6.0"
    assert status["tuning"] == {"seeded": 0, "gpu": "NVIDIA H200"}   # the shipped autotune choices, once it passed
    monkeypatch.setenv("FLA_TILELANG", "0")
    _fake_fla(monkeypatch, triton="3.6.0", backends={"gated_delta_rule": ["none (triton)"], "common": ["none (triton)"]})
    with pytest.raises(ImportError, match="TileLang backend") as info:
        gdn.configure_fla(0)
    assert "FLA_TILELANG=0" in str(info.value)
    from experiments.megatron.failures import classify_exception
    assert classify_exception(info.value, "config") == "invalid_config"
    # FlashQLA serves the whole call; Triton >= 3.7.1 is right; other GPUs are left alone.
    _fake_fla(monkeypatch, triton="3.6.0", backends={"gated_delta_rule": ["flash_qla"], "common": ["none (triton)"]})
    assert gdn.configure_fla(0)["FLA_TILELANG"] == "0 (set by the user)"
    _fake_fla(monkeypatch, triton="3.7.1", backends={"gated_delta_rule": ["none (triton)"], "common": ["none (triton)"]})
    gdn.configure_fla(0)
    monkeypatch.delenv("FLA_TILELANG")
    _fake_fla(monkeypatch, triton="3.6.0", backends={"common": ["none (triton)"]}, hopper=False)
    assert "FLA_TILELANG" not in gdn.configure_fla(0) and "FLA_TILELANG" not in gdn.os.environ
    assert gdn._version("3.6.0+git1234") == (3, 6, 0) and gdn._version("3.7") == (3, 7, 0)


def test_configure_fla_without_fla_says_the_torch_kernel_runs(monkeypatch):
    monkeypatch.setattr(gdn.importlib.util, "find_spec", lambda name, *a: None)
    assert "not importable" in gdn.configure_fla(0)["fla"]
    assert gdn.fla_dispatches() == [] and not gdn.fla_importable()
    assert gdn.linear_attention_kernel()[1] == gdn.TORCH_KERNEL


# ------------------------------------------------------------------------------ memory
def test_memory_tracker_keeps_the_largest_device_use():
    free = iter([100, 90, 95, 80, 85])
    reserved = iter([31, 41, 35, 51, 46])  # 9 GiB outside PyTorch, 10 at one sample
    tracker = memory.MemoryTracker(lambda: (next(free) * memory.GIB, 140 * memory.GIB),
                                   lambda: next(reserved) * memory.GIB)
    assert tracker.sample("after_build") == 40
    tracker.sample("after_optimizer_first_step")
    for _ in range(3):
        tracker.sample()
    assert (tracker.peak, tracker.total, tracker.outside) == (60, 140, 10)
    report = memory.memory_report(1.0, 2.0, tracker, lambda: 30 * memory.GIB, lambda: 33 * memory.GIB)
    assert report == {"after_build": 1.0, "after_optimizer": 2.0, "peak_allocated": 30.0, "peak_reserved": 33.0,
                      "device_peak": 60, "device_total": 140, "outside_pytorch": 10,
                      "device_after_optimizer_first_step": 50}
    assert "device_peak" not in memory.memory_report(1.0, 2.0, None, lambda: 0, lambda: 0)


def test_oom_message_figures():
    f = memory.parse_oom(OOM_MESSAGE)
    assert f["tried_to_allocate_gib"] == 30.31 and f["total_capacity_gib"] == 139.81 and f["free_gib"] == 2.31
    assert f["allocated_by_pytorch_gib"] == 126.6 and f["reserved_unallocated_gib"] == 1.5
    assert f["reserved_by_pytorch_gib"] == 128.1 and f["outside_pytorch_gib"] == pytest.approx(9.39)
    assert f["device_used_gib"] == pytest.approx(137.5)
    small = memory.parse_oom("Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 8.00 GiB of which 0 bytes "
                             "is free. Of the allocated memory 512.00 KiB is allocated by PyTorch, and 15.90 MiB is "
                             "reserved by PyTorch but unallocated.")
    assert small["tried_to_allocate_gib"] == round(20 / 1024, 3) and small["free_gib"] == 0
    assert small["allocated_by_pytorch_gib"] == round(512 / 1024**2, 3) and "outside_pytorch_gib" not in small
    assert memory.parse_oom("RuntimeError: CUDA error: out of memory") == {}
    assert memory.failure_snapshot(None) == {}  # no CUDA here: nothing to say, and no exception


# ------------------------------------------------------------------------------ the runner
def _spec(model, layout, steps=8, **wl):
    workload = Workload(**{"seq_len": 4096, "global_batch": 16, "framework": "megatron", **wl})
    return TrialSpec(Case(model, load_gpu("h200"), workload, layout), steps=steps, window=(2, steps - 1))


def test_workers_run_with_the_recipes_allocator_setting_unless_the_user_set_one(monkeypatch, qwen36):
    from recipes.slime_command import slime_env

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    case = Case(qwen36, load_gpu("h200"), Workload(), Layout(2, ep=2))
    env, sources = mr._worker_env(False, case)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == slime_env(case.layout, case.gpu)["PYTORCH_CUDA_ALLOC_CONF"]
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert sources["PYTORCH_CUDA_ALLOC_CONF"].startswith("recipe: recipes.slime_command.slime_env")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False,max_split_size_mb:512")
    env, sources = mr._worker_env(False, case)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False,max_split_size_mb:512"
    assert sources["PYTORCH_CUDA_ALLOC_CONF"].startswith("user:")


def _rank(rank: int, device_peak: float | None):
    mem = {"after_build": 8.0, "after_optimizer": 40.0, "peak_allocated": 70.0 + rank, "peak_reserved": 75.0}
    if device_peak is not None:
        mem.update(device_peak=device_peak + rank, device_total=139.8)
    return {"gpu_name": "NVIDIA H200", "megatron_core": "0.19.2", "torch": "2.11.0", "backend": "torch-native",
            "backend_reason": "auto", "kernels": {**tnb.KERNELS["torch-native"], "linear_attention": "fla 0.6.0 ..."},
            "kernels_ran": {}, "optimizer": "standard", "step_times_s": [2.0] + [1.0] * 7, "losses": [12.0] * 8,
            "grad_norms": [1.0] * 8, "num_microbatches": 8, "params_local": 10, "memory_gib": mem,
            "env_seen": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
            "fla": {"fla": "0.6.0", "backends": {"common": ["tilelang"]}}, "fla_dispatch": ["common:x:tilelang"]}


def test_runner_reports_the_device_peak_and_keeps_the_allocator_peaks(monkeypatch, qwen36):
    jobs = []

    def fake_run_job(job, world, launcher, timeout_s, hang_timeout_s, **limits):
        jobs.append(job)
        return {"status": "ok", "wall_s": 30.0, "ranks": {r: _rank(r, device_peak) for r in range(world)}}

    monkeypatch.setattr(mr, "visible_gpus", lambda: 2)
    monkeypatch.setattr(mr, "run_job", fake_run_job)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    device_peak = 110.0
    res = mr.MegatronRunner(layers=4).run(_spec(qwen36, Layout(2, ep=2, max_tokens_per_gpu=4096)))
    d = res.details
    assert res.status == "ok" and res.peak_memory_gib == 111.0
    assert d["peak_memory_basis"] == "device (cuda mem_get_info)"
    assert res.peak_memory_gib_per_rank == (70.0, 71.0) and d["max_memory_allocated_gib_per_rank"] == [70.0, 71.0]
    assert d["memory_gib_per_rank"]["1"] == {"after_build": 8.0, "after_optimizer": 40.0, "peak_allocated": 71.0,
                                             "peak_reserved": 75.0, "device_peak": 111.0, "device_total": 139.8}
    assert jobs[0]["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert d["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True" and "MASTER_PORT" not in d["env"]
    assert d["env_sources"]["PYTORCH_CUDA_ALLOC_CONF"].startswith("recipe:")
    assert d["env_seen"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert d["kernels"]["linear_attention"] == "fla 0.6.0 ..." and d["fla"]["backends"]["common"] == ["tilelang"]
    assert "gdn kernel: fla 0.6.0 ..." in d["notes"] and d["model_run"]["name"] == "qwen3.6-35b-a3b[L4]"
    assert "linear_attention fla 0.6.0" in res.source
    device_peak = None  # a rank without mem_get_info figures: the allocator's peak, and it says so
    res = mr.MegatronRunner(layers=4, replace_gdn=True).run(_spec(qwen36, Layout(2, ep=2, max_tokens_per_gpu=4096)))
    assert res.peak_memory_gib == 71.0 and res.details["peak_memory_basis"] == "allocator (max_memory_allocated)"


def test_a_trial_stopped_in_its_warm_up_is_not_a_measurement(monkeypatch, qwen36):
    # A first step that compiles kernels can take the whole budget: that step's time is not the layout's.
    def fake_run_job(job, world, launcher, timeout_s, hang_timeout_s, **limits):
        ranks = {r: {**_rank(r, 100.0), "step_times_s": [130.8], "losses": [12.0], "grad_norms": [1.0]}
                 for r in range(world)}
        return {"status": "ok", "wall_s": 140.0, "ranks": ranks}

    monkeypatch.setattr(mr, "visible_gpus", lambda: 2)
    monkeypatch.setattr(mr, "run_job", fake_run_job)
    res = mr.MegatronRunner(layers=4).run(_spec(qwen36, Layout(2, ep=2, max_tokens_per_gpu=4096)))
    assert res.status == "failed" and res.failure_class == "too_few_steps"
    assert res.tokens_per_s_per_gpu is None and "only warm-up steps ran" in res.detail
    assert res.details["step_times_s"] == [130.8] and res.details["steps_run"] == 1


def test_an_oom_records_pytorchs_figures_per_rank(monkeypatch, qwen36):
    def fake_run_job(job, world, launcher, timeout_s, hang_timeout_s, **limits):
        return {"status": "failed", "failure_class": "cuda_oom", "wall_s": 20.0, "progress": {},
                "detail": f"rank 0 (train): OutOfMemoryError: {OOM_MESSAGE}",
                "errors": [{"rank": 0, "phase": "train", "failure_class": "cuda_oom", "type": "OutOfMemoryError",
                            "message": OOM_MESSAGE, "memory_gib": {"peak_allocated": 126.6}},
                           {"rank": 1, "phase": "train", "failure_class": "nccl_timeout", "type": "DistBackendError",
                            "message": "Watchdog caught collective operation timeout"}]}

    monkeypatch.setattr(mr, "visible_gpus", lambda: 2)
    monkeypatch.setattr(mr, "run_job", fake_run_job)
    res = mr.MegatronRunner(layers=4).run(_spec(qwen36, Layout(2, ep=2, max_tokens_per_gpu=4096)))
    assert res.failure_class == "cuda_oom"
    d = res.details
    assert list(d["oom_per_rank"]) == ["0"] and d["oom_per_rank"]["0"]["tried_to_allocate_gib"] == 30.31
    assert d["oom_per_rank"]["0"]["outside_pytorch_gib"] == pytest.approx(9.39)
    assert d["memory_gib_per_rank_at_failure"] == {"0": {"peak_allocated": 126.6}}
    assert d["env"]["PYTORCH_CUDA_ALLOC_CONF"]


def test_worker_reports_its_memory_with_an_oom(monkeypatch):
    from experiments.megatron import worker

    def oom(*a, **k):
        raise torch.cuda.OutOfMemoryError(OOM_MESSAGE)

    reports = []
    monkeypatch.setattr(worker, "train", oom)
    monkeypatch.setattr(worker, "failure_snapshot", lambda tracker: {"peak_allocated": 126.6})
    monkeypatch.setattr(worker, "_leave_process_group", lambda: None)
    worker.worker(0, 1, {"env": {}}, SimpleNamespace(put=reports.append))
    err = reports[-1]
    assert err["failure_class"] == "cuda_oom" and err["memory_gib"] == {"peak_allocated": 126.6}
    from experiments.megatron.launch import _error_fields
    assert _error_fields(err)["memory_gib"] == {"peak_allocated": 126.6}
    assert "memory_gib" not in _error_fields({**err, "memory_gib": {}})


@pytest.mark.slow
def test_runner_trains_a_tiny_gdn_model_on_cpu(monkeypatch, tmp_path, qwen36):
    """The runner's own training phases (train_loop.run_phases: config, build with the torch-native
    block spec and megatron's GatedDeltaNet, DDP, the schedule, the memory samples) on a gloo rank, with
    a CPU Adam for megatron's CUDA-only DistributedOptimizer: 5 steps on two repeated learnable rows give
    a finite, decreasing loss; the rank's result then goes through MegatronRunner's summary."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"tokens": [(7 * i + 3 * r) % 200 for i in range(33)]}) + "\n" for r in range(2)))
    tiny = tiny_qwen36_gdn()
    layout = Layout(1, max_tokens_per_gpu=64, rows_per_microbatch=2)  # 2 rows of 32 tokens: 1 micro-batch
    job = {"model": tiny, "layout": layout, "workload": Workload(seq_len=32, global_batch=2, framework="megatron"),
           "steps": 5, "global_batch": 2, "seed": 1234, "lr": 3e-3, "backend": "torch-native", "cpu_init": True,
           "rows_file": str(rows), "sdpa_backend": "auto", "deadline": time.time() + 3600}
    free = iter(range(100, 0, -1))
    build = config.build_transformer_config

    def allgather_config(*a, **k):  # the alltoall dispatcher needs CUDA streams
        cfg = build(*a, **k)
        cfg.moe_token_dispatcher_type = "allgather"
        return cfg

    beats = []
    with one_rank(factories=True), \
            mock.patch.object(train_loop, "build_transformer_config", allgather_config), \
            mock.patch.object(train_loop, "build_optimizer", lambda chunks, lay, lr: (CpuAdam(chunks, lr), "cpu adam")), \
            mock.patch("megatron.core.distributed.finalize_model_grads", lambda *a, **k: None), \
            mock.patch.object(torch.cuda, "mem_get_info", lambda: (next(free) * memory.GIB, 140 * memory.GIB)), \
            mock.patch.object(torch.cuda, "memory_allocated", lambda *a: memory.GIB), \
            mock.patch.object(torch.cuda, "max_memory_allocated", lambda *a: 3 * memory.GIB), \
            mock.patch.object(torch.cuda, "max_memory_reserved", lambda *a: 4 * memory.GIB), \
            mock.patch.object(torch.cuda, "memory_reserved", lambda *a: 4 * memory.GIB):
        out = train_loop.run_phases(job, lambda kind, **kw: beats.append(kw), {}, 0)
    losses = out["losses"]
    assert len(losses) == 5 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.5 and all(b < a for a, b in zip(losses, losses[1:]))
    assert out["kernels_ran"][gdn.TORCH_KERNEL] == 5 * 3  # 3 GDN layers x 1 micro-batch x 5 steps
    assert "torch_chunk_gated_delta_rule" in out["kernels"]["linear_attention"]
    assert out["fla"] == {"fla": "not importable: megatron's torch gated delta rule runs"}
    m = out["memory_gib"]
    assert m["device_total"] == 140 and m["device_peak"] == 140 - 94  # samples: build, optimizer, 5 steps
    assert m["device_after_optimizer_first_step"] == 140 - 98 and m["outside_pytorch"] == 140 - 94 - 4
    assert [b.get("step") for b in beats if "step" in b] == [0, 1, 2, 3, 4]

    monkeypatch.setattr(mr, "visible_gpus", lambda: 1)
    monkeypatch.setattr(mr, "run_job", lambda job, *a, **k: {"status": "ok", "wall_s": 9.0, "ranks": {
        0: {"gpu_name": "cpu", **out}}})
    res = mr.MegatronRunner(layers=4, scale_batch_to_budget=False).run(
        TrialSpec(Case(tiny, load_gpu("h200"), job["workload"], layout), steps=5, window=(1, 4)))
    assert res.status == "ok" and res.losses == tuple(losses)
    assert res.peak_memory_gib == 46 and res.details["peak_memory_basis"] == "device (cuda mem_get_info)"
    assert res.details["kernels"]["linear_attention"] == out["kernels"]["linear_attention"]
    assert any(n.startswith("gdn kernel: megatron.core torch_chunk_gated_delta_rule") for n in res.details["notes"])


def test_runner_trains_a_tiny_dense_qwen35_on_cpu(tmp_path):
    """Dense Qwen3.5 (GDN layers with a dense MLP, no experts, tied embeddings) through the same training phases:
    3 GDN layers and a gated-attention one with dense MLPs train to a falling loss."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"tokens": [(5 * i + 3 * r) % 200 for i in range(33)]}) + "\n" for r in range(2)))
    tiny = dataclasses.replace(model_run.trial_model(load_model("qwen3.5-0.8b"), 4), hidden_size=64,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
                               vocab_size=256, linear_num_key_heads=2, linear_num_value_heads=4,
                               linear_key_head_dim=8, linear_value_head_dim=8)
    assert not tiny.is_moe and tiny.tie_word_embeddings
    layout = Layout(1, max_tokens_per_gpu=64, rows_per_microbatch=2)
    job = {"model": tiny, "layout": layout, "workload": Workload(seq_len=32, global_batch=2, framework="megatron"),
           "steps": 3, "global_batch": 2, "seed": 1234, "lr": 3e-3, "backend": "torch-native", "cpu_init": True,
           "rows_file": str(rows), "sdpa_backend": "auto", "deadline": time.time() + 3600}
    with one_rank(factories=True), \
            mock.patch.object(train_loop, "build_optimizer", lambda chunks, lay, lr: (CpuAdam(chunks, lr), "cpu adam")), \
            mock.patch("megatron.core.distributed.finalize_model_grads", lambda *a, **k: None), \
            mock.patch.object(torch.cuda, "mem_get_info", lambda: (100 * memory.GIB, 140 * memory.GIB)), \
            mock.patch.object(torch.cuda, "memory_allocated", lambda *a: memory.GIB), \
            mock.patch.object(torch.cuda, "max_memory_allocated", lambda *a: memory.GIB), \
            mock.patch.object(torch.cuda, "max_memory_reserved", lambda *a: memory.GIB), \
            mock.patch.object(torch.cuda, "memory_reserved", lambda *a: memory.GIB):
        out = train_loop.run_phases(job, lambda kind, **kw: None, {}, 0)
    losses = out["losses"]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert out["kernels_ran"][gdn.TORCH_KERNEL] == 3 * 3   # 3 GDN layers x 1 micro-batch x 3 steps


# ------------------------------------------------------------------------------ the suite and the CLI
def test_gdn_suite_runs_qwen36_with_its_gdn_layers_from_the_same_weights(h200, qwen36):
    trials, meta = suite.parse_suite(GDN_SUITE)
    by = {t.name: t for t in trials}
    assert list(by) == ["gdn-1g-tp1-ep1", "gdn-1g-tp1-mbs2", "gdn-1g-tp1-full1", "gdn-ref-tp1-ep2", "gdn-cand-tp2-ep1"]
    assert [(t.gpus, t.layout.tp, t.layout.ep, t.layout.rows_per_microbatch) for t in trials] == [
        (1, 1, 1, 1), (1, 1, 1, 2), (1, 1, 1, 1), (2, 1, 2, 1), (2, 2, 1, 1)]
    assert by["gdn-1g-tp1-full1"].layout.recompute_granularity == "full"
    assert meta["budget_s"] <= 600  # one device call
    for t in trials:
        assert (t.model, t.layers, t.replace_gdn, t.cpu_init, t.seed, t.lr) == ("qwen3.6-35b-a3b", 4, False, True,
                                                                                   1234, 1e-4)
        assert (t.workload.seq_len, t.workload.global_batch, t.steps, t.window) == (4096, 16, 20, (5, 19))
        assert t.rows_file == "/tmp/rows-learnable.jsonl"
        plan = mr.MegatronRunner(layers=t.layers, replace_gdn=t.replace_gdn, timeout_s=t.timeout_s,
                                 cpu_init=t.cpu_init).plan(TrialSpec(Case(qwen36, h200, t.workload, t.layout),
                                                                     steps=t.steps, window=t.window))
        assert plan["model"].layer_types == (LINEAR_ATTENTION,) * 3 + (FULL_ATTENTION,)
        assert plan["global_batch"] == 16 and plan["prediction"]["fits"] is True, t.name
        assert "gdn: megatron-core GatedDeltaNet: 3 of 4 layers" in plan["notes"][1]


def test_cli_flags_for_gdn(capsys):
    from experiments.megatron import cli

    args = cli.build_parser().parse_args(["--model", "qwen3.6-35b-a3b", "--gpus", "1"])
    assert args.replace_gdn is False and args.keep_gdn is False
    assert cli.main(["--model", "qwen3.6-35b-a3b", "--gpus", "1", "--replace-gdn", "--keep-gdn"]) == 2
    assert "contradict" in capsys.readouterr().err
    assert suite.parse_suite({"trials": [{"name": "a", "gpus": 1, "layout": {}, "model": "qwen3.6-35b-a3b"}]})[0][
        0].replace_gdn is False


def test_allocator_churn_is_counted_step_by_step_after_the_first_step():
    # samples: after build, after the optimizer, then after steps 0-3; step 2 retried twice and remapped 3 GiB
    retries = iter([0, 0, 1, 1, 3, 3])
    mapped = iter([10, 20, 40, 40, 43, 43])
    stats = lambda: {"num_alloc_retries": next(retries), "num_device_alloc": 5, "num_device_free": 0,  # noqa: E731
                     "reserved_bytes.all.allocated": next(mapped) * memory.GIB, "reserved_bytes.all.freed": 0}
    tracker = memory.MemoryTracker(lambda: (50 * memory.GIB, 80 * memory.GIB), lambda: 20 * memory.GIB, stats)
    for _ in range(6):
        tracker.sample()
    report = memory.churn_report(tracker)
    assert report["alloc_retries"] == [0.0, 2.0, 0.0] and report["reserved_gib_mapped"] == [0.0, 3.0, 0.0]
    assert report["device_allocs"] == [0.0, 0.0, 0.0]
    # stand-ins without counters keep none (and the report stays as it was)
    plain = memory.MemoryTracker(lambda: (50 * memory.GIB, 80 * memory.GIB), lambda: 20 * memory.GIB)
    plain.sample()
    assert memory.churn_report(plain) == {} and memory.churn_report(None) == {}


def test_allocator_retries_per_step_reads_the_runner_details():
    from experiments.runner import allocator_retries_per_step
    details = {"allocator_churn_per_rank": {"0": {"alloc_retries": [16.0, 17.0, 4.0]},
                                            "1": {"alloc_retries": [0.0, 0.0, 0.0]}}}
    assert allocator_retries_per_step(details) == 16.0
    assert allocator_retries_per_step({"allocator_churn_per_rank": {"0": {"alloc_retries": [0.0, 0.0]}}}) == 0
    assert allocator_retries_per_step({}) is None and allocator_retries_per_step(None) is None
    for junk in ("x", 5, {"0": 3}, {"0": {"alloc_retries": "16"}}, {"0": {"alloc_retries": [True]}}):
        assert allocator_retries_per_step({"allocator_churn_per_rank": junk}) is None
