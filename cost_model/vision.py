"""The time and memory of running a VLM's vision encoder (cost_model.nouns.vision_spec) over a micro-batch's
images on the first pipeline stage. Megatron-Bridge runs the encoder on the first pipeline stage, its
layers sharded over TP like the language model's.

Token counts follow the model verification cards: tokens/s counts the language model's token slots
(padded rows, image placeholders included); the encoder's patches are extra work on top of them.
"""
from __future__ import annotations

from dataclasses import dataclass

from cost_model.rates import Rates
from cost_model.nouns.vision_spec import VisionSpec

# Bytes a ViT layer keeps for its backward per patch and hidden unit (Korthikanti et al.'s 34sbh without
# the attention scores, which flash attention recomputes), before TP sharding.
SAVED_BYTES_PER_PATCH_HIDDEN = 34


@dataclass(frozen=True)
class VisionWork:
    """The encoder's work in one micro-batch on one GPU of the first stage."""

    spec: VisionSpec
    patches: float                  # patches of the micro-batch's images (its CP share)
    patches_per_image: int


def vision_seconds(v: VisionSpec, patches: float, patches_per_image: int, tp: int, r: Rates,
                   weight_passes: int = 3) -> tuple[float, float]:
    """(forward+backward seconds, forward seconds) of the encoder over one micro-batch's `patches` on one GPU.
    `weight_passes`: 3 trained, 2 with frozen weights (the input gradient still flows to adapters below)."""
    if patches <= 0:
        return 0.0, 0.0
    gemm, attention = v.forward_flops(patches, patches_per_image)
    gemm_t = gemm / tp / r.gemm(patches, 3 * v.hidden_size / tp, v.hidden_size)
    attn_t = attention / tp / r.attention(max(patches_per_image, 1), v.hidden_size // v.num_heads)
    return weight_passes * gemm_t + 3 * attn_t, gemm_t + attn_t


def vision_activation_bytes(v: VisionSpec, patches: float, tp: int, in_flight: int) -> float:
    """Saved activations of the encoder for the micro-batches in flight on the first stage (bf16 weights
    beside them are counted with the stage's parameters)."""
    return in_flight * v.depth * SAVED_BYTES_PER_PATCH_HIDDEN * patches * v.hidden_size / tp
