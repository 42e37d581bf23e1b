"""Convergence verdicts and the 2-GPU leaderboard comparison from the measured suites.

1. Convergence arms from the same initial weights (benchmarks/results/convergence-same-init-h200-suite.jsonl,
   suite benchmarks/convergence_same_init_suite.json): cand TP2 EP1, cand TP1 EP2 with 2-row micro-batches
   and the broken arms (lr x10, different data) each checked against ref TP1 EP2 with
   experiments.checks.convergence.check; the step-1 losses of every arm (they start from the same weights, so
   these agree to bf16 rounding); full recompute with 1-row vs none with 2-row micro-batches.
2. The micro-batch / attention-kernel check (sdpa-mbs-h200-suite.jsonl): step-1 loss and grad norm.
3. The earlier arms with per-rank random initialisation (convergence-h200-suite.jsonl): each layout
   started from different weights, which the check rightly tells apart.
4. Issue 7 on 2 x H200 (x2-h200-vs-leaderboard-*.jsonl): (a) the leaderboard's layout shape and (b) the
   tuner's top 3, at lr 3e-4 and at lr 1e-4; tokens/s per GPU, ratio b/a, peak memory against the
   prediction, and each (b) convergence-checked against the (a) of its learning rate.
Writes benchmarks/results/x2-h200-vs-leaderboard.csv and the loss curves as CSV under benchmarks/results/curves/.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from benchmarks.megatron_results import rows_of
from experiments.checks.convergence import Curve, CurveError, check
from experiments.runner import TrialResult

RESULTS = Path(__file__).resolve().parent / "results"
COLUMNS = ("date", "lr", "gpus", "model", "layers", "layout_label", "tp", "pp", "ep", "etp", "cp", "recompute",
           "max_tokens_per_gpu", "measured_tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu",
           "measured_peak_memory_gib", "predicted_peak_memory_gib", "status", "failure_class", "role",
           "ratio_to_leaderboard_shape", "convergence", "convergence_detail", "trial")


def facts(line: dict) -> dict:
    """The runner's facts of a stored result line (old lines kept them in `detail`, new ones in `details`)."""
    return TrialResult.from_dict(line).details


def load(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def curve(r: dict, steps: int | None = None) -> Curve:
    losses = r["losses"][:steps] if steps else r["losses"]
    norms = (facts(r).get("grad_norms") or [])[:len(losses)] or None
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
                norms = facts(r).get("grad_norms") or [""] * len(r["losses"])
                for i, (loss, g) in enumerate(zip(r["losses"], norms), 1):
                    w.writerow([i, loss, g])


def _arms(path: Path, ref_name: str, names: list[str], title: str) -> dict:
    runs = {r["trial"]: r for r in load(path)}
    ref = runs[ref_name]
    print(f"{title}, against {ref_name}:")
    for name in names:
        result, detail = verdict(runs[name], ref)
        print(f"  {name:<24} {result:<5} {detail}")
    write_curves(list(runs.values()))
    return runs


def _first_steps(runs: dict, ref_name: str, title: str) -> None:
    """Step 1 is before any update: arms from the same weights and rows must agree to bf16 rounding."""
    ref = runs[ref_name]
    print(f"{title} (step-1 loss and grad norm relative to {ref_name}):")
    for name, r in runs.items():
        if r.get("status") != "ok" or not r.get("losses"):
            continue
        g, g0 = facts(r)["grad_norms"][0], facts(ref)["grad_norms"][0]
        print(f"  {name:<24} loss {r['losses'][0]:.6f} ({r['losses'][0] / ref['losses'][0] - 1:+.1e})  "
              f"grad norm {g:.4f} ({g / g0 - 1:+.1e})  sdpa {facts(r)['kernels_ran'].get('sdpa_backend')}")


def _tuner_run(db: Path) -> None:
    """`tune --backend megatron` on 2 x H200 (Llama3-8B, first 8 layers): its trials and convergence verdicts."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="llama3-8b-h200-x2", storage=f"sqlite:///{db}")
    verdicts = study.user_attrs.get("convergence_verdicts") or {}
    print("tune --backend megatron on 2 x H200 (Llama3-8B, 8 layers, 10 steps, learnable rows), convergence arm "
          f"against {next(iter((study.user_attrs.get('convergence_references') or {'': '?'}).values())).split(':')[0]}:")
    from tuner.report import ranked_rows

    for row in ranked_rows(study):
        v = verdicts.get(str(row.number)) or {}
        print(f"  trial {row.number} {row.layout.long_label}: {row.tokens_per_s_per_gpu:,.0f} tokens/s/GPU {row.kind}; convergence {v.get('result')} (correlation {v.get('correlation')}, final loss "
              f"difference {v.get('final_loss_difference')}, pointwise failures {v.get('pointwise_failures')})")


def main() -> None:
    same = RESULTS / "convergence-same-init-h200-suite.jsonl"
    runs = _arms(same, "same-ref-tp1-ep2", ["same-cand-tp2-ep1", "same-cand-tp1-ep2-mbs2", "same-broken-lr10",
                                              "same-broken-data"],
                 "Convergence arms from the same initial weights (2 x H200, 4-layer Qwen3.6-35B-A3B, 20 steps, "
                 "lr 1e-4, same rows and seed)")
    _first_steps({k: v for k, v in runs.items() if not k.startswith("rc-") and k != "same-broken-data"},
                 "same-ref-tp1-ep2",
                 "Same weights in every layout")
    result, detail = verdict(runs["rc-none-mbs2-8k"], runs["rc-full1-mbs1-8k"])
    print(f"  8,192-token rows, full recompute 1-row vs none 2-row micro-batches (3 steps): {result} {detail}; "
          f"step-1 losses {runs['rc-full1-mbs1-8k']['losses'][0]:.5f} / {runs['rc-none-mbs2-8k']['losses'][0]:.5f}")
    pipeline = {r["trial"]: r for r in load(RESULTS / "convergence-pipeline-h200-suite.jsonl")}
    pipeline.update({r["trial"]: r for r in load(RESULTS / "convergence-pipeline-vpp-h200-suite.jsonl")})
    ref = pipeline["pp-ref-tp1-ep2"]
    print("Pipeline splits, weights reseeded per global layer (20 steps, lr 1e-4), against pp-ref-tp1-ep2:")
    for name in ("pp-cand-tp1-pp2", "pp-cand-tp1-pp2-vpp2"):
        result, detail = verdict(pipeline[name], ref)
        print(f"  {name:<24} {result:<5} {detail}")
    write_curves(list(pipeline.values()))
    _first_steps(pipeline, "pp-ref-tp1-ep2", "Pipeline splits, step 1 (pp-init-tp1-pp2-vpp2 ran with batched p2p, "
                 "before the fix)")
    _tuner_run(RESULTS / "tune-llama3-8b-h200-x2" / "tune-llama3-8b-h200-x2.db")
    kernels = {r["trial"]: r for r in load(RESULTS / "sdpa-mbs-h200-suite.jsonl")}
    _first_steps(kernels, "tp1-ep2-mbs1-auto", "Micro-batch size and attention kernel")
    _arms(RESULTS / "convergence-h200-suite.jsonl", "conv-ref-tp1-ep2",
          ["conv-cand-tp2-ep1", "conv-broken-lr10", "conv-broken-data"],
          "Earlier arms, per-rank random initialisation (every layout starts from different weights), lr 3e-4")

    rows = []
    for lr, suite, a_name in (("3e-4", "x2-h200-vs-leaderboard-suite.jsonl", "a-leaderboard-tp1-ep2-full1-mt8192"),
                              ("1e-4", "x2-h200-vs-leaderboard-lr1e-4-suite.jsonl",
                               "a-leaderboard-tp1-ep2-full1-mt8192-lr1e-4")):
        runs = {r["trial"]: r for r in load(RESULTS / suite) if r.get("status") != "skipped"}
        rerun = RESULTS / "x2-h200-vs-leaderboard-b1-rerun.jsonl"
        if lr == "3e-4" and rerun.exists():
            runs.update({r["trial"]: r for r in load(rerun)})
        a = runs[a_name]
        for name, r in runs.items():
            is_a = r is a
            result, detail = ("reference", "") if is_a else verdict(r, a)
            ratio = (r["tokens_per_s_per_gpu"] / a["tokens_per_s_per_gpu"]) if r.get("tokens_per_s_per_gpu") else None
            row = rows_of([r], "2026-11-29")[0]
            row.update(lr=lr, role="a: leaderboard shape" if is_a else "b: tuner top 3",
                       ratio_to_leaderboard_shape=round(ratio, 3) if ratio else "", convergence=result,
                       convergence_detail=detail)
            rows.append({k: row.get(k, "") for k in COLUMNS})
        write_curves(list(runs.values()))
    with open(RESULTS / "x2-h200-vs-leaderboard.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print("\n2 x H200, leaderboard shape vs the tuner's top 3 (4-layer model, 8,192-token rows, measured):")
    for r in rows:
        print(f"  lr {r['lr']} {r['role']:<21} {r['layout_label']:<62} "
              f"{r['measured_tokens_per_s_per_gpu'] or r['failure_class']:>9} tok/s/GPU  "
              f"x{r['ratio_to_leaderboard_shape'] or '-'}  peak {r['measured_peak_memory_gib'] or '-'} GiB "
              f"(pred {r['predicted_peak_memory_gib']})  convergence {r['convergence']} {r['convergence_detail']}")
    print(f"wrote {RESULTS / 'x2-h200-vs-leaderboard.csv'}")


if __name__ == "__main__":
    main()
