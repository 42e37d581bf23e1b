"""Fit constants.yaml runner_scaled_work_exponent: the power of the modelled work ratio by which a layer timed as
another model's measured layer scales that measurement (cost_model.step_time.runner_layer_terms).

    python benchmarks/scaled_layer_exponent.py

Only runs of models with such layers count (the profile measured none of their layer kinds). The exponent is
fitted on the grids in sample (benchmarks/runner_accuracy.py IN_SAMPLE_FILES) by least squares in log error over
a grid of values; each model is then held out in turn (fitted on the others, its runs predicted: the leave-one-
model-out figures). The later grids (held out from the runner components) are predicted with the exponent fitted
on the in-sample ones and printed apart. Every figure is a measured run against a prediction.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.constant_fit import ConstantFit  # noqa: E402
from benchmarks.measured_runs import load_runs  # noqa: E402
from benchmarks.runner_accuracy import DEFAULT, IN_SAMPLE_FILES  # noqa: E402
from cost_model.constants import default_constants  # noqa: E402
from cost_model.nouns.hardware import load_gpu  # noqa: E402
from cost_model.nouns.model_spec import load_model  # noqa: E402
from cost_model.predict import predict  # noqa: E402
from experiments.megatron.model_run import trial_model  # noqa: E402
from tuner.intervals import measures_layers  # noqa: E402

GRID = [round(0.70 + 0.01 * i, 2) for i in range(41)]     # 0.70 .. 1.10


def scaled_runs(gpu) -> list[dict]:
    out = []
    for suite, results in DEFAULT:
        for run in load_runs(suite, results):
            t = run.trial
            if not run.ok or t.layout.offloaded:
                continue  # the offloaded step's CPU side is the host's, not the layer's
            model = trial_model(load_model(t.model), t.layers if isinstance(t.layers, int) else None, t.replace_gdn)
            if measures_layers(model, gpu):
                continue
            out.append({"model": str(t.model), "trial": t.name, "file": results.name, "measured": run.measured,
                        "case": (model, t.workload, t.layout, run.runtime),
                        "in_sample": results.name in IN_SAMPLE_FILES})
    return out


def log_errors(runs: list[dict], gpu, exponent: float, cache: dict) -> list[float]:
    c = dataclasses.replace(default_constants(), runner_scaled_work_exponent=exponent)
    errs = []
    for r in runs:
        key = (id(r), exponent)
        if key not in cache:
            model, wl, layout, rt = r["case"]
            p = predict(model, gpu, wl, layout, constants=c, precision_aware_optimizer=False, runtime=rt)
            cache[key] = math.log(p.tokens_per_s_per_gpu / r["measured"])
        errs.append(cache[key])
    return errs


def main() -> int:
    gpu = load_gpu("h200")
    runs = scaled_runs(gpu)
    ins = [r for r in runs if r["in_sample"]]
    held = [r for r in runs if not r["in_sample"]]
    cache: dict = {}
    print(f"{len(ins)} in-sample runs of {len({r['model'] for r in ins})} models with scaled layers; "
          f"{len(held)} held-out runs of {len({r['model'] for r in held})}")
    fit = ConstantFit(tuple(GRID), lambda r, a: log_errors([r], gpu, a, cache)[0], 1.0, lambda a: f"exponent {a:g}")
    print(json.dumps(fit.report(ins, held)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
