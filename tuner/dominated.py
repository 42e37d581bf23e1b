"""Layouts that cannot run faster than one measured: the same layout with recompute or optimizer offload added.

Recompute runs forward passes again and offload adds the CPU Adam step and its copies; everything else equal, such
a layout does the measured layout's work and more. Its only use is memory, so once the measured layout has run
without being near the memory limit (predicted a plain fit), a trial of it is spent on nothing.
"""
from __future__ import annotations

from dataclasses import fields
from operator import attrgetter

from cost_model.nouns.layout import Layout

_RECOMPUTE = ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules")
_OFFLOAD = ("optimizer_offload_fraction", "overlap_d2h_h2d")
# every other field of a layout (a field added later included): the base two layouts must share
_BASE = attrgetter(*(f.name for f in fields(Layout) if f.name not in _RECOMPUTE + _OFFLOAD))


def base(layout: Layout) -> tuple:
    """The layout without its recompute and offload choices."""
    return _BASE(layout)


def adds_work(layout: Layout, measured: Layout) -> bool:
    """Whether `layout` is `measured` with recompute and/or offload added (and nothing else changed)."""
    if base(layout) != base(measured):
        return False
    more_recompute = measured.recompute_granularity is None and layout.recompute_granularity is not None
    same_recompute = all(getattr(layout, f) == getattr(measured, f) for f in _RECOMPUTE)
    more_offload = not measured.offloaded and layout.offloaded
    same_offload = all(getattr(layout, f) == getattr(measured, f) for f in _OFFLOAD)
    return (more_recompute or same_recompute) and (more_offload or same_offload) and (more_recompute or more_offload)
