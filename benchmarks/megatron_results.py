"""Turn a Megatron runner suite's JSONL into benchmarks/results/megatron-h200.csv and print the
measured-vs-predicted figures: Spearman rank correlation of tokens/s, median absolute % error of
throughput and of peak memory, and whether predicted-OOM layouts did OOM.

Usage: python benchmarks/megatron_results.py [SUITE.jsonl ...] [--csv OUT.csv] [--date YYYY-MM-DD]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from experiments.runner import TrialResult

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("date", "gpus", "model", "layers", "layout_label", "tp", "pp", "ep", "etp", "cp", "recompute",
           "max_tokens_per_gpu", "measured_tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu",
           "measured_peak_memory_gib", "predicted_peak_memory_gib", "predicted_fits", "status", "failure_class",
           "backend", "trial")


def rows_of(lines: list[dict], date: str) -> list[dict]:
    out = []
    for r in lines:
        d = TrialResult.from_dict(r).details
        label = d.get("layout", "")
        shape = {k: 1 for k in ("TP", "PP", "EP", "ETP", "CP")}
        for token in label.split(" | ")[0].split():
            for key in shape:
                if token.startswith(key) and token[len(key):].isdigit():
                    shape[key] = int(token[len(key):])
        p = d.get("prediction_for_model_run") or {}
        run = d.get("model_run") or {}
        out.append({
            "date": date, "gpus": r["gpus"], "model": (run.get("name") or "").split("[")[0] or "qwen3.6-35b-a3b",
            "layers": run.get("layers", ""), "layout_label": label, "tp": shape["TP"], "pp": shape["PP"],
            "ep": shape["EP"], "etp": shape["ETP"], "cp": shape["CP"],
            "recompute": label.split(" | ")[2][3:] if label.count(" | ") >= 2 else "",
            "max_tokens_per_gpu": label.split(" | ")[1][3:] if " | " in label else "",
            "measured_tokens_per_s_per_gpu": _num(r.get("tokens_per_s_per_gpu")),
            "predicted_tokens_per_s_per_gpu": _num(p.get("tokens_per_s_per_gpu")),
            "measured_peak_memory_gib": _num(r.get("peak_memory_gib")),
            "predicted_peak_memory_gib": _num(p.get("peak_memory_gib")),
            "predicted_fits": p.get("fits", ""), "status": r["status"], "failure_class": r.get("failure_class") or "",
            "backend": d.get("backend", ""), "trial": r["trial"]})
    return out


def _num(x):
    return "" if x is None else round(float(x), 2)


def summary(table: pd.DataFrame) -> list[str]:
    """The figures of a results table (`rows_of`'s rows): counts, rank correlation, median errors, OOM verdicts."""
    ok = table[(table.status == "ok") & (table.predicted_tokens_per_s_per_gpu != "")]
    classes = sorted(set(table.failure_class) - {""})
    lines = [f"{len(table)} trials: {len(ok)} measured, {(table.status != 'ok').sum()} failed ({', '.join(classes)})"]
    if len(ok) >= 2:
        tps = pd.DataFrame({"measured": ok.measured_tokens_per_s_per_gpu.astype(float),
                            "predicted": ok.predicted_tokens_per_s_per_gpu.astype(float)})
        # Spearman: Pearson of the ranks, ties given their average rank (DataFrame.corr needs no scipy).
        rho = tps.corr(method="spearman").at["predicted", "measured"]
        lines.append(f"Spearman rank correlation, predicted vs measured tokens/s: {rho:.3f} (n={len(ok)})")
        tps_error = (tps.predicted / tps.measured - 1).abs().median()
        lines.append(f"median absolute % error of throughput: {tps_error:.1%}")
        memory = ok[ok.measured_peak_memory_gib.astype(bool)]
        memory_error = (memory.predicted_peak_memory_gib.astype(float) / memory.measured_peak_memory_gib.astype(float)
                        - 1).abs().median()
        lines.append(f"median absolute % error of peak memory: {memory_error:.1%}")
    for r in table[table.predicted_fits.eq(False)].itertuples(index=False):
        lines.append(f"predicted not to fit: {r.trial} -> {r.status} {r.failure_class}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", default=[str(ROOT / "benchmarks/results/megatron-h200-suite.jsonl")])
    parser.add_argument("--csv", default=str(ROOT / "benchmarks/results/megatron-h200.csv"))
    parser.add_argument("--date", default="2026-11-29")
    args = parser.parse_args()
    lines = [json.loads(l) for path in args.suites for l in Path(path).read_text().splitlines() if l.strip()]
    table = pd.DataFrame(rows_of(lines, args.date), columns=COLUMNS)
    table.to_csv(args.csv, index=False, lineterminator="\r\n")  # csv.writer's line ends, as the stored tables
    for line in summary(table):
        print(line)
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
