"""Every layout Megatron and slime accept for a model on N GPUs.

The product of the dimensions is filtered by the Layout constructor and `rules.violations`, so the
enumeration never holds a rule of its own: what it yields is exactly what `check` accepts.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product
from typing import Iterator

from cost_model.batching import max_tokens_per_gpu
from cost_model.errors import AttuneError
from cost_model.model_spec import MLA, ModelSpec
from cost_model.workload import Workload
from cost_model.layout import InvalidLayout, Layout
from cost_model.pipeline_layout import balanced_layout
from search_space.pipeline_splits import accounting_splits, divides, uneven_splits
from search_space.rules import violations
from cost_model.stack import Stack


@dataclass(frozen=True)
class SpaceOptions:
    """Which values of the non-parallel dimensions to try."""

    rows_per_microbatch: tuple[int, ...] = (1, 2, 4)
    full_recompute_layers: tuple[int, ...] = (1, 2, 4)
    offload_fractions: tuple[float, ...] = (0.0, 0.5, 1.0)
    max_tp: int = 8          # TP beyond one NVLink domain is never worth it
    max_vpp: int = 4
    # Narrowed to what a trial runner can run (search_space.runner_space); the defaults are everything.
    dispatchers: tuple[str, ...] = ("alltoall", "flex")
    exp_avg_dtypes: tuple[str, ...] = ("fp32", "bf16")   # Adam moments when not offloaded
    max_cp: int | None = None                            # None: no limit


# Fields a study's identity leaves out while at their defaults (studies made before they existed).
NARROWING_FIELDS = ("dispatchers", "exp_avg_dtypes", "max_cp")


# The most GPUs a space is built for: the layouts grow with the count's divisors (1,024 GPUs: ~1,500
# parallel shapes before the other dimensions), and no job today uses more.
MAX_GPUS = 4096
# The most layouts one space may hold, counted before any is built or scored (each scored one costs
# ~70 us and ~2.4 KB): every catalog model fits under it up to MAX_GPUS (the largest, Qwen3-30B-A3B on
# 4,096 GPUs with a global batch of 4,096 rows, has ~3.2 million); a config.json with unusual expert and
# layer counts asks for more (4,096 experts and 512 layers: ~4.8 million) and is refused in one line, in
# under a second, instead of growing for hours.
MAX_SPACE_LAYOUTS = 4_000_000


class SpaceTooLarge(AttuneError, ValueError):
    """A search space with more layouts than MAX_SPACE_LAYOUTS."""


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def selective_module_sets(model: ModelSpec) -> list[tuple[str, ...]]:
    sets = [("core_attn",), ("layernorm",)]
    if model.is_moe:
        sets += [("moe_act",), ("moe_act", "layernorm"), ("core_attn", "moe_act", "layernorm")]
        if model.shared_expert_intermediate_size:
            sets.append(("moe_act", "layernorm", "shared_experts"))
        sets.append(("moe",))
    else:
        sets += [("mlp",), ("core_attn", "layernorm", "mlp")]
    if model.count(MLA):
        sets.append(("mla_up_proj", "moe_act", "layernorm") if model.is_moe else ("mla_up_proj",))
    return sets


def recompute_choices(model: ModelSpec, options: SpaceOptions) -> list[dict]:
    out: list[dict] = [dict(recompute_granularity=None)]
    for mods in selective_module_sets(model):
        out.append(dict(recompute_granularity="selective", recompute_modules=mods))
    for method in ("uniform", "block"):
        for k in options.full_recompute_layers:
            out.append(dict(recompute_granularity="full", recompute_method=method, recompute_num_layers=k))
    return out


def workload_options(options: SpaceOptions, workload: Workload) -> SpaceOptions:
    """`options` without the dimensions the workload makes moot: a frozen base (LoRA) has no optimizer state to
    offload or to keep in bf16, so those choices would only repeat one layout."""
    if workload.frozen_weights:
        return replace(options, offload_fractions=(0.0,), exp_avg_dtypes=("fp32",))
    return options


def offload_choices(options: SpaceOptions) -> list[dict]:
    out = []
    for f in options.offload_fractions:
        if f == 0:
            out += [dict(optimizer_offload_fraction=0.0, overlap_d2h_h2d=False, exp_avg_dtype=d)
                    for d in ("fp32", "bf16") if d in options.exp_avg_dtypes]
        else:
            out += [dict(optimizer_offload_fraction=f, overlap_d2h_h2d=o) for o in (True, False)]
    return out


def parallel_shapes(model: ModelSpec, world_size: int, workload: Workload, stack: Stack,
                    options: SpaceOptions) -> Iterator[dict]:
    """(tp, pp, vpp, cp, ep, etp) combinations that pass every rule, before the other dimensions."""
    ds = divisors(world_size)
    expert_sizes = [e for e in ds if model.num_experts % e == 0] if model.is_moe else [1]
    for tp, pp, cp in product(ds, ds, ds):
        if world_size % (tp * pp * cp) or tp > options.max_tp or cp > (options.max_cp or cp):
            continue
        vpps = [1] + [v for v in range(2, options.max_vpp + 1) if pp > 1]
        etps = sorted({1, tp}) if model.is_moe else [tp]
        for vpp, ep, etp in product(vpps, expert_sizes, etps):
            for split in pipeline_splits(model, pp, vpp):
                try:
                    layout = Layout(world_size, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, **split,
                                    max_tokens_per_gpu=max_tokens_per_gpu(1, cp, workload.seq_len),
                                    rows_per_microbatch=1)
                except InvalidLayout:
                    continue
                if not violations(layout, model, workload, stack):
                    yield dict(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, **split)


def pipeline_splits(model: ModelSpec, pp: int, vpp: int) -> list[dict]:
    """Megatron's even split where the layers divide over PP x VPP; else the balanced uneven splits; where
    neither works (DeepSeek-V3's 61 layers over PP 8 x VPP 4), the balanced layout string."""
    layers = model.num_hidden_layers
    if divides(layers, pp, vpp):
        return [{}]
    splits = ([dict(decoder_first_pipeline_num_layers=first, decoder_last_pipeline_num_layers=last)
               for first, last in uneven_splits(layers, pp, vpp)]
              + [dict(account_for_embedding_in_pipeline_split=e, account_for_loss_in_pipeline_split=l)
                 for e, l in accounting_splits(layers, pp, vpp)])
    text = None if splits else balanced_layout(layers, pp, vpp)
    return splits + ([dict(pipeline_model_parallel_layout=text)] if text else [])


def shape_dispatchers(shape: dict, stack: Stack, options: SpaceOptions) -> list[str]:
    return [d for d in options.dispatchers if d == "alltoall" or (shape["ep"] * shape["etp"] > 1 and stack.deepep)]


def space_size(shapes: list[dict], model: ModelSpec, stack: Stack, options: SpaceOptions) -> int:
    """How many layouts the enumeration builds over these parallel shapes (an upper bound on what it yields)."""
    per_shape = len(options.rows_per_microbatch) * len(recompute_choices(model, options)) * len(offload_choices(options))
    return per_shape * sum(len(shape_dispatchers(s, stack, options)) for s in shapes)


def enumerate_layouts(model: ModelSpec, world_size: int, workload: Workload, stack: Stack,
                      options: SpaceOptions = SpaceOptions()) -> Iterator[Layout]:
    """Every valid layout; SpaceTooLarge (before the first one) when the space would exceed MAX_SPACE_LAYOUTS."""
    recomputes = recompute_choices(model, options)
    offloads = offload_choices(options)
    shapes = list(parallel_shapes(model, world_size, workload, stack, options))
    size = space_size(shapes, model, stack, options)
    if size > MAX_SPACE_LAYOUTS:
        raise SpaceTooLarge(f"the search space of {model.display_name} on {world_size:,} GPUs would hold {size:,} "
                            f"layouts ({len(shapes):,} parallel shapes), more than the {MAX_SPACE_LAYOUTS:,} one "
                            f"study scores; use fewer GPUs (--gpus) or a model with fewer layers or experts")
    for shape in shapes:
        dispatchers = shape_dispatchers(shape, stack, options)
        for rows, rc, off, disp in product(options.rows_per_microbatch, recomputes, offloads, dispatchers):
            max_tokens = max_tokens_per_gpu(rows, shape["cp"], workload.seq_len)
            try:
                layout = Layout(world_size, **shape, max_tokens_per_gpu=max_tokens, rows_per_microbatch=rows,
                                dispatcher=disp, **rc, **off)
            except InvalidLayout:
                continue
            if not violations(layout, model, workload, stack):
                yield layout
