"""Activation memory of one micro-batch, per layer kind, for each recompute setting.

Bytes are those Megatron saves for the backward pass, per token of the GPU's shard; selective
recompute drops the modules it rebuilds, full recompute keeps only each recomputed layer's input.
The output layer and loss are counted in cost_model.loss_path; the allocator's reserve beyond these
bytes in cost_model.device_memory.
"""
from __future__ import annotations

from typing import TYPE_CHECKING
from operator import attrgetter

from cost_model.memo import IdentityMemo
from cost_model.constants import Constants
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import FULL_ATTENTION, LINEAR_ATTENTION, MLA, MOE, SLIDING_ATTENTION, ModelSpec
from cost_model.stages import RankLayers
from cost_model.nouns.units import BF16, FP32

if TYPE_CHECKING:   # cost_model.memory imports this module
    from cost_model.memory import MemoryInputs


def softmax_attention_bytes(model: ModelSpec, layout: Layout, mods: set, tokens: float) -> float:
    """Saved bytes of a softmax attention block (GQA/MHA, optional output gate), sharded over TP."""
    h, tp = model.hidden_size, layout.tp
    q = model.num_attention_heads * model.head_dim
    kv = 2 * model.num_key_value_heads * model.head_dim
    gate = q if model.attn_output_gate else 0
    a = BF16 * (2 * h + 3 * q + gate + kv) / tp
    if model.qk_norm:
        # the query and key RMSNorms keep their inputs for the backward (recomputing core_attn starts after them)
        a += BF16 * (q + kv / 2) / tp
    if "core_attn" in mods:
        a -= BF16 * q / tp
    if "layernorm" in mods:
        a -= BF16 * h / tp
    return a * tokens


def linear_attention_bytes(model: ModelSpec, layout: Layout, tokens: float, sharded: bool = False) -> float:
    """Saved bytes of a Gated DeltaNet block. `sharded`: megatron-core's GatedDeltaNet, its heads over TP
    (and over CP after a head all-to-all: the whole row with 1/(TP x CP) of the heads, the same bytes as
    the CP shard with 1/TP of them); otherwise slime's HF module, the whole row on every TP and CP rank."""
    h = model.hidden_size
    qk = model.linear_num_key_heads * model.linear_key_head_dim
    v = model.linear_num_value_heads * model.linear_value_head_dim
    nv = model.linear_num_value_heads
    # fla's chunk_gated_delta_rule also keeps the chunks' WY matrix A ([tokens, value heads, 64], bf16),
    # and the l2-normalised q and k are kept by the norm's backward.
    kernel_extra = BF16 * (64 * nv + 2 * qk)
    if not sharded:
        a = BF16 * (h + (2 * qk + 2 * v + 2 * nv) + (2 * qk + v) + 2 * qk + 3 * v) + FP32 * 2 * nv + kernel_extra
        return a * (tokens * layout.cp)
    tp = layout.tp
    # input norm's input and output (SP shards); in_proj's output, which fla's causal_conv1d keeps whole (it
    # saves its input, a view of that output, and recomputes its own output in the backward); the kernel's q and
    # k repeated to the value heads and v, its fp32 g and beta; then the core output, the gate and the gated
    # norm's output (megatron-core 0.19.2 gated_delta_net, fla 0.6.0; checked on the runner's layer builds by
    # benchmarks/activation_builds.py).
    a = (BF16 * (2 * h + (2 * qk + 2 * v + 2 * nv) + 3 * v + 3 * v) + FP32 * 2 * nv + kernel_extra) / tp
    return a * tokens


def mla_bytes(model: ModelSpec, layout: Layout, mods: set, tokens: float) -> float:
    """Saved bytes of a multi-head latent attention block, sharded over TP."""
    h, tp = model.hidden_size, layout.tp
    heads = model.num_attention_heads
    qk_dim = model.qk_nope_head_dim + model.qk_rope_head_dim
    up = heads * qk_dim + heads * (model.qk_nope_head_dim + model.v_head_dim)
    a = BF16 * (2 * h + model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim
                + heads * model.v_head_dim * 2) / tp
    if "mla_up_proj" not in mods:
        a += BF16 * up / tp
    if "core_attn" in mods:
        a -= BF16 * heads * model.v_head_dim / tp
    return a * tokens


def moe_bytes(model: ModelSpec, layout: Layout, mods: set, tokens: float, routed_rows_per_token: float) -> float:
    """Saved bytes of a MoE block: router, routed experts (rows as dispatched) and shared experts."""
    h, tp = model.hidden_size, layout.tp
    fe = model.moe_intermediate_size / layout.etp
    m = BF16 * 2 * h / tp + FP32 * model.num_experts / tp
    routed = BF16 * (h + 2 * fe + (0 if "moe_act" in mods else fe)) * routed_rows_per_token / tp
    shared = _counted_shared_expert(model, layout, mods)[0]
    if "moe" in mods:
        routed = 0.0
    if "layernorm" in mods:
        m -= BF16 * h / tp
    return (m + routed + shared) * tokens


def dense_mlp_bytes(model: ModelSpec, layout: Layout, mods: set, tokens: float) -> float:
    """Saved bytes of a dense SwiGLU MLP, sharded over TP."""
    h, tp = model.hidden_size, layout.tp
    mlp = BF16 * (2 * h + 3 * model.intermediate_size) / tp
    if "mlp" in mods:
        mlp = BF16 * h / tp
    return mlp * tokens


def layer_bytes(attn_kind: str, mlp_kind: str, model: ModelSpec, layout: Layout, mods: set, tokens: float,
                routed_rows_per_token: float, gdn_sharded: bool = False) -> float:
    """Saved bytes of one layer for the micro-batch, with the given selective modules recomputed."""
    if attn_kind in (FULL_ATTENTION, SLIDING_ATTENTION):
        attention = softmax_attention_bytes(model, layout, mods, tokens)
    elif attn_kind == LINEAR_ATTENTION:
        attention = linear_attention_bytes(model, layout, tokens, gdn_sharded)
    else:  # MLA
        attention = mla_bytes(model, layout, mods, tokens)
    if mlp_kind == MOE:
        return attention + moe_bytes(model, layout, mods, tokens, routed_rows_per_token)
    return attention + dense_mlp_bytes(model, layout, mods, tokens)


def unfused_extra_bytes(attn_kind: str, mlp_kind: str, model: ModelSpec, layout: Layout, mods: set,
                        tokens: float, routed_rows_per_token: float, gdn_sharded: bool = True) -> float:
    """Bytes a layer saves beyond the fused count when its kernels are unfused torch ops (megatron
    without TE and Apex, bias_activation_fusion off, jit_fuser not compiling): the SwiGLU's silu output
    and its product kept for the backward (routed experts also keep the linear half's
    `+ glu_linear_offset` copy and the product the router probabilities scale; experts.py TEGroupedMLP);
    around SDPA the contiguous query it is given and the reshaped output, plus the output gate's sigmoid;
    Gated DeltaNet's gated norm in eager mode (the norm's bf16 output and the fp32 gate and its silu)."""
    tp = layout.tp
    extra = 0.0
    if attn_kind in (FULL_ATTENTION, SLIDING_ATTENTION):
        q = model.num_attention_heads * model.head_dim
        extra += BF16 * ((q if "core_attn" not in mods else 0) + q + (q if model.attn_output_gate else 0)) / tp
    elif attn_kind == LINEAR_ATTENTION:
        extra += gdn_gated_norm_extra(model, layout, gdn_sharded)
    if mlp_kind == MOE:
        if "moe" not in mods and "moe_act" not in mods:
            fe = model.moe_intermediate_size / layout.etp
            extra += BF16 * 3 * fe * routed_rows_per_token / tp
        extra += _counted_shared_expert(model, layout, mods)[1]
    elif "mlp" not in mods:
        extra += BF16 * model.intermediate_size / tp
    return extra * tokens


def gdn_gated_norm_extra(model: ModelSpec, layout: Layout, sharded: bool) -> float:
    """Bytes per token a Gated DeltaNet's eager gated norm keeps beyond the fused count: megatron-core's (`sharded`)
    the gate's fp32 copy and its silu (the bf16 gate goes unsaved; the norm's bf16 output takes its place); slime's
    HF module the gate as well."""
    v = model.linear_num_value_heads * model.linear_value_head_dim
    return 2 * FP32 * v / layout.tp if sharded else (BF16 + 2 * FP32) * v * layout.cp


def runner_gdn_bytes(attn_kind: str, model: ModelSpec, layout: Layout, tokens: float) -> float:
    """What megatron-core's Gated DeltaNet block keeps on the unfused stack (its count and unfused extra): counted
    tensor by tensor from its source and checked on the runner's layer builds (benchmarks/activation_builds.py:
    the host-floor builds, where the block is nearly all of the layer, within 1%), so the per-MLP-kind factors,
    fitted for what the softmax-attention and MLP counts miss, leave it alone. Zero for other attention kinds."""
    if attn_kind != LINEAR_ATTENTION:
        return 0.0
    return linear_attention_bytes(model, layout, tokens, True) + gdn_gated_norm_extra(model, layout, True) * tokens


def runner_dense_layer_bytes(attn_kind: str, model: ModelSpec, layout: Layout, mods: set, tokens: float) -> float:
    """What a dense-MLP layer keeps on the runner's torch-native stack, tensor by tensor
    (benchmarks/saved_tensors_cpu.py traces it): each norm's input and, unless layernorm is recomputed, its output;
    softmax attention's QKV output (its value half a view of it), the rotated query and key, the attention output the
    projection keeps (recomputing core_attn changes none of these), the query norm's input (the key norm's is a view
    of the QKV output), an output gate and its sigmoid, RoPE's cos and sin; the unfused SwiGLU's five ffn-wide
    tensors (fc1's output, twice ffn, the offset copy, silu, the product) unless mlp is recomputed. A Gated DeltaNet
    block is counted from its source (runner_gdn_bytes)."""
    h, tp, ffn = model.hidden_size, layout.tp, model.intermediate_size
    norms = h + (0 if "layernorm" in mods else h)
    if attn_kind == LINEAR_ATTENTION:
        attention = runner_gdn_bytes(attn_kind, model, layout, tokens)
    else:
        q = model.num_attention_heads * model.head_dim
        kv = 2 * model.num_key_value_heads * model.head_dim
        a = norms + (q + kv) + q + kv / 2 + q + (q if model.qk_norm else 0) + (2 * q if model.attn_output_gate else 0)
        attention = (BF16 * a / tp + BF16 * 4 * model.head_dim) * tokens
    mlp = norms + (0 if "mlp" in mods else 5 * ffn)
    return attention + BF16 * mlp / tp * tokens


def _counted_shared_expert(model: ModelSpec, layout: Layout, mods: set) -> tuple[float, float]:
    """Bytes per token the MoE count holds for the shared expert: (moe_bytes's, unfused_extra_bytes's)."""
    h, s, tp = model.hidden_size, model.shared_expert_intermediate_size, layout.tp
    if "moe" in mods:
        return 0.0, 0.0
    if "shared_experts" in mods:
        return BF16 * h / tp, 0.0
    return BF16 * (h + 3 * s) / tp, BF16 * s / tp


def unfused_scaled(counted: float, exact: float, factor: float, shared: tuple[float, float] = (0.0, 0.0)) -> float:
    """A layer's saved bytes on the unfused stack: its per-MLP-kind `factor` on what the count may miss, not on
    `exact`, the part counted from source (runner_gdn_bytes), nor on a shared expert's: `shared` = (what the
    count holds for it, what the runner keeps: runner_shared_expert_bytes), the first replaced by the second."""
    return exact + shared[1] + factor * (counted - exact - shared[0])


def runner_shared_expert_bytes(model: ModelSpec, layout: Layout, mods: set, tokens: float) -> float:
    """What a MoE layer's shared expert keeps on the runner's torch-native stack, tensor by tensor
    (benchmarks/saved_tensors_cpu.py traces it): the unfused SwiGLU's five ffn-wide tensors, as a dense MLP's, its
    own copy of the block's input and its gate's sigmoid; nothing once shared_experts or moe is recomputed (the
    checkpoint's input is the block's, kept anyway)."""
    s = model.shared_expert_intermediate_size
    if not s or "shared_experts" in mods or "moe" in mods:
        return 0.0
    return BF16 * (5 * s + model.hidden_size + (1 if model.shared_expert_gate else 0)) / layout.tp * tokens


def shared_expert_counts(mlp_kind: str, model: ModelSpec, layout: Layout, mods: set,
                         tokens: float) -> tuple[float, float]:
    """A MoE layer's shared expert: (its bytes in moe_bytes + unfused_extra_bytes, what the runner keeps:
    runner_shared_expert_bytes); (0, 0) for a layer without one."""
    if mlp_kind != MOE or not model.shared_expert_intermediate_size:
        return 0.0, 0.0
    counted = sum(_counted_shared_expert(model, layout, mods)) * tokens
    return counted, runner_shared_expert_bytes(model, layout, mods, tokens)


def glu_backward_tensor_bytes(mlp_kind: str, model: ModelSpec, layout: Layout, tokens: float,
                              routed_rows_per_token: float) -> float:
    """Bytes of one [rows, ffn] bf16 tensor of the layer's SwiGLU MLP (routed rows and an expert's ffn for a MoE
    layer): the unit in which the eager backward's gradient temporaries (d fc2 input, d activation, silu's
    terms, d gate, d up and their concatenation) are counted, while the layer runs its backward."""
    if mlp_kind == MOE:
        return BF16 * model.moe_intermediate_size / layout.etp * routed_rows_per_token / layout.tp * tokens
    return BF16 * model.intermediate_size / layout.tp * tokens


def activation_bytes_per_microbatch(rank: RankLayers, model: ModelSpec, layout: Layout, tokens: float,
                                    routed_rows_per_token: float, gdn_sharded: bool = False,
                                    unfused: tuple[float, float, float, float, float] | None = None) -> tuple[float, float]:
    """(saved bytes of one micro-batch through all layers of the rank, working set of the layer running its
    backward: on the unfused stack what it holds beyond its saved bytes, measured so on the runner; on the fused
    count the whole layer, as before, since no fused-stack run has separated the two).

    `tokens` is the micro-batch's tokens on this GPU (its CP shard); `routed_rows_per_token` the
    expert rows this GPU receives per local token (top-k x routing imbalance). `unfused` (a stack
    without fused kernels): the factors (dense-MLP layers, MoE layers) on the count with
    `unfused_extra_bytes`, for what that count misses or over-counts, fitted per MLP kind, and the eager
    SwiGLU backward's gradient temporaries in [rows, ffn] tensors (`glu_backward_tensor_bytes`; the routed experts'
    count for a MoE layer, the dense SwiGLU's derived count for a dense one), added to the
    working set of the layer running its backward, and with the experts' activation recomputed (moe_act) the more
    such tensors the measured runs hold.
    """
    mods = set(layout.selective_modules)
    saved = 0.0
    largest = 0.0      # the working set of the layer running its backward, over the rank's layers
    whole_max = temps_max = 0.0
    for attn_kind, mlp_kind, count in rank.kinds:
        if unfused is not None and mlp_kind != MOE and attn_kind != MLA:
            layer = runner_dense_layer_bytes(attn_kind, model, layout, mods, tokens)
            whole = runner_dense_layer_bytes(attn_kind, model, layout, set(), tokens)
        else:
            layer = layer_bytes(attn_kind, mlp_kind, model, layout, mods, tokens, routed_rows_per_token, gdn_sharded)
            whole = layer_bytes(attn_kind, mlp_kind, model, layout, set(), tokens, routed_rows_per_token, gdn_sharded)
            if unfused is not None:
                factor = unfused[1] if mlp_kind == MOE else unfused[0]
                gdn = runner_gdn_bytes(attn_kind, model, layout, tokens) if gdn_sharded else 0.0
                layer = unfused_scaled(layer + unfused_extra_bytes(
                    attn_kind, mlp_kind, model, layout, mods, tokens, routed_rows_per_token, gdn_sharded),
                    gdn, factor, shared_expert_counts(mlp_kind, model, layout, mods, tokens))
                whole = unfused_scaled(whole + unfused_extra_bytes(
                    attn_kind, mlp_kind, model, layout, set(), tokens, routed_rows_per_token, gdn_sharded),
                    gdn, factor, shared_expert_counts(mlp_kind, model, layout, set(), tokens))
        if unfused is None:
            # While a layer runs its backward, recomputed modules are rebuilt: its working set is the whole layer.
            working = whole
        else:
            # Beyond its saved bytes (already counted in `saved`), the layer running its backward holds what
            # recompute rebuilds and the eager backward's gradient temporaries.
            if mlp_kind == MOE:
                tensors = unfused[2] + (unfused[3] if "moe_act" in mods and "moe" not in mods else 0.0)
            else:
                tensors = unfused[4]
            temps = tensors * glu_backward_tensor_bytes(mlp_kind, model, layout, tokens, routed_rows_per_token)
            working = whole - layer + temps
            temps_max = max(temps_max, temps)
        whole_max = max(whole_max, whole)
        saved += layer * count
        largest = max(largest, working)
    if layout.recompute_granularity == "full":
        saved, largest = _full_recompute(rank, model, layout, tokens, saved, whole_max, temps_max)
    if rank.has_embedding:
        saved += BF16 * model.hidden_size / layout.tp * tokens
    return saved, largest


def _full_recompute(rank: RankLayers, model: ModelSpec, layout: Layout, tokens: float, saved: float,
                    whole: float, temps: float) -> tuple[float, float]:
    """(saved, working set) once full recompute keeps only the input of each recomputed layer (one hidden
    state per chunk of layers): the chunk's layers are rebuilt together (`whole`: the largest layer), and the
    one running its backward holds its gradient temporaries (`temps`, the unfused stack's)."""
    n = rank.num_layers
    k = layout.recompute_num_layers
    layer_input = BF16 * model.hidden_size / layout.tp * tokens
    if layout.recompute_method == "uniform":
        return layer_input * -(-n // k), whole * min(k, n) + temps
    # block: the first k layers of each virtual stage are recomputed
    per_chunk = n // layout.vpp
    recomputed = min(k, per_chunk) * layout.vpp
    avg = saved / max(n, 1)
    return avg * (n - recomputed) + layer_input * recomputed, whole + temps


def in_flight_microbatches(layout: Layout, num_microbatches: int) -> float:
    """Micro-batches whose activations the first pipeline rank holds at once. EP all-to-all overlap runs one
    more forward (a virtual stage's chunk) in the interleaved warmup. Without a pipeline its combined steps
    pair one micro-batch's forward, layer by layer, with the previous one's backward, which frees as the other
    allocates: still about one micro-batch (a published run's allocated peak agrees, r000 of the public rows)."""
    return in_flight_count(layout.pp, layout.vpp, layout.overlap_moe_expert_parallel_comm, num_microbatches)


def in_flight_count(pp: int, vpp: int, ep_overlap: bool, num_microbatches: int) -> float:
    """`in_flight_microbatches` from the fields it reads (a space's scoring asks it of layouts it has not built)."""
    if pp == 1:
        return 1.0
    if vpp == 1:
        return float(min(pp, num_microbatches))
    extra = 1.0 / vpp if ep_overlap else 0.0
    return min(pp * (1 + (pp - 1) / (pp * vpp)) + extra, float(num_microbatches))


# Scoring a space asks for one rank's activations under many layouts that differ elsewhere: the bytes depend on the
# layout only through these fields (this module's readers), memoized with the model held by the memo.
ACTIVATION_FIELDS = ("tp", "cp", "etp", "pp", "vpp", "overlap_moe_expert_parallel_comm", "recompute_granularity",
                      "recompute_method", "recompute_num_layers", "selective_modules")
activation_fields = attrgetter(*ACTIVATION_FIELDS)   # a tuple of them, read in C (a memo key per call)
_ACTIVATION_MEMO = IdentityMemo(100_000)


def activation_source(model: ModelSpec, fused: bool, c: Constants) -> str:
    """How the activations term was reached, for `tune predict --explain` (counted, and what was fitted)."""
    if fused:
        return ("counted (cost_model.activations): the tensors Megatron saves per layer kind with Transformer "
                "Engine's fused kernels, less what the layout's recompute drops (fp8: x fp8_activation_factor, an "
                "estimate)")
    traced = (["dense-MLP layers"] if any(m != MOE for m in model.mlp_types) else []) + (
        ["shared experts"] if model.has_moe_layers and model.shared_expert_intermediate_size else [])
    parts = []
    if traced:
        parts.append(f"{' and '.join(traced)} tensor by tensor as benchmarks/saved_tensors_cpu.py traces them")
    if model.has_linear_attention:
        parts.append("Gated DeltaNet blocks from megatron-core's source")
    if model.has_moe_layers:
        parts.append(f"a MoE layer's routed part and attention x {c.unfused_moe_activation_factor:g} "
                     "(constants.yaml unfused_moe_activation_factor, fitted: benchmarks/runner_activation_fit.py)")
    return ("counted on the runner's torch-native stack (cost_model.activations): " + "; ".join(parts)
            + "; the layer running its backward adds the eager SwiGLU's gradient temporaries (constants.yaml "
            "unfused_*glu_backward_tensors: the dense layers' derived, the routed experts' fitted)")


def unfused_constants(c: Constants) -> tuple[float, float, float, float, float]:
    """The unfused stack's constants as `activation_bytes_per_microbatch` takes them (its `unfused`)."""
    return (c.unfused_activation_factor, c.unfused_moe_activation_factor, c.unfused_glu_backward_tensors,
            c.unfused_moe_act_recompute_tensors, c.unfused_dense_glu_backward_tensors)


def rank_activation_bytes(index: int, rank: RankLayers, model: ModelSpec, layout: Layout, inputs: MemoryInputs,
                          in_flight: float, c: Constants) -> tuple[float, float]:
    """(saved, working) activation bytes on one GPU of pipeline rank `index`, whose first rank holds
    `in_flight` micro-batches at once (later ranks proportionally fewer, at least one): what the
    micro-batches in flight keep for the backward, and the largest layer's working set while it runs
    its backward. The loss path is counted apart (cost_model.loss_path). fp8 keeps fp8 copies of the
    linear layers' inputs. On a stack without fused kernels (`fused_kernels` False, cost_model.nouns.runtime) a
    dense-MLP layer is counted tensor by tensor (runner_dense_layer_bytes) and a MoE layer keeps the extra bytes
    `unfused_extra_bytes` counts, scaled by constants.yaml's unfused_moe_activation_factor
    (benchmarks/runner_activation_fit.py), but for its shared expert's, counted tensor by tensor
    (runner_shared_expert_bytes)."""
    precision, tokens, routed_rows_per_token = inputs.precision, inputs.tokens, inputs.routed_rows_per_token
    gdn_sharded, fused = inputs.runtime.gdn_sharded, inputs.runtime.fused_kernels
    unfused = None if fused else unfused_constants(c)
    key = (id(model), rank, activation_fields(layout), tokens, routed_rows_per_token,
           gdn_sharded, unfused)
    hit = _ACTIVATION_MEMO.get(key) or _ACTIVATION_MEMO.put(key, model, activation_bytes_per_microbatch(
        rank, model, layout, tokens, routed_rows_per_token, gdn_sharded, unfused))
    saved, working = hit[1]
    pp = layout.pp
    in_flight_rank = in_flight if index == 0 else max(1.0, in_flight * (pp - index) / pp)
    scale = c.fp8_activation_factor if precision == "fp8" else 1.0
    return saved * in_flight_rank * scale, working * scale
