"""What each pipeline rank holds: layer kinds and parameters by sharding class.

Computed once per (model, PP, VPP) and cached, so scoring a whole search space only pays
for the arithmetic of each layout.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from cost_model.nouns.model_spec import DENSE, MOE, ModelSpec
from cost_model.nouns.pipeline_layout import stage_grid


@dataclass(frozen=True)
class RankLayers:
    """The layers of one pipeline rank (all its virtual stages together)."""

    kinds: tuple[tuple[str, str, int], ...]  # (attention kind, mlp kind, count)
    num_layers: int
    has_embedding: bool
    has_head: bool
    # Parameters held by the rank, by sharding class (before any TP/EP division).
    attention: int
    linear_attention: int
    dense_mlp: int
    shared_expert: int
    routed_experts: int
    replicated: int
    embedding: int
    lm_head: int
    # Multi-token-prediction layers this rank runs (only where a --pipeline-model-parallel-layout places them
    # with 'm'): each is one more layer of the model's MTP kind and one more pass through the LM head.
    mtp_layers: int = 0
    # A VLM's vision encoder, on the first rank when the workload has images (cost_model.vision).
    vision: int = 0


@lru_cache(maxsize=256)
def rank_layers(model: ModelSpec, pp: int, vpp: int, first: int | None = None, last: int | None = None,
                embedding: bool = False, loss: bool = False, pipeline_layout: str | None = None) -> tuple[RankLayers, ...]:
    params = model.params
    ranks, same = [], {}   # equal ranks are one object: pricing a layout then prices each distinct rank once
    mtp = _mtp_per_rank(model, pp, pipeline_layout)
    for r, indices in enumerate(model.stage_layers(pp, vpp, first, last, embedding, loss, pipeline_layout)):
        counts: dict[tuple[str, str], int] = {}
        sums = dict(attention=0, linear_attention=0, dense_mlp=0, shared_expert=0, routed_experts=0, replicated=0)
        layers = [(model.layer_types[i], model.mlp_types[i], params.layers[i]) for i in indices]
        layers += [(model.mtp_layer_type, MOE if model.is_moe else DENSE, lp) for lp in params.mtp[:mtp[r]]]
        for attn_kind, mlp_kind, lp in layers:
            key = (attn_kind, mlp_kind)
            counts[key] = counts.get(key, 0) + 1
            for name in sums:
                sums[name] += getattr(lp, name)
        first, last = r == 0, r == pp - 1
        rank = RankLayers(
            kinds=tuple((a, m, c) for (a, m), c in sorted(counts.items())),
            num_layers=len(indices),
            has_embedding=first,
            has_head=last,
            embedding=params.embedding if first else 0,
            # A tied output layer needs its own copy of the embedding on the last stage when PP > 1.
            lm_head=((params.lm_head or (params.embedding if pp > 1 else 0)) + params.final_norm) if last else 0,
            mtp_layers=mtp[r],
            **sums,
        )
        ranks.append(same.setdefault(rank, rank))
    return tuple(ranks)


def _mtp_per_rank(model: ModelSpec, pp: int, pipeline_layout: str | None) -> list[int]:
    """MTP layers on each pipeline rank: those a layout string places ('m'); none without one."""
    if pipeline_layout is None:
        return [0] * pp
    grid = stage_grid(pipeline_layout, pp, model.num_hidden_layers, model.num_nextn_predict_layers)
    return [sum(row[r].count("m") for row in grid) for r in range(pp)]


def layout_rank_layers(model: ModelSpec, layout, with_vision: bool = False) -> tuple[RankLayers, ...]:
    """rank_layers for a Layout's pipeline fields; `with_vision`: the first rank also holds the model's
    vision encoder (a workload with images)."""
    ranks = rank_layers(model, layout.pp, layout.vpp, layout.decoder_first_pipeline_num_layers,
                        layout.decoder_last_pipeline_num_layers, layout.account_for_embedding_in_pipeline_split,
                        layout.account_for_loss_in_pipeline_split, layout.pipeline_model_parallel_layout)
    if with_vision and model.vision is not None:
        ranks = (replace(ranks[0], vision=model.vision.params),) + ranks[1:]
    return ranks
