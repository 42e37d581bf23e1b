"""Optimistic bounds: tokens/s/GPU that no layout of a parallel shape can beat, under any of the hypotheses.

Scoring a very large space (hundreds of GPUs) skips the parallel shapes whose ceiling is below layouts already
scored (tuner.space_pruning). A ceiling must hold for every layout of the shape and every hypothesis the agent
weighs, so it is the cost model itself under constants no hypothesis undercuts, on the layouts of the shape that
run fastest in what the model sees:

- a hypothesis changes the per-pass launch time, the flex dispatcher's factor on it and the CPU-Adam share
  (Hypothesis.constants), and adds a term >= 0 (Hypothesis.extra_s). The launch term grows with the launch time
  and the factor (max(0, launch - pass)), the CPU-Adam share prices the offload term only: the smallest launch
  time and factor of them all, and no offload term, price a step no hypothesis prices lower;
- recompute only adds: its own term, launch passes (2 + a share) and per-expert calls (more passes); nothing
  else of a micro-batch reads it (step_time, layer_time): the layout without recompute is the fastest of its
  rows and dispatcher;
- the optimizer's GPU step shrinks with the offloaded fraction, so the largest one the space tries prices it
  lowest; the offload term it adds is left out.

A shape's layouts of one micro-batch size and dispatcher are priced no faster than that layout (`ceilings_of`).

Those floors have a cheaper floor of their own (`floors_below`), from which the shapes are put in order: the
slowest rank's micro-batch is at least the ranks' mean, and without recompute each term of a rank's micro-batch
adds per layer of a kind, per LM head pass and once for the encoder, so the ranks' terms add up to those of one
rank holding all their layers (`all_layers`): the same for every PP, VPP and split of a shape's TP, CP and EP.

Memory has a floor too (`memory_floor_gib`): a layout's peak holds at least its static memory (weights, gradients,
optimizer state) on each rank, with the allocator's reserve on it and what lies outside PyTorch; activations, the
loss path and the optimizer step's temporary only add. The static memory reads neither the micro-batch nor recompute.

Pure functions: no I/O, no globals.
"""
from __future__ import annotations

from dataclasses import replace

from cost_model.constants import Constants
from cost_model.nouns.hardware import GpuSpec
from cost_model.device_memory import overheads
from cost_model.nouns.layout import Layout
from cost_model.memory import MemoryInputs, _rank_static
from cost_model.memory_fit import DOES_NOT_FIT, fit_probability, fit_verdict
from cost_model.nouns.units import GIB
from cost_model.nouns.model_spec import ModelSpec
from cost_model.predict import _step_context, microbatches
from cost_model.profile import HardwareProfile, shipped_profile
from cost_model.nouns.runtime import default_runtime
from cost_model.stages import RankLayers
from cost_model.step_time import (_rank_fields, _sync_and_overhead, ep_overlap_share, layer_launch_s,
                                  optimizer_time, pass_launch_s, rank_microbatch_terms, slowest_launch_passes,
                                  step_breakdown)
from cost_model.nouns.workload import Workload

# A ceiling is compared with figures summed in another order: a relative margin far above rounding.
ROUNDING_MARGIN = 1e-9


def optimistic_constants(c: Constants, hypotheses) -> Constants:
    """`c` with the smallest launch time and flex factor of `c` and every hypothesis (Hypothesis.constants)."""
    launch = min([c.layer_launch_overhead_s] + [h.layer_launch_overhead_s for h in hypotheses])
    flex = min([c.flex_overhead_factor] + [h.flex_overhead_factor for h in hypotheses])
    return replace(c, layer_launch_overhead_s=launch, flex_overhead_factor=flex)


def launch_key(c: Constants, layout: Layout, workload: Workload) -> tuple:
    """What of `c` a step floor reads beyond what all judges share: the launch time per layer pass and the flex
    factor on it (cost_model.step_time), as the step reads them."""
    launch = c.layer_launch_overhead_s if workload.framework == "slime" else c.megatron_layer_launch_overhead_s
    if launch == 0:
        return (0.0, None)
    return (launch, c.flex_overhead_factor if layout.dispatcher == "flex" else None)


def step_floor_s(model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout, constants: Constants,
                 profile: HardwareProfile | None = None) -> float:
    """`layout`'s step seconds under `constants` without its offload term (predict's default stack)."""
    profile = profile or shipped_profile(gpu.name)
    ctx = _step_context(model, gpu, workload, layout, constants, profile, default_runtime(workload.framework, True))
    return sum(v for k, v in step_breakdown(ctx).items() if k != "offload")


def all_layers(ranks: tuple[RankLayers, ...]) -> RankLayers:
    """One rank holding every layer, LM head pass and encoder of `ranks` (its parameters left at 0: a rank's micro-batch
    terms do not read them)."""
    counts: dict = {}
    for r in ranks:
        for attn_kind, mlp_kind, n in r.kinds:
            counts[attn_kind, mlp_kind] = counts.get((attn_kind, mlp_kind), 0) + n
    heads = sum(int(r.has_head) + r.mtp_layers for r in ranks)
    return RankLayers(kinds=tuple((a, m, n) for (a, m), n in sorted(counts.items())),
                      num_layers=sum(r.num_layers for r in ranks), has_embedding=True, has_head=heads > 0,
                      attention=0, linear_attention=0, dense_mlp=0, shared_expert=0, routed_experts=0, replicated=0,
                      embedding=0, lm_head=0, mtp_layers=max(heads - 1, 0), vision=max(r.vision for r in ranks))


def floors_below(fastest: list[Layout], model: ModelSpec, gpu: GpuSpec, workload: Workload, constants: Constants,
                 profile: HardwareProfile | None = None, memo: dict | None = None) -> list[float] | None:
    """Below each step_floor_s of `fastest` (one parallel shape's layouts without recompute and of one optimizer
    choice), cheaper: the micro-batches and the bubble at the ranks' mean (all_layers over PP), the sync, the
    optimizer's step and the step's overhead (the shape's own), no p2p sends (>= 0). `memo`: the caller's for one
    model, GPU, workload, set of constants and profile: the whole-model rank's seconds per what a micro-batch reads
    of the layout. None where it does not hold: recompute, a runner's measured step, a VLM's encoder (its work
    reads the rows)."""
    profile = profile or shipped_profile(gpu.name)
    rt, memo = default_runtime(workload.framework, True), {} if memo is None else memo
    first = fastest[0]
    ctx = _step_context(model, gpu, workload, first, constants, profile, rt)
    if ctx.runner is not None or ctx.vision is not None or any(x.recompute_granularity for x in fastest):
        return None
    whole = all_layers(ctx.ranks[:first.pp])
    dense, expert = ctx.trained_params
    dp_comm, overhead = _sync_and_overhead(ctx)
    outside = dp_comm + optimizer_time(first, ctx.rates, dense, expert) + overhead
    out = []
    for layout in fastest:
        tokens, n_mb, _ = microbatches(layout, workload)
        overlap = ep_overlap_share(layout, n_mb)
        # what rank_microbatch_terms reads that differs between the shapes of one scoring
        key = (_rank_fields(layout), tokens, overlap, whole.kinds, whole.has_head, whole.mtp_layers, whole.vision)
        seconds = memo.get(key)
        if seconds is None:
            at = _step_context(model, gpu, workload, layout, constants, profile, rt)
            seconds = memo[key] = sum(rank_microbatch_terms(at, whole, overlap).values())
        weight = n_mb + (layout.pp - 1) / layout.vpp
        out.append((weight * seconds / layout.pp + outside) * (1 - ROUNDING_MARGIN))
    return out


def launch_parts(model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout, constants: Constants,
                 profile: HardwareProfile | None = None) -> tuple | None:
    """What `launch_floor_s` reads of `layout`'s step floor under `constants`: the weight of its slowest rank's
    micro-batch in the step (the micro-batches and the bubble's share), that rank's launch passes and the launch time
    per pass they were priced at. None for a step composed from a runner's measured components."""
    profile = profile or shipped_profile(gpu.name)
    ctx = _step_context(model, gpu, workload, layout, constants, profile, default_runtime(workload.framework, True))
    if ctx.runner is not None:
        return None
    return ctx.num_microbatches + (layout.pp - 1) / layout.vpp, slowest_launch_passes(ctx), layer_launch_s(ctx)


def launch_floor_s(floor: float, parts: tuple, constants: Constants, layout: Layout, workload: Workload) -> float:
    """Below `layout`'s step_floor_s under `constants`, from its `floor` under constants that differ only in the
    launch time per layer pass and the flex factor on it (`parts`: launch_parts under those). No other term reads
    the launch time, and the rank slowest there is at least as slow here: its launch term grows by its passes'
    exposed launch time here over there (micro_batch_constants.with_launch), times its weight in the step. Summed in
    another order than the floor: the margin keeps it below."""
    weight, passes, at = parts
    launch = pass_launch_s(constants, workload.framework, workload.cuda_graphs, layout.dispatcher)
    gain = sum(n * p * (max(0.0, launch - gpu_pass) - max(0.0, at - gpu_pass)) for n, p, gpu_pass in passes)
    return (floor + weight * gain) * (1 - ROUNDING_MARGIN)


def ceilings_of(floors: list[float], fastest: list[Layout], workload: Workload, hypothesis=None,
                counts: list[int] | None = None) -> list[float]:
    """Tokens/s/GPU above any layout of a shape with the micro-batch size and dispatcher of each of `fastest` (its
    layouts without recompute at the largest offloaded fraction); `floors` their step_floor_s under constants no
    judge undercuts (optimistic_constants) or under one hypothesis's (Hypothesis.constants), then with its extra
    term (Hypothesis.extra_s: it reads the layout only through its micro-batches, shape and dispatcher). `counts`:
    the layouts' micro-batches per step where the caller has them (a shape's are asked under every hypothesis)."""
    if hypothesis is not None and counts is None:
        counts = [microbatches(layout, workload)[1] for layout in fastest]
    seconds = floors if hypothesis is None else [
        floor + hypothesis.extra_s(n_mb, layout, workload) for floor, layout, n_mb in zip(floors, fastest, counts)]
    return [workload.tokens_per_step / s / layout.world_size * (1 + ROUNDING_MARGIN)
            for s, layout in zip(seconds, fastest)]


def memory_floor_gib(model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout, constants: Constants,
                     profile: HardwareProfile | None = None) -> tuple[float, float]:
    """(GiB no layout of `layout`'s shape, dispatcher and optimizer choice (offload, Adam moments' dtype) stays under,
    whatever its micro-batch and recompute; the GPU's usable GiB), for predict's default stack."""
    profile = profile or shipped_profile(gpu.name)
    rt = default_runtime(workload.framework, True)
    ctx = _step_context(model, gpu, workload, layout, constants, profile, rt)
    device = profile.device_memory if profile is not None else None
    inputs = MemoryInputs(workload.precision, ctx.tokens, 0.0, ctx.num_microbatches, rt, gpu, device, True,
                          workload.frozen_weights, ctx.vision)
    fixed = overheads(layout, rt, model.is_moe, 0.0, gpu, device, constants, model.has_linear_attention)
    static = max(sum(_rank_static(model, layout, ctx.ranks, i, inputs)[:3]) for i in range(len(ctx.ranks))) / GIB
    return (static + static * fixed.reserve_fraction + fixed.outside_pytorch) * (1 - ROUNDING_MARGIN), fixed.usable


def cannot_fit(floor_gib: float, usable_gib: float, constants: Constants) -> bool:
    """Whether a peak of at least `floor_gib` is predicted not to fit (Prediction.fit_verdict)."""
    return fit_verdict(fit_probability(floor_gib, usable_gib, constants.memory_error_sd)) == DOES_NOT_FIT
