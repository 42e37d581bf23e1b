"""Which model features each runner backend can build: plain rules on the model, no torch, so the search space
and tests ask them on machines without torch."""
from __future__ import annotations

from cost_model.model_spec import MLA, SLIDING_ATTENTION, ModelSpec


def unsupported(model: ModelSpec, backend: str, cp: int = 1) -> list[str]:
    """Why `backend` cannot build `model` (empty: it can)."""
    out = []
    if MLA in model.layer_types:
        out.append("MLA models are not wired into this runner (needs MLATransformerConfig)")
    if backend == "torch-native":
        if cp > 1:
            out.append(f"context parallelism (CP {cp}) needs TE's ring attention; SDPA has none")
        if model.attention_sinks:
            out.append("attention sinks (learnable softmax offset) are not expressible with "
                       "scaled_dot_product_attention; use backend local")
        if SLIDING_ATTENTION in model.layer_types:
            out.append("sliding-window attention: SDPA has no window argument; use backend local")
    if backend == "local" and cp > 1:
        out.append(f"context parallelism (CP {cp}): megatron's DotProductAttention supports CP 1 only")
    return out
