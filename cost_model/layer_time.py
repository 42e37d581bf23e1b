"""Seconds of one decoder layer's micro-batch on one GPU, per layer kind, forward and backward.

FLOPs follow Megatron's conventions (training = 3 x forward GEMM FLOPs); each class of work runs
at the efficiency `Rates` gives its shape. With the base weights frozen (LoRA), a weight GEMM runs
twice, not three times: forward and the input gradient, no weight gradient. The TP all-gathers
and the CP ring a layer issues are counted with it. The terms add up in a fixed order, part by
part, into a `LayerTime`.
"""
from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from cost_model.memo import IdentityMemo
from cost_model.communication import expert_dispatch_time, hidden_state_bytes
from cost_model.constants import Constants
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import FULL_ATTENTION, LINEAR_ATTENTION, MOE, SLIDING_ATTENTION, ModelSpec
from cost_model.rates import Rates
from cost_model.nouns.units import BF16


@dataclass(slots=True)
class LayerTime:
    """Seconds of one layer, by class of work; `selective` is the forward work selective recompute reruns."""

    attention: float = 0.0
    linear_attention: float = 0.0
    mlp: float = 0.0
    experts: float = 0.0
    elementwise: float = 0.0
    tp_comm: float = 0.0
    ep_comm: float = 0.0
    cp_comm: float = 0.0
    selective: float = 0.0
    forward: float = 0.0          # the forward share of the five compute fields above
    weight_passes: int = 3        # passes of a weight GEMM: 3 trained, 2 frozen (no weight gradient)

    def add(self, part: str, seconds: float, passes: int = 3) -> None:
        """Add forward+backward `seconds` of work that runs in `passes` passes (one of them forward)."""
        setattr(self, part, getattr(self, part) + seconds)
        self.forward += seconds / passes

    def add_gemm(self, part: str, flops_one_pass: float, rate: float) -> None:
        """A GEMM on the layer's weights: forward, input gradient and (when trained) weight gradient."""
        self.add(part, self.weight_passes * flops_one_pass / rate, self.weight_passes)

    @property
    def gpu_pass(self) -> float:
        """Seconds of one pass (forward) of the layer's kernels, communication aside."""
        return self.forward

    @property
    def gpu_work(self) -> float:
        """Seconds of all the layer's kernels, forward and backward, communication aside."""
        return self.attention + self.linear_attention + self.mlp + self.experts + self.elementwise

    @property
    def comm(self) -> float:
        return self.tp_comm + self.ep_comm + self.cp_comm


@dataclass(frozen=True)
class LayerInputs:
    """What a layer's time depends on besides its kinds: one micro-batch of `tokens` (`seq_len` per row) on one GPU
    of `layout`, with the selective recompute modules `mods`. `gdn_sharded`: Gated DeltaNet as megatron-core's
    GatedDeltaNet (see `linear_attention`); `frozen_weights`: no weight gradients (LoRA's frozen base; its
    adapters' few FLOPs are not counted)."""

    model: ModelSpec
    layout: Layout
    rates: Rates
    c: Constants
    tokens: float
    seq_len: int
    imbalance: float
    mods: set
    gdn_sharded: bool = False
    frozen_weights: bool = False


def _tp_all_gather(model: ModelSpec, layout: Layout, r: Rates, tokens: float) -> float:
    """One sequence-parallel all-gather (or reduce-scatter) of the micro-batch's hidden states over TP."""
    return r.collective("all_gather", hidden_state_bytes(model, tokens), layout.tp, layout.tp)


def _cp_ring(layout: Layout, r: Rates, c: Constants, kv_bytes: float) -> float:
    """Exposed seconds of context parallelism's K/V ring: CP - 1 sends per pass, three passes."""
    cp = layout.cp
    return 3 * (cp - 1) * r.collective("p2p", kv_bytes, cp, layout.tp * cp) * c.cp_exposed_fraction


def _elementwise(model: ModelSpec, r: Rates, c: Constants, tokens: float) -> float:
    return c.elementwise_bytes_per_token_per_layer_h * model.hidden_size * tokens / r.hbm


def softmax_attention(t: LayerTime, kind: str, x: LayerInputs) -> None:
    """GQA/MHA attention (full or sliding window, optional output gate), sharded over TP."""
    model, layout, r, c, tokens, seq_len, mods = x.model, x.layout, x.rates, x.c, x.tokens, x.seq_len, x.mods
    h, tp = model.hidden_size, layout.tp
    q = model.num_attention_heads * model.head_dim
    kvw = 2 * model.num_key_value_heads * model.head_dim
    gate = q if model.attn_output_gate else 0
    proj_flops = 2 * h * (q + gate + kvw) + 2 * q * h
    t.add_gemm("attention", proj_flops * tokens / tp, r.gemm(tokens, (q + gate + kvw) / tp, h))
    keys = seq_len / 2 if kind == FULL_ATTENTION else min(seq_len / 2, model.sliding_window or seq_len)
    core = 3 * 4 * keys * q * tokens / tp
    # A window of W keys is the work per query of a causal attention 2W long, and runs at that length's rate
    # (the profile's curve, clamped at its shortest sequence), not at the full sequence's.
    rate_seq = seq_len if kind == FULL_ATTENTION else min(seq_len, 2 * (model.sliding_window or seq_len))
    core_t = core / r.attention(rate_seq, model.head_dim)
    t.add("attention", core_t)
    if "core_attn" in mods:
        t.selective += core_t / 3
    if layout.cp > 1:
        t.cp_comm += _cp_ring(layout, r, c, tokens * kvw * BF16 / tp)
    t.tp_comm += 4 * _tp_all_gather(model, layout, r, tokens)
    t.add("elementwise", _elementwise(model, r, c, tokens / tp))


def gdn_kernel_seconds(model: ModelSpec, layout: Layout, r: Rates, tokens: float, sharded: bool = False) -> float:
    """Forward+backward seconds of one Gated DeltaNet layer's delta-rule kernel (fla's
    chunk_gated_delta_rule) for one micro-batch on one GPU.

    The kernel sees whole rows: slime's HF module does not shard them, megatron's GatedDeltaNet gathers the
    CP shards by a head all-to-all. Megatron shards the value heads over TP x CP; the HF module runs all of
    them on every rank. The time is the profile's measured kernel time at that many tokens, scaled by the
    heads this GPU runs (`Rates.gdn_kernel`), else the efficiency estimate on the recurrence's FLOPs."""
    full_tokens = tokens * layout.cp
    heads = model.linear_num_value_heads / (layout.tp * layout.cp if sharded else 1)
    dk, dv = model.linear_key_head_dim, model.linear_value_head_dim
    measured = r.gdn_kernel(full_tokens, heads, dk, dv)
    if measured is not None:
        return measured
    return 3 * 2 * 4 * heads * dk * dv * full_tokens / r.linear_attention()


def linear_attention(t: LayerTime, model: ModelSpec, layout: Layout, r: Rates, c: Constants,
                     tokens: float, sharded: bool = False) -> None:
    """Gated DeltaNet: projections, causal conv and the delta-rule kernel. `sharded`: megatron-core's
    GatedDeltaNet (in_proj column- and out_proj row-parallel over TP, a head all-to-all over CP);
    otherwise slime's HF module, which runs the whole row on every TP and CP rank."""
    h, tp, cp = model.hidden_size, layout.tp, layout.cp
    qk = model.linear_num_key_heads * model.linear_key_head_dim
    v = model.linear_num_value_heads * model.linear_value_head_dim
    nv = model.linear_num_value_heads
    in_width = 2 * qk + 2 * v + 2 * nv
    proj_flops = 2 * (h * in_width + h * v)
    if sharded:
        t.add_gemm("linear_attention", proj_flops * tokens / tp, r.gemm(tokens, in_width / tp, h))
        conv_work = tokens * (2 * qk + v) / tp
        t.tp_comm += 4 * _tp_all_gather(model, layout, r, tokens)
        if cp > 1:  # in_proj's output to head shards and the core output back, forward and backward
            t.cp_comm += 2 * sum(r.collective("all_to_all", tokens * width / tp * BF16, cp, tp * cp)
                                 for width in (in_width, v))
        t.add("elementwise", _elementwise(model, r, c, tokens / tp))
    else:
        full_tokens = tokens * cp
        t.add_gemm("linear_attention", proj_flops * full_tokens, r.gemm(full_tokens, 2 * qk + 2 * v, h))
        conv_work = full_tokens * (2 * qk + v)
        t.tp_comm += 2 * _tp_all_gather(model, layout, r, tokens)
        if cp > 1:
            t.cp_comm += 2 * r.collective("all_gather", hidden_state_bytes(model, tokens) * cp / tp, cp, tp * cp)
        t.add("elementwise", _elementwise(model, r, c, full_tokens))
    t.add("linear_attention", 3 * 2 * model.linear_conv_kernel_dim * conv_work / r.linear_attention())
    t.add("linear_attention", gdn_kernel_seconds(model, layout, r, tokens, sharded))


def mla(t: LayerTime, model: ModelSpec, layout: Layout, r: Rates, c: Constants, tokens: float, seq_len: int,
        mods: set) -> None:
    """Multi-head latent attention (DeepSeek-V3), sharded over TP."""
    h, tp = model.hidden_size, layout.tp
    heads = model.num_attention_heads
    qk_dim = model.qk_nope_head_dim + model.qk_rope_head_dim
    ql = model.q_lora_rank
    q_flops = 2 * (h * ql + ql * heads * qk_dim) if ql else 2 * h * heads * qk_dim
    kv_flops = 2 * h * (model.kv_lora_rank + model.qk_rope_head_dim) + 2 * model.kv_lora_rank * heads * (
        model.qk_nope_head_dim + model.v_head_dim)
    proj_flops = q_flops + kv_flops + 2 * heads * model.v_head_dim * h
    t.add_gemm("attention", proj_flops * tokens / tp, r.gemm(tokens, heads * qk_dim / tp, h))
    core = 3 * 2 * (seq_len / 2) * heads * (qk_dim + model.v_head_dim) * tokens / tp
    core_t = core / r.attention(seq_len, qk_dim)
    t.add("attention", core_t)
    if "core_attn" in mods:
        t.selective += core_t / 3
    if "mla_up_proj" in mods:
        t.selective += 2 * model.kv_lora_rank * heads * (model.qk_nope_head_dim + model.v_head_dim) * tokens / tp / (
            r.gemm(tokens, heads * qk_dim / tp, model.kv_lora_rank))
    if layout.cp > 1:
        t.cp_comm += _cp_ring(layout, r, c, tokens * heads * (qk_dim + model.v_head_dim) * BF16 / tp)
    t.tp_comm += 4 * _tp_all_gather(model, layout, r, tokens)
    t.add("elementwise", _elementwise(model, r, c, tokens / tp))


def moe(t: LayerTime, model: ModelSpec, layout: Layout, r: Rates, c: Constants, tokens: float, imbalance: float,
        mods: set) -> None:
    """Router, routed experts (grouped GEMM on the rows this GPU receives), shared experts, token dispatch."""
    h, tp, ep, etp = model.hidden_size, layout.tp, layout.ep, layout.etp
    k, fe, fs, e = model.num_experts_per_tok, model.moe_intermediate_size, \
        model.shared_expert_intermediate_size, model.num_experts
    local_tokens = tokens / tp * etp  # dispatch input per GPU (SP shard, gathered over ETP)
    rows = local_tokens * k * imbalance
    rows_per_expert = rows / (e / ep)
    t.add_gemm("experts", 2 * 3 * h * fe / etp * rows, r.grouped(rows_per_expert, h, 2 * fe / etp))
    if fs:
        t.add_gemm("mlp", 2 * 3 * h * fs * tokens / tp, r.gemm(tokens, fs / tp, h))
    t.add_gemm("mlp", 2 * h * e * tokens / tp, r.gemm(tokens / tp, e, h))  # router
    if ep > 1:
        t.ep_comm += 4 * expert_dispatch_time(local_tokens * imbalance * h * BF16, k, ep, ep * etp,
                                              layout.dispatcher, r, c)
    if fs or etp < tp:
        t.tp_comm += 4 * _tp_all_gather(model, layout, r, tokens)
    t.add("elementwise", c.permute_passes * rows * h * BF16 / r.hbm)
    if "moe" in mods:  # the whole MoE layer, shared experts and activation included
        wp = t.weight_passes
        t.selective += t.experts / wp + t.ep_comm / 2 + (t.mlp / wp if fs else 0.0)
        return
    if "moe_act" in mods:
        t.selective += rows * fe / etp * BF16 * 3 / r.hbm
    if "shared_experts" in mods and fs:
        t.selective += 2 * 3 * h * fs * tokens / tp / r.gemm(tokens, fs / tp, h)


def dense_mlp(t: LayerTime, model: ModelSpec, layout: Layout, r: Rates, tokens: float, mods: set) -> None:
    """Dense SwiGLU MLP, sharded over TP."""
    h, tp = model.hidden_size, layout.tp
    f = model.intermediate_size
    t.add_gemm("mlp", 2 * 3 * h * f * tokens / tp, r.gemm(tokens, f / tp, h))
    t.tp_comm += 4 * _tp_all_gather(model, layout, r, tokens)
    if "mlp" in mods:
        t.selective += t.mlp / t.weight_passes


# Scoring a space prices the same layer shape for thousands of layouts that differ only in what a layer does not
# see (PP, DP, offload, optimizer...). A layer's time depends on the layout only through these fields.
_LAYER_FIELDS = ("tp", "cp", "ep", "etp", "dispatcher")
_layer_fields = attrgetter(*_LAYER_FIELDS)   # a tuple of them, read in C (a memo key per call)
_MEMO = IdentityMemo(200_000)


def layer_time(attn_kind: str, mlp_kind: str, x: LayerInputs) -> LayerTime:
    """One layer of the given kinds: its token mixer, its MLP, then its norms and residuals.
    Memoized on its inputs (the objects by identity, held by the memo so their identity stays theirs): the
    result is shared, so a caller that changes it copies it first."""
    key = (attn_kind, mlp_kind, id(x.model), id(x.rates), id(x.c), _layer_fields(x.layout), x.tokens, x.seq_len,
           x.imbalance, frozenset(x.mods), x.gdn_sharded, x.frozen_weights)
    hit = _MEMO.get(key) or _MEMO.put(key, (x.model, x.rates, x.c), _layer_time(attn_kind, mlp_kind, x))
    return hit[1]


def _layer_time(attn_kind: str, mlp_kind: str, x: LayerInputs) -> LayerTime:
    model, layout, r, c, tokens, seq_len, mods = x.model, x.layout, x.rates, x.c, x.tokens, x.seq_len, x.mods
    t = LayerTime(weight_passes=2 if x.frozen_weights else 3)
    if attn_kind in (FULL_ATTENTION, SLIDING_ATTENTION):
        softmax_attention(t, attn_kind, x)
    elif attn_kind == LINEAR_ATTENTION:
        linear_attention(t, model, layout, r, c, tokens, x.gdn_sharded)
    else:  # MLA
        mla(t, model, layout, r, c, tokens, seq_len, mods)
    if mlp_kind == MOE:
        moe(t, model, layout, r, c, tokens, x.imbalance, mods)
    else:
        dense_mlp(t, model, layout, r, tokens, mods)
    h, tp = model.hidden_size, layout.tp
    t.add("elementwise", c.elementwise_bytes_per_token_per_layer_h * h * tokens / tp / r.hbm)
    if "layernorm" in mods:
        t.selective += 2 * BF16 * h * tokens / tp * 2 / r.hbm
    return t
