"""Step time of one pipeline rank, term by term.

FLOPs follow Megatron's conventions (training = 3 x forward GEMM FLOPs); each class of work runs
at an efficiency that depends on its shape; communication is latency plus bytes over bus
bandwidth of the link the group spans. All times are seconds per micro-batch on one GPU.
"""
from __future__ import annotations

from cost_model.constants import Constants
from cost_model.model_spec import FULL_ATTENTION, LINEAR_ATTENTION, MLA, MOE, SLIDING_ATTENTION, ModelSpec
from cost_model.rates import Rates
from cost_model.stages import RankLayers
from cost_model.layout import Layout

BF16 = 2

# Breakdown keys, in the order tables print them.
TERMS = (
    "compute_attention", "compute_linear_attention", "compute_mlp", "compute_experts", "compute_logits",
    "elementwise", "launch_overhead", "recompute", "tp_comm", "ep_comm", "cp_comm", "pp_p2p", "pp_bubble",
    "dp_comm", "optimizer", "offload", "step_overhead",
)


# Share of a layer's kernels each selective-recompute module launches again in the backward pass.
SELECTIVE_LAUNCH_SHARE = {"core_attn": 0.1, "mla_up_proj": 0.1, "layernorm": 0.1, "moe_act": 0.05, "mlp": 0.3,
                          "moe": 0.5, "shared_experts": 0.15}


def selective_launch_share(mods: set, attn_kind: str, mlp_kind: str) -> float:
    applies = {"core_attn": attn_kind in (FULL_ATTENTION, SLIDING_ATTENTION, MLA), "mla_up_proj": attn_kind == MLA,
               "layernorm": True, "moe_act": mlp_kind == MOE and "moe" not in mods, "moe": mlp_kind == MOE,
               "shared_experts": mlp_kind == MOE and "moe" not in mods, "mlp": mlp_kind != MOE}
    return min(1.0, sum(SELECTIVE_LAUNCH_SHARE[m] for m in mods if applies.get(m)))


def expert_dispatch_time(token_bytes: float, k: int, ep: int, span: int, dispatcher: str, r: Rates,
                         c: Constants) -> float:
    """Seconds of one token dispatch (or combine) over the EP group; token_bytes = local tokens x hidden bytes.

    alltoall sends one copy per (token, expert); flex (DeepEP) one per destination rank inside a node
    and one per destination node across nodes. Across nodes, the NVLink and network parts run
    concurrently and the slower one sets the time.
    """
    domain = r.gpu.nvlink_domain
    if span <= domain:
        copies = k if dispatcher == "alltoall" else ep * (1 - (1 - 1 / ep) ** k) * c.deepep_traffic_dedup
        return r.collective("all_to_all", token_bytes * copies, ep, span)
    nodes = span // domain
    local = max(1, ep // nodes)
    if dispatcher == "alltoall":
        remote_copies = k * (ep - local) / ep
        local_copies = k * local / ep
    else:
        remote_copies = (nodes - 1) * (1 - (1 - 1 / nodes) ** k) * c.deepep_traffic_dedup
        local_copies = local * (1 - (1 - 1 / ep) ** k) * c.deepep_traffic_dedup
    # The local part is an all-to-all among the node's ranks of the group; the remote part goes out
    # over the node's network links.
    t_local = r.collective("all_to_all", token_bytes * local_copies, local, min(span, domain)) if local > 1 else 0.0
    t_remote = c.collective_latency_s + token_bytes * remote_copies / r.internode
    return max(t_local, t_remote)


def rank_microbatch_terms(rank: RankLayers, model: ModelSpec, rates: Rates, layout: Layout, tokens: float,
                          seq_len: int, imbalance: float, c: Constants, framework: str = "slime") -> dict[str, float]:
    """Seconds per micro-batch on one GPU of this pipeline rank, by term (no pipeline/step terms)."""
    h, tp, cp, ep, etp = model.hidden_size, layout.tp, layout.cp, layout.ep, layout.etp
    hbm = rates.hbm
    r = rates
    mods = set(layout.selective_modules)
    t = dict.fromkeys(("compute_attention", "compute_linear_attention", "compute_mlp", "compute_experts",
                       "compute_logits", "elementwise", "launch_overhead", "recompute", "tp_comm",
                       "ep_comm", "cp_comm"), 0.0)

    # Fraction of each layer's forward that is run again in the backward pass.
    full_fraction = 0.0
    if layout.recompute_granularity == "full":
        if layout.recompute_method == "uniform":
            full_fraction = 1.0
        else:
            per_chunk = rank.num_layers // layout.vpp
            full_fraction = min(layout.recompute_num_layers, per_chunk) / max(per_chunk, 1)

    tp_span = tp
    ep_span = ep * etp
    cp_span = tp * cp
    act_bytes = tokens * h * BF16  # one hidden state of the local micro-batch, before SP sharding
    launch = (c.layer_launch_overhead_s if framework == "slime" else c.megatron_layer_launch_overhead_s) * (
        c.flex_overhead_factor if layout.dispatcher == "flex" else 1.0)

    for attn_kind, mlp_kind, count in rank.kinds:
        att = lin = mlp = exp = elem = tpc = epc = cpc = 0.0
        selective = 0.0  # forward seconds recomputed by selective recompute
        # --- attention ---
        if attn_kind in (FULL_ATTENTION, SLIDING_ATTENTION):
            q = model.num_attention_heads * model.head_dim
            kvw = 2 * model.num_key_value_heads * model.head_dim
            gate = q if model.attn_output_gate else 0
            proj_flops = 2 * h * (q + gate + kvw) + 2 * q * h
            att += 3 * proj_flops * tokens / tp / r.gemm(tokens, (q + gate + kvw) / tp, h)
            keys = seq_len / 2 if attn_kind == FULL_ATTENTION else min(seq_len / 2, model.sliding_window or seq_len)
            core = 3 * 4 * keys * q * tokens / tp
            core_t = core / r.attention(seq_len, model.head_dim)
            att += core_t
            if "core_attn" in mods:
                selective += core_t / 3
            if cp > 1:
                kv_bytes = tokens * kvw * BF16 / tp
                cpc += 3 * (cp - 1) * r.collective("p2p", kv_bytes, cp, cp_span) * c.cp_exposed_fraction
            tpc += 4 * r.collective("all_gather", act_bytes, tp, tp_span)
            elem_tokens = tokens / tp
        elif attn_kind == LINEAR_ATTENTION:
            qk = model.linear_num_key_heads * model.linear_key_head_dim
            v = model.linear_num_value_heads * model.linear_value_head_dim
            nv = model.linear_num_value_heads
            dv = model.linear_value_head_dim
            full_tokens = tokens * cp  # slime's GDN runs the whole row on every TP and CP rank
            proj_flops = 2 * (h * (2 * qk + 2 * v + 2 * nv) + h * v)
            lin += 3 * proj_flops * full_tokens / r.gemm(full_tokens, 2 * qk + 2 * v, h)
            rec_flops = 2 * (model.linear_conv_kernel_dim * (2 * qk + v) + 4 * nv * dv * dv)
            lin += 3 * rec_flops * full_tokens / r.linear_attention()
            tpc += 2 * r.collective("all_gather", act_bytes, tp, tp_span)
            if cp > 1:
                cpc += 2 * r.collective("all_gather", act_bytes * cp / tp, cp, cp_span)
            elem_tokens = full_tokens
        else:  # MLA
            heads = model.num_attention_heads
            qk_dim = model.qk_nope_head_dim + model.qk_rope_head_dim
            ql = model.q_lora_rank
            q_flops = 2 * (h * ql + ql * heads * qk_dim) if ql else 2 * h * heads * qk_dim
            kv_flops = 2 * h * (model.kv_lora_rank + model.qk_rope_head_dim) + 2 * model.kv_lora_rank * heads * (
                model.qk_nope_head_dim + model.v_head_dim)
            proj_flops = q_flops + kv_flops + 2 * heads * model.v_head_dim * h
            att += 3 * proj_flops * tokens / tp / r.gemm(tokens, heads * qk_dim / tp, h)
            core = 3 * 2 * (seq_len / 2) * heads * (qk_dim + model.v_head_dim) * tokens / tp
            core_t = core / r.attention(seq_len, qk_dim)
            att += core_t
            if "core_attn" in mods:
                selective += core_t / 3
            if "mla_up_proj" in mods:
                selective += 2 * model.kv_lora_rank * heads * (model.qk_nope_head_dim + model.v_head_dim) * tokens / tp / (
                    r.gemm(tokens, heads * qk_dim / tp, model.kv_lora_rank))
            if cp > 1:
                kv_bytes = tokens * heads * (qk_dim + model.v_head_dim) * BF16 / tp
                cpc += 3 * (cp - 1) * r.collective("p2p", kv_bytes, cp, cp_span) * c.cp_exposed_fraction
            tpc += 4 * r.collective("all_gather", act_bytes, tp, tp_span)
            elem_tokens = tokens / tp
        elem += c.elementwise_bytes_per_token_per_layer_h * h * elem_tokens / hbm

        # --- MLP ---
        if mlp_kind == MOE:
            k, fe, fs, e = model.num_experts_per_tok, model.moe_intermediate_size, \
                model.shared_expert_intermediate_size, model.num_experts
            local_tokens = tokens / tp * etp  # dispatch input per GPU (SP shard, gathered over ETP)
            rows = local_tokens * k * imbalance
            rows_per_expert = rows / (e / ep)
            exp_flops = 3 * 2 * 3 * h * fe / etp * rows
            exp += exp_flops / r.grouped(rows_per_expert, h, 2 * fe / etp)
            if fs:
                mlp += 3 * 2 * 3 * h * fs * tokens / tp / r.gemm(tokens, fs / tp, h)
            mlp += 3 * 2 * h * e * tokens / tp / r.gemm(tokens / tp, e, h)  # router
            if ep > 1:
                epc += 4 * expert_dispatch_time(local_tokens * imbalance * h * BF16, k, ep, ep_span,
                                                layout.dispatcher, r, c)
            if fs or etp < tp:
                tpc += 4 * r.collective("all_gather", act_bytes, tp, tp_span)
            elem += c.permute_passes * rows * h * BF16 / hbm
            if "moe" in mods:  # the whole MoE layer, shared experts and activation included
                selective += exp / 3 + epc / 2 + (mlp / 3 if fs else 0.0)
            else:
                if "moe_act" in mods:
                    selective += rows * fe / etp * BF16 * 3 / hbm
                if "shared_experts" in mods and fs:
                    selective += 2 * 3 * h * fs * tokens / tp / r.gemm(tokens, fs / tp, h)
        else:
            f = model.intermediate_size
            mlp += 3 * 2 * 3 * h * f * tokens / tp / r.gemm(tokens, f / tp, h)
            tpc += 4 * r.collective("all_gather", act_bytes, tp, tp_span)
            if "mlp" in mods:
                selective += mlp / 3
        elem += c.elementwise_bytes_per_token_per_layer_h * h * tokens / tp / hbm
        if "layernorm" in mods:
            selective += 2 * BF16 * h * tokens / tp * 2 / hbm

        # Full recompute reruns the forward (a third of the GEMM work, half the comm: the fwd collectives).
        recompute = full_fraction * ((att + lin + mlp + exp + elem) / 3 + (tpc + epc + cpc) / 2) + selective
        # Recomputed kernels are launched again: a full pass for full recompute, a share for selective
        # (only the modules this layer has, and never more than the whole layer).
        passes = 2 + max(full_fraction, selective_launch_share(mods, attn_kind, mlp_kind))
        t["compute_attention"] += count * att
        t["compute_linear_attention"] += count * lin
        t["compute_mlp"] += count * mlp
        t["compute_experts"] += count * exp
        t["elementwise"] += count * elem
        t["tp_comm"] += count * tpc
        t["ep_comm"] += count * epc
        t["cp_comm"] += count * cpc
        t["recompute"] += count * recompute
        # The host launches each layer pass eagerly; when the GPU compute of a pass is shorter than the
        # host's launch time, the difference is exposed. Communication does not hide it: the alltoall
        # dispatcher's host sync on split sizes stops the host from running ahead of the collectives.
        gpu_pass = (att + lin + mlp + exp + elem) / 3
        t["launch_overhead"] += count * passes * max(0.0, launch - gpu_pass)

    if rank.has_head:
        v = model.vocab_size
        t["compute_logits"] += 3 * 2 * h * v * tokens / tp / r.gemm(tokens, v / tp, h)
        t["elementwise"] += 3 * 6 * tokens * v / tp / hbm  # fp32 softmax / cross-entropy passes
    return t
