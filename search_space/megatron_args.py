"""A layout as Megatron/slime command-line arguments (one flag per layout field), and a catalog
model as Megatron's model arguments (slime's MODEL_ARGS).

Grouped the way the reference recipes' slime command orders them, so the recipe writer and the
Megatron cross-check use the same mapping. Every flag name is one megatron-core 0.19.2's
`megatron/training/arguments.py` parser accepts, except `--use-dynamic-batch-size` and
`--max-tokens-per-gpu`, which are slime's own.
"""
from __future__ import annotations

from cost_model.nouns.model_spec import MLA, MOE, SLIDING_ATTENTION, ModelSpec
from cost_model.nouns.layout import Layout
from cost_model.nouns.pipeline_layout import parse_stages


def parallel_args(layout: Layout) -> list[str]:
    args = ["--tensor-model-parallel-size", str(layout.tp)]
    if layout.sequence_parallel:
        args.append("--sequence-parallel")
    args += ["--pipeline-model-parallel-size", str(layout.pp)]
    text = layout.pipeline_model_parallel_layout
    if text is not None:   # it sets VPP itself: Megatron refuses --num-virtual-stages-per-pipeline-rank beside it
        args += ["--pipeline-model-parallel-layout", text]
        mtp = "".join(parse_stages(text)).count("m")
        if mtp:
            args += ["--mtp-num-layers", str(mtp)]
    elif layout.vpp > 1:   # (not --num-layers-per-virtual-pipeline-stage: Megatron refuses it with an uneven split)
        args += ["--num-virtual-stages-per-pipeline-rank", str(layout.vpp)]
    if layout.decoder_first_pipeline_num_layers is not None:
        args += ["--decoder-first-pipeline-num-layers", str(layout.decoder_first_pipeline_num_layers)]
    if layout.decoder_last_pipeline_num_layers is not None:
        args += ["--decoder-last-pipeline-num-layers", str(layout.decoder_last_pipeline_num_layers)]
    if layout.account_for_embedding_in_pipeline_split:
        args.append("--account-for-embedding-in-pipeline-split")
    if layout.account_for_loss_in_pipeline_split:
        args.append("--account-for-loss-in-pipeline-split")
    args += ["--context-parallel-size", str(layout.cp),
             "--expert-model-parallel-size", str(layout.ep)]
    if layout.etp is not None:   # always set on a Layout; None only where a test maps unchecked values
        args += ["--expert-tensor-parallel-size", str(layout.etp)]
    return args


def recompute_args(layout: Layout) -> list[str]:
    # One flag per field that is set (a valid Layout sets exactly the ones its granularity takes),
    # so the Megatron cross-check also sees the combinations Layout rejects.
    args = []
    if layout.recompute_granularity is not None:
        args += ["--recompute-granularity", layout.recompute_granularity]
    if layout.recompute_method is not None:
        args += ["--recompute-method", layout.recompute_method]
    if layout.recompute_num_layers is not None:
        args += ["--recompute-num-layers", str(layout.recompute_num_layers)]
    if layout.recompute_modules:
        args += ["--recompute-modules", *layout.recompute_modules]
    return args


def batch_args(layout: Layout) -> list[str]:
    # slime's dynamic batching packs rows into bins of max_tokens_per_gpu x CP tokens.
    return ["--use-dynamic-batch-size", "--max-tokens-per-gpu", str(layout.max_tokens_per_gpu)]


def offload_args(layout: Layout) -> list[str]:
    args = []
    if layout.offloaded:
        args.append("--optimizer-cpu-offload")
        if layout.optimizer_offload_fraction != 1.0:
            args += ["--optimizer-offload-fraction", f"{layout.optimizer_offload_fraction:g}"]
    if layout.overlap_d2h_h2d:  # a valid Layout sets it only with offload
        args.append("--overlap-cpu-optimizer-d2h-h2d")
    return args


def dispatcher_args(layout: Layout) -> list[str]:
    # alltoall is already in the model's MODEL_ARGS; flex overrides it (argparse keeps the later value).
    # DeepEP is named by --moe-flex-dispatcher-backend: Megatron-LM deprecates --moe-enable-deepep for it
    # (TransformerConfig, at slime's pin 1dcf0da and in megatron-core 0.19).
    args = []
    if layout.dispatcher == "flex":
        args += ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"]
    if layout.overlap_moe_expert_parallel_comm:
        args.append("--overlap-moe-expert-parallel-comm")
    return args


def model_args(model: ModelSpec) -> list[str]:
    """Megatron's model arguments for a catalog model: the equivalent of slime's MODEL_ARGS
    (`THUDM/slime:scripts/models/*.sh`), built from the architecture alone.

    Only what ModelSpec knows is emitted: sizes, attention kind (GQA/MHA, MLA, output gate,
    sliding window, sinks), MoE shape and layer pattern, biases, norm and activation, and where the
    config gave them the RoPE base, Llama 3.1's RoPE scaling, the norm epsilon and Qwen's pre-softmax
    routing. Sigmoid routing and load balancing, MTP and slime's `--spec` (the Qwen3.5/Next
    linear-attention plugin) are not part of ModelSpec and are left to slime's scripts.
    The MoE dispatcher is alltoall, as in slime's scripts; `dispatcher_args` overrides it.
    """
    mla = model.count(MLA) > 0
    args = ["--num-layers", str(model.num_hidden_layers),
            "--hidden-size", str(model.hidden_size),
            # All-MoE models (Qwen3.5) have no dense FFN; slime then passes the expert width.
            "--ffn-hidden-size", str(model.intermediate_size or model.moe_intermediate_size),
            "--num-attention-heads", str(model.num_attention_heads)]
    if mla:
        args += ["--multi-latent-attention"]
        if model.q_lora_rank:
            args += ["--q-lora-rank", str(model.q_lora_rank)]
        args += ["--kv-lora-rank", str(model.kv_lora_rank),
                 "--qk-head-dim", str(model.qk_nope_head_dim),
                 "--qk-pos-emb-head-dim", str(model.qk_rope_head_dim),
                 "--v-head-dim", str(model.v_head_dim),
                 # slime's deepseek-v3.sh / moonlight.sh: kv-channels = v_head_dim, and no RoPE
                 # fusion (Megatron's MLA RoPE fusion needs YaRN, transformer_config.py).
                 "--kv-channels", str(model.v_head_dim),
                 "--no-rope-fusion"]
    else:
        if model.num_key_value_heads != model.num_attention_heads:
            args += ["--group-query-attention", "--num-query-groups", str(model.num_key_value_heads)]
        args += ["--kv-channels", str(model.head_dim)]
    if model.qk_norm or mla:
        args.append("--qk-layernorm")  # Qwen3 q/k norm; MLA's latent norms (slime passes it for MLA)
    if model.attn_output_gate:
        args.append("--attention-output-gate")
    if model.attention_sinks:
        args += ["--softmax-type", "learnable"]
    if model.sliding_window:
        args += ["--window-size", f"{model.sliding_window},0",
                 # 1 marks a sliding-window layer (megatron/core/transformer/utils.py:is_layer_window_attention)
                 "--window-attn-skip-freq", _pattern(1 if t == SLIDING_ATTENTION else 0 for t in model.layer_types)]
    args += ["--position-embedding-type", "rope"]
    if model.partial_rotary_factor != 1.0:
        args += ["--rotary-percent", f"{model.partial_rotary_factor:g}"]
    args += _rope_args(model)
    args += ["--normalization", "RMSNorm"]
    if model.norm_epsilon:
        args += ["--norm-epsilon", _plain(model.norm_epsilon)]
    if model.model_type == "gpt_oss":
        # GPT-OSS: clamped SwiGLU with a +1 linear offset (Megatron-Bridge's gpt_oss provider).
        args += ["--quick-geglu", "--glu-linear-offset", "1.0", "--activation-func-clamp-value", "7.0"]
    else:
        args.append("--swiglu")
    if not (model.mlp_bias or model.expert_bias):
        args.append("--disable-bias-linear")
        if model.attention_bias:
            args.append("--add-qkv-bias")
    args += ["--vocab-size", str(model.vocab_size)]
    if not model.tie_word_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if model.is_moe:
        args += ["--num-experts", str(model.num_experts),
                 "--moe-router-topk", str(model.num_experts_per_tok),
                 "--moe-ffn-hidden-size", str(model.moe_intermediate_size)]
        if model.shared_expert_intermediate_size:
            args += ["--moe-shared-expert-intermediate-size", str(model.shared_expert_intermediate_size)]
            if model.shared_expert_gate:
                args.append("--moe-shared-expert-gate")
        args += ["--moe-layer-freq", _pattern(1 if t == MOE else 0 for t in model.mlp_types),
                 "--moe-grouped-gemm",
                 "--moe-token-dispatcher-type", "alltoall"]
        if model.router_pre_softmax:
            args.append("--moe-router-pre-softmax")
    return args


def _plain(x: float) -> str:
    """A number as slime's scripts write it: 1000000, 1e-06."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _rope_args(model: ModelSpec) -> list[str]:
    """RoPE base and Llama 3.1's scaling where the config gave them (ModelSpec.rope_theta, rope_scaling)."""
    args = ["--rotary-base", _plain(model.rope_theta)] if model.rope_theta and model.count(MLA) == 0 else []
    if model.rope_scaling.startswith("llama3 "):
        args += ["--use-rope-scaling", "--rope-scaling-factor", model.rope_scaling.split()[1]]
    return args


# The model families whose MODEL_ARGS `model_args` builds whole for a launch (`launch_model_args`): softmax GQA/MHA
# layers, dense or with softmax-routed experts. MLA (YaRN, sigmoid routing with a bias), Gated DeltaNet (slime's
# --spec plugin), GPT-OSS and GLM routing are left to slime's own scripts.
_LAUNCH_FAMILIES = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}


def launch_model_args(model: ModelSpec) -> tuple[list[str] | None, str]:
    """(MODEL_ARGS for a launch, "") where `model_args` holds everything such a model's launch needs, else (None,
    what is missing)."""
    if model.model_type not in _LAUNCH_FAMILIES:
        return None, f"MODEL_ARGS are built for {', '.join(sorted(_LAUNCH_FAMILIES))} models, not {model.model_type}"
    missing = [name for name, value in (("rope_theta", model.rope_theta), ("rms_norm_eps", model.norm_epsilon))
               if not value]
    if missing:
        return None, f"the config does not give {' or '.join(missing)}"
    if model.rope_scaling and not model.rope_scaling.startswith("llama3 "):
        return None, (f"its RoPE scaling ({model.rope_scaling}) is not one Megatron's GPT arguments take "
                      "(Llama 3.1's only)")
    if model.sliding_window:
        return None, "a sliding-window model's launch is not built"
    return model_args(model), ""


def _pattern(flags) -> str:
    """A per-layer 0/1 list as Megatron's compact list expression (`moe_freq_type` evaluates it),
    e.g. "[0]*3+[1]*58", or "([1]+[0])*12" for an alternating pattern."""
    flags = list(flags)
    n = len(flags)
    for period in range(1, n // 2 + 1):
        if n % period == 0 and flags == flags[:period] * (n // period):
            return _runs(flags) if period == 1 else f"({_runs(flags[:period])})*{n // period}"
    return _runs(flags)


def _runs(flags: list[int]) -> str:
    runs: list[list[int]] = []
    for flag in flags:
        if runs and runs[-1][0] == flag:
            runs[-1][1] += 1
        else:
            runs.append([flag, 1])
    return "+".join(f"[{flag}]*{count}" if count > 1 else f"[{flag}]" for flag, count in runs)


def moment_args(layout: Layout) -> list[str]:
    if layout.exp_avg_dtype == "fp32":
        return []
    return ["--exp-avg-dtype", layout.exp_avg_dtype, "--exp-avg-sq-dtype", layout.exp_avg_dtype]
