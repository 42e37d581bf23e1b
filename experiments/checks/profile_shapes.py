"""The hardware profile's measurement grid: GEMM, fp8 GEMM, grouped GEMM, attention, linear attention and
collective points, optionally with a model's own shapes. Pure: no torch, no GPU."""
from __future__ import annotations

import itertools

from cost_model.nouns.model_spec import DENSE, FULL_ATTENTION, LINEAR_ATTENTION, MLA, SLIDING_ATTENTION, ModelSpec

GEMM_M = (512, 1024, 2048, 4096, 8192, 16384, 32768)
GEMM_NK = (256, 512, 1024, 2048, 4096, 8192, 16384)
MODEL_TOKENS = (4096, 8192, 16384)          # micro-batch token counts for the model's own GEMMs
FP8_M = (4096, 8192, 16384)
FP8_NK = (4096, 8192, 16384)                # square n = k
GROUPED_EXPERTS = (8, 32, 128, 256)
GROUPED_ROWS = (16, 64, 256, 1024, 4096)
GROUPED_MAX_ROWS = 262_144
DEFAULT_HIDDEN, DEFAULT_MOE_FFN = 2048, 512
ATTENTION_SEQS = (2048, 4096, 8192, 16384, 32768)
ATTENTION_DEFAULT_HEADS = ((32, 128), (16, 256))
LINEAR_ATTENTION_TOKENS = (4096, 8192, 16384, 32768)  # tokens per GPU the GDN kernel sees (batch 1)
LINEAR_ATTENTION_DEFAULT = dict(qk_heads=16, v_heads=32, key_head_dim=128, value_head_dim=128)  # Qwen3.5/3.6 GDN
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
COLLECTIVE_BYTES = tuple(64 * 1024 * 4 ** i for i in range(8))   # 64 KiB .. 1 GiB


def model_gemms(model: ModelSpec) -> list[tuple[str, int, int]]:
    """(label, n, k) of the model's forward GEMMs (x[tokens,k] @ W[k,n]), before any TP split."""
    h = model.hidden_size
    kinds = set(model.layer_types)
    out: list[tuple[str, int, int]] = []
    if kinds & {FULL_ATTENTION, SLIDING_ATTENTION}:
        q = model.num_attention_heads * model.head_dim
        gate = q if model.attn_output_gate else 0
        out += [("attn_qkv", q + gate + 2 * model.num_key_value_heads * model.head_dim, h),
                ("attn_out", h, q)]
    if MLA in kinds:
        heads, qk = model.num_attention_heads, model.qk_nope_head_dim + model.qk_rope_head_dim
        out += [("mla_q", heads * qk, model.q_lora_rank or h),
                ("mla_kv_a", model.kv_lora_rank + model.qk_rope_head_dim, h),
                ("mla_kv_b", heads * (model.qk_nope_head_dim + model.v_head_dim), model.kv_lora_rank),
                ("attn_out", h, heads * model.v_head_dim)]
        if model.q_lora_rank:
            out.append(("mla_q_a", model.q_lora_rank, h))
    if LINEAR_ATTENTION in kinds:
        qk = model.linear_num_key_heads * model.linear_key_head_dim
        v = model.linear_num_value_heads * model.linear_value_head_dim
        out += [("gdn_in", 2 * qk + 2 * v, h), ("gdn_out", h, v)]
    if DENSE in model.mlp_types and model.intermediate_size:
        f = model.intermediate_size
        out += [("mlp_up", 2 * f, h), ("mlp_down", h, f)]
    if model.is_moe:
        if model.shared_expert_intermediate_size:
            fs = model.shared_expert_intermediate_size
            out += [("shared_up", 2 * fs, h), ("shared_down", h, fs)]
        out.append(("router", model.num_experts, h))
    out.append(("lm_head_slice", model.vocab_size // 8, h))
    return [(label, n, k) for label, n, k in out if n > 0 and k > 0]


def _attention_heads(model: ModelSpec | None) -> list[tuple[int, int]]:
    pairs: list[tuple[int, int]] = []
    if model is not None:
        if MLA in model.layer_types:
            pairs.append((model.num_attention_heads, model.qk_nope_head_dim + model.qk_rope_head_dim))
        elif set(model.layer_types) & {FULL_ATTENTION, SLIDING_ATTENTION}:
            pairs.append((model.num_attention_heads, model.head_dim))
    return pairs + [p for p in ATTENTION_DEFAULT_HEADS if p not in pairs]


def _linear_attention_shape(model: ModelSpec | None) -> dict | None:
    """The Gated DeltaNet kernel's shape: the model's own; None for a model without such layers (its first call
    compiles for most of a minute, which a profile for that model does not need); the default without a model."""
    if model is not None and not model.has_linear_attention:
        return None
    if model is not None:
        return dict(qk_heads=model.linear_num_key_heads, v_heads=model.linear_num_value_heads,
                    key_head_dim=model.linear_key_head_dim, value_head_dim=model.linear_value_head_dim,
                    tokens=list(LINEAR_ATTENTION_TOKENS))
    return default_linear_attention_shape()


def default_linear_attention_shape() -> dict:
    """The Gated DeltaNet kernel's shape when no model names one (Qwen3.5/3.6's heads)."""
    return dict(LINEAR_ATTENTION_DEFAULT, tokens=list(LINEAR_ATTENTION_TOKENS))


def profile_shapes(model: ModelSpec | None) -> dict:
    """The measurement grid. Pure: no torch, no GPU.

    gemm: the full m x n x k grid (dicts m, n, k), then the model's own shapes at MODEL_TOKENS
    (dicts with a `label` too; points already on the grid are not repeated).
    """
    grid = [dict(m=m, n=n, k=k) for m, n, k in itertools.product(GEMM_M, GEMM_NK, GEMM_NK)]
    seen = {(p["m"], p["n"], p["k"]) for p in grid}
    extras = []
    if model is not None:
        for tokens in MODEL_TOKENS:
            for label, n, k in model_gemms(model):
                if (tokens, n, k) not in seen:
                    seen.add((tokens, n, k))
                    extras.append(dict(m=tokens, n=n, k=k, label=label))
    if model is not None and model.is_moe:
        hidden, ffn = model.hidden_size, model.moe_intermediate_size
    else:
        hidden, ffn = DEFAULT_HIDDEN, DEFAULT_MOE_FFN
    grouped = [dict(experts=e, rows_per_expert=r, k=k, n=n)
               for k, n in ((hidden, 2 * ffn), (ffn, hidden))
               for e in GROUPED_EXPERTS for r in GROUPED_ROWS if e * r <= GROUPED_MAX_ROWS]
    attention = [dict(seq=s, heads=h, head_dim=d) for h, d in _attention_heads(model) for s in ATTENTION_SEQS]
    return dict(
        gemm=grid + extras,
        gemm_fp8=[dict(m=m, n=nk, k=nk) for m in FP8_M for nk in FP8_NK],
        grouped_gemm=grouped,
        attention=attention,
        linear_attention=_linear_attention_shape(model),
        collectives=dict(ops=list(COLLECTIVE_OPS), bytes=list(COLLECTIVE_BYTES)),
    )


def quick_shapes(shapes: dict) -> dict:
    """A small subset of `profile_shapes` for a smoke run (`--quick`)."""
    keep = dict(shapes)
    keep["gemm"] = [p for p in shapes["gemm"]
                    if (p["m"] == 8192 and "label" in p)
                    or (p["m"] in (1024, 8192) and p["n"] in (1024, 8192) and p["k"] in (1024, 8192))]
    keep["gemm_fp8"] = shapes["gemm_fp8"][:2]
    keep["grouped_gemm"] = [p for p in shapes["grouped_gemm"]
                            if p["experts"] in (8, 128) and p["rows_per_expert"] in (64, 1024)]
    keep["attention"] = [p for p in shapes["attention"] if p["seq"] in (2048, 8192)]
    keep["linear_attention"] = shapes["linear_attention"] and dict(shapes["linear_attention"], tokens=[8192])
    keep["collectives"] = dict(ops=shapes["collectives"]["ops"], bytes=[2 ** 20, 256 * 2 ** 20])
    return keep
