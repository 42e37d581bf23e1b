"""Which model features each runner backend can build: plain rules on the model, no torch, so the search space
and tests ask them on machines without torch."""
from __future__ import annotations

from cost_model.nouns.model_spec import MLA, SLIDING_ATTENTION, ModelSpec

BACKENDS = ("auto", "te", "torch-native", "local")
# "auto": torch's own SDPA dispatch; a kernel name forces that kernel (torch_native.SDPA_KERNELS maps them)
SDPA_BACKENDS = ("auto", "flash", "cudnn", "efficient", "math")


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


def microbatch_refusal(layout, global_batch: int) -> str | None:
    """Why the runner cannot split `global_batch` rows into the layout's micro-batches (None: it can). Megatron's
    fixed micro-batch size needs the global batch a multiple of DP x rows per micro-batch, and the interleaved
    schedule the micro-batch count a multiple of PP; slime's dynamic batching has neither rule."""
    unit = layout.dp * layout.rows_per_microbatch
    if global_batch % unit:
        return (f"global batch {global_batch} rows is not divisible by DP {layout.dp} x "
                f"{layout.rows_per_microbatch} rows per micro-batch")
    if layout.vpp > 1 and global_batch % (unit * layout.pp):
        return (f"the interleaved pipeline schedule needs the micro-batches per step ({global_batch // unit}) to be "
                f"a multiple of PP {layout.pp}")
    return None
