"""Every layout Megatron and slime accept for a model on N GPUs.

The product of the dimensions is filtered by the Layout constructor and `rules.violations`, so the
enumeration never holds a rule of its own: what it yields is exactly what `check` accepts.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product
from typing import Iterator

from cost_model.nouns.batching import max_tokens_per_gpu
from cost_model.nouns.errors import AttuneError
from cost_model.nouns.model_spec import DENSE, FULL_ATTENTION, MLA, MOE, SLIDING_ATTENTION, ModelSpec
from cost_model.nouns.workload import Workload
from cost_model.nouns.layout import InvalidLayout, Layout
from cost_model.memory import MEMORY_BLIND_FIELDS, lighter_optimizer
from cost_model.nouns.pipeline_layout import balanced_layout
from search_space.pipeline_splits import accounting_splits, divides, uneven_splits
from search_space.rules import microbatch_violations, shape_violations, template_violations, violations
from cost_model.nouns.stack import Stack


@dataclass(frozen=True)
class SpaceOptions:
    """Which values of the non-parallel dimensions to try."""

    # None: derived per parallel shape (rows_choices): the powers of two up to the rows a data-parallel rank
    # holds in a step, and those rows (see BASE_ROWS); a tuple: these values (those above a rank's rows are not
    # valid, rules.py).
    rows_per_microbatch: tuple[int, ...] | None = None
    full_recompute_layers: tuple[int, ...] = (1, 2, 4)
    offload_fractions: tuple[float, ...] = (0.0, 0.5, 1.0)
    max_tp: int = 8          # TP beyond one NVLink domain is never worth it
    max_vpp: int = 4
    # Narrowed to what a trial runner can run (search_space.runner_space); the defaults are everything.
    dispatchers: tuple[str, ...] = ("alltoall", "flex")
    exp_avg_dtypes: tuple[str, ...] = ("fp32", "bf16")   # Adam moments when not offloaded
    max_cp: int | None = None                            # None: no limit
    # Selective-recompute module sets; None: those of the model's layer kinds (selective_module_sets). A runner
    # that trains fewer layers narrows them to the kinds it runs (search_space.runner_space).
    selective_module_sets: tuple[tuple[str, ...], ...] | None = None


# Fields a study's identity leaves out while at their defaults (studies made before they existed).
NARROWING_FIELDS = ("dispatchers", "exp_avg_dtypes", "max_cp", "selective_module_sets")


# The most GPUs a space is built for: the layouts grow with the count's divisors (1,024 GPUs: ~1,500
# parallel shapes before the other dimensions), and no job today uses more.
MAX_GPUS = 4096
# The most layouts one space may hold, counted before any is built or scored (each scored one costs
# ~70 us and ~2.4 KB): every catalog model fits under it up to MAX_GPUS (the largest, Qwen3-30B-A3B on
# 4,096 GPUs with a global batch of 4,096 rows, has ~3.2 million); a config.json with unusual expert and
# layer counts asks for more (4,096 experts and 512 layers: ~4.8 million) and is refused in one line, in
# under a second, instead of growing for hours.
MAX_SPACE_LAYOUTS = 4_000_000
# A scoring that prunes (tuner.space_pruning) scores at most MAX_SPACE_LAYOUTS of a space planned up to this: its
# shapes are bounded one by one (~1 ms each), not their layouts.
MAX_PLANNED_LAYOUTS = 32_000_000


# Rows per micro-batch (SpaceOptions.rows_per_microbatch None): the powers of two up to what a data-parallel
# rank holds in a step, and that number; above BASE_ROWS (what every space tried before) only while a
# micro-batch holds at most MAX_MICROBATCH_TOKENS tokens per GPU (rows x row length / CP). A larger one gains
# nothing the cost model sees: its GEMMs run at their saturated rate (gemm_half_m is 1,500 rows), so it only
# saves launches while its activations grow (Qwen3.6-35B-A3B on 8 x H200, global batch 128 of 8k rows: none
# of the 55,608 layouts above 64k tokens per GPU fits, and the best at 64k is 24% slower than the best at
# 32k); without the cap that space would grow 2.4x, with it 1.6x. Where the sweep would take a space past
# MAX_SPACE_LAYOUTS (thousands of GPUs, where CP shapes hold few tokens per row), it is BASE_ROWS alone.
BASE_ROWS = (1, 2, 4)
MAX_MICROBATCH_TOKENS = 65536


class SpaceTooLarge(AttuneError, ValueError):
    """A search space with more layouts than MAX_SPACE_LAYOUTS."""


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


SOFTMAX_ATTENTION = (FULL_ATTENTION, SLIDING_ATTENTION, MLA)   # the layer kinds Megatron's core_attn covers


def layer_kinds(model: ModelSpec) -> set[tuple[str, str]]:
    """(attention kind, MLP kind) of every layer the model trains, its MTP layers included."""
    kinds = set(zip(model.layer_types, model.mlp_types))
    if model.num_nextn_predict_layers:
        kinds.add((model.mtp_layer_type, MOE if model.is_moe else DENSE))
    return kinds


def covered_modules(model: ModelSpec) -> set[str]:
    """Megatron's selective-recompute modules that cover some layer of `model`: core_attn its softmax attention
    layers (not Gated DeltaNet), mla_up_proj MLA, mlp dense MLPs, moe_act, moe and shared_experts MoE layers."""
    kinds = layer_kinds(model)
    attention, mlps = {a for a, _ in kinds}, {m for _, m in kinds}
    out = {"layernorm"}
    if attention & set(SOFTMAX_ATTENTION):
        out.add("core_attn")
    if MLA in attention:
        out.add("mla_up_proj")
    if DENSE in mlps:
        out.add("mlp")
    if MOE in mlps:
        out |= {"moe_act", "moe"} | ({"shared_experts"} if model.shared_expert_intermediate_size else set())
    return out


def selective_module_sets(model: ModelSpec, run: ModelSpec | None = None) -> list[tuple[str, ...]]:
    """The selective-recompute module sets of `model`'s layer kinds, each only once. `run`: the model a
    trial trains (fewer layers, see search_space.runner_space); its sets are `model`'s that cover one of its
    layers, each cut to the modules that do where that cut is one of `model`'s sets (so a study's Optuna
    choices hold them), and none that covers what an earlier one does."""
    mlps = {m for _, m in layer_kinds(model)}
    sets = [("core_attn",), ("layernorm",)]
    if MOE in mlps:
        sets += [("moe_act",), ("moe_act", "layernorm"), ("core_attn", "moe_act", "layernorm")]
        if model.shared_expert_intermediate_size:
            sets.append(("moe_act", "layernorm", "shared_experts"))
        sets.append(("moe",))
    else:
        sets += [("mlp",), ("core_attn", "layernorm", "mlp")]
    if model.count(MLA):
        sets.append(("mla_up_proj", "moe_act", "layernorm") if MOE in mlps else ("mla_up_proj",))
    own = covering_sets(sets, model)
    return own if run is None else covering_sets(own, run)


def covering_sets(sets, model: ModelSpec) -> list[tuple[str, ...]]:
    """`sets` without the modules that cover no layer of `model` (where what is left is one of `sets`; else
    the set as it is: the rest are no-ops), without the sets that cover nothing or what an earlier one does."""
    out, seen, covers = [], set(), covered_modules(model)
    for mods in sets:
        covered = tuple(m for m in mods if m in covers)
        if not covered or frozenset(covered) in seen:
            continue
        seen.add(frozenset(covered))
        out.append(covered if covered in sets else tuple(mods))
    return out


def recompute_choices(model: ModelSpec, options: SpaceOptions) -> list[dict]:
    out: list[dict] = [dict(recompute_granularity=None)]
    sets = options.selective_module_sets
    for mods in selective_module_sets(model) if sets is None else sets:
        out.append(dict(recompute_granularity="selective", recompute_modules=tuple(mods)))
    for method in ("uniform", "block"):
        for k in options.full_recompute_layers:
            out.append(dict(recompute_granularity="full", recompute_method=method, recompute_num_layers=k))
    return out


def rows_choices(options: SpaceOptions, workload: Workload, dp: int, cp: int = 1) -> tuple[int, ...]:
    """Rows per micro-batch to try on a shape of data-parallel size `dp` and context-parallel size `cp`: the
    options' own, or (None) every power of two up to the rows a DP rank holds in a step (global batch / DP,
    rounded up) and those rows; above BASE_ROWS only while a micro-batch holds at most MAX_MICROBATCH_TOKENS
    tokens per GPU. A micro-batch of more rows than a rank holds is the same step as one of those rows."""
    if options.rows_per_microbatch is not None:
        return tuple(options.rows_per_microbatch)
    per_rank = max(1, -(-workload.global_batch // dp))
    cap = max(max(BASE_ROWS), MAX_MICROBATCH_TOKENS * cp // workload.seq_len)
    rows = [1 << k for k in range(per_rank.bit_length()) if 1 << k <= min(per_rank, cap)]
    return tuple(rows + ([per_rank] if per_rank <= cap and per_rank not in rows else []))


def study_rows_choices(options: SpaceOptions, workload: Workload, world_size: int) -> list[int]:
    """Every value rows_choices gives a shape on `world_size` GPUs (a study's Optuna choices)."""
    if options.rows_per_microbatch is not None:
        return list(options.rows_per_microbatch)
    ds = divisors(world_size)
    return sorted({r for dp in ds for cp in ds if world_size % (dp * cp) == 0
                   for r in rows_choices(options, workload, dp, cp)})


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


def smallest_global_batch(model: ModelSpec, world_size: int, workload: Workload, stack: Stack,
                          options: SpaceOptions) -> int | None:
    """Where no parallel shape passes the rules, the smallest global batch (rows per step) with which one would:
    every DP rank needs a row, so a batch below the smallest DP leaves none (1,000 GPUs at the default 128 rows).
    None where the batch is not what stands in the way."""
    ample = replace(workload, global_batch=world_size)   # a multiple of every DP the GPUs allow
    dps = [shape_dp(s, world_size) for s in parallel_shapes(model, world_size, ample, stack, options)]
    if not dps:
        return None
    for gbs in sorted({dp * k for dp in dps for k in range(1, world_size // dp + 1)}):
        if gbs > workload.global_batch and any(parallel_shapes(model, world_size, replace(workload, global_batch=gbs),
                                                               stack, options)):
            return gbs
    return None


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


def shape_dp(shape: dict, world_size: int) -> int:
    return world_size // (shape["tp"] * shape["pp"] * shape["cp"])


def space_size(shapes: list[dict], model: ModelSpec, world_size: int, workload: Workload, stack: Stack,
               options: SpaceOptions) -> int:
    """How many layouts the enumeration builds over these parallel shapes (an upper bound on what it yields)."""
    per_shape = len(recompute_choices(model, options)) * len(offload_choices(options))
    rows = {}   # (DP, CP): how many rows per micro-batch (a few pairs over thousands of shapes)
    for s in shapes:
        key = (shape_dp(s, world_size), s["cp"])
        if key not in rows:
            rows[key] = len(rows_choices(options, workload, *key))
    return per_shape * sum(rows[shape_dp(s, world_size), s["cp"]] * len(shape_dispatchers(s, stack, options))
                           for s in shapes)


def bounded_options(shapes: list[dict], model: ModelSpec, world_size: int, workload: Workload, stack: Stack,
                    options: SpaceOptions) -> tuple[SpaceOptions, int]:
    """`options`, with rows per micro-batch BASE_ROWS where the derived ones would take the space over these
    shapes past MAX_SPACE_LAYOUTS; and the size of the space they make (space_size)."""
    size = space_size(shapes, model, world_size, workload, stack, options)
    if options.rows_per_microbatch is None and size > MAX_SPACE_LAYOUTS:
        options = replace(options, rows_per_microbatch=BASE_ROWS)
        size = space_size(shapes, model, world_size, workload, stack, options)
    return options, size


def space_plan(model: ModelSpec, world_size: int, workload: Workload, stack: Stack,
               options: SpaceOptions = SpaceOptions(), limit: int = MAX_SPACE_LAYOUTS
               ) -> tuple[list[dict], SpaceOptions, int]:
    """(parallel shapes, the options the enumeration uses over them (bounded_options), the space's size);
    SpaceTooLarge when the space would exceed `limit` (MAX_PLANNED_LAYOUTS where its scoring prunes)."""
    shapes = list(parallel_shapes(model, world_size, workload, stack, options))
    options, size = bounded_options(shapes, model, world_size, workload, stack, options)
    if size > limit:
        raise SpaceTooLarge(f"the search space of {model.display_name} on {world_size:,} GPUs would hold {size:,} "
                            f"layouts ({len(shapes):,} parallel shapes), more than the {limit:,} one "
                            f"study {'scores' if limit == MAX_SPACE_LAYOUTS else 'plans'}; use fewer GPUs (--gpus) or "
                            f"a model with fewer layers or experts")
    return shapes, options, size


class ShapeRuns:
    """The layouts of one parallel shape (`options` as space_plan gives them) as shape_layouts walks them: the
    product of rows per micro-batch (outermost), recompute, offload and dispatcher choices. A layout is named by its
    rows' index and its template's (the recompute, offload and dispatcher choice): its place in that walk is
    `rows_index * len(templates) + template_index`. A run of siblings (one template, every rows value) can be
    walked on its own, and a layout that is not needed is never built."""

    def __init__(self, shape: dict, model: ModelSpec, world_size: int, workload: Workload, stack: Stack,
                 options: SpaceOptions):
        self.shape, self.model, self.world_size, self.workload, self.stack = shape, model, world_size, workload, stack
        self.rows = rows_choices(options, workload, shape_dp(shape, world_size), shape["cp"])
        self.max_tokens = tuple(max_tokens_per_gpu(rows, shape["cp"], workload.seq_len) for rows in self.rows)
        parts = (recompute_choices(model, options), offload_choices(options), shape_dispatchers(shape, stack, options))
        self.templates = list(product(*parts))
        # a template given twice (the same fields) runs the same layouts: the first's index names both
        self.same_as = _first_of_each(product(*_part_keys(parts)))
        # templates whose layouts hold the same memory (they differ only in fields memory does not read): one that
        # does not fit at some micro-batch rules out the other's at that micro-batch and above, as its own siblings
        self.same_memory_as = _first_of_each(product(*_part_keys(parts, MEMORY_BLIND_FIELDS)))
        # per template, one whose layouts hold no more memory at each micro-batch (cost_model.memory's
        # lighter_optimizer), or None: where that one does not fit, this one does not
        rcs, offs, disps = parts
        lighter = [lighter_optimizer(off) for off in offs]
        at = {(r, o, d): i for i, (r, o, d) in enumerate(product(range(len(rcs)), range(len(offs)), range(len(disps))))}
        self.lighter_than = [None if lighter[o] is None or lighter[o] not in offs else at[r, offs.index(lighter[o]), d]
                             for r, o, d in at]
        self.broken = None   # the shape's own rules, asked of its first layout: the same for all of them
        # per template, its first layout built and whether it passes the template's rules (rules.template_violations):
        # its siblings are that layout with another micro-batch (Layout.with_microbatch), asked the batching rules
        self.built: dict[int, tuple[Layout, bool]] = {}

    def layout(self, rows_index: int, template_index: int) -> Layout | None:
        """The layout, or None where it is not valid (a broken shape: `broken` is True after the first one)."""
        if self.broken:
            return None
        rows, workload = self.rows[rows_index], self.workload
        built = self.built.get(template_index)
        if built is not None:
            first, passes = built
            if not passes:
                return None
            layout = first.with_microbatch(self.max_tokens[rows_index], rows)
            return None if microbatch_violations(layout, workload) else layout
        rc, off, disp = self.templates[template_index]
        try:
            if self.built:   # the shape's first layout with this template's choices (only their checks run)
                layout = next(iter(self.built.values()))[0].with_choices(self.max_tokens[rows_index], rows,
                                                                        dispatcher=disp, **rc, **off)
            else:
                layout = Layout(self.world_size, **self.shape, max_tokens_per_gpu=self.max_tokens[rows_index],
                                rows_per_microbatch=rows, dispatcher=disp, **rc, **off)
        except InvalidLayout:
            return None
        model, stack = self.model, self.stack
        if self.broken is None:
            self.broken = bool(shape_violations(layout, model, workload, stack))
            if self.broken:
                return None
        passes = not template_violations(layout, model, stack, workload)
        self.built[template_index] = (layout, passes)
        return layout if passes and not microbatch_violations(layout, workload) else None


def _part_keys(parts: tuple, leave_out: tuple = ()) -> tuple:
    """The recompute, offload and dispatcher choices as keys (their fields, less `leave_out`), in their order."""
    rcs, offs, disps = parts
    return ([tuple(sorted(rc.items())) for rc in rcs],
            [tuple(sorted(i for i in off.items() if i[0] not in leave_out)) for off in offs], disps)


def _first_of_each(keys) -> list[int]:
    """Per key, the index of the first equal key."""
    first: dict = {}
    return [first.setdefault(key, i) for i, key in enumerate(keys)]


def shape_layouts(shape: dict, model: ModelSpec, world_size: int, workload: Workload, stack: Stack,
                  options: SpaceOptions) -> Iterator[Layout]:
    """Every valid layout of one parallel shape (`options` as space_plan gives them)."""
    runs = ShapeRuns(shape, model, world_size, workload, stack, options)
    templates = range(len(runs.templates))
    for ri in range(len(runs.rows)):
        for ti in templates:
            layout = runs.layout(ri, ti)
            if runs.broken:
                return
            if layout is not None:
                yield layout


def enumerate_layouts(model: ModelSpec, world_size: int, workload: Workload, stack: Stack,
                      options: SpaceOptions = SpaceOptions()) -> Iterator[Layout]:
    """Every valid layout; SpaceTooLarge (before the first one) when the space would exceed MAX_SPACE_LAYOUTS."""
    shapes, options, _ = space_plan(model, world_size, workload, stack, options)
    for shape in shapes:
        yield from shape_layouts(shape, model, world_size, workload, stack, options)
