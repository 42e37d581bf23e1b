"""Turn a Megatron runner suite's JSONL into benchmarks/results/megatron-h200.csv and print the
measured-vs-predicted figures: Spearman rank correlation of tokens/s, median absolute % error of
throughput and of peak memory, and whether predicted-OOM layouts did OOM.

Usage: python benchmarks/megatron_results.py [SUITE.jsonl ...] [--csv OUT.csv] [--date YYYY-MM-DD]
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

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


def summary(rows: list[dict]) -> list[str]:
    ok = [r for r in rows if r["status"] == "ok" and r["predicted_tokens_per_s_per_gpu"] != ""]
    lines = [f"{len(rows)} trials: {len(ok)} measured, "
             f"{sum(r['status'] != 'ok' for r in rows)} failed ({', '.join(sorted({r['failure_class'] for r in rows if r['failure_class']}))})"]
    if len(ok) >= 2:
        m = [r["measured_tokens_per_s_per_gpu"] for r in ok]
        p = [r["predicted_tokens_per_s_per_gpu"] for r in ok]
        lines.append(f"Spearman rank correlation, predicted vs measured tokens/s: {spearman(m, p):.3f} (n={len(ok)})")
        lines.append(f"median absolute % error of throughput: {statistics.median(abs(b / a - 1) for a, b in zip(m, p)):.1%}")
        mm = [(r["measured_peak_memory_gib"], r["predicted_peak_memory_gib"]) for r in ok if r["measured_peak_memory_gib"]]
        lines.append(f"median absolute % error of peak memory: {statistics.median(abs(b / a - 1) for a, b in mm):.1%}")
    for r in rows:
        if r["predicted_fits"] is False:
            lines.append(f"predicted not to fit: {r['trial']} -> {r['status']} {r['failure_class']}")
    return lines


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(xs):
        order = sorted(range(len(xs)), key=xs.__getitem__)
        r = [0.0] * len(xs)
        for k, i in enumerate(order):
            r[i] = k
        return r
    ra, rb, n = ranks(a), ranks(b), len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", default=[str(ROOT / "benchmarks/results/megatron-h200-suite.jsonl")])
    parser.add_argument("--csv", default=str(ROOT / "benchmarks/results/megatron-h200.csv"))
    parser.add_argument("--date", default="2026-11-29")
    args = parser.parse_args()
    lines = [json.loads(l) for path in args.suites for l in Path(path).read_text().splitlines() if l.strip()]
    rows = rows_of(lines, args.date)
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    for line in summary(rows):
        print(line)
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
