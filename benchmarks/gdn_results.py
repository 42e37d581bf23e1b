"""Issue 12's measured figures for Qwen3.6-35B-A3B with its real Gated DeltaNet layers on H200.

    python benchmarks/gdn_results.py

1. Convergence arms from the same initial weights (benchmarks/gdn_h200_suite.json; results
   gdn-h200-1g-suite.jsonl and gdn-h200-2g-suite.jsonl): each candidate against its reference with
   experiments.checks.convergence.check (Megatron-Bridge's rules).
2. The `tune trial --backend megatron` runs on 1 and 2 GPUs (gdn-tune-trial-h200-{1g,2g}.json).
3. Point 5: the grid (megatron_h200_suite.json) and the leaderboard-shape comparison
   (x2_vs_leaderboard_suite.json) with the GDN layers replaced by full attention (earlier results) and
   with the real layers (…-gdn-suite.jsonl): measured tokens/s per GPU, the ranking in each, and the
   cost model's prediction for the real layers (carried on each result line).
Every figure is measured on H200 unless it says predicted.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.checks.convergence import check  # noqa: E402
from experiments.checks.loss_curve import Curve  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
ARMS = (("gdn-h200-1g-suite.jsonl", "gdn-1g-tp1-ep1", "gdn-1g-tp1-mbs2"),
        ("gdn-h200-1g-suite.jsonl", "gdn-1g-tp1-ep1", "gdn-1g-tp1-full1"),
        ("gdn-h200-2g-suite.jsonl", "gdn-ref-tp1-ep2", "gdn-cand-tp2-ep1"))
GRIDS = (("grid (first 4 layers, 8 steps)", "megatron-h200-suite.jsonl", "megatron-h200-gdn-suite.jsonl"),
         ("leaderboard shape vs tuner families (first 4 layers, 8k rows, 20 steps)",
          ("x2-h200-vs-leaderboard-suite.jsonl", "x2-h200-vs-leaderboard-b1-rerun.jsonl"),
          ("x2-h200-vs-leaderboard-gdn-suite.jsonl",
                                                 "x2-h200-vs-leaderboard-gdn-b1b2.jsonl")))


def lines(name: str) -> list[dict]:
    path = RESULTS / name
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def longest(rows: list[dict], trial: str) -> dict | None:
    """The run of `trial` with the most steps (a first run may have spent its time compiling kernels)."""
    runs = [r for r in rows if r.get("trial") == trial and r.get("status") == "ok"]
    return max(runs, key=lambda r: len(r.get("losses") or []), default=None)


def convergence() -> list[dict]:
    out = []
    for name, ref_name, cand_name in ARMS:
        rows = lines(name)
        ref, cand = longest(rows, ref_name), longest(rows, cand_name)
        if ref is None or cand is None:
            print(f"  {cand_name} vs {ref_name}: not measured ({name})")
            continue
        v = check(Curve.from_values(cand["losses"], source=cand_name), Curve.from_values(ref["losses"], source=ref_name))
        out.append(dict(reference=ref_name, candidate=cand_name, passed=v.passed, correlation=v.correlation,
                        final_diff=v.final_loss_difference))
        print(f"  {cand_name} ({cand['details']['layout']}) vs {ref_name} ({ref['details']['layout']}): "
              f"{'PASS' if v.passed else 'FAIL'}, correlation {v.correlation:.6f}, final loss difference "
              f"{v.final_loss_difference:.2%}, {len(cand['losses'])} steps; measured {cand['tokens_per_s_per_gpu']:,.0f} vs "
              f"{ref['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU")
    return out


def tune_trials() -> None:
    for gpus in (1, 2):
        path = RESULTS / f"gdn-tune-trial-h200-{gpus}g.json"
        if not path.exists():
            print(f"  {gpus} GPU(s): not measured")
            continue
        r = json.loads(path.read_text())
        d = r["details"]
        pred = d.get("prediction_for_model_run") or {}
        print(f"  {gpus} GPU(s) {d['layout']}: {r['status']}, {len(r['losses'])} steps, loss {r['losses'][0]:.2f} -> "
              f"{r['losses'][-1]:.2f}; measured {r['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU (predicted "
              f"{pred.get('tokens_per_s_per_gpu', float('nan')):,.0f}), allocated peak "
              f"{max(r['peak_memory_gib_per_rank']):.1f} GiB (predicted {pred.get('memory_gib', {}).get('allocated')}); "
              f"GDN: {d['kernels']['linear_attention']}")


def short_run(r: dict) -> str | None:
    """A run that ended before its measuring window (first TileLang compile of new shapes took the trial)."""
    d = r.get("details") or {}
    ran, asked = d.get("steps_run"), d.get("steps_requested")
    return f"{ran} of {asked} steps" if ran is not None and asked and ran < min(asked, 3) else None


def ranking(rows: list[dict]) -> dict[str, dict]:
    out = {}
    for r in rows:
        if r.get("status") == "ok" and short_run(r):
            out.setdefault(r["trial"], dict(failed=f"compile-only ({short_run(r)})", gpus=r.get("gpus")))
        elif r.get("status") == "ok" and r.get("tokens_per_s_per_gpu") and not r["trial"].endswith("lr1e-4"):
            pred = (r.get("details") or {}).get("prediction_for_model_run") or {}
            out[r["trial"]] = dict(measured=r["tokens_per_s_per_gpu"], predicted=pred.get("tokens_per_s_per_gpu"),
                                   gpus=r["gpus"])
        elif r.get("trial") and r["trial"] not in out and not r["trial"].endswith("lr1e-4"):
            out[r["trial"]] = dict(failed=r.get("failure_class"), gpus=r.get("gpus"))
    return out


def grids() -> None:
    for title, replaced_names, real_names in GRIDS:
        replaced_names, real_names = ((n,) if isinstance(n, str) else n for n in (replaced_names, real_names))
        replaced = ranking([r for n in replaced_names for r in lines(n)])
        real = ranking([r for n in real_names for r in lines(n)])
        print(f"  {title}: {' + '.join(replaced_names)} (GDN replaced) vs {' + '.join(real_names)} (real layers)")
        for trial in sorted(set(replaced) | set(real), key=lambda t: -(real.get(t, {}).get("measured") or 0)):
            a, b = replaced.get(trial, {}), real.get(trial, {})
            fmt = lambda x: (f"{x['measured']:9,.0f}" if "measured" in x  # noqa: E731
                             else f"{str(x['failed']) if 'failed' in x else 'not run':>9}")
            pred = f"predicted {b['predicted']:,.0f}" if b.get("predicted") else ""
            ratio = f"{b['measured'] / a['measured']:.2f}x" if "measured" in a and "measured" in b else ""
            print(f"    {trial:38s} replaced {fmt(a)}  real {fmt(b)} {ratio:>6}  {pred}")
        for label, table in (("replaced", replaced), ("real", real)):
            order = [t for t, x in sorted(table.items(), key=lambda kv: -(kv[1].get("measured") or 0)) if "measured" in x]
            print(f"    ranking ({label}, measured tokens/s/GPU): {' > '.join(order)}")


def main() -> int:
    print("1. Convergence arms, same initial weights (measured on H200):")
    convergence()
    print("2. tune trial --backend megatron with the real GDN layers (measured on H200):")
    tune_trials()
    print("3. Point 5: replaced vs real layers (measured on H200; predictions for the real layers from each line):")
    grids()
    return 0


if __name__ == "__main__":
    sys.exit(main())
