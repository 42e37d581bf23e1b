"""Fit constants.yaml runner_scaled_work_exponent: the power of the modelled work ratio by which a layer timed as
another model's measured layer scales that measurement (cost_model.step_time.runner_layer_terms); with --linear,
runner_scaled_linear_work_exponent, the power for a Gated DeltaNet layer timed as another model's measured one.

    python benchmarks/scaled_layer_exponent.py [--linear]

Only runs of models with such layers count (the profile measured none of their layer kinds). The exponent is
fitted on the grids in sample (benchmarks/runner_accuracy.py IN_SAMPLE_FILES) by least squares in log error over
a grid of values; each model is then held out in turn (fitted on the others, its runs predicted: the leave-one-
model-out figures). The later grids (held out from the runner components) are predicted with the exponent fitted
on the in-sample ones and printed apart. Each run is predicted on the GPU type it ran on, from that type's shipped
profile. --linear: every stored run whose model has a Gated DeltaNet layer priced by another model's measured one
(Qwen3.5-0.8B and Qwen3.5-4B, scaled from Qwen3.5-27B's layer): those stored when the constant was chosen
(2026-12-07, runner_accuracy LINEAR_EXPONENT_LOOKED_AT) are in sample, later ones (v42's synthetic GDN-dense model)
held out; the baseline is the dense exponent they had before. Every figure is a measured run against a prediction.
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
from benchmarks.runner_accuracy import DEFAULT, IN_SAMPLE_FILES, LINEAR_EXPONENT_LOOKED_AT  # noqa: E402
from cost_model.constants import default_constants  # noqa: E402
from cost_model.nouns.hardware import load_gpu  # noqa: E402
from cost_model.nouns.model_spec import load_model  # noqa: E402
from cost_model.predict import predict  # noqa: E402
from experiments.megatron.model_run import trial_model  # noqa: E402
from tuner.intervals import measures_layers, scales_linear_layers  # noqa: E402

GRID = [round(0.70 + 0.01 * i, 2) for i in range(41)]     # 0.70 .. 1.10


def scaled_runs(gpu=None, linear: bool = False) -> list[dict]:
    """The stored runs (offload left out) of models with a layer timed as another model's: with `linear`, those whose
    Gated DeltaNet layer is; `gpu` keeps one GPU type's runs only."""
    out = []
    for suite, results in DEFAULT:
        for run in load_runs(suite, results):
            t = run.trial
            if not run.ok or t.layout.offloaded or (gpu is not None and run.gpu != gpu.name):
                continue  # the offloaded step's CPU side is the host's, not the layer's
            on = load_gpu(run.gpu)
            model = trial_model(load_model(t.model), t.layers if isinstance(t.layers, int) else None, t.replace_gdn)
            if (not scales_linear_layers(model, on)) if linear else measures_layers(model, on):
                continue
            out.append({"model": str(t.model), "trial": t.name, "file": results.name, "measured": run.measured,
                        "case": (model, t.workload, t.layout, run.runtime), "gpu": on,
                        "in_sample": results.name in (LINEAR_EXPONENT_LOOKED_AT if linear else IN_SAMPLE_FILES)})
    return out


def log_errors(runs: list[dict], exponent: float, cache: dict, field: str = "runner_scaled_work_exponent") -> list:
    c = dataclasses.replace(default_constants(), **{field: exponent})
    errs = []
    for r in runs:
        key = (id(r), field, exponent)
        if key not in cache:
            model, wl, layout, rt = r["case"]
            p = predict(model, r["gpu"], wl, layout, constants=c, precision_aware_optimizer=False, runtime=rt)
            cache[key] = math.log(p.tokens_per_s_per_gpu / r["measured"])
        errs.append(cache[key])
    return errs


def main() -> int:
    linear = "--linear" in sys.argv[1:]
    field = "runner_scaled_linear_work_exponent" if linear else "runner_scaled_work_exponent"
    runs = scaled_runs(linear=linear) if linear else scaled_runs(load_gpu("h200"))
    ins = [r for r in runs if r["in_sample"]]
    held = [r for r in runs if not r["in_sample"]]
    cache: dict = {}
    print(f"{field}: {len(ins)} in-sample runs of {len({r['model'] for r in ins})} models with scaled layers; "
          f"{len(held)} held-out runs of {len({r['model'] for r in held})}")
    baseline = default_constants().runner_scaled_work_exponent if linear else 1.0
    fit = ConstantFit(tuple(GRID), lambda r, a: log_errors([r], a, cache, field)[0], baseline,
                      lambda a: f"exponent {a:g}")
    print(json.dumps(fit.report(ins, held)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
