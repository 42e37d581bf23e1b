"""The fixed cost per micro-batch of a measured MoE layer per expert, and what moving it with the expert count does
to the stored runs of MoE models whose layer is priced from another model's with another expert count.

    python benchmarks/expert_fixed_cost.py

First, per measured layer of the shipped H200 profile: its line's intercept (seconds per micro-batch at no tokens),
its gradient accumulation over every parameter it holds (GRAD_ACCUMULATION_BYTES at the profile's copy rate), and
what is left per expert. Then every stored run (offload left out: its CPU step is the host's) of a model that
cost_model.step_time.fixed_cost_shift moves (benchmarks/runner_accuracy.py moves_expert_count), predicted as tune
predicts it and with the per-expert part left out (the layer's fixed cost moved by its gradient accumulation alone,
as before the shift): median and max APE per model and over all. The runs stored when the shift was chosen were
looked at (runner_accuracy EXPERT_COUNT_LOOKED_AT): in sample; later ones held out. Every figure is a measured run or
build against a prediction; nothing is simulated.
"""
from __future__ import annotations

import statistics
import sys
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.built_models import load_built_model  # noqa: E402
from benchmarks.measured_runs import load_runs  # noqa: E402
from benchmarks.runner_accuracy import DEFAULT, EXPERT_COUNT_LOOKED_AT, moves_expert_count  # noqa: E402
from cost_model import step_time  # noqa: E402
from cost_model.nouns.hardware import load_gpu  # noqa: E402
from cost_model.nouns.layout import Layout  # noqa: E402
from cost_model.nouns.model_spec import load_model  # noqa: E402
from cost_model.predict import predict  # noqa: E402
from cost_model.profile import shipped_profile  # noqa: E402
from cost_model.runner_components import signature_model  # noqa: E402
from experiments.megatron.model_run import trial_model  # noqa: E402


def layer_table() -> None:
    profile = shipped_profile("h200")
    hbm = profile.hbm_copy_tb_s * 1e12
    print("shipped H200 profile: a measured layer's fixed cost per micro-batch (its line's intercept)")
    print(f"{'model':24} {'layer kind':24} {'experts':>7} {'params M':>9} {'fixed ms':>9} {'grad acc ms':>11} "
          f"{'rest/expert us':>14}")
    for sig, curves in sorted(profile.runner.layers.items()):
        if curves.none.line is None:
            continue
        attn, mlp = sig.split("|")[0].split("+")
        model = signature_model(load_built_model(curves.model), sig)
        params = step_time.shard_layer_params(model, attn, mlp, Layout(1))
        fixed = curves.none.line[0]
        beyond = step_time.fixed_beyond_accumulation(curves, model, attn, mlp, hbm)
        accumulate = fixed - beyond
        experts = step_time.layer_experts(model, mlp)
        rest = f"{beyond / experts * 1e6:14.1f}" if experts else f"{'-':>14}"
        print(f"{curves.model:24} {attn + '+' + mlp:24} {experts:7.0f} {params / 1e6:9.1f} {fixed * 1e3:9.2f} "
              f"{accumulate * 1e3:11.2f} {rest}")


def run_errors() -> None:
    with_shift, without = {}, {}
    for suite, results in DEFAULT:
        for run in load_runs(suite, results):
            t = run.trial
            if not run.ok or t.layout.offloaded:
                continue
            gpu = load_gpu(run.gpu)
            model = trial_model(load_model(t.model), t.layers if isinstance(t.layers, int) else None, t.replace_gdn)
            if not moves_expert_count(model, gpu):
                continue
            key = ("in sample (looked at)" if results.name in EXPERT_COUNT_LOOKED_AT else "held out", str(t.model))
            for out, patch in ((with_shift, None), (without, lambda *a: 0)):
                with mock.patch.object(step_time, "layer_experts", patch) if patch else nullcontext():
                    p = predict(model, gpu, t.workload, t.layout, precision_aware_optimizer=False,
                                runtime=run.runtime)
                out.setdefault(key, []).append(abs(p.tokens_per_s_per_gpu / run.measured - 1))
    print("\nstored runs of MoE models priced from a layer with another expert count (offload left out)")
    for label in ("in sample (looked at)", "held out"):
        keys = sorted(k for k in with_shift if k[0] == label)
        for key in keys:
            a, b = with_shift[key], without[key]
            print(f"  {label:22} {key[1]:52} {len(a):3} runs: median APE {100 * statistics.median(a):4.1f}%, max "
                  f"{100 * max(a):4.1f}% (without the per-expert part: {100 * statistics.median(b):4.1f}%, "
                  f"{100 * max(b):4.1f}%)")
        a, b = sum((with_shift[k] for k in keys), []), sum((without[k] for k in keys), [])
        if a:
            print(f"{label}: {len(a)} runs, median APE {100 * statistics.median(a):.1f}%, max {100 * max(a):.1f}% "
                  f"(without: {100 * statistics.median(b):.1f}%, {100 * max(b):.1f}%)")


def main() -> int:
    layer_table()
    run_errors()
    return 0


if __name__ == "__main__":
    sys.exit(main())
