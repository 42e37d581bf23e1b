"""Fit the megatron runner's activation factors (constants.yaml unfused_activation_factor and
unfused_moe_activation_factor) to its measured allocated peaks on H200.

    python benchmarks/runner_activation_fit.py [RESULTS.jsonl ...]

Since 2026-12-06 a layer with a dense MLP is counted tensor by tensor instead (activations.runner_dense_layer_bytes,
as benchmarks/saved_tensors_cpu.py traces it): the dense factor printed is the one then in force, used no more.

The runner's stack is unfused (no Transformer Engine): its layers keep more for the backward than the
fused count, and cost_model.activations scales the count (fused + `unfused_extra_bytes`) by one factor
for layers with a dense MLP and one for layers with a MoE MLP. Each result line carries the prediction
it was made with (details.prediction_for_model_run: static parts, activations, loss path, and the
factors then in force, `unfused_activation_factors`; 1.15 for both kinds before they were recorded). A run tells us the factor only where its peak is the
activations' (no optimizer-step term in the prediction, activations at least MIN_ACTIVATIONS_GIB): then

    factor = factor at measurement x (measured allocated peak - weights - grads - optimizer - loss path)
             / predicted activations

which takes the static parts and the loss path as right (the runs whose peak is the optimizer step or the
loss path, printed as checks, show them within 0.3%). Models whose layers mix both MLP kinds are left
out (their runs cannot split the factor).

An OOM message is a lower bound: "Tried to allocate X GiB ... Y GiB allocated" in the forward's fp32 copy
of the logits means the saved activations and the bf16 logits were all held, so

    factor >= factor now x (Y - weights - grads - optimizer - bf16 logits) / predicted activations now

(OOM_BOUNDS, re-predicted with the current model), printed as a check beside the fit. The fitted factor is
the largest of its kind's runs, so the boundary leans to refusing; the spread is printed beside it. The one
bound on record (a run with the GDN layers replaced by full attention, without expandable segments, in an
earlier runner) sits 20% above the 12 MoE runs of the boundary and GDN suites (0.86-0.91): it is reported,
not fitted, until a run with the current runner reproduces it.
"""
from __future__ import annotations

import glob
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GLOBS = ("benchmarks/results/memory-boundary-h200-*.jsonl", "benchmarks/results/gdn-h200-*.jsonl",
                 "benchmarks/results/megatron-h200-gdn-suite.jsonl", "benchmarks/results/x2-h200-vs-leaderboard-gdn-suite.jsonl")
FACTOR_BEFORE_RECORDED = 1.15    # constants.yaml's one unfused_activation_factor before the runner recorded its factors
MIN_ACTIVATIONS_GIB = 2.0
# (model, layers, GPUs, seq_len, global batch rows, layout fields, GiB allocated at the OOM, where it is from)
OOM_BOUNDS = (
    ("qwen3.6-35b-a3b", 4, 2, 8192, 8, dict(max_tokens_per_gpu=32768, rows_per_microbatch=4), 86.31,
     "x2-h200-vs-leaderboard-b1-rerun.jsonl b1-tp1-dp2-mt32768 (GDN replaced by full attention): 'Tried to "
     "allocate 30.31 GiB' (the fp32 copy of 32,768 x 248,320 logits) with 86.31 GiB allocated"),
)
MOE_MODELS = ("qwen3-30b-a3b", "qwen3.6-35b-a3b", "qwen3.5-35b-a3b")
DENSE_MODELS = ("llama3-8b",)


def runs(paths: list[str]) -> list[dict]:
    """The measured, activation-bound runs: name, kind, implied factor, and the figures behind it."""
    out, seen = [], set()
    for path in paths:
        for line in Path(path).read_text().splitlines():
            r = json.loads(line)
            d = r.get("details") or {}
            pred = (d.get("prediction_for_model_run") or {}).get("memory_gib") or {}
            ranks = r.get("peak_memory_gib_per_rank")
            if r.get("status") != "ok" or not pred or not ranks:
                continue
            model = ((d.get("model_run") or {}).get("name") or "").split("[")[0]
            key = (r.get("trial"), d.get("layout"), model)
            if key in seen:
                continue
            seen.add(key)
            kind = "moe" if model in MOE_MODELS else "dense" if model in DENSE_MODELS else None
            measured = max(ranks)
            static = pred["weights"] + pred["grads"] + pred["optimizer"]
            bound = "optimizer step" if pred.get("optimizer_step", 0) > 0 else (
                "loss path" if pred["activations"] < MIN_ACTIVATIONS_GIB else "activations")
            row = dict(trial=r.get("trial"), model=model, kind=kind, layout=d.get("layout"), bound=bound,
                       measured=measured, predicted=pred["allocated"], error=pred["allocated"] / measured - 1)
            then = ((d.get("prediction_for_model_run") or {}).get("unfused_activation_factors") or {}).get(
                kind, FACTOR_BEFORE_RECORDED)
            if bound == "activations" and kind and then is not None:   # None: counted, no factor
                row["factor"] = then * (measured - static - pred["loss_path"]) / pred["activations"]
            out.append(row)
    return out


# The results files of DEFAULT_GLOBS and the suites their trials come from (for re-predicting them with today's count).
SUITE_OF = {"gdn-h200-1g-suite.jsonl": "gdn_h200_suite.json", "gdn-h200-2g-suite.jsonl": "gdn_h200_suite.json",
            "megatron-h200-gdn-suite.jsonl": "megatron_h200_gdn_suite.json",
            "x2-h200-vs-leaderboard-gdn-suite.jsonl": "x2_vs_leaderboard_gdn_suite.json"}


def suite_of(results: Path) -> Path | None:
    name = SUITE_OF.get(results.name)
    if name is None and results.name.startswith("memory-boundary-h200-"):
        name = "memory_boundary_h200_" + results.stem.removeprefix("memory-boundary-h200-").replace("-", "_") + "_suite.json"
    path = ROOT / "benchmarks" / name if name else None
    return path if path and path.exists() else None


def refit(paths: list[str]) -> dict[str, list[float]]:
    """The factor each activation-bound run implies under today's count, re-predicted: the activations are
    E + factor x R (E what no factor scales: the Gated DeltaNet block's count, cost_model.activations.runner_gdn_bytes,
    and a shared expert's, runner_shared_expert_bytes),
    read from predictions at the factor in force and at twice it; then factor = (measured - static - loss path - E) / R."""
    from dataclasses import replace
    from cost_model.constants import default_constants
    from cost_model.nouns.hardware import load_gpu
    from cost_model.nouns.model_spec import load_model
    from cost_model.predict import predict
    from benchmarks.measured_runs import load_runs
    from experiments.megatron.model_run import trial_model
    c = default_constants()
    doubled = replace(c, unfused_activation_factor=2 * c.unfused_activation_factor,
                      unfused_moe_activation_factor=2 * c.unfused_moe_activation_factor)
    out: dict[str, list[float]] = {"dense": [], "moe": []}
    for path in map(Path, paths):
        suite = suite_of(path)
        if suite is None:
            continue
        allocated = {}
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r.get("status") == "ok" and r.get("peak_memory_gib_per_rank"):
                allocated.setdefault(r["trial"], max(r["peak_memory_gib_per_rank"]))
        for run in load_runs(suite, path):
            t = run.trial
            # a dense-MLP layer is counted tensor by tensor since 2026-12-06 (activations.runner_dense_layer_bytes)
            kind = "moe" if t.model in MOE_MODELS else None
            if not run.ok or kind is None or t.name not in allocated:
                continue
            model = trial_model(load_model(t.model), t.layers if isinstance(t.layers, int) else None, t.replace_gdn)
            now, twice = (predict(model, load_gpu(run.gpu), t.workload, t.layout, constants=k,
                                  precision_aware_optimizer=False, runtime=run.runtime).memory for k in (c, doubled))
            if now.optimizer_step > 0 or now.activations < MIN_ACTIVATIONS_GIB:
                continue
            f0 = c.unfused_moe_activation_factor if kind == "moe" else c.unfused_activation_factor
            rest = (twice.activations - now.activations) / f0
            exact = now.activations - f0 * rest
            out[kind].append((allocated[t.name] - now.weights - now.grads - now.optimizer - now.loss_path - exact) / rest)
    return out


def oom_bounds() -> list[dict]:
    """The lower bounds OOM_BOUNDS put on the factor of their model's MLP kind, with the current model."""
    from cost_model.nouns.case import Case
    from cost_model.constants import default_constants
    from cost_model.nouns.hardware import load_gpu
    from cost_model.nouns.layout import Layout
    from cost_model.loss_path import padded_vocab
    from cost_model.nouns.model_spec import load_model
    from cost_model.nouns.units import BF16, GIB
    from cost_model.nouns.workload import Workload
    from experiments.megatron.model_run import predict_run, trial_model
    c = default_constants()
    out = []
    for model_name, layers, gpus, seq_len, rows, fields, allocated, where in OOM_BOUNDS:
        model = load_model(model_name)
        layout = Layout(gpus, **fields)
        run = trial_model(model, layers, replace_gdn=True)
        p = predict_run(Case(run, load_gpu("h200"), Workload(seq_len=seq_len, global_batch=rows,
                                                              framework="megatron"), layout))
        m = p.memory
        logits = BF16 * layout.max_tokens_per_gpu * padded_vocab(model.vocab_size, layout.tp) / layout.tp / GIB
        if not model.is_moe:   # a dense-MLP layer has no factor since 2026-12-06
            continue
        kind, now = "moe", c.unfused_moe_activation_factor
        out.append(dict(kind=kind, where=where, bound=now * (allocated - m.weights - m.grads - m.optimizer - logits)
                        / m.activations))
    return out


def main(argv: list[str]) -> int:
    paths = argv or sorted(p for g in DEFAULT_GLOBS for p in glob.glob(str(ROOT / g)))
    rows = runs(paths)
    bounds = oom_bounds()
    for b in bounds:
        print(f"OOM bound ({b['kind']}): factor >= {b['bound']:.3f} from {b['where']}")
    for r in rows:
        f = f"factor {r['factor']:.3f}" if "factor" in r else "(check: static parts and loss path)"
        print(f"{r['trial'] or '':40s} {r['model']:16s} {r['bound']:15s} measured {r['measured']:6.1f} "
              f"predicted {r['predicted']:6.1f} ({r['error']:+.1%})  {f}")
    fitted = {}
    for kind in ("dense", "moe"):
        fs = [r["factor"] for r in rows if r.get("kind") == kind and "factor" in r]
        lows = [b["bound"] for b in bounds if b["kind"] == kind]
        if fs:
            value = max(fs)
            fitted[kind] = dict(value=round(value, 3), runs=len(fs), median=round(statistics.median(fs), 3),
                                oom_bounds_above=[round(b, 3) for b in lows if b > value])
            print(f"{kind}: factor {value:.3f} (the largest of {len(fs)} runs: {min(fs):.3f}-{max(fs):.3f}, "
                  f"median {statistics.median(fs):.3f})"
                  + "".join(f"; an OOM bound of {b:.3f} is above it (reported, not fitted)" for b in lows if b > value))
    for kind, fs in refit(paths).items():
        if fs:
            print(f"{kind}, re-predicted with today's count (the Gated DeltaNet block unscaled): factor "
                  f"{max(fs):.3f} (the largest of {len(fs)} runs: {min(fs):.3f}-{max(fs):.3f}, median "
                  f"{statistics.median(fs):.3f})")
            fitted.setdefault(kind, {})["today"] = dict(value=round(max(fs), 3), runs=len(fs),
                                                        median=round(statistics.median(fs), 3))
    checks = [abs(r["error"]) for r in rows if r["bound"] != "activations"]
    if checks:
        print(f"runs bound by the optimizer step or the loss path: {len(checks)}, |error| at most {max(checks):.1%}")
    print(json.dumps({"fitted": fitted, "files": [str(Path(p).resolve().relative_to(ROOT)) for p in paths]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
