"""Fit the cost model's free constants to measured runs, print the fit, and optionally save it.

Today two constants are fitted, each to the one reference recipe that determines it:
  layer_launch_overhead_s     to attune-tp1-pp1-ep8 (no offload: the launch-bound step)
  cpu_adam_share_of_profile   to attune-tp1-ep8-mt16k (CPU offload: adds the CPU Adam step)
Each is found by bisection with the other held, alternating until both match.
Usage: python benchmarks/calibrate.py [--write]   (--write updates cost_model/data/constants.yaml)
"""
from __future__ import annotations

import argparse
import dataclasses
import re
from datetime import date
from pathlib import Path

from cost_model.constants import default_constants
from cost_model.predict import predict
from recipes.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ROOT / "tests" / "fixtures" / "reference_recipes"
CONSTANTS = ROOT / "cost_model" / "data" / "constants.yaml"


def bisect(fn, lo: float, hi: float, target: float, increasing: bool, steps: int = 60) -> float:
    """x in [lo, hi] with fn(x) == target, for fn monotone in x."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        if (fn(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="save the fitted values to constants.yaml")
    args = parser.parse_args()
    plain = load_recipe(REFERENCES / "attune-tp1-pp1-ep8.yaml")
    offload = load_recipe(REFERENCES / "attune-tp1-ep8-mt16k.yaml")
    measured = {id(r): r.data["result"]["tokens_per_s_per_gpu"] for r in (plain, offload)}

    def tps(recipe, c):
        return predict(recipe.model, recipe.gpu, recipe.workload, recipe.layout, c).tokens_per_s_per_gpu

    c = default_constants()
    for _ in range(4):
        launch = bisect(lambda x: tps(plain, dataclasses.replace(c, layer_launch_overhead_s=x)), 1e-5, 0.2,
                        measured[id(plain)], increasing=False)
        c = dataclasses.replace(c, layer_launch_overhead_s=launch)
        share = bisect(lambda x: tps(offload, dataclasses.replace(c, cpu_adam_share_of_profile=x)), 0.01, 4.0,
                       measured[id(offload)], increasing=True)
        c = dataclasses.replace(c, cpu_adam_share_of_profile=share)
    print(f"layer_launch_overhead_s   = {c.layer_launch_overhead_s:.5f} s")
    print(f"cpu_adam_share_of_profile = {c.cpu_adam_share_of_profile:.4f}")
    for recipe in (plain, offload):
        p = predict(recipe.model, recipe.gpu, recipe.workload, recipe.layout, c)
        err = p.tokens_per_s_per_gpu / measured[id(recipe)] - 1
        print(f"{recipe.layout.long_label}: predicted {p.tokens_per_s_per_gpu:,.1f} tokens/s/GPU, "
              f"measured {measured[id(recipe)]:,.2f} ({err:+.2%}); peak {p.peak_memory_gib:.1f} GiB ({p.source})")
    if args.write:
        text = CONSTANTS.read_text()
        today = date.today().isoformat()
        for name, value in (("layer_launch_overhead_s", f"{c.layer_launch_overhead_s:.5f}"),
                            ("cpu_adam_share_of_profile", f"{c.cpu_adam_share_of_profile:.4f}")):
            text, n = re.subn(rf"(  {name}: {{value: )[^,]+(, source: \")(?:fitted \([^)]*\) )?",
                              rf"\g<1>{value}\g<2>fitted (benchmarks/calibrate.py, {today}) ", text)
            assert n == 1, name
        CONSTANTS.write_text(text)
        print(f"wrote {CONSTANTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
