"""predict(model, gpu, workload, layout): memory, step time, throughput and cost of one layout.

A pure function of its arguments (the constants come from a cached data file): no other I/O, no
global state, fast enough to score every layout of a search space.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter

from cost_model.nouns.quick_init import quick_init
from cost_model.memo import IdentityMemo
from cost_model.nouns.batching import rows_per_microbatch, slime_rows_held, slime_schedule, tokens_per_microbatch
from cost_model.constants import Constants, default_constants
from cost_model.nouns.hardware import GpuSpec, placed
from cost_model.nouns.layout import Layout
from cost_model.memory import (MemoryBreakdown, MemoryInputs, host_memory_gib_per_node, most_loaded_params,
                               peak_memory)
from cost_model import memory_fit
from cost_model.activations import in_flight_microbatches
from cost_model.memory_fit import BORDERLINE, DOES_NOT_FIT, FITS, borderline_reason, fit_probability, fit_verdict
from cost_model.allocator_strain import allocator_remap_s, remap_seconds
from cost_model.metrics import format_mfu
from cost_model.metrics import usd_per_million_tokens
from cost_model.nouns.model_spec import ModelSpec
from cost_model.profile import HardwareProfile, shipped_profile
from cost_model.rates import rates_for
from cost_model.nouns.runtime import Runtime, default_runtime
from cost_model.stages import layout_rank_layers
from cost_model.step_time import StepContext, step_breakdown
from cost_model.term_sources import term_sources
from cost_model.vision import VisionWork
from cost_model.nouns.workload import Workload, WorkloadError


@quick_init
@dataclass(frozen=True)
class Prediction:
    fits: bool                          # a plain fit: fit_verdict "fits" (cost_model/memory_fit.py)
    reasons: tuple[str, ...]            # why it does not fit, or why it is borderline; empty when it fits
    memory: MemoryBreakdown             # GiB on the most-loaded GPU, device-level (see cost_model.memory)
    gpu_memory_gib: float               # usable HBM of one GPU: its visible capacity
    host_memory_gib_per_node: float
    host_memory_capacity_gib: float
    step_time_s: float
    breakdown: dict = field(default_factory=dict)  # seconds per term; sums to step_time_s
    tokens_per_s_per_gpu: float = 0.0
    mfu: float = 0.0
    usd_per_million_tokens: float = 0.0
    num_microbatches: int = 0
    tokens_per_microbatch: float = 0.0
    source: str = ""
    # P(the layout fits) under the memory model's measured error, and its verdict: "fits", "borderline"
    # or "does not fit" (cost_model/memory_fit.py); the defaults follow `fits` for a Prediction built
    # without them
    fit_probability: float | None = None
    fit_verdict: str = ""
    # the step's inputs, kept so that `term_sources` can be worked out when asked (scoring a search space
    # never asks); None for a Prediction built without them
    context: StepContext | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.fit_probability is None:
            object.__setattr__(self, "fit_probability", 1.0 if self.fits else 0.0)
        if not self.fit_verdict:
            object.__setattr__(self, "fit_verdict", FITS if self.fits else DOES_NOT_FIT)

    @cached_property
    def term_sources(self) -> dict:
        """Where each non-zero term of `breakdown` comes from, one line each: "measured: ...", "modelled: ..."
        or "fitted: ..." (cost_model.term_sources.term_sources); empty without a context."""
        return term_sources(self.context, self.breakdown) if self.context is not None else {}

    @property
    def peak_memory_gib(self) -> float:
        return self.memory.total

    @property
    def borderline(self) -> bool:
        return self.fit_verdict == BORDERLINE

    @property
    def may_fit(self) -> bool:
        """A plain fit or a borderline one: worth a trial where the risk is weighed."""
        return self.fit_verdict != DOES_NOT_FIT

    @property
    def under_limit(self) -> bool:
        """The point prediction fits: the predicted peak within the usable memory and the host memory
        within the node's, whatever the memory model's error."""
        return (self.memory.total <= self.gpu_memory_gib
                and self.host_memory_gib_per_node <= self.host_memory_capacity_gib)

    def figures_at(self, tokens_per_s_per_gpu: float) -> tuple[float, float, float]:
        """(step seconds, MFU, $/1M tokens) of this layout's step were it to run at `tokens_per_s_per_gpu` (its tokens
        per step unchanged): what a figure other than this prediction's own, such as the hypotheses' posterior median,
        implies; the breakdown stays this prediction's."""
        if self.tokens_per_s_per_gpu <= 0 or tokens_per_s_per_gpu <= 0:
            return self.step_time_s, self.mfu, self.usd_per_million_tokens
        ratio = tokens_per_s_per_gpu / self.tokens_per_s_per_gpu
        return self.step_time_s / ratio, self.mfu * ratio, self.usd_per_million_tokens / ratio

    @property
    def fit_label(self) -> str:
        """"fits", "borderline (60%)" or "does not fit"."""
        return memory_fit.fit_label(self.fit_verdict, self.fit_probability)

    def to_dict(self) -> dict:
        return {
            "kind": "predicted",
            "source": self.source,
            "fits": self.fits,
            "fit_probability": self.fit_probability,
            "fit_verdict": self.fit_verdict,
            "reasons": list(self.reasons),
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "step_time_s": self.step_time_s,
            "peak_memory_gib": self.peak_memory_gib,
            "gpu_memory_gib": self.gpu_memory_gib,
            "memory_gib": self.memory.as_dict(),
            "memory_sources": dict(self.memory.sources),
            "host_memory_gib_per_node": self.host_memory_gib_per_node,
            "host_memory_capacity_gib": self.host_memory_capacity_gib,
            "mfu": self.mfu,
            "usd_per_million_tokens": self.usd_per_million_tokens,
            "num_microbatches": self.num_microbatches,
            "tokens_per_microbatch": self.tokens_per_microbatch,
            "breakdown": dict(self.breakdown),
            "term_sources": dict(self.term_sources),
        }


def microbatches(layout: Layout, workload: Workload) -> tuple[float, int, float]:
    """(tokens of one micro-batch on each GPU, its CP shard, as the step's time sees them; micro-batches per DP
    rank in one step; tokens of the largest micro-batch, which sets the memory peak). slime packs the step's rows
    into bins of --max-tokens-per-gpu and deals them to the DP ranks (`slime_schedule`): the time is the mean
    micro-batch of the rows the step waits for, not a full bin per micro-batch. Megatron's fixed micro-batch
    (--framework megatron, the runner) holds `rows` rows each."""
    return microbatch_split(layout.max_tokens_per_gpu, layout.dp, layout.pp, layout.vpp, layout.cp, layout.ep,
                            workload)


def in_flight_share(max_tokens: int, dp: int, pp: int, vpp: int, cp: int, workload: Workload,
                    in_flight: float) -> float:
    """`in_flight` micro-batches of a pipeline's first stage in units of the largest micro-batch: slime's uneven bins
    hold fewer rows than that many of the largest (a rank's 4- and 2-row micro-batches hold 6 rows, not 8).
    Megatron's fixed micro-batch: `in_flight` itself."""
    if workload.framework != "slime" or in_flight <= 1:
        return in_flight
    rows = rows_per_microbatch(max_tokens, cp, workload.seq_len)
    held = slime_rows_held(workload.global_batch, dp, rows, dp * (pp if vpp > 1 else 1))
    whole = min(int(in_flight), len(held))
    part = in_flight - whole if whole < len(held) else 0.0
    count = held[whole - 1] + (part * (held[whole] - held[whole - 1]) if part else 0.0)
    return count / held[0]


def microbatch_split(max_tokens: int, dp: int, pp: int, vpp: int, cp: int, ep: int,
                     workload: Workload) -> tuple[float, int, float]:
    """`microbatches` from the fields it reads (a space's scoring asks it of layouts it has not built)."""
    rows = rows_per_microbatch(max_tokens, cp, workload.seq_len)
    if workload.framework == "slime":
        align = dp * (pp if vpp > 1 else 1)   # microbatch_group_size_per_vp_stage: PP
        work, n_mb, largest = slime_schedule(workload.global_batch, dp, rows, align, ep > 1)
        return (tokens_per_microbatch(work / n_mb, cp, workload.seq_len), n_mb,
                tokens_per_microbatch(largest, cp, workload.seq_len))
    tokens = tokens_per_microbatch(rows, cp, workload.seq_len)
    n_mb = -(-(-(-workload.global_batch // dp)) // rows)
    if vpp > 1:  # the interleaved schedule runs a multiple of PP micro-batches
        n_mb = -(-n_mb // pp) * pp
    return tokens, n_mb, tokens


def vision_work(model: ModelSpec, workload: Workload, layout: Layout) -> VisionWork | None:
    """The vision encoder's work in one micro-batch on a first-stage GPU; None for a text workload."""
    if not workload.images_per_row:
        return None
    if model.vision is None:
        raise WorkloadError(f"{model.display_name} has no vision encoder attune models (a Qwen-VL-style "
                            f"vision_config, with 'depth'; another encoder's is not read and only the language model "
                            f"is priced): images_per_row must be 0, got {workload.images_per_row}")
    v = model.vision
    if workload.image_size < v.patch_size:
        raise WorkloadError(f"image_size {workload.image_size} px is smaller than one {v.patch_size}-px patch of "
                            f"{model.display_name}'s vision encoder")
    per_image = v.patches_per_image(workload.image_size)
    row_tokens = workload.images_per_row * per_image // v.spatial_merge_size ** 2
    if row_tokens > workload.seq_len:   # each image's merged patches are placeholder tokens of the row
        raise WorkloadError(f"{workload.images_per_row} image(s) of {workload.image_size} px are {row_tokens:,} "
                            f"image tokens, more than the {workload.seq_len:,}-token row that holds them")
    rows = rows_per_microbatch(layout.max_tokens_per_gpu, layout.cp, workload.seq_len)
    return VisionWork(model.vision, rows * workload.images_per_row * per_image / layout.cp, per_image)


def workload_note(workload: Workload) -> str:
    """What the prediction assumed beyond a full-training text step, for its source line ('' when nothing)."""
    parts = []
    if workload.cuda_graphs != "none":
        parts.append(f"CUDA graphs {workload.cuda_graphs}")
    if workload.frozen_weights:
        parts.append("LoRA: frozen base, no weight gradients")
    if workload.images_per_row:
        n, side = workload.images_per_row, workload.image_size
        parts.append(f"{n} image{'s' if n > 1 else ''} of {side}x{side} px per row through the vision encoder")
    return "".join(f"; {p}" for p in parts)


def routing_imbalance(model: ModelSpec, workload: Workload, layout: Layout, c: Constants) -> float:
    """Tokens the busiest expert rank receives over the mean: natural routing is uneven, and the more EP
    ranks the experts are spread over, the more one of them gets."""
    if model.is_moe and workload.routing == "natural":
        return 1.0 + (c.routing_imbalance_natural - 1.0) * (1.0 - 1.0 / layout.ep)
    return 1.0


def fit_reasons(memory: MemoryBreakdown, capacity: float, host: float, gpu: GpuSpec) -> list[str]:
    """Why the layout does not fit the GPU (`capacity` GiB usable) or the node's host memory."""
    reasons = []
    if memory.total > capacity:
        m = memory
        reasons.append(f"GPU memory {m.total:.1f} GiB exceeds {capacity:.1f} GiB usable of {gpu.display_name} "
                       f"(weights {m.weights:.1f}, grads {m.grads:.1f}, optimizer {m.optimizer:.1f}, "
                       f"activations {m.activations:.1f}, loss path {m.loss_path:.1f}, optimizer step "
                       f"{m.optimizer_step:.1f}, allocator reserve {m.allocator_reserve:.1f}, outside PyTorch "
                       f"{m.outside_pytorch:.1f})")
    if host > gpu.host_memory_gib_per_node:
        reasons.append(f"host memory {host:.0f} GiB per node exceeds the node's {gpu.host_memory_gib_per_node:.0f} GiB")
    return reasons


def runner_components(rt: Runtime, profile: HardwareProfile | None):
    """The measured components that price the megatron runner's own stack (None: another stack, or a profile
    that has not measured them: then the fitted Megatron terms price it)."""
    if not rt.profiled or profile is None:
        return None
    return profile.runner


def _step_context(model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout, c: Constants,
                  profile: HardwareProfile | None, rt: Runtime) -> StepContext:
    tokens, n_mb, largest = microbatches(layout, workload)
    vision = vision_work(model, workload, layout)
    rates, imbalance, ranks, dense, expert, runner, ranks_per_host = _shape_context(
        model, placed(gpu, layout.world_size), workload, layout, c, profile, rt, vision is not None)
    return StepContext(ranks, model, rates, layout, tokens, n_mb, workload.seq_len, imbalance, c, workload.framework,
                       dense, expert, rt.gdn_sharded, workload.cuda_graphs, workload.frozen_weights, vision,
                       rt.per_expert_gemm_calls, runner, ranks_per_host, largest)


# Scoring a space builds a context for every layout, and the layouts of one parallel shape share most of it: the
# rates, the routing imbalance, the ranks' layers and the most-loaded rank's parameters read the layout only through
# these fields. Memoized with the objects held by the memo (keyed by identity, as the rates are).
_SHAPE_FIELDS = ("pp", "vpp", "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                 "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                 "pipeline_model_parallel_layout", "tp", "ep", "etp", "world_size")
_shape_fields = attrgetter(*_SHAPE_FIELDS)
_SHAPE_MEMO = IdentityMemo(20_000)


def _shape_context(model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout, c: Constants,
                   profile: HardwareProfile | None, rt: Runtime, with_vision: bool) -> tuple:
    held = (model, gpu, workload, c, profile, rt)
    key = (tuple(map(id, held)), _shape_fields(layout), with_vision)
    hit = _SHAPE_MEMO.get(key)
    if hit is None:
        rates = rates_for(gpu, c, workload.precision, profile)
        imbalance = routing_imbalance(model, workload, layout, c)
        ranks = layout_rank_layers(model, layout, with_vision=with_vision)
        # Static memory and the optimizer step are set by the rank holding the most parameters.
        dense, expert = most_loaded_params(ranks, layout, rt.gdn_sharded)
        hit = _SHAPE_MEMO.put(key, held, (rates, imbalance, ranks, dense, expert, runner_components(rt, profile),
                                          min(layout.world_size, gpu.gpus_per_node)))
    return hit[1]


# Every layout of a space has the same source line: built once per (model, GPU, workload, constants, rates, runtime),
# the objects held by the memo.
_SOURCE_MEMO = IdentityMemo(256)


def _source(model: ModelSpec, gpu: GpuSpec, workload: Workload, c: Constants, rates, rt: Runtime) -> str:
    held = (model, gpu, workload, c, rates, rt)
    key = tuple(map(id, held))
    hit = _SOURCE_MEMO.get(key)
    if hit is None:
        source = f"attune cost model {c.version}, {gpu.display_name} {rates.source}, runtime {rt.name}"
        if model.has_linear_attention:
            source += f"; GDN kernel {rates.gdn_source}"
        source += workload_note(workload)
        hit = _SOURCE_MEMO.put(key, held, source)
    return hit[1]


def step_time_only(model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout,
                   constants: Constants | None = None, profile: HardwareProfile | None = None,
                   precision_aware_optimizer: bool = True, runtime: Runtime | None = None) -> tuple[float, int]:
    """(step seconds, micro-batches) as `predict` computes them without the memory model (what ranking a layout
    under another set of time constants needs): so without the allocator_remap term of a MoE layout at the limit."""
    c = constants or default_constants()
    profile = profile or shipped_profile(gpu.name)
    rt = runtime or default_runtime(workload.framework, precision_aware_optimizer)
    ctx = _step_context(model, gpu, workload, layout, c, profile, rt)
    return sum(step_breakdown(ctx).values()), ctx.num_microbatches


@quick_init
@dataclass(frozen=True)
class MemoryVerdict:
    """The memory side of a prediction alone (what deciding whether a layout may fit needs)."""

    memory: MemoryBreakdown
    capacity: float            # usable GiB of one GPU
    host: float                # host GiB per node
    fit_probability: float
    fit_verdict: str
    context: StepContext = field(default=None, compare=False, repr=False)   # what `predict` goes on from

    @property
    def may_fit(self) -> bool:
        return self.fit_verdict != DOES_NOT_FIT


def _memory_verdict(ctx: StepContext, gpu: GpuSpec, workload: Workload, profile: HardwareProfile | None, rt: Runtime,
                    precision_aware_optimizer: bool) -> MemoryVerdict:
    model, layout, c = ctx.model, ctx.layout, ctx.c
    gpu = placed(gpu, layout.world_size)   # the GPUs a node holds as slime places them
    routed_rows_per_token = model.num_experts_per_tok * ctx.imbalance * layout.etp
    in_flight = in_flight_share(layout.max_tokens_per_gpu, layout.dp, layout.pp, layout.vpp, layout.cp, workload,
                                in_flight_microbatches(layout, ctx.num_microbatches))
    inputs = MemoryInputs(workload.precision, ctx.largest_tokens, routed_rows_per_token, ctx.num_microbatches, rt, gpu,
                          profile.device_memory if profile is not None else None, precision_aware_optimizer,
                          workload.frozen_weights, ctx.vision, in_flight)
    memory = peak_memory(ctx.ranks, model, layout, inputs, c)
    host = host_memory_gib_per_node(gpu, layout, workload.framework, ctx.dense, ctx.expert, c, workload.frozen_weights)
    capacity = memory.usable
    # the GPU side under the memory model's measured error; a node short of host memory does not fit
    p_fit = 0.0 if host > gpu.host_memory_gib_per_node else fit_probability(memory.total, capacity, c.memory_error_sd)
    return MemoryVerdict(memory, capacity, host, p_fit, fit_verdict(p_fit), ctx)


def memory_verdict(model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout,
                   constants: Constants | None = None, profile: HardwareProfile | None = None,
                   precision_aware_optimizer: bool = True, runtime: Runtime | None = None) -> MemoryVerdict:
    """The memory side of `predict` exactly as it computes it, without the step time: scoring a space asks
    this first and prices the step only of the layouts that may fit."""
    c = constants or default_constants()
    profile = profile or shipped_profile(gpu.name)
    rt = runtime or default_runtime(workload.framework, precision_aware_optimizer)
    ctx = _step_context(model, gpu, workload, layout, c, profile, rt)
    return _memory_verdict(ctx, gpu, workload, profile, rt, precision_aware_optimizer)


def predict(model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout,
            constants: Constants | None = None, profile: HardwareProfile | None = None,
            precision_aware_optimizer: bool = True, runtime: Runtime | None = None) -> Prediction:
    """`profile` defaults to the profile shipped for the GPU type; without one, datasheet rates apply.
    `precision_aware_optimizer`: False for a stack without Transformer Engine (standard fp32 optimizer).
    `runtime`: the stack's memory behaviour (cost_model.nouns.runtime); by default the framework's, or the
    megatron runner's without the precision-aware optimizer."""
    c = constants or default_constants()
    profile = profile or shipped_profile(gpu.name)
    rt = runtime or default_runtime(workload.framework, precision_aware_optimizer)
    ctx = _step_context(model, gpu, workload, layout, c, profile, rt)
    return _prediction(ctx, gpu, workload, rt, None, precision_aware_optimizer, profile)


def predict_from_verdict(verdict: MemoryVerdict, gpu: GpuSpec, workload: Workload,
                         precision_aware_optimizer: bool = True, runtime: Runtime | None = None) -> Prediction:
    """`predict` for the arguments `memory_verdict` gave `verdict` for, when the caller asked it first: its memory
    and step context (model, layout, constants, profile) are not computed again."""
    rt = runtime or default_runtime(workload.framework, precision_aware_optimizer)
    return _prediction(verdict.context, gpu, workload, rt, verdict)


def _prediction(ctx: StepContext, gpu: GpuSpec, workload: Workload, rt: Runtime, verdict: MemoryVerdict | None,
                precision_aware_optimizer: bool = True, profile: HardwareProfile | None = None) -> Prediction:
    """`predict` on from its step context; the memory side is `verdict`, else worked out here."""
    model, layout, c = ctx.model, ctx.layout, ctx.c
    rates, tokens, n_mb = ctx.rates, ctx.tokens, ctx.num_microbatches
    breakdown = step_breakdown(ctx)
    mv = verdict or _memory_verdict(ctx, gpu, workload, profile, rt, precision_aware_optimizer)
    memory, capacity, host, p_fit, fit = mv.memory, mv.capacity, mv.host, mv.fit_probability, mv.fit_verdict
    # a MoE layout with no room for the allocator's cache maps memory again every micro-batch (runner's stack)
    breakdown["allocator_remap"] = remap = allocator_remap_s(ctx, memory)
    step_time = sum(breakdown.values())
    reasons = fit_reasons(memory, capacity, host, gpu)
    if fit == BORDERLINE:
        # a MoE layout's note says what retrying once a micro-batch costs, and whether the step prices it
        moe = model.has_moe_layers
        strain = (remap or remap_seconds(ctx), step_time, remap > 0) if moe else None
        reasons.append(borderline_reason(memory.total, capacity, c.memory_error_sd, p_fit, moe=moe, strain=strain))

    tokens_per_s_per_gpu = workload.tokens_per_step / step_time / layout.world_size
    mfu = format_mfu(model.params.active_non_embedding, tokens_per_s_per_gpu, gpu)   # the format's: bf16 peak
    usd = usd_per_million_tokens(gpu.usd_per_gpu_hour, tokens_per_s_per_gpu)
    source = _source(model, gpu, workload, c, rates, rt)
    return Prediction(
        fits=fit == FITS, reasons=tuple(reasons), memory=memory, gpu_memory_gib=capacity,
        host_memory_gib_per_node=host, host_memory_capacity_gib=gpu.host_memory_gib_per_node,
        step_time_s=step_time, breakdown=breakdown, tokens_per_s_per_gpu=tokens_per_s_per_gpu, mfu=mfu,
        usd_per_million_tokens=usd, num_microbatches=n_mb, tokens_per_microbatch=tokens, source=source,
        fit_probability=p_fit, fit_verdict=fit, context=ctx,
    )
