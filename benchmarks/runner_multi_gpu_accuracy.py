"""The megatron runner's stored 2-GPU runs re-predicted by today's cost model (tokens/s and device peak).

    python benchmarks/runner_multi_gpu_accuracy.py

Every 2-GPU runner run stored (2026-11-29 to 2026-12-01; only 1 GPU has been lent since): the first suites (TP2,
EP2, TP2+EP2 at 4k tokens), the leaderboard comparison on 2 GPUs, the Gated DeltaNet suites and the memory boundary
runs. All are in sample for memory (the runner's activation factors and outside-PyTorch figures were fitted on the
boundary runs) and none was fitted for the runner components' tokens/s; the Gated DeltaNet TP2/EP2 runs were
looked at when the MoE kinds' host floors were measured (the profile's run9, nothing fitted to them). Some ran on
an earlier runner (the first suites before the torch-native GDN kernels settled), so a large error here is a
question, not a verdict. The PP2 runs (Qwen3.6 at 12 layers, two sessions) are in sample for the runner's pipeline
bubble since 2026-12-04: under-predicted 10-14% with (PP - 1) x the slowest stage, they led to the 1F1B fill and
drain of the other stages (cost_model.step_time.pipeline_bubble_s); nothing fitted.
The first suites (megatron-h200-suite, x2-h200-vs-leaderboard-suite) recorded the allocator's peak
(torch.cuda.max_memory_allocated), not the device's: their peaks are compared with the predicted allocator peak and
marked "alloc"; every other run's with the predicted device peak.
The band: how many runs the 90% band `tune` prints for them holds (tuner.intervals.runner_stack_sd), and the
smallest log-normal sd whose 90% band holds 90% of them, runner_multi_gpu_error_sd's derivation (in sample: these are
every multi-GPU runner run there is).
Every figure is a measured run against a prediction.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measured_runs import load_runs  # noqa: E402
from benchmarks.runner_accuracy import sd_holding_90pct, trial_prediction  # noqa: E402
from cost_model.nouns.hardware import load_gpu  # noqa: E402
from cost_model.hypotheses import Z90  # noqa: E402
from tuner.intervals import runner_stack_sd  # noqa: E402

B, R = Path(__file__).resolve().parent, Path(__file__).resolve().parent / "results"
PAIRS = (("megatron_h200_suite.json", "megatron-h200-suite.jsonl"),
         ("megatron_h200_gdn_suite.json", "megatron-h200-gdn-suite.jsonl"),
         ("x2_vs_leaderboard_suite.json", "x2-h200-vs-leaderboard-suite.jsonl"),
         ("x2_vs_leaderboard_gdn_suite.json", "x2-h200-vs-leaderboard-gdn-suite.jsonl"),
         ("gdn_h200_suite.json", "gdn-h200-2g-suite.jsonl"),
         ("memory_boundary_h200_2g_suite.json", "memory-boundary-h200-2g.jsonl"),
         ("memory_boundary_h200_v2_suite.json", "memory-boundary-h200-v2.jsonl"),
         ("memory_boundary_h200_v3_suite.json", "memory-boundary-h200-v3.jsonl"),
         ("memory_boundary_h200_v2_gdn_suite.json", "memory-boundary-h200-v2-gdn.jsonl"),
         ("memory_boundary_h200_v3_gdn_suite.json", "memory-boundary-h200-v3-gdn.jsonl"))


def main() -> int:
    gpu = load_gpu("h200")
    rows = []
    print(f"{'results file':36} {'trial':40} {'layout':18} {'measured':>8} {'predicted':>9} {'err%':>6} "
          f"{'peak':>6} {'pred':>6}")
    for suite, results in PAIRS:
        for run in load_runs(B / suite, R / results):
            t = run.trial
            if not run.ok or t.gpus < 2:
                continue
            model, p = trial_prediction(t, gpu, run.runtime)
            err = p.tokens_per_s_per_gpu / run.measured - 1
            gdn = "linear_attention" in model.layer_types
            predicted_peak = p.memory.device_peak if run.device_peaks else p.memory.allocated
            rows.append({"file": results, "trial": t.name, "err": err, "gdn": gdn, "device": run.device_peaks,
                         "peak_err": predicted_peak / run.peak - 1 if run.peak else None,
                         "log": math.log(run.measured / p.tokens_per_s_per_gpu),
                         "band_sd": runner_stack_sd(model, gpu, None, p)})
            print(f"{results[:36]:36} {t.name[:40]:40} {t.layout.label[:18]:18} {run.measured:8.0f} "
                  f"{p.tokens_per_s_per_gpu:9.0f} {100 * err:6.1f} {run.peak:6.1f} {predicted_peak:6.1f}"
                  + ("" if run.device_peaks else " alloc"))
    summary = {}
    for name, sel in (("all", rows), ("Gated DeltaNet models", [r for r in rows if r["gdn"]]),
                      ("others", [r for r in rows if not r["gdn"]])):
        if not sel:
            continue
        apes = [abs(r["err"]) for r in sel]
        peaks = {basis: [abs(r["peak_err"]) for r in sel if r["peak_err"] is not None and r["device"] == device]
                 for basis, device in (("device", True), ("allocator", False))}
        summary[name] = {"runs": len(sel), "median_ape": statistics.median(apes), "max_ape": max(apes),
                         "over_predicted": sum(r["err"] > 0 for r in sel),
                         "peak_max_abs_err": max(peaks["device"], default=None),
                         "allocator_peak_max_abs_err": max(peaks["allocator"], default=None)}
        said = "; ".join(f"{basis} peak within {100 * max(errs):.1f}% ({len(errs)} runs)"
                         for basis, errs in peaks.items() if errs)
        print(f"{name}: {len(sel)} runs, tokens/s median APE {100 * statistics.median(apes):.1f}%, max "
              f"{100 * max(apes):.1f}% ({summary[name]['over_predicted']} over-predicted); {said}")
    need = sd_holding_90pct([abs(r["log"]) for r in rows])
    inside = sum(abs(r["log"]) <= Z90 * r["band_sd"] for r in rows)
    summary["band"] = {"inside": inside, "runs": len(rows), "sd_holding_90pct": need}
    print(f"90% band printed for them: holds {inside} of {len(rows)}; the smallest sd whose band holds 90% of them: "
          f"{need:.3f} (in sample)")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
