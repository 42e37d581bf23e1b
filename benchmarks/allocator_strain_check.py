"""The stored MoE runs near the memory limit, with and without the allocator_remap term.

For every measured megatron-runner run of a MoE model whose predicted device peak leaves at most NEAR_GIB of the
usable memory, it prints the room the memory model leaves beside the allocator's whole cache (cost_model.memory
allocator_gap_gib), whether that cache has no room (the allocator_remap rule, cost_model/allocator_strain.py), the
allocator's retries a step where the runner counted them (from v32 on), and the tokens/s error with today's model
and without its allocator_remap term. The rule was chosen after seeing these runs: those it prices are in sample
(benchmarks/runner_accuracy.py STRAIN_LOOKED_AT), the runs stored after it are the test.

    python benchmarks/allocator_strain_check.py
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measured_runs import load_runs  # noqa: E402
from benchmarks.runner_accuracy import DEFAULT, STRAIN_LOOKED_AT, trial_prediction  # noqa: E402
from cost_model.allocator_strain import cache_does_not_fit  # noqa: E402
from cost_model.nouns.hardware import load_gpu  # noqa: E402

NEAR_GIB = 4.5   # room beyond the predicted need: the runs near the limit (the largest MoE cache gap is about 2 GiB)


def near_limit_runs(pairs=DEFAULT) -> list[dict]:
    """One row per measured MoE run of the stored grids within NEAR_GIB of its usable memory."""
    out = []
    for suite, results in pairs:
        if not results.exists():
            continue
        for run in load_runs(suite, results):
            if not run.ok or not run.measured:
                continue
            t = run.trial
            model, p = trial_prediction(t, load_gpu(run.gpu), run.runtime)
            m = p.memory
            if not model.has_moe_layers or m.usable - m.total > NEAR_GIB:
                continue
            remap = p.breakdown.get("allocator_remap", 0.0)
            without = p.tokens_per_s_per_gpu * p.step_time_s / (p.step_time_s - remap)
            out.append(dict(gpu=run.gpu, file=results.name, trial=t.name, room=m.usable - m.total,
                            cache=m.allocator_cache, no_room=cache_does_not_fit(p.context, m),
                            retries=max(run.retries) if run.retries else None,
                            err=p.tokens_per_s_per_gpu / run.measured - 1, err_without=without / run.measured - 1,
                            looked_at=results.name in STRAIN_LOOKED_AT))
    return sorted(out, key=lambda r: r["room"])


def _pct(xs: list[float]) -> str:
    return f"{100 * min(xs):+.1f}% to {100 * max(xs):+.1f}% (median |err| {100 * statistics.median(map(abs, xs)):.1f}%)"


def main() -> int:
    rows = near_limit_runs()
    print(f"{'gpu':5} {'trial':26} {'room GiB':>8} {'cache':>6} {'no room':>7} {'retries':>7} {'err':>7} "
          f"{'without':>8}  results")
    for r in rows:
        retries = "-" if r["retries"] is None else f"{r['retries']:.0f}"
        print(f"{r['gpu']:5} {r['trial']:26} {r['room']:8.2f} {r['cache']:6.2f} {'yes' if r['no_room'] else '':>7} "
              f"{retries:>7} {100 * r['err']:+6.1f}% {100 * r['err_without']:+7.1f}%  {r['file']}"
              + ("" if r["looked_at"] else "  (stored after the rule)"))
    for label, pick in (("no room for the cache", True), ("room for it", False)):
        sel = [r for r in rows if r["no_room"] == pick]
        if sel:
            print(f"{label}: {len(sel)} runs; tokens/s error {_pct([r['err'] for r in sel])}, without allocator_remap "
                  f"{_pct([r['err_without'] for r in sel])}; {sum(r['err_without'] > 0.1 for r in sel)} ran over 10% "
                  f"slower than the step without it")
    print("labels: measured runner runs (few-layer proxies on the runner's own stack, not the full models on slime); "
          "predictions from today's model and the shipped profile of each run's GPU type")
    return 0


if __name__ == "__main__":
    sys.exit(main())
