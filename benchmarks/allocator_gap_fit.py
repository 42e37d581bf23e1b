"""The allocator's gap (reserved - allocated peak) on the megatron runner's runs, and the fit of constants.yaml's
allocator_gap_* to it.

A run with room to spare shows a device-level peak above what it needs: PyTorch's caching allocator keeps blocks
reserved beyond its allocated peak. On the runner's H200 grids the gap is about 0.3 GiB on dense models and 0.5-4.5
GiB on MoE models, larger where a micro-batch routes more rows (the dispatched tokens and expert inputs have
routing-dependent sizes every micro-batch). cost_model.memory.allocator_gap_gib models it as a constant for dense
models and a line in the micro-batch's dispatched GiB (cost_model.memory.dispatched_gib) for MoE models; it enters
the expected device peak only (capped by the card's room), never what a layout needs.

Fitted by least squares on the in-sample grids only (benchmarks/runner_accuracy.IN_SAMPLE_FILES: v1-v10); printed
with each MoE family held out in turn (the fit without it, its runs' residuals), and the held-out grids' residuals.

    python benchmarks/allocator_gap_fit.py
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.measured_runs import load_runs  # noqa: E402
from benchmarks.runner_accuracy import DEFAULT, IN_SAMPLE_FILES  # noqa: E402
from cost_model.constants import default_constants  # noqa: E402
from cost_model.memory import dispatched_gib  # noqa: E402
from cost_model.nouns.model_spec import load_model  # noqa: E402
from experiments.megatron.model_run import trial_model  # noqa: E402


def gap_rows(pairs=DEFAULT) -> list[dict]:
    """One row per measured run with rank 0's allocator figures: the gap and the dispatched GiB."""
    out, seen = [], set()
    for suite, results in pairs:
        memory = {}
        for line in results.read_text().splitlines():
            rec = json.loads(line)
            m = ((rec.get("details") or {}).get("memory_gib_per_rank") or {}).get("0")
            if rec.get("status") == "ok" and m and "peak_reserved" in m:
                memory.setdefault(rec["trial"], m)
        for run in load_runs(suite, results):
            t, m = run.trial, memory.get(run.trial.name)
            if not run.ok or m is None or (results.name, t.name) in seen:
                continue
            seen.add((results.name, t.name))
            model = trial_model(load_model(t.model), t.layers if isinstance(t.layers, int) else None, t.replace_gdn)
            # the micro-batch's tokens on one GPU and its routed rows per token as cost_model.predict gives them to
            # the memory model (these runs are all EP1: no routing imbalance)
            tokens = t.layout.max_tokens_per_gpu / t.layout.cp
            routed = model.num_experts_per_tok * t.layout.etp
            out.append({"file": results.name, "trial": t.name, "family": model.display_name.split("[")[0],
                        "moe": model.has_moe_layers, "dispatched": dispatched_gib(model, t.layout, tokens, routed),
                        "gap": m["peak_reserved"] - m["peak_allocated"], "in_sample": results.name in IN_SAMPLE_FILES})
    return out


def fit(rows: list[dict]) -> tuple[float, float, float]:
    """(dense gap, MoE intercept, MoE slope per dispatched GiB)."""
    dense = [r["gap"] for r in rows if not r["moe"]]
    moe = [r for r in rows if r["moe"]]
    x = np.array([[1.0, r["dispatched"]] for r in moe])
    (a, b), *_ = np.linalg.lstsq(x, np.array([r["gap"] for r in moe]), rcond=None)
    return float(statistics.mean(dense)), float(a), float(b)


def main() -> None:
    rows = gap_rows()
    ins = [r for r in rows if r["in_sample"]]
    dense, a, b = fit(ins)
    c = default_constants()
    print(f"{len(rows)} runs with allocator figures, {len(ins)} in sample (v1-v10)")
    print(f"fit on the in-sample runs: dense {dense:.2f} GiB; MoE {a:.2f} + {b:.2f} x dispatched GiB")
    print(f"constants.yaml:            dense {c.allocator_gap_dense_gib:.2f} GiB; MoE {c.allocator_gap_moe_gib:.2f} + "
          f"{c.allocator_gap_per_dispatched_gib:.2f} x dispatched GiB")

    def predicted(r, d, i, s):
        return i + s * r["dispatched"] if r["moe"] else d

    for fam in sorted({r["family"] for r in rows if r["moe"]}):
        d, i, s = fit([r for r in ins if r["family"] != fam])
        res = [r["gap"] - predicted(r, d, i, s) for r in rows if r["family"] == fam]
        print(f"  {fam:22} held out: fit {i:.2f} + {s:.2f} x; {len(res):3} runs, residual median {statistics.median(res):+.2f}"
              f", max |.| {max(map(abs, res)):.2f} GiB")
    for label, sel in (("in sample", ins), ("held out (v11 on)", [r for r in rows if not r["in_sample"]])):
        for kind in (True, False):
            res = [r["gap"] - predicted(r, dense, a, b) for r in sel if r["moe"] is kind]
            if res:
                print(f"{label:18} {'MoE' if kind else 'dense':5} {len(res):3} runs: residual median "
                      f"{statistics.median(res):+.2f}, max |.| {max(map(abs, res)):.2f} GiB")


if __name__ == "__main__":
    main()
