"""Fitting one cost-model constant to measured runs: least squares in log error over a grid of values on the runs in
sample, each model held out in turn (fitted on the others, its runs predicted: the leave-one-model-out figures), and
the held-out runs predicted with the in-sample fit, each beside the baseline value (the model without the constant).
Used by benchmarks/scaled_layer_exponent.py and benchmarks/host_overlap_exponent.py; every figure is a measured run
against a prediction.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable


def apes(errs: list[float]) -> tuple[float, float]:
    """(median, max) absolute percentage error of log errors."""
    a = [abs(math.exp(e) - 1) for e in errs]
    return (statistics.median(a), max(a)) if a else (float("nan"), float("nan"))


@dataclass(frozen=True)
class ConstantFit:
    grid: tuple[float, ...]
    error: Callable[[dict, float], float]   # a run's log error, log(predicted / measured), at a value
    baseline: float                         # the value that is the model without the constant
    label: Callable[[float], str]           # how a value is printed

    def fit(self, runs: list[dict]) -> float:
        return min(self.grid, key=lambda v: sum(self.error(r, v) ** 2 for r in runs))

    def errors(self, runs: list[dict], value: float) -> list[float]:
        return [self.error(r, value) for r in runs]

    def report(self, ins: list[dict], held: list[dict], held_lines: Callable[[dict], str] | None = None) -> dict:
        """Prints the fit, the leave-one-model-out figures and the held-out ones (`held_lines`: how a held-out run's
        line is labelled, one line each; without it, one line per model); returns them."""
        best = self.fit(ins)
        base = self.label(self.baseline)
        print(f"fitted on every in-sample run: {self.label(best)}")
        lomo_base, lomo_fit = [], []
        for m in sorted({r["model"] for r in ins}):
            mine = [r for r in ins if r["model"] == m]
            v = self.fit([r for r in ins if r["model"] != m])
            eb, ev = self.errors(mine, self.baseline), self.errors(mine, v)
            lomo_base += eb
            lomo_fit += ev
            print(f"  {m:48} {len(mine):3} runs  fitted without it {self.label(v)}: median APE "
                  f"{100 * apes(ev)[0]:4.1f}% ({base}: {100 * apes(eb)[0]:4.1f}%)")
        print(f"leave-one-model-out over {len(lomo_fit)} runs: median APE {100 * apes(lomo_fit)[0]:.1f}%, max "
              f"{100 * apes(lomo_fit)[1]:.1f}% ({base}: median {100 * apes(lomo_base)[0]:.1f}%, max "
              f"{100 * apes(lomo_base)[1]:.1f}%)")
        out = {"value": best, "in_sample_runs": len(ins), "lomo_median_ape": apes(lomo_fit)[0],
               "lomo_max_ape": apes(lomo_fit)[1], "lomo_median_ape_baseline": apes(lomo_base)[0],
               "lomo_max_ape_baseline": apes(lomo_base)[1]}
        if not held:
            return out
        groups = ([(held_lines(r), [r]) for r in sorted(held, key=held_lines)] if held_lines else
                  [(m, [r for r in held if r["model"] == m]) for m in sorted({r["model"] for r in held})])
        for name, mine in groups:
            eb, ev = self.errors(mine, self.baseline), self.errors(mine, best)
            print(f"  held out {name:60} {len(mine):3} runs: median APE {100 * apes(ev)[0]:4.1f}%, max "
                  f"{100 * apes(ev)[1]:4.1f}% ({base}: {100 * apes(eb)[0]:4.1f}%, {100 * apes(eb)[1]:4.1f}%)")
        eb, ev = self.errors(held, self.baseline), self.errors(held, best)
        print(f"held out ({len(held)} runs, {self.label(best)} from the in-sample fit): median APE "
              f"{100 * apes(ev)[0]:.1f}%, max {100 * apes(ev)[1]:.1f}% ({base}: median {100 * apes(eb)[0]:.1f}%, max "
              f"{100 * apes(eb)[1]:.1f}%)")
        out.update(held_out_runs=len(held), held_out_median_ape=apes(ev)[0], held_out_max_ape=apes(ev)[1],
                   held_out_median_ape_baseline=apes(eb)[0], held_out_max_ape_baseline=apes(eb)[1])
        return out
