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
from cost_model.step_time import layer_launch_s, pass_launch_s, slowest_launch_passes, step_breakdown
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
