"""The loss path's peak: the logits-sized tensors alive at once for one micro-batch on the last stage.

Counted from the code each runtime runs (`tokens` = the micro-batch's tokens on this GPU, its CP
shard; the vocabulary padded as megatron pads it and split over TP):

megatron (megatron-core 0.19.2 GPTModel._postprocess -> LanguageModule.compute_language_model_loss ->
tensor_parallel.vocab_parallel_cross_entropy; the fused 'native' variant allocates the same):
  forward: the output layer's bf16 logits [T, V/TP] stay referenced by GPTModel while the cross-entropy
  takes its fp32 copy (`.float()`), which it turns in place into the softmax it saves for the backward:
  2 + 4 bytes per logit at once;
  backward: the saved fp32 softmax becomes the gradient in place, then autograd casts it to bf16 for
  the output layer (the `.float()`'s backward): 4 + 2 bytes per logit at once.
slime (its log-prob loss, slime/utils/ppo_utils.calculate_log_probs_and_entropy): GPTModel returns the bf16
  logits, slime clones them for megatron's fused vocab-parallel cross-entropy, which upcasts the clone to
  fp32: 2 + 2 + 4 bytes per logit at once, plus the fp32 per-token log-probs.
Both: the output layer's input, the final norm's output (saved, sequence-parallel shard) and, under
sequence parallelism, its all-gather.
"""
from __future__ import annotations

from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import ModelSpec
from cost_model.nouns.runtime import SLIME_LOSS, Runtime
from cost_model.nouns.units import BF16, FP32

VOCAB_MULTIPLE = 128  # megatron's --make-vocab-size-divisible-by default


def padded_vocab(vocab: int, tp: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """The vocabulary megatron builds: padded to a multiple of `multiple` x TP."""
    m = multiple * tp
    return -(-vocab // m) * m


def logit_bytes_per_element(runtime: Runtime) -> int:
    """Bytes per logit (token x local vocab entry) alive at the loss path's peak."""
    return BF16 + BF16 + FP32 if runtime.loss_path == SLIME_LOSS else BF16 + FP32


def loss_path_source(runtime: Runtime) -> str:
    """How the loss path term was reached, for `tune predict --explain`."""
    return (f"counted (cost_model.loss_path) from the code {runtime.name} runs: {logit_bytes_per_element(runtime)} "
            "bytes a logit (token x padded vocabulary / TP) alive at once, plus the output layer's input; nothing "
            "fitted")


def loss_path_bytes(model: ModelSpec, layout: Layout, tokens: float, runtime: Runtime) -> float:
    """Peak bytes of the output layer and the loss for one micro-batch of `tokens` tokens on this GPU."""
    local_vocab = padded_vocab(model.vocab_size, layout.tp) / layout.tp
    peak = logit_bytes_per_element(runtime) * tokens * local_vocab
    if runtime.loss_path == SLIME_LOSS:
        peak += FP32 * tokens  # the per-token log-probs
    gathered = 1.0 if layout.sequence_parallel else 0.0
    return peak + BF16 * tokens * model.hidden_size * (1.0 / layout.tp + gathered)


def fp32_logits_bytes(model: ModelSpec, layout: Layout, tokens: float) -> float:
    """Bytes of one micro-batch's fp32 logits on this GPU (the cross-entropy's softmax, then its gradient): the
    loss path's largest block, what an allocator short of memory maps again every micro-batch."""
    return FP32 * tokens * padded_vocab(model.vocab_size, layout.tp) / layout.tp
