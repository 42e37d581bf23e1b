"""What one dense layer of the megatron runner keeps for its backward, per selective-recompute module set, traced
tensor by tensor on the CPU, against the memory model's count.

Builds megatron-core's TransformerBlock with the runner's torch-native spec (experiments.megatron.torch_native:
torch norms, torch SDPA, megatron's linears and SwiGLU) at a toy width (hidden 256, 4 heads of 64, 2 KV heads,
ffn 704), bf16, RoPE as GPTModel passes it, one row of 256 tokens, and runs a forward under autograd's
saved-tensor hooks. It sums the distinct storages still holding bytes afterwards (what recompute discarded is
resized to nothing), less the parameters and the block's input, and takes 2 layers less 1 layer: one layer's bf16
bytes per token, in units of hidden x 2 bytes. Next to it, the cost model's count for that layer on the runner's
stack (cost_model.activations.runner_dense_layer_bytes, which this trace gave: no constant fitted).

What the CPU cannot show: the CPU's RMSNorm is torch's composite one, which keeps fp32 copies (left out here:
the fused CUDA kernel keeps its bf16 input instead, one hidden per norm, so add 2 for the layer's two norms where
layernorm is not recomputed), and its SDPA kernel's output layout (the CPU's makes the output projection's input
a view; with more than one row a micro-batch a GPU kernel's may be a copy). The differences between module sets
are what it is for: on this stack recomputing core_attn keeps the same bytes (the checkpoint's output, the size of
the attention's, is what the output projection keeps either way), and the unfused SwiGLU keeps five ffn-wide
tensors; the count before 2026-12-06 (layer_bytes + unfused_extra_bytes times a fitted 1.083) said otherwise.

A MoE layer's shared expert the same way (toy_moe_model: Qwen1.5-MoE-A2.7B's layer at toy width, its gated
shared expert at two widths and none): it keeps five ffn-wide tensors as the dense SwiGLU does, its own copy of the
block's input and the gate's sigmoid (cost_model.activations.runner_shared_expert_bytes), where the MoE count before
2026-12-06 held four and scaled them by the MoE layers' fitted factor (0.913). The toy's token dispatcher is
allgather (the runner's alltoall one needs CUDA streams); the shared expert runs beside it, on the block's input.

    python benchmarks/saved_tensors_cpu.py
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import warnings
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

MODULE_SETS = ((), ("core_attn",), ("layernorm",), ("mlp",), ("layernorm", "mlp"), ("core_attn", "mlp"),
               ("core_attn", "layernorm", "mlp"))
MOE_MODULE_SETS = ((), ("moe_act",), ("shared_experts",), ("layernorm",), ("moe",))
SHARED_WIDTHS = (512, 1024)   # the shared expert widths main prints (each against the layer without one)
SEQ = 256


def toy_model(layers: int):
    from cost_model.nouns.model_spec import load_model
    from experiments.megatron.model_run import trial_model

    return dataclasses.replace(trial_model(load_model("llama3-8b"), layers), hidden_size=256, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=64, intermediate_size=704, vocab_size=256)


def toy_moe_model(layers: int, shared: int):
    """Qwen1.5-MoE-A2.7B's first `layers` layers at toy width: hidden 256, 4 heads of 64 (as many KV heads), 8
    experts of 128 top-2, a gated shared expert `shared` wide (none at 0)."""
    from cost_model.nouns.model_spec import load_model
    from experiments.megatron.model_run import trial_model

    base = trial_model(load_model(str(ROOT / "benchmarks" / "models" / "qwen1.5-moe-a2.7b" / "config.json")), layers)
    return dataclasses.replace(base, hidden_size=256, num_attention_heads=4, num_key_value_heads=4, head_dim=64,
                               num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
                               shared_expert_intermediate_size=shared, vocab_size=256)


def layout_for(mods: tuple[str, ...]):
    from cost_model.nouns.layout import Layout

    extra = dict(recompute_granularity="selective", recompute_modules=mods) if mods else {}
    return Layout(1, max_tokens_per_gpu=SEQ, **extra)


@contextlib.contextmanager
def cpu_rank():
    """One CPU rank as the tests build the runner's model (tests/megatron_cpu.one_rank), with the CPU's RNG state
    standing in for the CUDA one megatron's recompute checkpoint saves and restores."""
    import megatron.core.tensor_parallel.random as tp_random
    import torch
    from megatron_cpu import one_rank

    with one_rank(), warnings.catch_warnings(), \
            mock.patch.object(tp_random, "_get_cuda_rng_state", lambda *a, **k: torch.get_rng_state()), \
            mock.patch.object(tp_random, "_set_cuda_rng_state", lambda *a, **k: None):
        warnings.simplefilter("ignore")
        yield


def saved_bf16_bytes(layers: int, mods: tuple[str, ...], shared: int | None = None) -> int:
    """bf16 bytes the block of `layers` toy layers keeps for its backward after one forward of SEQ tokens: the dense
    toy's, or with `shared` the MoE toy's with a shared expert that wide (toy_moe_model)."""
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.core.transformer.transformer_config import TransformerConfig

    from cost_model.nouns.workload import Workload
    from experiments.megatron import config
    from experiments.megatron import torch_native as tnb

    model = toy_model(layers) if shared is None else toy_moe_model(layers, shared)
    kw = config.transformer_config_kwargs(model, layout_for(mods), Workload(seq_len=SEQ, global_batch=1),
                                          use_cpu_initialization=True)
    kw.update(bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16)
    if model.is_moe:
        kw["moe_token_dispatcher_type"] = "allgather"   # the alltoall one needs CUDA streams
    cfg = TransformerConfig(**kw)
    spec, _ = tnb.block_spec(model, cfg, "torch-native")
    block = TransformerBlock(cfg, spec)
    skip = {p.untyped_storage().data_ptr() for p in block.parameters()}
    x = torch.randn(SEQ, 1, model.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    skip.add(x.untyped_storage().data_ptr())
    rope = RotaryEmbedding(kv_channels=model.head_dim, rotary_percent=1.0, use_cpu_initialization=True)(SEQ)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        block(x, attention_mask=None, rotary_pos_emb=rope)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved
                if t.dtype == torch.bfloat16}
    return sum(n for ptr, n in storages.items() if ptr not in skip)


def model_count(mods: tuple[str, ...]) -> float:
    """The memory model's bytes per token for one toy layer on the runner's stack (runner_dense_layer_bytes)."""
    from cost_model.activations import runner_dense_layer_bytes
    from cost_model.nouns.model_spec import FULL_ATTENTION

    return runner_dense_layer_bytes(FULL_ATTENTION, toy_model(1), layout_for(mods), set(mods), 1.0)


def gpu_equivalent(traced: float, mods: tuple[str, ...], hidden: int) -> float:
    """The traced bytes with the fused CUDA RMSNorm's bf16 input in place of the CPU's composite norm's fp32 copies
    (one hidden per norm, two norms a layer) where layernorm is not recomputed (recomputed, its checkpoint keeps the
    bf16 input either way)."""
    return traced + (0 if "layernorm" in mods else 2 * 2 * hidden)


def shared_expert_traced(mods: tuple[str, ...], shared: int) -> float:
    """bf16 bytes per token one MoE layer keeps for a `shared`-wide shared expert: the toy MoE layer with it less
    the one without (each 2 layers less 1)."""
    def layer(width: int) -> int:
        return saved_bf16_bytes(2, mods, width) - saved_bf16_bytes(1, mods, width)
    return (layer(shared) - layer(0)) / SEQ


def shared_expert_count(mods: tuple[str, ...], shared: int) -> float:
    """The memory model's bytes per token for that shared expert (runner_shared_expert_bytes)."""
    from cost_model.activations import runner_shared_expert_bytes

    return runner_shared_expert_bytes(toy_moe_model(1, shared), layout_for(mods), set(mods), 1.0)


def main() -> int:
    unit = 2 * toy_model(1).hidden_size
    print("one toy dense layer (hidden 256, q 256, k+v 256, ffn 704; bf16, RoPE, 256 tokens) on the runner's "
          "torch-native stack, traced on the CPU; bf16 bytes per token in units of hidden x 2 bytes")
    print(f"{'recomputed':32} {'traced':>7} {'on GPU':>7} {'model':>7}   (traced: the composite CPU norms' fp32 copies "
          "left out; on GPU: with the fused norm's bf16 input)")
    with cpu_rank():
        for mods in MODULE_SETS:
            traced = (saved_bf16_bytes(2, mods) - saved_bf16_bytes(1, mods)) / SEQ
            print(f"{', '.join(mods) or 'none':32} {traced / unit:7.2f} "
                  f"{gpu_equivalent(traced, mods, toy_model(1).hidden_size) / unit:7.2f} {model_count(mods) / unit:7.2f}")
        print("\na toy MoE layer's gated shared expert (hidden 256, 8 experts of 128 top-2), the layer with it less "
              "the one without; bf16 bytes per token in units of the shared expert's width x 2 bytes")
        print(f"{'recomputed':32} " + " ".join(f"{f'traced {w}':>11} {f'model {w}':>10}" for w in SHARED_WIDTHS))
        for mods in MOE_MODULE_SETS:
            cells = [(shared_expert_traced(mods, w) / (2 * w), shared_expert_count(mods, w) / (2 * w))
                     for w in SHARED_WIDTHS]
            print(f"{', '.join(mods) or 'none':32} " + " ".join(f"{t:11.3f} {m:10.3f}" for t, m in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
