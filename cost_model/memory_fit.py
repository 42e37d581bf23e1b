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
# frees its cache and maps memory again each time. Measured on the megatron runner (runner_accuracy.py), the MoE
# layouts at the limit that retried did so about once a micro-batch, each time mapping again about that micro-batch's
# fp32 logits; where the memory model leaves no room for the whole cache, the step prices that
# (cost_model.allocator_strain: allocator_remap). A borderline layout whose cache fits as predicted may still come
# closer to the limit than predicted and retry: its note says what that would cost. Neither the expert count (v34
# refuted "at most 64 experts", registered before it ran) nor the margin alone tells which will; one measured layout
# whose cache fitted, barely, ran 10% slow (Qwen1.5-MoE-A2.7B on an H200), and a plain fit can retry too (v37's
# Phi-3.5-MoE at 96k tokens, 95.7% of the card, 9% below its 64k neighbour): one run makes no rule, plain fits get no
# note.
MOE_NEAR_LIMIT_NOTE = ("; a MoE model this near the limit may also run slower than predicted (with no room for the "
                       "allocator's cache the measured runner layouts retried about once a micro-batch)")


def strain_note(strain_s: float, step_s: float, priced: bool = False) -> str:
    """The MoE near-limit note: what retrying once a micro-batch costs this layout (`strain_s` seconds a step: its
    micro-batches' fp32 logits released and mapped again; `step_s` the predicted step), and whether that step
    already prices it (`priced`: no room for the allocator's cache)."""
    share = strain_s / (step_s - strain_s if priced else step_s) if step_s > strain_s else 0.0
    if priced:
        return (f"; a MoE model with no room for the allocator's cache: its predicted step includes mapping each "
                f"micro-batch's fp32 logits again ({strain_s:.2f} s a step, {share:.1%}: allocator_remap)")
    return (f"; a MoE model this near the limit may also run slower than predicted: with no room for the "
            f"allocator's cache the measured runner layouts retried about once a micro-batch, mapping its fp32 "
            f"logits again (here about {strain_s:.2f} s a step, {share:.1%} slower)")


def borderline_reason(needed_gib: float, capacity_gib: float, sd: float, p: float, moe: bool = False,
                      strain: tuple[float, float, bool] | None = None) -> str:
    """The one line that says why a layout is borderline (for a MoE model, with the slowdown near the limit:
    `strain` = (seconds a step if it retried once a micro-batch, the predicted step, whether that step prices it),
    where known)."""
    margin = capacity_gib / needed_gib - 1.0 if needed_gib > 0 else 0.0
    side = "under" if margin >= 0 else "over"
    note = (strain_note(*strain) if strain is not None else MOE_NEAR_LIMIT_NOTE) if moe else ""
    return (f"borderline: predicted {needed_gib:.1f} of {capacity_gib:.1f} GiB usable, {abs(margin):.1%} {side}; "
            f"the memory model's measured error (sd {sd:.1%}) gives a {percent(p)} chance to fit" + note)
