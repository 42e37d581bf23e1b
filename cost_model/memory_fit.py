"""Whether a layout fits, given the memory model's own measured error.

The predicted peak a layout needs (MemoryBreakdown.total) is compared with the GPU's usable memory
(MemoryBreakdown.usable). The actual peak is taken as predicted x (1 + e), e ~ Normal(0, sd), where sd is
the memory model's relative error on measured runs (constants' memory_error_sd, derived by
benchmarks/memory_error.py). A layout is a plain fit only when it fits with a high probability; near the
limit it is borderline (it may or may not fit), well over it it does not fit.
"""
from __future__ import annotations

import math

FITS, BORDERLINE, DOES_NOT_FIT = "fits", "borderline", "does not fit"
FIT_P = 0.95          # at or above: a plain fit
NO_FIT_P = 0.05       # below: does not fit; in between: borderline


def fit_probability(needed_gib: float, capacity_gib: float, sd: float) -> float:
    """P(actual peak <= capacity) for actual = needed x (1 + e), e ~ Normal(0, sd)."""
    if needed_gib <= 0:
        return 1.0
    margin = capacity_gib / needed_gib - 1.0     # the relative error the layout can absorb
    if sd <= 0:
        return 1.0 if margin >= 0 else 0.0
    return 0.5 * (1.0 + math.erf(margin / (sd * math.sqrt(2.0))))


def fit_verdict(p: float) -> str:
    """"fits" (p >= 0.95), "borderline" (0.05 <= p < 0.95) or "does not fit" (p < 0.05)."""
    if p >= FIT_P:
        return FITS
    return BORDERLINE if p >= NO_FIT_P else DOES_NOT_FIT


def percent(p: float) -> str:
    """A borderline probability in whole percent, rounded down (0.949 is 94%, never a plain fit's 95%)."""
    return f"{math.floor(p * 100 + 1e-9)}%"


def fit_label(verdict: str, p: float) -> str:
    """The verdict for a table: "fits", "borderline (60%)" or "does not fit"."""
    return f"{verdict} ({percent(p)})" if verdict == BORDERLINE else verdict


# A MoE layer allocates routing-dependent sizes every micro-batch; with no room left for the allocator's cache it
# frees its cache and maps memory again each time. Measured on the megatron runner (runner_accuracy.py), on the
# MoE layouts run since the runner counts it that the memory model now calls borderline (v32, v34 on 1 x H100, v30
# on 1 x H200): 5 of 9 retried every step (6-16 times), all of them without recompute, and ran 0.9% faster to 26%
# slower than predicted (Phi-3.5-MoE -1%, the synthetic 32-expert MoE 10%, Qwen1.5-MoE-A2.7B 10%, Qwen2-57B-A14B 12%,
# Qwen3-30B-A3B 26%, mapping and releasing 111 GiB a step); two Qwen3.6 layouts with full recompute, one without and
# a Qwen1.5-MoE one without did not. Before the counter, Qwen1.5-MoE-A2.7B at 0.19 GiB under ran 26% slow. Neither
# the expert count (v34 refuted "at most 64 experts", registered before it ran) nor the predicted margin tells which
# will: the memory model's error is as large as the margins involved. Those that did retried about once a
# micro-batch, each time mapping again about that micro-batch's fp32 logits (0.66-0.72 of the loss path, whose fp32
# part is 4 of its 6 bytes a logit); at the release-and-map cost measured on an H100 (allocator_remap_s_per_gib)
# that accounts for 70-93% of the three slowdowns seen first. So the note prices that case; the prediction itself
# does not assume it. A plain fit can retry too: v37's Phi-3.5-MoE at 1 layer and 96k tokens (1 x H100, P(fits)
# 99.6%, needing 95.7% of the card) retried 4 times a step, mapping and releasing 47 GiB, and ran 9% below its 64k
# neighbour where the prediction is flat (+5.6%); the 15 other plain-fit MoE runs with the counter at 93-97% of the
# card (5 of them without recompute) did not (runner-accuracy-2026-12-07.txt). One run makes no rule: plain fits get
# no note.
MOE_NEAR_LIMIT_NOTE = ("; a MoE model this near the limit may also run slower than predicted (no room for the "
                       "allocator's cache: up to 26% slower on the measured runner layouts, 5 of 9 retrying every "
                       "step)")


def strain_note(strain_s: float, step_s: float) -> str:
    """The MoE near-limit note with what retrying once a micro-batch would cost this layout (`strain_s` seconds a
    step: its micro-batches' fp32 logits released and mapped again, `step_s` the predicted step)."""
    share = strain_s / step_s if step_s > 0 else 0.0
    return (f"; a MoE model this near the limit may also run slower than predicted: with no room for the "
            f"allocator's cache, 5 of 9 measured runner layouts retried about once a micro-batch, mapping its fp32 "
            f"logits again (here about {strain_s:.2f} s a step, {share:.0%} slower, at the release-and-map cost "
            f"measured on an H100; 26% slower at most on those layouts)")


def borderline_reason(needed_gib: float, capacity_gib: float, sd: float, p: float, moe: bool = False,
                      strain: tuple[float, float] | None = None) -> str:
    """The one line that says why a layout is borderline (for a MoE model, with the slowdown risk near the limit:
    `strain` = (seconds a step if it retried once a micro-batch, the predicted step), where known)."""
    margin = capacity_gib / needed_gib - 1.0 if needed_gib > 0 else 0.0
    side = "under" if margin >= 0 else "over"
    note = (strain_note(*strain) if strain is not None else MOE_NEAR_LIMIT_NOTE) if moe else ""
    return (f"borderline: predicted {needed_gib:.1f} of {capacity_gib:.1f} GiB usable, {abs(margin):.1%} {side}; "
            f"the memory model's measured error (sd {sd:.1%}) gives a {percent(p)} chance to fit" + note)
