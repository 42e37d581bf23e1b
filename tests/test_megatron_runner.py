"""CPU tests of the megatron runner and its torch-native backend (the experiments.megatron package,
experiments/megatron/torch_native.py).

Everything here runs on the CPU and asserts that it does (no test is skipped). What only a GPU can
run — NCCL, the CUDA grouped-GEMM and SDPA kernels, megatron's alltoall dispatcher (CUDA streams),
DistributedOptimizer (allocates on 'cuda'), the pipeline schedules, and the measurements — is
exercised by `python -m experiments.megatron` / benchmarks/megatron_h200_suite.json on the GPU
machine, not here. The CPU path covers: the model run (truncation, GDN replacement), the
TransformerConfig of several layouts, torch grouped_mm (torch >= 2.10 has a CPU implementation)
against a per-expert loop, the torch-native layer spec against megatron's local spec on a whole
GPTModel (forward and backward, allgather dispatcher, CPU tensors), the suite file, the CLI's
no-GPU error, failure classification, and the process launcher/monitor with stand-in workers.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from cost_model.nouns.case import Case
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.model_spec import FULL_ATTENTION, LINEAR_ATTENTION, MOE, load_model
from cost_model.predict import predict
from cost_model.nouns.layout import InvalidLayout, Layout
from cost_model.nouns.workload import Workload
from experiments.megatron import config, data, failures, launch, model_run, suite, train_loop, worker
from experiments.megatron import runner as mr
from experiments.megatron import torch_native as tnb
from experiments.runner import FAILURE_CLASSES, TrialResult, TrialSpec

pytestmark = [pytest.mark.torch]

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "benchmarks" / "megatron_h200_suite.json"
WL = Workload(seq_len=4096, global_batch=16, framework="megatron")


def test_this_machine_has_no_gpu():
    # The premise of every CPU-path assertion below (the GPU paths are run by the suite instead).
    assert torch.cuda.device_count() == 0
    assert mr.visible_gpus() == 0


# ------------------------------------------------------------------------------ the model run
def test_trial_model_truncates_and_replaces_gdn_when_asked(qwen36):
    run = model_run.trial_model(qwen36, 4, replace_gdn=True)
    assert qwen36.layer_types[:4] == (LINEAR_ATTENTION,) * 3 + (FULL_ATTENTION,)
    assert run.num_hidden_layers == 4
    assert run.layer_types == (FULL_ATTENTION,) * 4
    assert run.mlp_types == (MOE,) * 4
    assert run.num_nextn_predict_layers == 0
    assert (run.linear_num_key_heads, run.linear_num_value_heads, run.linear_conv_kernel_dim) == (0, 0, 0)
    assert run.name == "qwen3.6-35b-a3b[L4,gdn->full]"
    # Everything else is the catalog model's.
    for f in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "num_experts",
              "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size", "attn_output_gate",
              "qk_norm", "partial_rotary_factor", "tie_word_embeddings"):
        assert getattr(run, f) == getattr(qwen36, f), f
    # Each layer now counts as the catalog model's full-attention MoE layer.
    full_layer = qwen36.params.layers[3]
    assert all(layer == full_layer for layer in run.params.layers)
    assert run.params.total == (qwen36.params.embedding + qwen36.params.lm_head + qwen36.params.final_norm
                                + 4 * full_layer.total)
    notes = model_run.trial_model_notes(qwen36, run, "--layers")
    assert notes == ["truncated: 4 of 40 layers (--layers)",
                     "gdn: replaced by full attention (replace_gdn asked for): 3 of 4 layers",
                     "mtp: 1 MTP layer(s) not built"]


def test_trial_model_keeps_gdn_by_default_and_full_depth(qwen36):
    kept = model_run.trial_model(qwen36, 4)
    assert kept.layer_types == qwen36.layer_types[:4] and kept.name == "qwen3.6-35b-a3b[L4]"
    assert kept.linear_num_value_heads == qwen36.linear_num_value_heads
    assert model_run.trial_model_notes(qwen36, kept)[1] == (
        "gdn: megatron-core GatedDeltaNet: 3 of 4 layers (kernel: details.kernels.linear_attention)")
    assert kept.params.layers[0] == qwen36.params.layers[0]  # the catalog model's GDN layer, as predicted
    full = model_run.trial_model(qwen36, None, replace_gdn=True)
    assert full.num_hidden_layers == 40 and full.layer_types == (FULL_ATTENTION,) * 40
    assert full.name == "qwen3.6-35b-a3b[gdn->full]"
    same = model_run.trial_model(load_model("qwen3-30b-a3b"), None)
    assert same.name == "qwen3-30b-a3b" and same.layer_types == load_model("qwen3-30b-a3b").layer_types
    with pytest.raises(ValueError, match="has 40 layers"):
        model_run.trial_model(qwen36, 41)
    with pytest.raises(ValueError, match="positive integer"):
        model_run.trial_model(qwen36, 0)


def test_auto_layers_is_the_largest_predicted_fit(qwen36, h200):
    layout = Layout(1, max_tokens_per_gpu=4096)
    n, how = model_run.auto_layers(Case(qwen36, h200, WL, layout))
    # This machine has no Transformer Engine: the runner predicts with the standard fp32 optimizer.
    assert predict(model_run.trial_model(qwen36, n), h200, WL, layout, precision_aware_optimizer=False).fits
    assert not predict(model_run.trial_model(qwen36, n + 1), h200, WL, layout, precision_aware_optimizer=False).fits
    assert how.startswith("auto: largest layer count predicted to fit")
    n_pp, _ = model_run.auto_layers(Case(qwen36, h200, WL, Layout(2, pp=2, max_tokens_per_gpu=4096)))
    assert n_pp % 2 == 0


# ------------------------------------------------------------------------------ TransformerConfig
CONFIG_LAYOUTS = [
    Layout(1, max_tokens_per_gpu=4096),
    Layout(2, ep=2),
    Layout(2, tp=2, etp=1),
    Layout(2, tp=2, ep=2, etp=1),
    Layout(4, tp=2, ep=2, etp=2),
    Layout(2, pp=2),
    Layout(4, pp=2, vpp=2),
    Layout(1, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
    Layout(1, recompute_granularity="full", recompute_method="block", recompute_num_layers=2),
    Layout(1, recompute_granularity="selective", recompute_modules=("moe_act",)),
    Layout(1, recompute_granularity="selective", recompute_modules=("core_attn", "layernorm", "shared_experts")),
    Layout(1, recompute_granularity="selective"),
    Layout(2, ep=2, dispatcher="flex"),
]


@pytest.mark.parametrize("layout", CONFIG_LAYOUTS, ids=lambda lay: lay.long_label)
def test_transformer_config_validates(qwen36, layout):
    run = model_run.trial_model(qwen36, 4)
    cfg = config.build_transformer_config(run, layout, WL, use_cpu_initialization=True)  # __post_init__ validates
    assert cfg.num_layers == 4 and cfg.hidden_size == 2048
    assert (cfg.num_attention_heads, cfg.num_query_groups, cfg.kv_channels) == (16, 2, 256)
    assert (cfg.num_moe_experts, cfg.moe_router_topk, cfg.moe_ffn_hidden_size) == (256, 8, 512)
    assert cfg.moe_shared_expert_intermediate_size == 512 and cfg.moe_shared_expert_gate
    assert cfg.moe_grouped_gemm and cfg.moe_layer_freq == [1, 1, 1, 1]
    assert cfg.moe_token_dispatcher_type == layout.dispatcher
    assert cfg.attention_output_gate and cfg.qk_layernorm and cfg.gated_linear_unit
    assert cfg.bf16 and cfg.params_dtype == torch.bfloat16 and not cfg.add_bias_linear
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, cfg.context_parallel_size,
            cfg.expert_model_parallel_size, cfg.expert_tensor_parallel_size) == (
        layout.tp, layout.pp, layout.cp, layout.ep, layout.etp)
    assert cfg.virtual_pipeline_model_parallel_size == (layout.vpp if layout.vpp > 1 else None)
    assert cfg.sequence_parallel == (layout.tp > 1)
    assert cfg.recompute_granularity == layout.recompute_granularity
    if layout.recompute_granularity == "full":
        assert (cfg.recompute_method, cfg.recompute_num_layers) == (layout.recompute_method, layout.recompute_num_layers)
    if layout.recompute_granularity == "selective":
        assert cfg.recompute_modules == list(layout.selective_modules)
    # No fusion that needs Transformer Engine or Apex on the torch-native path.
    assert not (cfg.apply_rope_fusion or cfg.bias_activation_fusion or cfg.gradient_accumulation_fusion
                or cfg.masked_softmax_fusion or cfg.moe_permute_fusion)


def test_transformer_config_rejections_are_invalid_config():
    dense = model_run.trial_model(load_model("llama3-8b"), 2)
    lay = Layout(1, recompute_granularity="selective", recompute_modules=("moe_act",))
    with pytest.raises(ValueError, match="moe_act") as info:
        config.build_transformer_config(dense, lay, WL, use_cpu_initialization=True)
    assert failures.classify_exception(info.value, "config") == "invalid_config"
    with pytest.raises(NotImplementedError, match="MLA"):
        config.transformer_config_kwargs(load_model("deepseek-v3"), Layout(1), WL)
    with pytest.raises(NotImplementedError, match="bf16"):
        config.transformer_config_kwargs(dense, Layout(1), Workload(precision="fp8"))


def test_mixtral_config_builds_and_a_sliding_window_is_refused():
    from cost_model.nouns.hf_config import from_hf_config
    from tests.test_model_catalog import MIXTRAL_8X7B
    run = model_run.trial_model(from_hf_config(MIXTRAL_8X7B, "mixtral-8x7b"), 2)
    cfg = config.build_transformer_config(run, Layout(1), WL, use_cpu_initialization=True)
    assert (cfg.num_moe_experts, cfg.moe_router_topk, cfg.moe_ffn_hidden_size) == (8, 2, 14336)
    assert not cfg.qk_layernorm and cfg.moe_shared_expert_intermediate_size is None
    windowed = from_hf_config({**MIXTRAL_8X7B, "sliding_window": 4096}, "mistral-windowed")
    with pytest.raises(NotImplementedError, match="sliding-window"):
        config.transformer_config_kwargs(windowed, Layout(1), WL)


# ------------------------------------------------------------------------------ grouped GEMM
SPLITS = [5, 0, 17, 3, 0, 11]  # includes experts that receive no token


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_grouped_linear_matches_per_expert_loop(dtype, tol):
    """torch grouped_mm (the kernel the torch-native experts call) against the per-expert loop,
    forward and backward, on the CPU (torch >= 2.10 implements grouped_mm for CPU tensors; the
    CUDA kernel of torch 2.11 on the H200 is exercised only by the GPU suite)."""
    fn, name = tnb.grouped_mm_fn()
    assert fn is not None, name  # this torch has the kernel; on the CPU, not skipped
    g = torch.Generator().manual_seed(0)
    x = torch.randn(sum(SPLITS), 32, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(len(SPLITS), 48, 32, generator=g) * 0.1).to(dtype).requires_grad_()
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    tnb.reset_kernel_report()
    y = tnb.grouped_linear(x, w, SPLITS)
    ref = tnb.reference_grouped_linear(x2, w2, SPLITS)
    assert y.shape == ref.shape == (sum(SPLITS), 48)
    torch.testing.assert_close(y.float(), ref.float(), atol=tol, rtol=tol)
    grad = torch.randn(y.shape, generator=g).to(dtype)
    y.backward(grad)
    ref.backward(grad)
    torch.testing.assert_close(x.grad.float(), x2.grad.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(w.grad.float(), w2.grad.float(), atol=tol * 4, rtol=tol)
    assert w.grad[1].abs().sum() == 0 and w.grad[4].abs().sum() == 0  # experts without tokens
    assert tnb.kernel_report() == {name: 1}
    # A stride-0 (expanded) output gradient, which grouped_mm's backward rejects, is made contiguous.
    x.grad = None
    tnb.grouped_linear(x, w, SPLITS).sum().backward()
    assert x.grad is not None


def test_grouped_linear_offsets_and_empty_input():
    offs = tnb._offsets([3, 0, 4], torch.device("cpu"))
    assert offs.dtype == torch.int32 and offs.tolist() == [3, 3, 7]
    assert tnb._offsets(torch.tensor([2, 2]), torch.device("cpu")).tolist() == [2, 4]
    x = torch.zeros(0, 16)
    w = torch.randn(4, 8, 16)
    assert tnb.grouped_linear(x, w, [0, 0, 0, 0]).shape == (0, 8)


class _Group:
    def __init__(self, size, rank=0):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def _expert_cfg(tp=1, ep=1, etp=1):
    return SimpleNamespace(expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
                           tensor_model_parallel_size=tp, use_cpu_initialization=True, params_dtype=torch.float32,
                           perform_initialization=True, gated_linear_unit=True)


@pytest.mark.parametrize("tp,ep,etp,allreduce", [(1, 1, 1, True), (1, 2, 1, False), (2, 1, 1, False),
                                                 (2, 2, 2, False), (2, 1, 2, True)])
def test_grouped_linear_weight_layout_and_sharding(tp, ep, etp, allreduce):
    """megatron's GroupedMLP/TEGroupedMLP layout: 128 local experts (256 / EP 2 for example), fc1
    column-parallel over ETP ([gate|up] of the FFN slice), fc2 row-parallel over ETP; DDP's
    `allreduce` flag as ColumnParallelLinear sets it for experts (False: expert-DP reduction)."""
    cfg = _expert_cfg(tp, ep, etp)
    pgs = SimpleNamespace(expt_tp=_Group(etp))
    local, hidden, ffn = 256 // ep, 64, 32
    init = lambda t: torch.nn.init.normal_(t, std=0.02)  # noqa: E731
    fc1 = tnb.TorchColumnParallelGroupedLinear(local, hidden, 2 * ffn, config=cfg, init_method=init, bias=False,
                                               skip_bias_add=False, is_expert=True, pg_collection=pgs)
    fc2 = tnb.TorchRowParallelGroupedLinear(local, ffn, hidden, config=cfg, init_method=init, bias=False,
                                            skip_bias_add=True, is_expert=True, pg_collection=pgs)
    assert fc1.weight.shape == (local, 2 * ffn // etp, hidden)
    assert fc2.weight.shape == (local, hidden, ffn // etp)
    assert (fc1.weight.partition_dim, fc2.weight.partition_dim) == (1, 2)
    assert fc1.weight.tensor_model_parallel and fc2.weight.tensor_model_parallel
    assert fc1.weight.allreduce is allreduce and fc2.weight.allreduce is allreduce
    assert 0.015 < fc1.weight.std().item() < 0.025
    with pytest.raises(ValueError, match="routed experts only"):
        tnb.TorchColumnParallelGroupedLinear(local, hidden, 2 * ffn, config=cfg, init_method=init, bias=False,
                                             skip_bias_add=False, is_expert=False, pg_collection=pgs)


def _expert_shards(ep, etp, experts=8, hidden=16, ffn=12):
    """fc1/fc2 weights of every (EP rank, ETP rank) built from the same process RNG state, as each
    rank of a layout would build them with CPU initialisation; plus the RNG state afterwards."""
    init = lambda t: torch.nn.init.normal_(t, std=0.02)  # noqa: E731
    cfg = _expert_cfg(1, ep, etp)
    shards, state = {}, None
    for ep_rank in range(ep):
        for etp_rank in range(etp):
            torch.manual_seed(7)
            pgs = SimpleNamespace(expt_tp=_Group(etp, etp_rank), ep=_Group(ep, ep_rank))
            fc1 = tnb.TorchColumnParallelGroupedLinear(experts // ep, hidden, 2 * ffn, config=cfg, init_method=init,
                                                       bias=False, skip_bias_add=False, is_expert=True,
                                                       pg_collection=pgs)
            fc2 = tnb.TorchRowParallelGroupedLinear(experts // ep, ffn, hidden, config=cfg, init_method=init,
                                                    bias=False, skip_bias_add=True, is_expert=True, pg_collection=pgs)
            shards[ep_rank, etp_rank] = (fc1.weight.detach(), fc2.weight.detach())
            after = torch.randn(4)
            assert state is None or torch.equal(after, state)  # every rank's RNG moved on alike
            state = after
    return shards, state


@pytest.mark.parametrize("ep,etp", [(2, 1), (1, 2), (2, 2), (4, 1)])
def test_cpu_initialised_experts_are_the_same_model_in_every_layout(ep, etp):
    """With CPU initialisation, the EP/ETP shards of every layout put together give the EP 1 ETP 1
    experts exactly (fc1 sharded as megatron shards a GLU fc1: [gate slice | up slice] per ETP rank),
    and the process RNG ends where it ends for EP 1 ETP 1, so all later layers match too."""
    (ref1, ref2), ref_state = _expert_shards(1, 1)[0][0, 0], _expert_shards(1, 1)[1]
    shards, state = _expert_shards(ep, etp)
    ffn_local = ref1.shape[1] // 2 // etp
    fc1 = torch.cat([torch.cat([torch.cat([shards[e, r][0][:, :ffn_local] for r in range(etp)], dim=1),
                                torch.cat([shards[e, r][0][:, ffn_local:] for r in range(etp)], dim=1)], dim=1)
                     for e in range(ep)])
    fc2 = torch.cat([torch.cat([shards[e, r][1] for r in range(etp)], dim=2) for e in range(ep)])
    assert torch.equal(fc1, ref1) and torch.equal(fc2, ref2)
    assert torch.equal(state, ref_state)
    assert len({tuple(ref1[i].flatten()[:3].tolist()) for i in range(ref1.shape[0])}) == ref1.shape[0]  # distinct experts


def test_sdpa_attention_matches_naive_causal_gqa():
    from megatron.core.transformer.enums import AttnMaskType

    cfg = SimpleNamespace(context_parallel_size=1, softmax_type="vanilla", window_size=None,
                          window_attn_skip_freq=None, kv_channels=16, attention_dropout=0.0)
    attn = tnb.TorchSDPAttention(cfg, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    g = torch.Generator().manual_seed(1)
    sq, b, npart, ng, hn = 12, 2, 4, 2, 16
    q, k, v = (torch.randn(sq, b, n, hn, generator=g) for n in (npart, ng, ng))
    tnb.reset_kernel_report()
    out = attn(q, k, v, None)
    assert out.shape == (sq, b, npart * hn)
    # Naive reference: repeat KV heads, causal softmax.
    kr, vr = k.repeat_interleave(npart // ng, dim=2), v.repeat_interleave(npart // ng, dim=2)
    scores = torch.einsum("sbnh,tbnh->bnst", q, kr) / hn ** 0.5
    scores = scores.masked_fill(torch.triu(torch.ones(sq, sq, dtype=torch.bool), 1), float("-inf"))
    ref = torch.einsum("bnst,tbnh->sbnh", scores.softmax(-1), vr).reshape(sq, b, -1)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    report = tnb.kernel_report()
    assert report["torch.nn.functional.scaled_dot_product_attention"] == 1
    assert report["gqa"] in (["enable_gqa"], ["repeat_kv"])
    # Both GQA modes give the same result.
    attn._gqa_mode = {k_: ("repeat_kv" if m == "enable_gqa" else "enable_gqa") for k_, m in attn._gqa_mode.items()}
    torch.testing.assert_close(attn(q, k, v, None), ref, atol=1e-5, rtol=1e-5)
    for bad, match in ((dict(context_parallel_size=2), "context parallelism"), (dict(softmax_type="learnable"), "sinks")):
        with pytest.raises(NotImplementedError, match=match):
            tnb.TorchSDPAttention(SimpleNamespace(**{**vars(cfg), **bad}), 1, AttnMaskType.causal, "self")


def test_the_torch_free_sdpa_names_are_the_kernels_torch_native_maps():
    from experiments.megatron import backend_support, torch_native
    assert backend_support.SDPA_BACKENDS == ("auto", *torch_native.SDPA_KERNELS)


def test_backend_resolution_and_unsupported_models(qwen36):
    # This machine: no Transformer Engine, torch with grouped_mm and SDPA -> torch-native.
    assert not tnb.te_available()
    assert tnb.resolve_backend("auto")[0] == "torch-native"
    assert tnb.resolve_backend("local") == ("local", "requested")
    with pytest.raises(ImportError, match="transformer_engine"):
        tnb.resolve_backend("te")
    with pytest.raises(ValueError):
        tnb.resolve_backend("apex")
    assert tnb.unsupported(model_run.trial_model(qwen36, 4), "torch-native") == []
    assert tnb.unsupported(qwen36, "torch-native") == []  # Gated DeltaNet: megatron's GatedDeltaNet (gdn.py)
    oss = tnb.unsupported(load_model("gpt-oss-20b"), "torch-native")
    assert any("sinks" in r for r in oss) and any("sliding-window" in r for r in oss)
    assert tnb.unsupported(load_model("gpt-oss-20b"), "local") == []
    assert any("CP 2" in r for r in tnb.unsupported(load_model("qwen3-30b-a3b"), "torch-native", cp=2))
    spec = tnb.layer_spec(model_run.trial_model(qwen36, 4), "auto")
    assert spec.metainfo["attune_backend"] == "torch-native"
    assert "grouped_mm" in spec.metainfo["attune_kernels"]["grouped_gemm"]
    assert spec.submodules.self_attention.submodules.core_attention is tnb.TorchSDPAttention
    assert tnb.layer_spec(model_run.trial_model(qwen36, 4), "local").metainfo["attune_backend"] == "local"


# ------------------------------------------------------------------------------ a whole GPTModel on the CPU
@contextlib.contextmanager
def _cpu_megatron():
    """A 1-rank gloo process group and megatron's parallel state, plus the stubs that let
    megatron's local DotProductAttention (the reference) run on CPU tensors."""
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.fusions import fused_softmax

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
        tracker = tensor_parallel.get_cuda_rng_tracker()
        with warnings.catch_warnings(), \
                mock.patch.object(torch.cuda, "current_device", lambda: "cpu"), \
                mock.patch.object(tracker, "fork", lambda *a, **k: contextlib.nullcontext()), \
                mock.patch.object(fused_softmax, "get_default_causal_mask",
                                  lambda sq: torch.triu(torch.ones(sq, sq), diagonal=1).bool()):
            warnings.simplefilter("ignore")
            yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _tiny_qwen36():
    run = model_run.trial_model(load_model("qwen3.6-35b-a3b"), 2, replace_gdn=True)
    return dataclasses.replace(run, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                               num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                               shared_expert_intermediate_size=32, vocab_size=256)


def test_torch_native_gptmodel_matches_local_backend_on_cpu():
    """A 2-layer Qwen3.6-shaped GPTModel (GQA, q/k norm, output gate, shared gated expert, 4 experts
    top-2) built from the torch-native block spec and from megatron's local spec with the same
    weights: same per-token losses and gradients (fp32, CPU; the allgather dispatcher, since the
    alltoall one needs CUDA streams)."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    tiny = _tiny_qwen36()
    kw = config.transformer_config_kwargs(tiny, Layout(1), Workload(seq_len=32, global_batch=2),
                                      use_cpu_initialization=True)
    kw.update(moe_token_dispatcher_type="allgather", bf16=False, params_dtype=torch.float32,
              pipeline_dtype=torch.float32, moe_layer_freq=[1, 0])
    with _cpu_megatron():
        from megatron.core.transformer.transformer_config import TransformerConfig
        cfg = TransformerConfig(**kw)
        models = {}
        for backend in ("torch-native", "local"):
            spec, info = tnb.block_spec(tiny, cfg, backend)
            assert info["attune_backend"] == backend
            torch.manual_seed(0)
            models[backend] = GPTModel(cfg, spec, vocab_size=256, max_sequence_length=32,
                                       position_embedding_type="none")
        native, local = models["torch-native"], models["local"]
        experts = native.decoder.layers[0].mlp.experts
        assert type(experts).__name__ == "TorchGroupedMLP"
        assert type(local.decoder.layers[0].mlp.experts).__name__ == "SequentialMLP"
        assert type(native.decoder.layers[0].self_attention.core_attention) is tnb.TorchSDPAttention
        # Same weights: the local model's per-expert weights, stacked.
        sd = local.state_dict()
        new = {k: v for k, v in sd.items() if "local_experts" not in k}
        for fc in ("linear_fc1", "linear_fc2"):
            new[f"decoder.layers.0.mlp.experts.{fc}.weight"] = torch.stack(
                [sd[f"decoder.layers.0.mlp.experts.local_experts.{i}.{fc}.weight"] for i in range(4)])
        native.load_state_dict(new, strict=False)
        ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(3))
        pos = torch.arange(32).expand(2, 32)
        tnb.reset_kernel_report()
        loss_n = native(ids, pos, None, labels=ids)
        loss_l = local(ids, pos, None, labels=ids)
        torch.testing.assert_close(loss_n, loss_l, atol=1e-5, rtol=1e-5)
        loss_n.mean().backward()
        loss_l.mean().backward()
        g_n = experts.linear_fc1.weight.grad
        g_l = torch.stack([e.linear_fc1.weight.grad for e in local.decoder.layers[0].mlp.experts.local_experts])
        torch.testing.assert_close(g_n, g_l, atol=1e-6, rtol=1e-4)
        for name in ("self_attention.linear_qkv.weight", "self_attention.linear_proj.weight"):
            a = native.decoder.layers[0].get_parameter(name).grad
            b = local.decoder.layers[0].get_parameter(name).grad
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
        report = tnb.kernel_report()
        assert report["torch.nn.functional.scaled_dot_product_attention"] == 2  # both layers' attention
        assert sum(v for k, v in report.items() if "grouped_mm" in k) == 2  # fc1 + fc2 forward of the MoE layer


def test_selective_layernorm_and_moe_act_recompute_run_without_te():
    """megatron-core 0.19.2's CheckpointWithoutOutput takes fp8=False as FP8 (`fp8 is not None`) and
    calls FP8GlobalStateManager, a TE-only name: selective `layernorm` / `moe_act` recompute crashed
    with NameError without TE. The non-TE block spec turns that FP8 path off; forward and backward run."""
    from megatron.core.tensor_parallel import random as mrandom

    if getattr(mrandom, "HAVE_TE", False):
        pytest.skip("transformer_engine is importable: the FP8 path exists")
    tiny = _tiny_qwen36()
    layout = Layout(1, recompute_granularity="selective", recompute_modules=("layernorm", "moe_act"))
    kw = config.transformer_config_kwargs(tiny, layout, Workload(seq_len=32, global_batch=2),
                                          use_cpu_initialization=True)
    kw.update(moe_token_dispatcher_type="allgather", bf16=False, params_dtype=torch.float32,
              pipeline_dtype=torch.float32, moe_layer_freq=[1, 0])
    assert kw["recompute_modules"] == ["layernorm", "moe_act"]
    with _cpu_megatron():
        from megatron.core.transformer.transformer_config import TransformerConfig
        tnb.block_spec(tiny, TransformerConfig(**kw), "torch-native")
        ckpt = mrandom.CheckpointWithoutOutput()
        assert ckpt.fp8 is False
        # The forward megatron runs for the checkpointed norm / activation (CUDA RNG capture aside).
        x = torch.randn(4, 8, requires_grad=True)
        out = mrandom.CheckpointWithoutOutputFunction.apply(torch.nn.functional.silu, ckpt, x)
        torch.testing.assert_close(out, torch.nn.functional.silu(x.detach()))


def test_seeded_layers_draw_the_same_weights_whatever_was_built_before_them():
    """CPU initialisation with init_seed: a layer's weights depend on the seed and its global layer
    number only (a PP 2 stage building layer 2 alone gets the PP 1 model's layer 2), and the generator
    ends each layer in the same state (the output layer after the last layer matches too)."""
    from megatron.core.transformer.spec_utils import build_module

    tiny = _tiny_qwen36()
    kw = config.transformer_config_kwargs(tiny, Layout(1), Workload(seq_len=32, global_batch=2),
                                      use_cpu_initialization=True)
    kw.update(moe_token_dispatcher_type="allgather", bf16=False, params_dtype=torch.float32,
              pipeline_dtype=torch.float32)
    with _cpu_megatron():
        from megatron.core.transformer.transformer_config import TransformerConfig
        cfg = TransformerConfig(**kw)
        spec, _ = tnb.block_spec(tiny, cfg, "torch-native", init_seed=11)
        assert all(ls.module.__name__ == "SeededTransformerLayer" for ls in spec.layer_specs)
        torch.manual_seed(0)
        whole = [build_module(ls, config=cfg, layer_number=i + 1) for i, ls in enumerate(spec.layer_specs)]
        after_whole = torch.randn(5)
        torch.manual_seed(1)
        torch.randn(1000)  # a different history: another stage built other modules first
        alone = build_module(spec.layer_specs[1], config=cfg, layer_number=2)
        after_alone = torch.randn(5)
        assert torch.equal(after_whole, after_alone)
        params = dict(alone.named_parameters())
        assert len(params) > 10
        for name, a in whole[1].named_parameters():
            assert torch.equal(a, params[name]), name
        w0 = whole[0].self_attention.linear_qkv.weight
        assert not torch.equal(w0, whole[1].self_attention.linear_qkv.weight)  # layers still differ
        # Without a seed the layer takes the generator as it finds it (megatron's behaviour).
        plain, _ = tnb.block_spec(tiny, cfg, "torch-native")
        torch.manual_seed(1)
        torch.randn(1000)
        other = build_module(plain.layer_specs[1], config=cfg, layer_number=2)
        assert not torch.equal(other.self_attention.linear_qkv.weight, alone.self_attention.linear_qkv.weight)


def test_forward_step_and_masked_loss_through_megatron_ddp_on_cpu():
    """The runner's forward_step/loss_func on a bf16 Float16Module + megatron DDP model (CPU):
    masked mean cross-entropy and expert gradients landing in DDP's main_grad buffers."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.module import Float16Module

    tiny = _tiny_qwen36()
    kw = config.transformer_config_kwargs(tiny, Layout(1), Workload(seq_len=32, global_batch=4),
                                      use_cpu_initialization=True)
    kw["moe_token_dispatcher_type"] = "allgather"
    with _cpu_megatron():
        from megatron.core.transformer.transformer_config import TransformerConfig
        cfg = TransformerConfig(**kw)
        spec, _ = tnb.block_spec(tiny, cfg, "torch-native")
        model = Float16Module(cfg, GPTModel(cfg, spec, vocab_size=model_run.padded_vocab(256, 1), max_sequence_length=32,
                                            position_embedding_type="none"))
        ddp = DistributedDataParallel(config=cfg, ddp_config=DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=True), module=model)
        ids = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(5))
        mask = torch.ones(2, 32)
        mask[1, 16:] = 0
        batch = {"tokens": ids[:, :-1], "labels": ids[:, 1:], "loss_mask": mask,
                 "position_ids": torch.arange(32).expand(2, 32)}
        out, lf = train_loop.forward_step(iter([batch]), ddp)
        total, count, logged = lf(out)
        assert int(count) == 48
        torch.testing.assert_close(total, (out.float() * mask).sum())
        assert train_loop.step_loss([logged]) == pytest.approx(float(total) / 48)
        assert 4.5 < train_loop.step_loss([logged]) < 6.5  # ~ln(256) at random init
        (total / count).backward()
        w = model.module.decoder.layers[0].mlp.experts.linear_fc1.weight
        assert w.dtype == torch.bfloat16 and w.main_grad.abs().sum() > 0
    assert train_loop.step_loss([]) is None


def test_a_released_moe_build_is_collected_once_its_dispatchers_graph_references_are_dropped():
    """The profile's builds share a process: a released MoE build (megatron DDP, a forward run) must go. megatron's
    dispatcher keeps the routing probabilities with their graph, a cycle the collector cannot see through autograd's
    nodes; experiments.checks.device_tensors.drop_graphs removes it, and the build is collected (CPU)."""
    import gc
    import weakref

    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.module import Float16Module

    from experiments.checks.device_tensors import drop_graphs

    tiny = _tiny_qwen36()
    kw = config.transformer_config_kwargs(tiny, Layout(1), Workload(seq_len=32, global_batch=4),
                                          use_cpu_initialization=True)
    kw["moe_token_dispatcher_type"] = "allgather"
    with _cpu_megatron():
        from megatron.core.transformer.transformer_config import TransformerConfig

        def build_and_step():
            cfg = TransformerConfig(**kw)
            spec, _ = tnb.block_spec(tiny, cfg, "torch-native")
            model = Float16Module(cfg, GPTModel(cfg, spec, vocab_size=model_run.padded_vocab(256, 1),
                                                max_sequence_length=32, position_embedding_type="none"))
            ddp = DistributedDataParallel(config=cfg, ddp_config=DistributedDataParallelConfig(
                grad_reduce_in_fp32=True, use_distributed_optimizer=True), module=model)
            ids = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(5))
            batch = {"tokens": ids[:, :-1], "labels": ids[:, 1:], "loss_mask": torch.ones(2, 32),
                     "position_ids": torch.arange(32).expand(2, 32)}
            out, lf = train_loop.forward_step(iter([batch]), ddp)
            total, count, _ = lf(out)
            (total / count).backward()
            return cfg, ddp

        cfg, ddp = build_and_step()
        alive = weakref.ref(ddp)
        dropped = drop_graphs(ddp, cfg)
        assert dropped and all(d.endswith("probs") for d in dropped)
        del cfg, ddp
        gc.collect()
        assert alive() is None


# ------------------------------------------------------------------------------ failures
def test_failure_classification():
    assert failures.classify_exception(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")) == "cuda_oom"
    assert failures.classify_exception(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB")) == "cuda_oom"
    # a Triton kernel's launch (fla's Gated DeltaNet on 1 x H100, 2026-12-07) is the device out of memory too
    assert failures.classify_exception(RuntimeError("Triton Error [CUDA]: out of memory")) == "cuda_oom"
    assert failures.classify_exit(1, "RuntimeError: Triton Error [CUDA]: out of memory") == "cuda_oom"
    assert failures.classify_exception(RuntimeError("DefaultCPUAllocator: can't allocate memory")) == "crash"
    assert failures.classify_exception(MemoryError()) == "host_oom"
    timeout = torch.distributed.DistBackendError("[Rank 0] Watchdog caught collective operation timeout: "
                                                  "WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 60000 ms")
    assert failures.classify_exception(timeout) == "nccl_timeout"
    assert failures.classify_exception(RuntimeError("NCCL communicator was aborted: timed out")) == "nccl_timeout"
    for phase in ("config", "build", "optimizer"):
        assert failures.classify_exception(ValueError("moe_act needs grouped gemm"), phase) == "invalid_config"
        assert failures.classify_exception(AssertionError("heads % tp"), phase) == "invalid_config"
        assert failures.classify_exception(ImportError("DeepEP is not installed"), phase) == "invalid_config"
        assert failures.classify_exception(RuntimeError("CUDA error: illegal memory access"), phase) == "crash"
    assert failures.classify_exception(ValueError("bad value"), "train") == "crash"
    assert failures.classify_exception(InvalidLayout("world size"), "train") == "invalid_config"
    assert failures.classify_exception(KeyError("x"), "train") == "crash"
    assert failures.classify_exit(-9) == "host_oom"
    assert failures.classify_exit(-6, "... Watchdog caught collective operation timeout ...") == "nccl_timeout"
    assert failures.classify_exit(1, "torch.OutOfMemoryError: CUDA out of memory") == "cuda_oom"
    assert failures.classify_exit(1) == "crash" and failures.classify_exit(-11) == "crash"
    assert set(failures.CLASS_PRIORITY) == set(FAILURE_CLASSES)


def test_a_stored_crash_that_says_the_device_ran_out_of_memory_counts_as_out_of_memory():
    """v37's Qwen3.6 at 32k tokens on 1 x H100 (predicted not to fit) stopped in a Triton kernel, stored as a crash
    before the runner knew that message: the benchmarks read it as the out-of-memory run it was."""
    from benchmarks.measured_runs import failure_class
    detail = "rank 0 (train): RuntimeError: Triton Error [CUDA]: out of memory"
    assert failure_class({"status": "failed", "failure_class": "crash", "detail": detail}) == "cuda_oom"
    assert failure_class({"status": "failed", "failure_class": "crash", "detail": "illegal memory access"}) == "crash"
    assert failure_class({"status": "ok"}) == "too_few_steps"


def test_the_first_suites_stored_peaks_are_the_allocators_and_are_judged_as_such():
    """The first 2-GPU suites stored torch's max_memory_allocated as peak_memory_gib (a `detail` dict, no basis):
    the multi-GPU benchmark compares those with the predicted allocator peak, not the device peak."""
    from benchmarks.measured_runs import load_runs, peak_is_device
    assert peak_is_device({"details": {"peak_memory_basis": "device (cuda mem_get_info)"}})
    assert not peak_is_device({"details": {"peak_memory_basis": "allocator (max_memory_allocated)"}})
    assert not peak_is_device({"detail": {"max_memory_allocated_gib_per_rank": [48.5]}})
    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    first = load_runs(bench / "megatron_h200_suite.json", bench / "results" / "megatron-h200-suite.jsonl")
    later = load_runs(bench / "runner_grids_h100_v41_suite.json",
                      bench / "results" / "runner-grids-h100-v41-a-2026-12-07.jsonl")
    assert [r.device_peaks for r in first if r.ok] and not any(r.device_peaks for r in first if r.ok)
    assert all(r.device_peaks for r in later if r.ok)


# The launcher tests run real processes on a machine that may be loaded: only a test of a silence limit
# shortens that one limit; every other limit stays generous, so no outcome depends on how fast the
# stand-ins start.
GENEROUS_S = 600.0


def _stand_ins(tmp_path, mode: str, launcher: str = "mp", **limits) -> dict:
    job = {"selftest": mode, "env": {"ATTUNE_SELFTEST": "1"}, "log_dir": str(tmp_path / mode), "load_s": 3.0}
    return launch.run_job(job, 2, launcher, **{"timeout_s": GENEROUS_S, **limits}, target=worker.selftest_worker)


@pytest.mark.slow
@pytest.mark.parametrize("mode,status,failure", [("ok", "ok", None), ("error", "failed", "invalid_config"),
                                                  ("exit", "failed", "crash")])
def test_launcher_and_monitor_with_stand_in_workers(tmp_path, mode, status, failure):
    """Two spawned processes (torch.multiprocessing, the launcher real trials use) running a stand-in
    worker: results, reported errors and silent exits are told apart."""
    out = _stand_ins(tmp_path, mode)
    assert out["status"] == status
    assert out.get("failure_class") == failure
    if mode == "ok":
        assert sorted(out["ranks"]) == [0, 1]
    if mode == "exit":
        assert "exited with code 3" in out["detail"]


@pytest.mark.slow
def test_monitor_reports_a_stalled_step_as_a_hang(tmp_path):
    """Once a training step has run, silence for the hang timeout is a hang (start-up keeps its grace)."""
    out = _stand_ins(tmp_path, "hang", hang_timeout_s=2)
    assert (out["status"], out["failure_class"]) == ("failed", "hang")
    assert out["detail"].startswith("no report from any rank for 2 s; last progress: ")
    assert "train step 0" in out["detail"]


@pytest.mark.slow
def test_monitor_gives_start_up_its_own_grace(tmp_path):
    """Loading (imports, NCCL, the model build) reports nothing for minutes: before the first step the
    hang timeout does not apply, the start-up grace does."""
    slow = _stand_ins(tmp_path, "slow-start", hang_timeout_s=0.5)  # 3 s of silent loading, then a result
    assert slow["status"] == "ok" and sorted(slow["ranks"]) == [0, 1]
    stuck = _stand_ins(tmp_path, "startup-hang", hang_timeout_s=GENEROUS_S, startup_grace_s=2)
    assert (stuck["status"], stuck["failure_class"]) == ("failed", "hang")
    assert stuck["detail"].startswith("no report from any rank for 2 s during start-up (no training step yet)")


@pytest.mark.ray
@pytest.mark.slow
def test_ray_launcher_shares_the_worker_contract(tmp_path):
    """The Ray launcher (placement group, one actor per rank) drives the same worker contract and the
    same monitor; on this CPU machine its bundles ask for no GPU (real trials ask for one each)."""
    import importlib.util
    assert importlib.util.find_spec("ray") is not None and launch.ray_available()
    import ray
    try:
        for mode, status, failure in (("ok", "ok", None), ("error", "failed", "invalid_config")):
            out = _stand_ins(tmp_path, mode, "ray", gpus_per_worker=0)
            assert (out["status"], out.get("failure_class")) == (status, failure)
    finally:
        ray.shutdown()


# ------------------------------------------------------------------------------ the runner on a CPU
def _spec(model, layout, steps=8, **wl):
    workload = Workload(**{"seq_len": 4096, "global_batch": 16, "framework": "megatron", **wl})
    return TrialSpec(Case(model, load_gpu("h200"), workload, layout), steps=steps, window=(2, steps - 1))


def test_the_runner_prices_only_micro_batches_that_split_the_global_batch(qwen36):
    """A layout the trial would refuse at set-up is refused when the study scores its space, not as a trial."""
    runner = mr.MegatronRunner(layers=4)
    five = Layout(1, max_tokens_per_gpu=20480, rows_per_microbatch=5)
    with pytest.raises(InvalidLayout, match="not divisible by DP 1 x 5 rows per micro-batch"):
        runner.predict(_spec(qwen36, five).case)
    assert runner.predict(_spec(qwen36, Layout(1, max_tokens_per_gpu=16384, rows_per_microbatch=4)).case).may_fit


def test_runner_without_gpus_returns_a_failed_result(qwen36):
    runner = mr.MegatronRunner(layers=4)
    assert runner.name == "megatron"
    res = runner.run(_spec(qwen36, Layout(1, max_tokens_per_gpu=4096)))
    assert (res.status, res.kind, res.failure_class) == ("failed", "measured", "invalid_config")
    assert res.detail == "needs 1 GPU(s), 0 visible"
    d = res.details
    assert d["model_run"]["name"] == "qwen3.6-35b-a3b[L4]"  # Gated DeltaNet kept: the default
    assert "gdn: megatron-core GatedDeltaNet: 3 of 4 layers" in " ".join(d["notes"])
    assert d["prediction_for_model_run"]["fits"] is True
    replaced = mr.MegatronRunner(layers=4, replace_gdn=True).run(_spec(qwen36, Layout(1, max_tokens_per_gpu=4096)))
    assert replaced.details["model_run"]["name"] == "qwen3.6-35b-a3b[L4,gdn->full]"
    assert GDN_NOTE_PREFIX in " ".join(replaced.details["notes"])
    flex = runner.run(_spec(qwen36, Layout(2, ep=2, dispatcher="flex", max_tokens_per_gpu=4096)))
    assert flex.failure_class == "invalid_config" and "DeepEP" in flex.detail
    odd = runner.run(_spec(qwen36, Layout(2, ep=2, max_tokens_per_gpu=4096), global_batch=15))
    assert odd.failure_class == "invalid_config" and "not divisible by DP 2" in odd.detail


GDN_NOTE_PREFIX = "gdn: replaced by full attention (replace_gdn asked for)"


def test_plan_scales_the_global_batch_to_the_time_budget(qwen36):
    spec = _spec(qwen36, Layout(1, max_tokens_per_gpu=4096), global_batch=256)
    plan = mr.MegatronRunner(layers=4, timeout_s=100).plan(spec)
    assert plan["global_batch"] < 256 and plan["global_batch"] >= 1
    assert any("global batch scaled down from 256" in n for n in plan["notes"])
    assert plan["prediction"]["global_batch"] == plan["global_batch"]
    assert mr.MegatronRunner(layers=4, scale_batch_to_budget=False).plan(spec)["global_batch"] == 256
    assert mr.MegatronRunner(layers=4, timeout_s=100).plan(_spec(qwen36, Layout(1, max_tokens_per_gpu=4096)))[
        "global_batch"] == 16


def test_gpu_from_name():
    assert mr.gpu_from_name("NVIDIA H200\nNVIDIA H200").name == "h200"
    assert mr.gpu_from_name("NVIDIA H100 80GB HBM3").name == "h100"
    assert mr.gpu_from_name("NVIDIA B200").name == "b200"
    assert mr.gpu_from_name("Tesla V100-SXM2-16GB") is None
    assert mr.gpu_from_name("") is None


def test_window_default():
    assert mr._window(8, None) == (2, 7)
    assert mr._window(8, (5, 19)) == (2, 7)  # TrialSpec's default window does not fit 8 steps
    assert mr._window(20, (5, 19)) == (5, 19)
    assert mr._window(2, None) == (1, 1)


# ------------------------------------------------------------------------------ data
def test_rows_file(tmp_path):
    p = tmp_path / "rows.jsonl"
    p.write_text('{"tokens": [1, 2, 3, 4, 5], "loss_mask": [0, 0, 1, 1, 1]}\n\n{"tokens": [7, 300]}\n')
    rows = data.load_rows(p)
    assert len(rows) == 2 and rows[1]["loss_mask"] == [1, 1]
    ids, labels, mask = data.row_arrays(rows[0], 3, 256)
    assert (ids, labels, mask) == ([1, 2, 3], [2, 3, 4], [0, 1, 1])
    ids, labels, mask = data.row_arrays(rows[1], 3, 256)
    assert (ids, labels, mask) == ([7, 44, 0], [44, 0, 0], [1, 0, 0])  # padded, ids modulo the vocabulary
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens": [1, 2], "loss_mask": [1]}\n')
    with pytest.raises(ValueError, match="as long as 'tokens'"):
        data.load_rows(bad)


# ------------------------------------------------------------------------------ the suite
def test_shipped_suite_parses_and_matches_its_expectations(h200):
    trials, meta = suite.parse_suite(SUITE)
    assert meta["budget_s"] == 480
    names = [t.name for t in trials]
    assert len(names) == len(set(names)) >= 8
    assert {t.gpus for t in trials} == {1, 2}
    assert all(t.model == "qwen3.6-35b-a3b" and t.replace_gdn and t.workload.seq_len == 4096 for t in trials)
    by = {t.name: t for t in trials}
    assert by["2g-tp2-ep1-sp-mt4096"].layout.sequence_parallel
    assert by["2g-tp2-ep2-etp1-mt4096"].layout.edp == 1
    assert by["1g-rc-selective-moe_act-mt4096"].layout.selective_modules == ("moe_act",)
    assert by["1g-tp1-ep1-rc-none-mt8192"].layout.rows_per_microbatch == 2
    # What the cost model says about each model run, and the flex trial's verdict before any spawn.
    for t in trials:
        runner = mr.MegatronRunner(layers=t.layers, replace_gdn=t.replace_gdn, timeout_s=t.timeout_s)
        spec = TrialSpec(Case(load_model(t.model), h200, t.workload, t.layout), steps=t.steps, window=t.window)
        if t.layout.dispatcher == "flex":
            assert t.expect.startswith("invalid_config")
            with pytest.raises(InvalidLayout, match="DeepEP"):
                runner.plan(spec)
            continue
        plan = runner.plan(spec)
        assert plan["global_batch"] == 16, t.name  # no budget scaling at 100 s per trial
        assert plan["prediction"]["fits"] is t.expect.startswith("ok"), t.name
        assert plan["notes"][:2] == [f"truncated: {t.layers} of 40 layers (--layers)",
                                     f"{GDN_NOTE_PREFIX}: {3 * t.layers // 4} of {t.layers} layers"]
        assert not any("rows_per_microbatch" in n for n in plan["notes"]), t.name  # slime's rule holds


def test_suite_parsing_errors(tmp_path):
    base = {"defaults": {"model": "qwen3.6-35b-a3b", "layers": 2}, "trials": [{"name": "a", "gpus": 1, "layout": {}}]}
    trials, _ = suite.parse_suite(base)
    assert trials[0].layers == 2 and trials[0].layout == Layout(1) and trials[0].steps == 8
    assert suite.parse_suite({**base, "defaults": {**base["defaults"], "layers": "auto"}})[0][0].layers is None
    cases = [
        ({"trials": []}, "non-empty 'trials'"),
        ({**base, "defaults": {"modle": "x"}}, "unknown suite defaults"),
        ({**base, "trials": [{"name": "a", "gpus": 1, "layout": {}, "learning_rate": 1}]}, "unknown keys"),
        ({**base, "trials": [{"name": "a", "gpus": 1, "layout": {}}] * 2}, "duplicate name"),
        ({**base, "trials": [{"name": "a", "gpus": 2, "layout": {"tp": 4}}]}, "not divisible"),
        ({**base, "trials": [{"name": "a", "gpus": 0, "layout": {}}]}, "positive integer"),
        ({**base, "trials": [{"name": "a", "layout": {}}]}, "missing 'gpus'"),
        ({**base, "trials": [{"name": "a", "gpus": 1, "layout": {}, "layers": -1}]}, "layers must be"),
        ({**base, "trials": [{"name": "a", "gpus": 1, "layout": {}, "backend": "apex"}]}, "unknown backend"),
        ({**base, "trials": [{"name": "a", "gpus": 1, "layout": {}, "sdpa_backend": "fa3"}]}, "sdpa_backend must be"),
    ]
    for data, match in cases:
        with pytest.raises(ValueError, match=match):
            suite.parse_suite(data)
    bad = tmp_path / "s.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="malformed JSON"):
        suite.parse_suite(bad)


@pytest.mark.parametrize("suite_file", ["convergence_same_init_suite.json", "convergence_pipeline_suite.json",
                                   "sdpa_mbs_suite.json", "x2_vs_leaderboard_suite.json"])
def test_convergence_suites_start_every_arm_from_the_same_weights(suite_file, h200):
    """The shipped convergence suites: CPU-initialised (layout-independent) weights, one seed, and
    the sdpa choice carried to the job."""
    trials, _ = suite.parse_suite(SUITE.parent / suite_file)
    assert all(t.cpu_init for t in trials)
    assert len({t.seed for t in trials}) == 1
    kernels = {t.sdpa_backend for t in trials}
    assert kernels == ({"auto", "flash"} if suite_file == "sdpa_mbs_suite.json" else {"auto"})


def test_sdpa_policy_forces_the_kernel_and_rejects_unknown_names():
    from megatron.core.transformer.enums import AttnMaskType

    cfg = SimpleNamespace(context_parallel_size=1, softmax_type="vanilla", window_size=None,
                          window_attn_skip_freq=None, kv_channels=16, attention_dropout=0.0)
    attn = tnb.TorchSDPAttention(cfg, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    q, k, v = (torch.randn(8, 2, n, 16, generator=torch.Generator().manual_seed(n)) for n in (4, 2, 2))
    try:
        tnb.reset_kernel_report()
        tnb.set_sdpa_backend("math")
        out = attn(q, k, v, None)
        assert tnb.kernel_report()["sdpa_backend"] == ["math (cpu)"]
        tnb.set_sdpa_backend("cudnn")  # no cuDNN attention on the CPU: SDPA refuses rather than falls back
        with pytest.raises(RuntimeError):
            attn(q, k, v, None)
        tnb.set_sdpa_backend("auto")
        torch.testing.assert_close(attn(q, k, v, None), out, atol=1e-5, rtol=1e-5)
        with pytest.raises(ValueError, match="sdpa backend must be one of"):
            tnb.set_sdpa_backend("fa3")
    finally:
        tnb.set_sdpa_backend("auto")


def _fake_rank(rank, steps):
    times = [4.0, 1.5] + [1.0 + 0.1 * (i % 2) for i in range(steps - 2)]
    return {"kind": "result", "rank": rank, "gpu_name": "NVIDIA H200", "megatron_core": "0.19.2", "torch": "2.11.0",
            "backend": "torch-native", "backend_reason": "auto", "kernels": dict(tnb.KERNELS["torch-native"]),
            "kernels_ran": {"torch._grouped_mm": 128}, "optimizer": "standard distributed optimizer",
            "step_times_s": times, "losses": [12.4 - 0.1 * i for i in range(steps)],
            "grad_norms": [3.0] * steps, "num_microbatches": 16, "params_local": 4_000_000_000,
            "memory_gib": {"after_build": 8.0, "after_optimizer": 40.0, "peak_allocated": 70.0 + rank,
                           "peak_reserved": 75.0}}


def test_suite_run_with_stubbed_workers(tmp_path, monkeypatch):
    """run_suite -> MegatronRunner.run -> the result lines, with the GPU count and the worker launch
    stubbed (what the GPU machine returns is shaped as _train returns it): the summary arithmetic,
    the failure lines, and the JSONL output."""
    jobs = []

    def fake_run_job(job, world, launcher, timeout_s, hang_timeout_s, **limits):
        jobs.append((job, world, launcher))
        assert job["env"]["NCCL_NVLS_ENABLE"] == "0" and job["env"]["TORCHDYNAMO_DISABLE"] == "1"
        if job["model"].num_hidden_layers == 8:
            return {"status": "failed", "failure_class": "cuda_oom", "wall_s": 20.0,
                    "detail": "rank 0 (train): OutOfMemoryError: CUDA out of memory", "errors": [], "progress": {}}
        return {"status": "ok", "wall_s": 40.0, "ranks": {r: _fake_rank(r, job["steps"]) for r in range(world)}}

    monkeypatch.setattr(mr, "visible_gpus", lambda: 2)
    monkeypatch.setattr(mr, "run_job", fake_run_job)
    out = tmp_path / "results.jsonl"
    printed = []
    lines = suite.run_suite(SUITE, str(out), suite.SuiteSetup(load_gpu("h200"), log_root=str(tmp_path / "logs")),
                            emit=printed.append)
    assert len(lines) == len(printed) == len(out.read_text().splitlines()) == 9
    by = {line["trial"]: line for line in lines}
    ok = by["2g-tp1-ep2-mt4096"]
    assert ok["status"] == "ok" and ok["kind"] == "measured"
    window = [1.0 + 0.1 * (i % 2) for i in range(6)]  # steps 2..7
    assert ok["tokens_per_s_per_gpu"] == pytest.approx(16 * 4096 * 6 / sum(window) / 2)
    assert ok["step_time_s"] == pytest.approx(sum(window) / 6)
    assert ok["step_time_cv_percent"] == pytest.approx(100 * 0.05 / 1.05, rel=1e-3)
    assert ok["peak_memory_gib"] == 71.0 and len(ok["step_times_s"]) == 8
    assert ok["source"].startswith("megatron-core 0.19.2 runner on NVIDIA H200 x2, backend torch-native, kernels")
    d = ok["details"]
    assert d["model_run"]["name"] == "qwen3.6-35b-a3b[L4,gdn->full]" and d["window"] == [2, 7]
    assert d["max_memory_allocated_gib_per_rank"] == [70.0, 71.0]
    assert d["prediction_for_model_run"]["fits"] is True
    assert by["2g-tp1-ep2-flex"]["failure_class"] == "invalid_config"
    assert by["1g-8layers-rc-none-mt16384"]["failure_class"] == "cuda_oom"
    assert by["1g-8layers-rc-none-mt16384"]["details"]["prediction_for_model_run"]["fits"] is False
    # Every trial but flex reached the launcher, with the model run and one process per GPU.
    assert len(jobs) == 8 and all(world == t.gpus for (_, world, _), t in
                                  zip(jobs, [t for t in suite.parse_suite(SUITE)[0] if t.layout.dispatcher != "flex"]))
    assert all(launcher == "mp" for _, _, launcher in jobs)
    assert all(job["sdpa_backend"] == "auto" and job["cpu_init"] is False for job, _, _ in jobs)
    assert json.loads(out.read_text().splitlines()[0])["trial"] == "1g-tp1-ep1-rc-none-mt4096"
    # An exhausted suite budget records the remaining trials as skipped instead of starting them.
    skipped = suite.run_suite(SUITE, None, suite.SuiteSetup(load_gpu("h200")), budget_s=30,
                              only=["2g-tp1-ep2-mt4096"], emit=lambda _: None)
    assert [line["status"] for line in skipped] == ["skipped"] and len(jobs) == 8


# ------------------------------------------------------------------------------ the CLI
def _cli(*args):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "experiments.megatron", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_cli_without_gpu_exits_2_with_one_line():
    for args in (["--model", "qwen3.6-35b-a3b", "--gpus", "1", "--layers", "2", "--layout", "max_tokens_per_gpu=4096",
                  "--steps", "4", "--json"],
                 ["--suite", str(SUITE), "--out", "/dev/null"]):
        p = _cli(*args)
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1, p.stderr
        assert lines[0].startswith("megatron_runner: error: no CUDA GPU visible")
        assert p.stdout == ""


def test_cli_argument_errors_exit_2(capsys):
    from experiments.megatron import cli

    base = ["--model", "qwen3.6-35b-a3b", "--gpus", "2", "--layout"]
    for layout, message in ((["tp=4"], "not divisible"), (["tp"], "is not KEY=VALUE"),
                            (["tp=2", "tp=1"], "given twice")):
        assert cli.main([*base, *layout]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert cli.main(["--gpus", "1"]) == 2
    assert "give --suite FILE, or --model and --gpus" in capsys.readouterr().err
    # Typed layout values (none, fractions, booleans) pass validation; the next stop is the missing GPU.
    assert cli.main([*base, "tp=2", "recompute_granularity=none", "optimizer_offload_fraction=0.5",
                     "overlap_d2h_h2d=true"]) == 2
    assert "no CUDA GPU visible" in capsys.readouterr().err


def test_trial_result_summary_is_one_labelled_line():
    ok = TrialResult(status="ok", kind="measured", source="megatron-core runner on NVIDIA H200 x2",
                     tokens_per_s_per_gpu=49681.2, step_time_s=1.3192, peak_memory_gib=74.84, step_time_cv_percent=0.4)
    assert ok.summary() == ("measured 49,681 tokens/s/GPU, step 1.319 s (CV 0.4%), peak 74.8 GiB | "
                            "megatron-core runner on NVIDIA H200 x2")
    predicted = TrialResult(status="ok", kind="predicted", source="cost model v1", tokens_per_s_per_gpu=4663.1,
                            step_time_s=7.0)
    assert predicted.summary() == "predicted 4,663 tokens/s/GPU, step 7.000 s | cost model v1"
    failed = TrialResult(status="failed", kind="measured", source="x", failure_class="cuda_oom",
                         detail="rank 0 (train):\n OutOfMemoryError " + "x" * 900)
    line = failed.summary()
    assert "\n" not in line and line.startswith("failed (cuda_oom): rank 0 (train): OutOfMemoryError x")
    assert len(line) == len("failed (cuda_oom): ") + 500


def test_a_taken_rendezvous_port_is_retried_once_on_a_fresh_port(monkeypatch, tmp_path):
    """EADDRINUSE at init (seen on H200 in the memory boundary suite) is not the layout's failure."""
    from experiments.megatron import runner as runner_mod

    taken = {"status": "failed", "failure_class": "crash", "errors": [
        "rank 0 (init): DistNetworkError: The server socket has failed to listen on any local network address. "
        "port: 38945, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"], "detail": ""}
    oom = {"status": "failed", "failure_class": "cuda_oom", "errors": ["rank 0 (train): OutOfMemoryError"],
           "detail": ""}
    assert runner_mod.port_taken(taken) and not runner_mod.port_taken(oom)
    calls = []

    def fake_run_job(job, world, *args, **kwargs):
        calls.append(world)
        return taken if len(calls) == 1 else oom

    monkeypatch.setattr(runner_mod, "run_job", fake_run_job)
    r = runner_mod.MegatronRunner(layers=1, log_dir=str(tmp_path))
    model = load_model("llama3-8b")
    spec = _spec(model, Layout(1))
    out = r._launch(spec, r.plan(spec), str(tmp_path), "mp")
    assert out is oom and len(calls) == 2


def _stub_suite_jobs(monkeypatch, wall_s: float = 1.0) -> list:
    """run_job stubbed on 2 visible GPUs, every rank a result: the (job, timeout_s) of each call."""
    calls = []

    def fake_run_job(job, world, launcher, timeout_s, hang_timeout_s, **_kw):
        calls.append((job, timeout_s))
        return {"status": "ok", "wall_s": wall_s, "ranks": {r: _fake_rank(r, job["steps"]) for r in range(world)}}

    monkeypatch.setattr(mr, "visible_gpus", lambda: 2)
    monkeypatch.setattr(mr, "run_job", fake_run_job)
    return calls


def test_suite_runs_the_global_batch_it_names_under_a_short_budget(monkeypatch):
    """A suite is a measurement of the workload it names: with little of its budget left a trial keeps its rows
    (it may end with too few steps), where a tune trial would scale its global batch down to the budget."""
    calls = _stub_suite_jobs(monkeypatch, wall_s=40.0)
    trial = next(t for t in suite.parse_suite(SUITE)[0] if t.name == "2g-tp1-ep2-mt4096")
    suite.run_suite(SUITE, None, suite.SuiteSetup(load_gpu("h200")), budget_s=suite.MIN_TRIAL_S + 1,
                    only=[trial.name], emit=lambda _: None)
    assert [job["global_batch"] for job, _ in calls] == [trial.workload.global_batch]
    spec = mr.TrialSpec(Case(load_model(trial.model), load_gpu("h200"),
                             dataclasses.replace(trial.workload, global_batch=4096),
                             trial.layout), steps=8)
    assert mr.MegatronRunner(layers=4, timeout_s=suite.MIN_TRIAL_S + 1).plan(spec)["global_batch"] < 4096


def test_a_line_run_with_fewer_rows_is_its_own_run():
    """A stored line whose runner scaled the global batch down is predicted for the rows it ran, never averaged
    with the suite's trial (benchmarks/measured_runs.as_run)."""
    from benchmarks.measured_runs import as_run

    trial = suite.parse_suite(SUITE)[0][0]
    rows = trial.workload.global_batch
    assert as_run(trial, {"details": {"global_batch_rows": rows}}) is trial
    assert as_run(trial, {"details": {}}) is trial and as_run(trial, {}) is trial
    small = as_run(trial, {"details": {"global_batch_rows": rows // 2}})
    assert small.name == f"{trial.name}[gb {rows // 2}]" and small.workload.global_batch == rows // 2
    assert small.layout == trial.layout and small.workload.seq_len == trial.workload.seq_len


def test_a_line_the_suite_budget_cut_is_not_a_run_but_a_trial_timeout_fails(tmp_path, monkeypatch):
    """A trial the suite's time budget stopped before its timing window measured nothing of its layout: left out,
    like a skipped line. One that ran out of its own limit (a first kernel compile) is a failed run. The suite
    marks the first kind (`suite_budget_s`); older lines are told apart by stopping well inside the trial's limit."""
    import json

    from benchmarks.measured_runs import load_runs

    trial = suite.parse_suite(SUITE)[0][0]
    cut = {"trial": trial.name, "status": "failed", "failure_class": "too_few_steps", "elapsed_s": 12.0,
           "detail": "stopped after 1 of 5 steps (time budget), before the timing window 2-4"}
    own = dict(cut, elapsed_s=trial.timeout_s)
    marked = dict(own, suite_budget_s=30.0)
    for lines, runs in (([cut], 0), ([marked], 0), ([own], 1)):
        path = tmp_path / "r.jsonl"
        path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
        got = load_runs(Path(SUITE), path)
        assert len(got) == runs
        assert all(r.failure == "too_few_steps" and not r.ok for r in got)

    # the suite records what it left a trial of its budget
    _stub_suite_jobs(monkeypatch)
    name = "2g-tp1-ep2-mt4096"
    short = suite.run_suite(SUITE, None, suite.SuiteSetup(load_gpu("h200")), budget_s=suite.MIN_TRIAL_S + 1,
                            only=[name], emit=lambda _: None)
    full = suite.run_suite(SUITE, None, suite.SuiteSetup(load_gpu("h200")), only=[name], emit=lambda _: None)
    assert short[0]["suite_budget_s"] <= suite.MIN_TRIAL_S + 1 and "suite_budget_s" not in full[0]


def test_a_trial_timed_out_before_its_first_step_says_the_first_step_compiles_kernels(tmp_path):
    """A first GDN trial on a fresh machine spends minutes compiling its kernels: timed out before any step, the
    detail says so (it may be tried again); after a step it is the plain timeout."""
    from experiments.megatron.launch import _Monitor

    mon = _Monitor(1, tmp_path, start=0.0, timeout_s=150, hang_timeout_s=1e9, startup_grace_s=1e9)
    mon.last_msg = 151.0
    assert "before any training step finished (a first step compiles kernels" in mon._silence(151.0)
    mon.stepped = True
    assert mon._silence(151.0) == "trial exceeded its 150 s timeout; last progress: none (no worker started)"


def test_a_suite_run_can_give_every_trial_a_longer_limit(monkeypatch):
    """`--suite S --timeout-s 400`: each trial's own limit (a first GDN trial compiling its kernels needs more than
    the suite's 150 s), still cut by what is left of the suite's budget."""
    calls = _stub_suite_jobs(monkeypatch)
    name = "2g-tp1-ep2-mt4096"
    own = next(t for t in suite.parse_suite(SUITE)[0] if t.name == name).timeout_s
    lines = suite.run_suite(SUITE, None, suite.SuiteSetup(load_gpu("h200"), timeout_s=own + 250), only=[name],
                            emit=lambda _: None)
    assert calls[0][1] > own and "suite_budget_s" not in lines[0]
    cut = suite.run_suite(SUITE, None, suite.SuiteSetup(load_gpu("h200"), timeout_s=own + 250),
                          budget_s=own + 100, only=[name], emit=lambda _: None)
    assert cut[0]["suite_budget_s"] <= own + 100
