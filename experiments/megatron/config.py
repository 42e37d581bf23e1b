"""megatron-core TransformerConfig keyword arguments for a catalog model under a layout.

The equivalents of search_space.megatron_args' model, parallel, recompute and dispatcher arguments,
with TransformerConfig's own names.
"""
from __future__ import annotations

from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import LINEAR_ATTENTION, MLA, MOE, SLIDING_ATTENTION, ModelSpec
from cost_model.nouns.workload import Workload


def transformer_config_kwargs(model: ModelSpec, layout: Layout, workload: Workload, *,
                              backend: str = "torch-native", use_cpu_initialization: bool = False) -> dict:
    """TransformerConfig keyword arguments for `model` under `layout` (the equivalents of
    search_space.megatron_args.model_args + parallel/recompute/dispatcher args)."""
    _check_supported(model, workload, layout)
    kw = {**_architecture_kwargs(model), **_linear_attention_kwargs(model), **_precision_kwargs(use_cpu_initialization),
          **_parallel_kwargs(layout), **_unfused_kwargs()}
    if layout.vpp > 1:
        # Megatron-LM training's default for the interleaved schedule (--no-overlap-p2p-communication
        # unset). ModelParallelConfig's own default, batched p2p, mixes activations and gradients at
        # PP 2, where the previous and next stage are the same rank: Megatron-LM then asks for PP > 2.
        kw.update(overlap_p2p_comm=True, batch_p2p_comm=False)
    if backend == "te":
        kw.update(apply_rope_fusion=True, bias_activation_fusion=True)
    kw.update(_recompute_kwargs(layout))
    if model.is_moe:
        kw.update(_moe_kwargs(model, layout, workload, backend))
    return kw


def build_transformer_config(model: ModelSpec, layout: Layout, workload: Workload, **options):
    from megatron.core.transformer.transformer_config import TransformerConfig
    return TransformerConfig(**transformer_config_kwargs(model, layout, workload, **options))


def unsupported(model: ModelSpec, precision: str = "bf16") -> str | None:
    """Why the megatron runner cannot train `model` at `precision`; None where it can."""
    if model.count(MLA):
        return f"{model.display_name}: MLA models are not supported by the megatron runner"
    if model.model_type == "gpt_oss":
        return "GPT-OSS (clamped SwiGLU, sinks, sliding window) is not wired into the megatron runner"
    if model.count(SLIDING_ATTENTION):
        return f"{model.display_name}: sliding-window attention is not wired into the megatron runner"
    if precision != "bf16":
        return f"precision {precision} needs Transformer Engine; the runner trains bf16"
    return None


def layout_unsupported(layout: Layout) -> str | None:
    """Why the megatron runner cannot run `layout` whatever the model; None where it can."""
    if layout.overlap_moe_expert_parallel_comm:
        # the combined 1F1B schedule needs the model's schedule plan, which the runner's loop does not build
        return "EP all-to-all overlap (overlap_moe_expert_parallel_comm) is not wired into the megatron runner"
    return None


def _check_supported(model: ModelSpec, workload: Workload, layout: Layout | None = None) -> None:
    reason = (layout_unsupported(layout) if layout is not None else None) or unsupported(model, workload.precision)
    if reason:
        raise NotImplementedError(reason)


def _architecture_kwargs(model: ModelSpec) -> dict:
    import torch.nn.functional as F

    return dict(
        num_layers=model.num_hidden_layers,
        hidden_size=model.hidden_size,
        ffn_hidden_size=model.intermediate_size or model.moe_intermediate_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_key_value_heads,
        kv_channels=model.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=1e-6,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=bool(model.mlp_bias or model.expert_bias),
        add_qkv_bias=bool(model.attention_bias),
        qk_layernorm=bool(model.qk_norm),
        attention_output_gate=bool(model.attn_output_gate),
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=0.02,
    )


def _linear_attention_kwargs(model: ModelSpec) -> dict:
    """Gated DeltaNet layers (Megatron-LM's --experimental-attention-variant gated_delta_net with
    --linear-attention-freq as a per-layer list: 1 for GDN, 0 for full attention)."""
    if not model.has_linear_attention:
        return {}
    return dict(
        experimental_attention_variant="gated_delta_net",
        linear_attention_freq=[1 if t == LINEAR_ATTENTION else 0 for t in model.layer_types],
        linear_conv_kernel_dim=model.linear_conv_kernel_dim,
        linear_key_head_dim=model.linear_key_head_dim,
        linear_value_head_dim=model.linear_value_head_dim,
        linear_num_key_heads=model.linear_num_key_heads,
        linear_num_value_heads=model.linear_num_value_heads,
    )


def _precision_kwargs(use_cpu_initialization: bool) -> dict:
    import torch

    return dict(bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
                use_cpu_initialization=use_cpu_initialization)


def _parallel_kwargs(layout: Layout) -> dict:
    return dict(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
        num_layers_in_first_pipeline_stage=layout.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=layout.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=layout.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=layout.account_for_loss_in_pipeline_split,
        pipeline_model_parallel_layout=layout.pipeline_model_parallel_layout,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
        sequence_parallel=layout.sequence_parallel,
    )


def _unfused_kwargs() -> dict:
    # No fused kernels that need TE/Apex (the torch-native and local backends).
    return dict(apply_rope_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
                masked_softmax_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False)


def _recompute_kwargs(layout: Layout) -> dict:
    if layout.recompute_granularity is None:
        return {}
    kw = {"recompute_granularity": layout.recompute_granularity}
    if layout.recompute_granularity == "full":
        kw["recompute_method"] = layout.recompute_method
        kw["recompute_num_layers"] = layout.recompute_num_layers
    else:
        kw["recompute_modules"] = list(layout.selective_modules)
    return kw


def _moe_kwargs(model: ModelSpec, layout: Layout, workload: Workload, backend: str) -> dict:
    kw = dict(
        num_moe_experts=model.num_experts,
        moe_router_topk=model.num_experts_per_tok,
        moe_ffn_hidden_size=model.moe_intermediate_size,
        moe_grouped_gemm=True,  # slime's --moe-grouped-gemm; the local backend ignores it (SequentialMLP)
        moe_token_dispatcher_type=layout.dispatcher,
        moe_layer_freq=[1 if t == MOE else 0 for t in model.mlp_types],
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=1e-3,
        moe_router_dtype="fp32",  # megatron warns against bf16 routing with >= 32 experts
        moe_router_force_load_balancing=workload.routing == "balanced",
    )
    if layout.dispatcher == "flex":
        kw["moe_flex_dispatcher_backend"] = "deepep"
    if backend == "te":
        kw["moe_permute_fusion"] = True
    if model.shared_expert_intermediate_size:
        kw["moe_shared_expert_intermediate_size"] = model.shared_expert_intermediate_size
        kw["moe_shared_expert_gate"] = bool(model.shared_expert_gate)
    return kw
