"""How each stored offload run's host ran the offloaded optimizer step, against the shipped profile's rate.

For every measured runner run with an offloaded optimizer, the offload seconds it implies are its measured step
less the prediction's other terms (re-predicted with today's model from the shipped profile of its GPU type), and
the ratio printed is those over the predicted offload term: 1.0 where the host ran the step as the profile's
offload builds did. The spread over runs is the hosts' (each device call lands on some host of the pool); a run's
other terms' error lands in it too, most where the offload is a small share of the step. Not used by the model:
the shipped profile prices the step as its own builds measured it, and runner_host_cpu_error_sd widens the band.

    python benchmarks/offload_hosts.py
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measured_runs import load_runs  # noqa: E402
from benchmarks.runner_accuracy import DEFAULT, trial_prediction  # noqa: E402
from cost_model.nouns.hardware import load_gpu  # noqa: E402


def offload_ratios(pairs=DEFAULT) -> list[dict]:
    """One row per measured offload run of the stored grids: GPU type, results file, trial, implied / predicted
    offload seconds, the predicted offload term and step."""
    out = []
    for suite, results in pairs:
        if not results.exists():
            continue
        for run in load_runs(suite, results):
            t = run.trial
            if not t.layout.offloaded or not run.ok or not run.measured:
                continue
            _, p = trial_prediction(t, load_gpu(run.gpu), run.runtime)
            offload = p.breakdown.get("offload", 0.0)
            if offload <= 0:
                continue
            step = t.workload.tokens_per_step / run.measured / t.layout.world_size
            out.append(dict(gpu=run.gpu, file=results.name, trial=t.name, offload_s=offload,
                            step_s=p.step_time_s, ratio=(step - (p.step_time_s - offload)) / offload))
    return out


def main() -> int:
    rows = offload_ratios()
    print(f"{'gpu':5} {'trial':32} {'offload s':>9} {'step s':>7} {'implied/predicted':>17}  results")
    for r in rows:
        print(f"{r['gpu']:5} {r['trial']:32} {r['offload_s']:9.2f} {r['step_s']:7.2f} {r['ratio']:17.2f}  {r['file']}")
    for gpu in sorted({r["gpu"] for r in rows}):
        ratios = [r["ratio"] for r in rows if r["gpu"] == gpu]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        print(f"{gpu}: {len(ratios)} offload runs, implied / predicted offload median {statistics.median(ratios):.2f} "
              f"(quartiles {q[0]:.2f}-{q[2]:.2f}, range {min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
