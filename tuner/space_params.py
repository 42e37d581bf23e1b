"""Layouts as Optuna trial parameters, and the fixed distributions of a search space.

Ten categorical parameters describe a layout; max_tokens_per_gpu follows from rows per
micro-batch, CP and the row length (slime's dynamic batching), so it is not a parameter.
"""
from __future__ import annotations

from optuna.distributions import CategoricalDistribution

from cost_model.model_spec import ModelSpec
from cost_model.workload import Workload
from search_space.enumerate import SpaceOptions, divisors, offload_choices, recompute_choices
from search_space.layout import Layout

PARAM_NAMES = ("tp", "pp", "vpp", "cp", "ep", "etp", "rows_per_microbatch", "recompute", "offload", "dispatcher")


def encode_recompute(layout_fields: dict) -> str:
    g = layout_fields.get("recompute_granularity")
    if g == "full":
        return f"full:{layout_fields['recompute_method']}:{layout_fields['recompute_num_layers']}"
    if g == "selective":
        return "selective:" + "+".join(layout_fields.get("recompute_modules") or ("core_attn",))
    return "none"


def decode_recompute(value: str) -> dict:
    if value == "none":
        return dict(recompute_granularity=None)
    kind, _, rest = value.partition(":")
    if kind == "full":
        method, _, k = rest.partition(":")
        return dict(recompute_granularity="full", recompute_method=method, recompute_num_layers=int(k))
    return dict(recompute_granularity="selective", recompute_modules=tuple(rest.split("+")))


def encode_offload(fraction: float, overlap: bool, moments: str = "fp32") -> str:
    """The optimizer's placement: '0' (on the GPU), '0:bf16' (bf16 moments), '0.5:overlap', '1'..."""
    if fraction == 0:
        return "0" if moments == "fp32" else f"0:{moments}"
    return f"{fraction:g}" + (":overlap" if overlap else "")


def decode_offload(value: str) -> dict:
    fraction, _, rest = value.partition(":")
    return dict(optimizer_offload_fraction=float(fraction), overlap_d2h_h2d=rest == "overlap",
                exp_avg_dtype=rest if rest in ("bf16",) else "fp32")


def layout_to_params(layout: Layout) -> dict:
    return {
        "tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp, "cp": layout.cp, "ep": layout.ep, "etp": layout.etp,
        "rows_per_microbatch": layout.rows_per_microbatch,
        "recompute": encode_recompute(layout.to_params() | {"recompute_modules": layout.selective_modules}),
        "offload": encode_offload(layout.optimizer_offload_fraction, layout.overlap_d2h_h2d, layout.exp_avg_dtype),
        "dispatcher": layout.dispatcher,
    }


def params_to_layout(params: dict, world_size: int, workload: Workload) -> Layout:
    """Raises InvalidLayout when the combination breaks a layout rule."""
    rows, cp = params["rows_per_microbatch"], params["cp"]
    return Layout(world_size, tp=params["tp"], pp=params["pp"], vpp=params["vpp"], cp=cp, ep=params["ep"],
                  etp=params["etp"], rows_per_microbatch=rows, max_tokens_per_gpu=max(1, rows * workload.seq_len // cp),
                  dispatcher=params["dispatcher"], **decode_recompute(params["recompute"]),
                  **decode_offload(params["offload"]))


def distributions(model: ModelSpec, world_size: int, options: SpaceOptions) -> dict[str, CategoricalDistribution]:
    """The same choices for every trial of a study (Optuna requires it), derived from the space's options."""
    ds = divisors(world_size)
    experts = [d for d in ds if model.num_experts % d == 0] if model.is_moe else [1]
    recomputes = []
    for rc in recompute_choices(model, options):
        value = encode_recompute(rc)
        if value not in recomputes:
            recomputes.append(value)
    return {
        "tp": CategoricalDistribution([d for d in ds if d <= options.max_tp]),
        "pp": CategoricalDistribution(ds),
        "vpp": CategoricalDistribution(list(range(1, options.max_vpp + 1))),
        "cp": CategoricalDistribution(ds),
        "ep": CategoricalDistribution(experts),
        "etp": CategoricalDistribution([d for d in ds if d <= options.max_tp]),
        "rows_per_microbatch": CategoricalDistribution(list(options.rows_per_microbatch)),
        "recompute": CategoricalDistribution(recomputes),
        "offload": CategoricalDistribution([encode_offload(o["optimizer_offload_fraction"], o["overlap_d2h_h2d"],
                                                           o.get("exp_avg_dtype", "fp32"))
                                            for o in offload_choices(options)]),
        "dispatcher": CategoricalDistribution(["alltoall", "flex"]),
    }
