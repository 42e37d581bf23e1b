"""Layouts that cannot run faster than one measured: the same layout with recompute or optimizer offload added, or
with fp32 Adam moments where bf16 ran.

Recompute runs forward passes again, offload adds the CPU Adam step and its copies, fp32 moments double the bytes
Adam reads and writes; everything else equal, such a layout does the measured layout's work and more. Its only use
is memory (or the moments' precision, which a search space without bf16 moments keeps), so once the measured layout
has run without being near the memory limit (predicted a plain fit), a trial of it is spent on nothing.
"""
from __future__ import annotations

from dataclasses import fields
from operator import attrgetter

from cost_model.nouns.layout import Layout

_RECOMPUTE = ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules")
_OFFLOAD = ("optimizer_offload_fraction", "overlap_d2h_h2d")
_MOMENTS = ("exp_avg_dtype",)
# every other field of a layout (a field added later included): the base two layouts must share
_BASE = attrgetter(*(f.name for f in fields(Layout) if f.name not in _RECOMPUTE + _OFFLOAD + _MOMENTS))


def base(layout: Layout) -> tuple:
    """The layout without its recompute, offload and Adam moments' choices."""
    return _BASE(layout)


def adds_work(layout: Layout, measured: Layout) -> bool:
    """Whether `layout` is `measured` with no less recompute (recompute added, or the same layers rerun in other
    chunks), offload added, or fp32 moments for bf16, and nothing else changed (the layout itself excepted)."""
    if base(layout) != base(measured) or layout == measured:
        return False
    more_offload = not measured.offloaded and layout.offloaded
    same_offload = all(getattr(layout, f) == getattr(measured, f) for f in _OFFLOAD)
    wider_moments = measured.exp_avg_dtype != "fp32" and layout.exp_avg_dtype == "fp32"
    same_moments = layout.exp_avg_dtype == measured.exp_avg_dtype
    return _no_less_recompute(layout, measured) and (more_offload or same_offload) and (wider_moments or same_moments)


def _no_less_recompute(layout: Layout, measured: Layout) -> bool:
    """Whether `layout` reruns at least the forward work `measured` does. Full uniform recompute reruns every layer,
    whatever its chunk (recompute_num_layers sets only how many layers' inputs are kept); full block reruns the first
    N layers of each stage; selective reruns its modules."""
    if measured.recompute_granularity is None:
        return True
    if layout.recompute_granularity != measured.recompute_granularity:
        return False
    if layout.recompute_granularity == "selective":
        return set(layout.selective_modules) >= set(measured.selective_modules)
    if layout.recompute_method == "uniform":
        return True
    return measured.recompute_method == "block" and layout.recompute_num_layers >= measured.recompute_num_layers
