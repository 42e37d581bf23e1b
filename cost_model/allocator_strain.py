"""The step time a MoE layout loses on the megatron runner when its allocator's cache does not fit.

A MoE layer allocates routing-dependent sizes every micro-batch, so the caching allocator keeps a gap beyond its
allocated peak (cost_model.memory.allocator_gap_gib). Where the card has no room for that gap (the predicted device
peak is the usable capacity), the allocator frees its cache and maps memory again about once a micro-batch, each time
about that micro-batch's fp32 logits (the loss path's largest block), at the release-and-map cost measured on an H100
(constants' allocator_remap_s_per_gib).

Why this rule (benchmarks/runner_accuracy.py, the runs stored through v37): all 5 measured MoE layouts whose cache
the memory model says does not fit ran 10.7-35.3% slower than the step without this term (Qwen3-30B-A3B, Qwen1.5-MoE-
A2.7B, Qwen2-57B-A14B, the synthetic 32-expert MoE on H100 and H200); with it, -1.0% to +12.7%. Of the 35 measured
MoE runs within 4.5 GiB of the limit whose cache has room, one ran 10.4% slow (Qwen1.5-MoE-A2.7B at 6 layers on an
H200, 2.1 GiB of room, retrying 6 times a step), the rest within 8.5%: they get no term
(benchmarks/allocator_strain_check.py prints them all). No constant was fitted; the rule was chosen after those runs
were seen (they are looked at for tokens/s since: runner_accuracy.py STRAIN_LOOKED_AT). Priced on the megatron
runner's stack only, where it was measured; a dense model's allocator reuses its sizes and does not.
"""
from __future__ import annotations

from cost_model.loss_path import fp32_logits_bytes
from cost_model.memory import MemoryBreakdown
from cost_model.nouns.units import GIB
from cost_model.step_time import StepContext

# GiB below the usable capacity at which a predicted device peak counts as the capacity (float noise)
AT_CAPACITY_GIB = 1e-6


def cache_does_not_fit(ctx: StepContext, memory: MemoryBreakdown) -> bool:
    """Whether `memory` (a MoE layout's on the runner's stack) leaves no room for the allocator's whole cache."""
    return (ctx.runner is not None and ctx.model.has_moe_layers and memory.usable > 0
            and memory.device_peak >= memory.usable - AT_CAPACITY_GIB)


def remap_seconds(ctx: StepContext) -> float:
    """Seconds a step to release and map again each micro-batch's fp32 logits."""
    per_mb = fp32_logits_bytes(ctx.model, ctx.layout, ctx.tokens) / GIB * ctx.c.allocator_remap_s_per_gib
    return ctx.num_microbatches * per_mb


def allocator_remap_s(ctx: StepContext, memory: MemoryBreakdown) -> float:
    """The step's allocator_remap term: `remap_seconds` where the cache does not fit, else 0."""
    return remap_seconds(ctx) if cache_does_not_fit(ctx, memory) else 0.0


def remap_source(ctx: StepContext) -> str:
    """Where the allocator_remap term comes from, for `tune predict --explain`."""
    if ctx.runner is None:
        return "modelled: none on this stack (priced on the megatron runner's stack only, where it was measured)"
    return (f"modelled: a MoE layout with no room for the allocator's cache maps each micro-batch's fp32 logits again "
            f"(cost_model.allocator_strain, a rule from the measured runner runs), at "
            f"{ctx.c.allocator_remap_s_per_gib * 1e3:.1f} ms a GiB released and mapped (measured: "
            f"allocator_remap_s_per_gib, 1 x H100)")
