"""The fixed Optuna distributions of a search space (the parameters themselves: cost_model.nouns.layout_codec).

Eleven categorical parameters describe a layout (the pipeline split 'even' unless the layers do not divide;
a twelfth, pipeline_layout, where only a --pipeline-model-parallel-layout string splits them); max_tokens_per_gpu follows from rows per
micro-batch, CP and the row length (slime's dynamic batching), so it is not a parameter.
"""
from __future__ import annotations

from optuna.distributions import CategoricalDistribution

from cost_model.nouns.layout_codec import NO_PIPELINE_LAYOUT, encode_offload, encode_recompute, encode_split
from cost_model.nouns.model_spec import ModelSpec
from cost_model.nouns.workload import Workload
from search_space.enumerate import (SpaceOptions, divisors, offload_choices, pipeline_splits, recompute_choices,
                                    study_rows_choices)


def distributions(model: ModelSpec, world_size: int, options: SpaceOptions,
                  workload: Workload) -> dict[str, CategoricalDistribution]:
    """The same choices for every trial of a study (Optuna requires it), derived from the space's options (rows
    per micro-batch: from the workload's global batch too)."""
    ds = divisors(world_size)
    experts = [d for d in ds if model.num_experts % d == 0] if model.is_moe else [1]
    recomputes = []
    for rc in recompute_choices(model, options):
        value = encode_recompute(rc.get("recompute_granularity"), rc.get("recompute_method"),
                                 rc.get("recompute_num_layers"), tuple(rc.get("recompute_modules") or ()))
        if value not in recomputes:
            recomputes.append(value)
    out = {
        "tp": CategoricalDistribution([d for d in ds if d <= options.max_tp]),
        "pp": CategoricalDistribution(ds),
        "vpp": CategoricalDistribution(list(range(1, options.max_vpp + 1))),
        "cp": CategoricalDistribution(ds),
        "ep": CategoricalDistribution(experts),
        "etp": CategoricalDistribution([d for d in ds if d <= options.max_tp]),
        "rows_per_microbatch": CategoricalDistribution(study_rows_choices(options, workload, world_size)),
        "recompute": CategoricalDistribution(recomputes),
        "offload": CategoricalDistribution([encode_offload(o["optimizer_offload_fraction"], o["overlap_d2h_h2d"],
                                                           o.get("exp_avg_dtype", "fp32"))
                                            for o in offload_choices(options)]),
        "dispatcher": CategoricalDistribution(["alltoall", "flex"]),
    }
    splits, strings = split_choices(model, ds, options)
    if len(splits) > 1:   # only where some PP x VPP does not divide the layers (older studies: no such parameter)
        out["pipeline_split"] = CategoricalDistribution(splits)
    if strings:           # only where nothing else divides them
        out["pipeline_layout"] = CategoricalDistribution([NO_PIPELINE_LAYOUT] + strings)
    return out


def split_choices(model: ModelSpec, ds: list[int], options: SpaceOptions) -> tuple[list[str], list[str]]:
    """The pipeline splits the search space holds (search_space.enumerate.pipeline_splits) over its PP and VPP
    sizes: 'even' and the balanced uneven splits as `pipeline_split` values, and the layout strings (where
    nothing else divides) as `pipeline_layout` values."""
    splits, strings = ["even"], []
    for pp in ds:
        for vpp in range(1, options.max_vpp + 1):
            for split in pipeline_splits(model, pp, vpp):
                text = split.get("pipeline_model_parallel_layout")
                if text is not None:
                    strings += [text] if text not in strings else []
                    continue
                value = encode_split(split.get("decoder_first_pipeline_num_layers"),
                                     split.get("decoder_last_pipeline_num_layers"),
                                     split.get("account_for_embedding_in_pipeline_split", False),
                                     split.get("account_for_loss_in_pipeline_split", False))
                splits += [value] if value not in splits else []
    return splits, strings
