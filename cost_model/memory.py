"""Per-GPU and per-node host memory of a layout, in Megatron's conventions.

Static memory follows Megatron's distributed, precision-aware optimizer as the reference recipes
run it: bf16 parameters, fp32 main gradients (--accumulate-allreduce-grads-in-fp32), and a
DP-sharded optimizer holding a 16-bit master remainder plus fp32 moments (10 B per sharded
parameter). CPU offload moves the offloaded share of the optimizer to host memory (16 B per
sharded parameter: fp32 copies of parameter and gradient, and both moments).
Activations are counted per layer kind, per token, for each recompute setting.
"""
from __future__ import annotations

from dataclasses import dataclass

from cost_model.constants import Constants
from cost_model.model_spec import FULL_ATTENTION, LINEAR_ATTENTION, MLA, MOE, SLIDING_ATTENTION, ModelSpec
from cost_model.stages import RankLayers
from cost_model.layout import Layout

GIB = 1024 ** 3
BF16, FP32 = 2, 4
MOMENT_BYTES = {"fp32": 4, "bf16": 2}
HOST_BYTES_PER_OFFLOADED_PARAM = 16             # fp32 param + fp32 grad + two fp32 moments
BACKUP_BYTES_PER_PARAM = 2                      # slime's bf16 weight backup in pinned host memory


@dataclass(frozen=True)
class MemoryBreakdown:
    """GiB on the most-loaded GPU."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    buffers: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.buffers

    def as_dict(self) -> dict:
        return {"weights": self.weights, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "buffers": self.buffers, "total": self.total}


def local_params(rank: RankLayers, layout: Layout) -> tuple[float, float]:
    """(non-expert, expert) parameters held by one GPU of this pipeline rank."""
    tp = layout.tp
    # slime's Gated DeltaNet (HF module) and norms/routers are replicated on every TP rank.
    dense = ((rank.attention + rank.dense_mlp + rank.shared_expert + rank.embedding + rank.lm_head) / tp
             + rank.linear_attention + rank.replicated)
    expert = rank.routed_experts / (layout.ep * layout.etp)
    return dense, expert


def static_memory(rank: RankLayers, layout: Layout, precision_aware: bool = True) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes on one GPU of this rank. Without the precision-aware optimizer
    (it needs Transformer Engine's FusedAdam) the shard holds an fp32 master and two fp32 moments."""
    dense, expert = local_params(rank, layout)
    params = dense + expert
    # The distributed optimizer shards dense parameters over DP x CP, experts over expert-DP.
    sharded = dense / (layout.dp * layout.cp) + expert / layout.edp
    # Precision-aware optimizer: a 16-bit master remainder beside the bf16 parameter, plus two moments.
    per_param = 2 + 2 * MOMENT_BYTES[layout.exp_avg_dtype] if precision_aware else 4 + 4 + 4
    optimizer = sharded * per_param * (1.0 - layout.optimizer_offload_fraction)
    return params * BF16, params * FP32, optimizer


def activation_bytes_per_microbatch(rank: RankLayers, model: ModelSpec, layout: Layout, tokens: float,
                                    routed_rows_per_token: float) -> tuple[float, float]:
    """(saved bytes of one micro-batch through all layers of the rank, working set of its largest layer).

    `tokens` is the micro-batch's tokens on this GPU (its CP shard); `routed_rows_per_token` the
    expert rows this GPU receives per local token (top-k x routing imbalance).
    """
    h, tp, cp = model.hidden_size, layout.tp, layout.cp
    q = model.num_attention_heads * model.head_dim
    kv = 2 * model.num_key_value_heads * model.head_dim
    gate = q if model.attn_output_gate else 0
    mods = set(layout.selective_modules)

    def layer_bytes(attn_kind: str, mlp_kind: str, mods: set) -> float:
        """Saved bytes of one layer for the micro-batch, with the given selective modules recomputed."""
        # Attention part, bytes per token of the local shard.
        if attn_kind in (FULL_ATTENTION, SLIDING_ATTENTION):
            a = BF16 * (2 * h + 3 * q + gate + kv) / tp
            if "core_attn" in mods:
                a -= BF16 * q / tp
            if "layernorm" in mods:
                a -= BF16 * h / tp
            attn_tokens = tokens
        elif attn_kind == LINEAR_ATTENTION:
            qk = model.linear_num_key_heads * model.linear_key_head_dim
            v = model.linear_num_value_heads * model.linear_value_head_dim
            nv = model.linear_num_value_heads
            # slime's Gated DeltaNet runs the whole row on every TP and CP rank (not sharded).
            a = BF16 * (h + (2 * qk + 2 * v + 2 * nv) + (2 * qk + v) + 2 * qk + 3 * v) + FP32 * 2 * nv
            attn_tokens = tokens * cp
        else:  # MLA
            heads = model.num_attention_heads
            qk_dim = model.qk_nope_head_dim + model.qk_rope_head_dim
            up = heads * qk_dim + heads * (model.qk_nope_head_dim + model.v_head_dim)
            a = BF16 * (2 * h + model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim
                        + heads * model.v_head_dim * 2) / tp
            if "mla_up_proj" not in mods:
                a += BF16 * up / tp
            if "core_attn" in mods:
                a -= BF16 * heads * model.v_head_dim / tp
            attn_tokens = tokens
        # MLP part.
        if mlp_kind == MOE:
            fe = model.moe_intermediate_size / layout.etp
            m = BF16 * 2 * h / tp + FP32 * model.num_experts / tp
            routed = BF16 * (h + 2 * fe + (0 if "moe_act" in mods else fe)) * routed_rows_per_token / tp
            shared = BF16 * (h + 3 * model.shared_expert_intermediate_size) / tp
            if "shared_experts" in mods:
                shared = BF16 * h / tp
            if "moe" in mods:
                routed, shared = 0.0, 0.0
            if "layernorm" in mods:
                m -= BF16 * h / tp
            mlp = m + routed + shared
        else:
            f = model.intermediate_size
            mlp = BF16 * (2 * h + 3 * f) / tp
            if "mlp" in mods:
                mlp = BF16 * h / tp
        return a * attn_tokens + mlp * tokens

    saved = 0.0
    largest = 0.0
    for attn_kind, mlp_kind, count in rank.kinds:
        saved += layer_bytes(attn_kind, mlp_kind, mods) * count
        # While a layer runs its backward, recomputed modules are rebuilt: its working set is the whole layer.
        largest = max(largest, layer_bytes(attn_kind, mlp_kind, set()))

    if layout.recompute_granularity == "full":
        # Recomputed layers keep only their input (one hidden state per chunk of layers).
        n = rank.num_layers
        k = layout.recompute_num_layers
        layer_input = BF16 * h / tp * tokens
        if layout.recompute_method == "uniform":
            saved = layer_input * -(-n // k)
            largest = largest * min(k, n)
        else:  # block: the first k layers of each virtual stage are recomputed
            per_chunk = n // layout.vpp
            recomputed = min(k, per_chunk) * layout.vpp
            avg = saved / max(n, 1)
            saved = avg * (n - recomputed) + layer_input * recomputed
    if rank.has_embedding:
        saved += BF16 * h / tp * tokens
    return saved, largest


def logits_bytes(model: ModelSpec, layout: Layout, tokens: float) -> float:
    """bf16 logits plus the fp32 copy the cross-entropy keeps, vocab-parallel over TP."""
    return (BF16 + FP32) * tokens * model.vocab_size / layout.tp


def in_flight_microbatches(layout: Layout, num_microbatches: int) -> float:
    """Micro-batches whose activations the first pipeline rank holds at once."""
    pp, vpp = layout.pp, layout.vpp
    if pp == 1:
        return 1.0
    if vpp == 1:
        return float(min(pp, num_microbatches))
    return min(pp * (1 + (pp - 1) / (pp * vpp)), float(num_microbatches))


def buffer_bytes(layout: Layout, c: Constants) -> float:
    groups = sum(1 for size in (layout.tp, layout.cp, layout.ep, layout.etp, layout.dp, layout.edp, layout.pp)
                 if size > 1)
    gib = c.cuda_context_gib + c.nccl_buffers_gib_per_group * groups
    if layout.dispatcher == "flex":
        gib += c.deepep_buffers_gib
    return gib * GIB
