"""One micro-batch's terms shared by every set of constants that prices them alike.

The shipped prediction, each hypothesis the agent weighs (Hypothesis.constants) and the pruning's optimistic floor
(cost_model.bounds) price the same rank at the same micro-batch under constants that differ only in the host's
launch time per layer pass, the flex dispatcher's factor on it and the CPU-Adam share. A micro-batch's terms read
none of those but the launch term (cost_model.step_time), and the rates read the CPU-Adam share only for the
offloaded step: so the terms are computed once under a "time twin" of the constants and rates (those three fields
set to one value), and the launch term is added per launch time, summed in the order it always was.

Pure: the twins are kept in bounded memos keyed by the objects' identity (held beside them) and by value; no entry
changes what any function returns.
"""
from __future__ import annotations

from dataclasses import replace

from cost_model.constants import Constants
from cost_model.memo import IdentityMemo
from cost_model.rates import ConstantRates, ProfileRates, Rates, rates_for

# the fields a twin sets to one value: what hypotheses and the optimistic floor change (Hypothesis.constants)
_TWIN_VALUES = dict(layer_launch_overhead_s=0.0, flex_overhead_factor=1.0, cpu_adam_share_of_profile=1.0)
_TWIN_MEMO = IdentityMemo(256)
_BY_VALUE: dict = {}   # a twin's value -> the one object of that value (so memos keyed by identity hit)


def time_twin(c: Constants, rates: Rates) -> tuple[Constants, Rates]:
    """(`c`, `rates`) with the launch time, flex factor and CPU-Adam share set to one value: the same objects for
    every constants that differ from `c` only there. Rates of another kind than this module knows are their own
    twin (with `c`)."""
    key = (id(c), id(rates))
    hit = _TWIN_MEMO.get(key)
    if hit is None:
        if type(rates) not in (ProfileRates, ConstantRates) or rates.c is not c:
            twin = (c, rates)
        else:
            value = replace(c, **_TWIN_VALUES)
            if len(_BY_VALUE) >= 256:
                _BY_VALUE.clear()
            twin_c = _BY_VALUE.setdefault(value, value)
            twin = (twin_c, rates_for(rates.gpu, twin_c, rates.precision, getattr(rates, "profile", None)))
        hit = _TWIN_MEMO.put(key, (c, rates), twin)
    return hit[1]


def with_launch(base: dict[str, float], launch_passes: tuple, launch: float) -> dict[str, float]:
    """A rank's micro-batch terms from its terms without the launch term (`base`) and, per layer kind in the order
    they were added, (layers, passes, one pass's GPU seconds): the host's launch time per pass exposed where a pass's
    GPU work is shorter (cost_model.step_time._add_layer)."""
    t = dict(base)
    total = t["launch_overhead"]
    for count, passes, gpu_pass in launch_passes:
        total += count * passes * max(0.0, launch - gpu_pass)
    t["launch_overhead"] = total
    return t
