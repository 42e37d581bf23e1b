"""How well the cost model predicts the megatron runner's own stack, on grids it was not built from.

Re-predicts, with the code and the shipped profile as they are now, every trial of measured runner suites
(by default the issue-25 grids: benchmarks/runner_grids_h200_suite.json, measured into
benchmarks/results/runner-grids-h200-2026-12-02.jsonl after the runner components were profiled and used
for nothing else), and prints per run and per grid: measured and predicted tokens/s/GPU, the absolute error,
Spearman's rank correlation within each grid, the device peak against the prediction, and the fit verdict
against what happened (a run predicted to fit that ran out of memory is a false fit). The prediction the
run recorded when it ran (the model of that day) is printed beside it.

Usage: python benchmarks/runner_accuracy.py [SUITE.json RESULTS.jsonl ...]
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from cost_model.case import Case
from cost_model.hardware import load_gpu
from cost_model.model_spec import load_model
from experiments.megatron.model_run import predict_run, trial_model
from experiments.megatron.suite import parse_suite

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = [(ROOT / "benchmarks/runner_grids_h200_suite.json", ROOT / "benchmarks/results/runner-grids-h200-2026-12-02.jsonl")]
# Runs the shipped model was built or fitted from: none of the grids above (the profile measured the
# components in separate processes, before these runs; no constant was fitted to them).
IN_SAMPLE: set[str] = set()


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        for i, j in enumerate(order):
            r[j] = float(i)
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else float("nan")


def rows(suite_path: Path, results_path: Path) -> list[dict]:
    trials = {t.name: t for t in parse_suite(str(suite_path))[0]}
    out = []
    for line in results_path.read_text().splitlines():
        r = json.loads(line)
        t = trials[r["trial"]]
        gpu = load_gpu("h200")
        model = trial_model(load_model(t.model), t.layers if isinstance(t.layers, int) else None, t.replace_gdn)
        p = predict_run(Case(model, gpu, t.workload, t.layout))
        then = (r.get("details") or {}).get("prediction_for_model_run") or {}
        out.append({"grid": t.model, "trial": t.name, "status": r["status"], "failure": r.get("failure_class"),
                    "measured": r.get("tokens_per_s_per_gpu") or 0.0, "predicted": p.tokens_per_s_per_gpu,
                    "then": then.get("tokens_per_s_per_gpu"), "peak": r.get("peak_memory_gib") or 0.0,
                    "peak_predicted": p.peak_memory_gib, "capacity": p.gpu_memory_gib, "fits": p.fits,
                    "verdict": getattr(p, "fit_verdict", "fits" if p.fits else "does not fit"),
                    "in_sample": t.name in IN_SAMPLE})
    return out


def main(argv: list[str]) -> int:
    pairs = [(Path(argv[i]), Path(argv[i + 1])) for i in range(0, len(argv), 2)] if argv else DEFAULT
    table = [row for s, r in pairs for row in rows(s, r)]
    ok = [r for r in table if r["status"] == "ok"]
    print(f"{len(table)} runs, {len(ok)} measured, {len(table) - len(ok)} out of memory or failed; "
          f"in sample: {sum(r['in_sample'] for r in table) or 'none'}")
    print(f"{'trial':22} {'measured':>9} {'predicted':>9} {'err%':>7} {'then':>8} {'peak':>6} {'pred':>6} verdict")
    for r in table:
        err = 100 * (r["predicted"] / r["measured"] - 1) if r["measured"] else float("nan")
        then = f"{r['then']:8.0f}" if r["then"] else "       -"
        peak = f"{r['peak']:6.1f}" if r["status"] == "ok" else f"{r['failure'] or r['status']:>6}"[:9]
        print(f"{r['trial']:22} {r['measured']:9.0f} {r['predicted']:9.0f} {err:7.1f} {then} {peak} "
              f"{r['peak_predicted']:6.1f} {r['verdict']}")
    apes = [abs(r["predicted"] / r["measured"] - 1) for r in ok]
    then_apes = [abs(r["then"] / r["measured"] - 1) for r in ok if r["then"]]
    summary = {"runs": len(table), "measured": len(ok),
               "median_ape": statistics.median(apes), "max_ape": max(apes),
               "median_ape_recorded_then": statistics.median(then_apes) if then_apes else None}
    print(f"\ntokens/s: median APE {100 * summary['median_ape']:.1f}%, max {100 * summary['max_ape']:.1f}% "
          f"({len(ok)} runs; the predictions recorded when they ran: median "
          f"{100 * summary['median_ape_recorded_then']:.1f}%)")
    grids = {}
    for r in ok:
        grids.setdefault(r["grid"], []).append(r)
    summary["spearman"] = {}
    for g, rs in grids.items():
        rho = spearman([r["measured"] for r in rs], [r["predicted"] for r in rs])
        summary["spearman"][g] = rho
        gape = statistics.median(abs(r["predicted"] / r["measured"] - 1) for r in rs)
        print(f"  {g:20} {len(rs)} runs: Spearman {rho:.2f}, median APE {100 * gape:.1f}%")
    peak_err = [r["peak"] / r["peak_predicted"] - 1 for r in ok]
    summary["peak_max_abs_err"] = max(abs(e) for e in peak_err)
    summary["peak_median_abs_err"] = statistics.median(abs(e) for e in peak_err)
    oom = [r for r in table if r["failure"] == "cuda_oom"]
    false_fit = [r["trial"] for r in oom if r["fits"]]
    false_refusal = [r["trial"] for r in ok if r["verdict"] == "does not fit"]
    near = [r["trial"] for r in table if abs(r["peak_predicted"] / r["capacity"] - 1) <= 0.02]
    summary.update(false_fits=false_fit, false_refusals=false_refusal, within_2pct_of_limit=near)
    print(f"device peak: within {100 * summary['peak_max_abs_err']:.1f}% (median "
          f"{100 * summary['peak_median_abs_err']:.1f}%) over {len(ok)} runs; {len(oom)} ran out of memory, "
          f"false fits: {false_fit or 'none'}; predicted not to fit but ran: {false_refusal or 'none'}; "
          f"predicted within 2% of the limit: {near or 'none'}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
