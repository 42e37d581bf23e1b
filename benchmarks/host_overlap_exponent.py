"""Fit constants.yaml runner_host_overlap_exponent: how imperfectly the runner's host (issuing a micro-batch's
kernels, its measured host floor) and GPU (running them) overlap where their times are close: the micro-batch takes
(host^p + GPU^p)^(1/p) (cost_model.step_time.host_and_gpu_s); p large is the plain maximum.

    python benchmarks/host_overlap_exponent.py

Every stored 1-GPU runner run but the offloaded ones (their CPU step is the host's too) is predicted at each p of
a grid; the runs the exponent moves (their prediction at p = 4 differs from the plain maximum's by more than 0.1%:
near the crossing) are the ones that inform it. p is fitted on the grids in sample (benchmarks/runner_accuracy.py
IN_SAMPLE_FILES) by least squares in log error; each model is then held out in turn (fitted on the others, its
runs predicted); the later grids are predicted with the in-sample fit and printed apart. Every figure is a measured
run against a prediction.
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

MAXIMUM = 1000.0   # p at which (host^p + GPU^p)^(1/p) is the larger of the two to within 0.07% at equal times
GRID = [4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 32.0, 48.0, MAXIMUM]


def runner_runs() -> list[dict]:
    out = []
    for suite, results in DEFAULT:
        for run in load_runs(suite, results):
            t = run.trial
            if not run.ok or t.layout.offloaded or t.gpus != 1:
                continue
            model = trial_model(load_model(t.model), t.layers if isinstance(t.layers, int) else None, t.replace_gdn)
            out.append({"model": str(t.model), "trial": t.name, "file": results.name, "measured": run.measured,
                        "case": (model, t.workload, t.layout, run.runtime),
                        "in_sample": results.name in IN_SAMPLE_FILES})
    return out


def log_error(r: dict, gpu, exponent: float, cache: dict) -> float:
    key = (id(r), exponent)
    if key not in cache:
        c = dataclasses.replace(default_constants(), runner_host_overlap_exponent=exponent)
        model, wl, layout, rt = r["case"]
        p = predict(model, gpu, wl, layout, constants=c, precision_aware_optimizer=False, runtime=rt)
        cache[key] = math.log(p.tokens_per_s_per_gpu / r["measured"])
    return cache[key]


def label(p: float) -> str:
    return "the maximum" if p == MAXIMUM else f"p {p:g}"


def main() -> int:
    gpu = load_gpu("h200")
    cache: dict = {}
    runs = runner_runs()
    near = [r for r in runs if abs(log_error(r, gpu, GRID[0], cache) - log_error(r, gpu, MAXIMUM, cache)) > 1e-3]
    ins = [r for r in near if r["in_sample"]]
    held = [r for r in near if not r["in_sample"]]
    print(f"{len(runs)} 1-GPU runs, {len(near)} near the host/GPU crossing (moved by the exponent): {len(ins)} in "
          f"sample over {len({r['model'] for r in ins})} models, {len(held)} held out (seen before this fit)")
    fit = ConstantFit(tuple(GRID), lambda r, p: log_error(r, gpu, p, cache), MAXIMUM, label)
    print(json.dumps(fit.report(ins, held, held_lines=lambda r: f"{r['trial']} ({r['file'][:40]})")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
