"""Uneven pipeline splits: where a model's layers do not divide over PP (x VPP) stages, the splits Megatron
accepts with --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers that balance the stages,
and those --account-for-embedding/loss-in-pipeline-split make divide.

DeepSeek-V3 (61 layers), Qwen3-235B-A22B (94) and Llama3.1-405B (126) train this way. Of every split Megatron
accepts, the search keeps the most balanced: the middle stages hold m layers (a multiple of VPP), m as small
as any split allows, and the first and last stages at most m each (they also hold the embedding and the
LM head and loss).
"""
from __future__ import annotations

from functools import lru_cache

from cost_model.nouns.model_spec import ModelError, stage_layers

Split = tuple[int | None, int | None]     # (decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers)
Accounting = tuple[bool, bool]            # (account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split)


@lru_cache(maxsize=4096)
def uneven_splits(num_layers: int, pp: int, vpp: int = 1) -> tuple[Split, ...]:
    """The balanced uneven splits of `num_layers` over `pp` stages of `vpp` virtual stages (none for PP 1, none
    where the even split works)."""
    if pp < 2 or num_layers < pp or divides(num_layers, pp, vpp):
        return ()
    base = -(-num_layers // pp)
    start = -(-base // vpp) * vpp
    found: dict[tuple[int, ...], Split] = {}
    for m in range(start, start + 3 * vpp, vpp):         # the smallest middle size any split allows
        for split in _candidates(num_layers, pp, vpp, m):
            try:
                per_rank = tuple(len(r) for r in stage_layers(num_layers, pp, vpp, *split))
            except ModelError:
                continue
            if max(per_rank) <= m:
                found.setdefault(per_rank, split)
        if found:
            break
    return tuple(found[k] for k in sorted(found))


def _candidates(num_layers: int, pp: int, vpp: int, m: int):
    """First only, last only, then both set, with m layers on each middle stage."""
    one_end = num_layers - m * (pp - 1)
    if one_end >= vpp and one_end % vpp == 0:
        yield (one_end, None)
        yield (None, one_end)
    both = num_layers - m * (pp - 2)
    low = (both // 2) // vpp * vpp
    for first in sorted({low, both - low}):
        last = both - first
        if first >= vpp and last >= vpp and first % vpp == 0 and last % vpp == 0:
            yield (first, last)


@lru_cache(maxsize=4096)
def accounting_splits(num_layers: int, pp: int, vpp: int = 1) -> tuple[Accounting, ...]:
    """The embedding and/or loss counted as a layer of the first/last virtual stage, where that makes the
    layers divide over PP x VPP (Llama3.1-405B: 126 + 2 over PP 8 x VPP 8; Qwen3-235B-A22B: 94 + 2 over PP 8)."""
    if pp < 2 or divides(num_layers, pp, vpp):
        return ()
    out = []
    for embedding, loss in ((True, True), (True, False), (False, True)):
        try:
            stage_layers(num_layers, pp, vpp, embedding=embedding, loss=loss)
        except ModelError:
            continue
        out.append((embedding, loss))
    return tuple(out)


def divides(num_layers: int, pp: int, vpp: int) -> bool:
    """Megatron's even split works: the layers divide over PP stages, and each stage's over VPP chunks."""
    return num_layers % pp == 0 and (num_layers // pp) % vpp == 0
