"""What each pipeline rank holds: layer kinds and parameters by sharding class.

Computed once per (model, PP, VPP) and cached, so scoring a whole search space only pays
for the arithmetic of each layout.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cost_model.model_spec import ModelSpec


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


@lru_cache(maxsize=256)
def rank_layers(model: ModelSpec, pp: int, vpp: int, first: int | None = None, last: int | None = None,
                embedding: bool = False, loss: bool = False) -> tuple[RankLayers, ...]:
    params = model.params
    ranks = []
    for r, indices in enumerate(model.stage_layers(pp, vpp, first, last, embedding, loss)):
        counts: dict[tuple[str, str], int] = {}
        sums = dict(attention=0, linear_attention=0, dense_mlp=0, shared_expert=0, routed_experts=0, replicated=0)
        for i in indices:
            key = (model.layer_types[i], model.mlp_types[i])
            counts[key] = counts.get(key, 0) + 1
            lp = params.layers[i]
            for name in sums:
                sums[name] += getattr(lp, name)
        first, last = r == 0, r == pp - 1
        ranks.append(RankLayers(
            kinds=tuple((a, m, c) for (a, m), c in sorted(counts.items())),
            num_layers=len(indices),
            has_embedding=first,
            has_head=last,
            embedding=params.embedding if first else 0,
            # A tied output layer needs its own copy of the embedding on the last stage when PP > 1.
            lm_head=((params.lm_head or (params.embedding if pp > 1 else 0)) + params.final_norm) if last else 0,
            **sums,
        ))
    return tuple(ranks)
