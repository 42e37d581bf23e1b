"""Convergence verdicts and the 2-GPU leaderboard comparison from the measured suites.

1. Convergence arms (benchmarks/results/convergence-h200-suite.jsonl): cand TP2 EP1 and the broken arms
   (lr x10, different data) each checked against ref TP1 EP2 with experiments.convergence.check.
2. Issue 7 on 2 x H200 (benchmarks/results/x2-h200-vs-leaderboard-*.jsonl): (a) the leaderboard's layout
   shape and (b) the tuner's top 3; tokens/s per GPU, ratio b/a, peak memory against the prediction, and
   each (b) convergence-checked against (a) over the steps both ran (a trial stopped early by the time
   budget is compared on its steps only, and the row says so).
Writes benchmarks/results/x2-h200-vs-leaderboard.csv and the loss curves as CSV under benchmarks/results/curves/.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from benchmarks.megatron_results import rows_of
from experiments.convergence import Curve, CurveError, check

RESULTS = Path(__file__).resolve().parent / "results"
COLUMNS = ("date", "gpus", "model", "layers", "layout_label", "tp", "pp", "ep", "etp", "cp", "recompute",
           "max_tokens_per_gpu", "measured_tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu",
           "measured_peak_memory_gib", "predicted_peak_memory_gib", "status", "failure_class", "role",
           "ratio_to_leaderboard_shape", "convergence", "convergence_detail", "trial")


def load(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def curve(r: dict, steps: int | None = None) -> Curve:
    losses = r["losses"][:steps] if steps else r["losses"]
    norms = (r["detail"].get("grad_norms") or [])[:len(losses)] or None
    return Curve(tuple(range(1, len(losses) + 1)), tuple(losses), tuple(norms) if norms else None, r["trial"])


def verdict(cand: dict, ref: dict) -> tuple[str, str]:
    if cand["status"] != "ok":
        return "not run", f"{cand['failure_class']}"
    n = min(len(cand["losses"]), len(ref["losses"]))
    note = "" if n == len(ref["losses"]) == len(cand["losses"]) else f" (first {n} steps: both arms ran them)"
    try:
        v = check(curve(cand, n), curve(ref, n))
    except CurveError as e:
        return "unusable", str(e)
    d = v.to_dict()
    return ("pass" if v.passed else "fail"), (
        f"correlation {d['correlation']:.5f}, final loss difference {d['final_loss_difference']:.4f}, "
        f"pointwise failures {d['pointwise_failures']}{note}")


def write_curves(rows: list[dict]) -> None:
    out = RESULTS / "curves"
    out.mkdir(exist_ok=True)
    for r in rows:
        if r.get("losses"):
            with open(out / f"{r['trial']}.csv", "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["step", "loss", "grad_norm"])
                norms = r["detail"].get("grad_norms") or [""] * len(r["losses"])
                for i, (loss, g) in enumerate(zip(r["losses"], norms), 1):
                    w.writerow([i, loss, g])


def main() -> None:
    conv = {r["trial"]: r for r in load(RESULTS / "convergence-h200-suite.jsonl")}
    ref = conv["conv-ref-tp1-ep2"]
    print("Convergence arms (2 x H200, 4-layer Qwen3.6-35B-A3B, 20 steps, same rows and seed), against "
          f"{ref['trial']}:")
    for name in ("conv-cand-tp2-ep1", "conv-broken-lr10", "conv-broken-data"):
        result, detail = verdict(conv[name], ref)
        print(f"  {name:<22} {result:<5} {detail}")
    write_curves(list(conv.values()))
    same_init = RESULTS / "convergence-cpuinit-h200-suite.jsonl"
    if same_init.exists():
        pair = {r["trial"]: r for r in load(same_init)}
        ref3 = pair["conv3-ref-tp1-ep2-cpuinit"]
        print(f"Same initial weights (CPU initialisation), lr 1e-4, against {ref3['trial']}:")
        result, detail = verdict(pair["conv3-cand-tp2-ep1-cpuinit"], ref3)
        print(f"  {'conv3-cand-tp2-ep1':<22} {result:<5} {detail}")
        write_curves(list(pair.values()))

    runs = {r["trial"]: r for r in load(RESULTS / "x2-h200-vs-leaderboard-suite.jsonl") if r.get("status") != "skipped"}
    rerun = RESULTS / "x2-h200-vs-leaderboard-b1-rerun.jsonl"
    if rerun.exists():
        runs.update({r["trial"]: r for r in load(rerun)})
    a = runs["a-leaderboard-tp1-ep2-full1-mt8192"]
    rows = []
    for name, r in runs.items():
        is_a = r is a
        result, detail = ("reference", "") if is_a else verdict(r, a)
        ratio = (r["tokens_per_s_per_gpu"] / a["tokens_per_s_per_gpu"]) if r.get("tokens_per_s_per_gpu") else None
        row = rows_of([r], "2026-11-29")[0]
        row.update(role="a: leaderboard shape" if is_a else "b: tuner top 3",
                   ratio_to_leaderboard_shape=round(ratio, 3) if ratio else "", convergence=result,
                   convergence_detail=detail)
        rows.append({k: row.get(k, "") for k in COLUMNS})
    with open(RESULTS / "x2-h200-vs-leaderboard.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    write_curves(list(runs.values()))
    print("\n2 x H200, leaderboard shape vs the tuner's top 3 (4-layer model, 8,192-token rows, measured):")
    for r in rows:
        print(f"  {r['role']:<21} {r['layout_label']:<62} {r['measured_tokens_per_s_per_gpu'] or r['failure_class']:>9} "
              f"tok/s/GPU  x{r['ratio_to_leaderboard_shape'] or '-'}  peak {r['measured_peak_memory_gib'] or '-'} GiB "
              f"(pred {r['predicted_peak_memory_gib']})  convergence {r['convergence']} {r['convergence_detail']}")
    print(f"wrote {RESULTS / 'x2-h200-vs-leaderboard.csv'}")


if __name__ == "__main__":
    main()
