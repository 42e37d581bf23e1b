"""The fixed cost per micro-batch of a measured MoE layer per expert, and what moving it with the expert count does
to the stored runs of MoE models whose layer is priced from another model's with another expert count.

    python benchmarks/expert_fixed_cost.py

First, per measured layer of the shipped H200 profile: its line's intercept (seconds per micro-batch at no tokens),
its gradient accumulation over every parameter it holds (GRAD_ACCUMULATION_BYTES at the profile's copy rate), and
what is left per expert. Then every stored run (offload left out: its CPU step is the host's) of a model that
cost_model.step_time.fixed_cost_shift moves (benchmarks/runner_accuracy.py moves_expert_count), predicted as tune
predicts it and with the per-expert part left out (the layer's fixed cost moved by its gradient accumulation alone):
median and max APE per model and over all. The runs stored when the per-expert part was chosen were looked at
(runner_accuracy EXPERT_COUNT_LOOKED_AT): in sample; later ones held out. Then three forms of the cost an expert on
the same runs: the slope of a line through the profile's measured layers of the kind (step_time.expert_fixed_line,
shipped since 2026-12-07's twenty-third session), the donor layer's own fixed cost over its experts (shipped before),
and the line's value at the layer's expert count in place of the donor's own. Last, where the error left sits, per
model and GPU type: the seconds each run's layer would need added per micro-batch to match the measurement (found by
moving the shift by 1 ms), a line through them against the run's tokens per micro-batch: its intercept is fixed cost
the prediction lacks, its slope per-token work (full recompute left out: its extra pass moves both). Every figure is
a measured run or build against a prediction; nothing is simulated.
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


def moved_runs():
    """(results file, run, its model as it ran, GPU type) of every stored run, offload left out (its CPU step is the
    host's), of a model whose MoE layer the shift moves (runner_accuracy moves_expert_count)."""
    for suite, results in DEFAULT:
        for run in load_runs(suite, results):
            t = run.trial
            if not run.ok or t.layout.offloaded:
                continue
            gpu = load_gpu(run.gpu)
            model = trial_model(load_model(t.model), t.layers if isinstance(t.layers, int) else None, t.replace_gdn)
            if moves_expert_count(model, gpu):
                yield results, run, model, gpu


def _predicted(run, model, gpu):
    t = run.trial
    return predict(model, gpu, t.workload, t.layout, precision_aware_optimizer=False, runtime=run.runtime)


def run_errors() -> None:
    with_shift, without = {}, {}
    for results, run, model, gpu in moved_runs():
        key = ("in sample (looked at)" if results.name in EXPERT_COUNT_LOOKED_AT else "held out", str(run.trial.model))
        for out, patch in ((with_shift, None), (without, lambda *a: 0)):
            with mock.patch.object(step_time, "layer_experts", patch) if patch else nullcontext():
                p = _predicted(run, model, gpu)
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


def _value_form():
    """fixed_cost_shift with the layer's fixed cost beyond its gradient accumulation the value of the measured
    layers' line (step_time.expert_fixed_line) at its expert count, less the donor's own."""
    shipped, line_of = step_time.fixed_cost_shift, step_time.expert_fixed_line

    def shift(ctx, curves, measured_model, attn_kind, mlp_kind):
        line = line_of(ctx, curves, attn_kind, mlp_kind)
        with mock.patch.object(step_time, "expert_fixed_line", lambda *_: None):
            seconds, note = shipped(ctx, curves, measured_model, attn_kind, mlp_kind)
        if line is None or not note:
            return seconds, note
        held, measured = (step_time.layer_experts(m, mlp_kind) for m in (ctx.model, measured_model))
        derived = ctx.runner.derivation_of(curves)
        rest = derived.rest_for(attn_kind == step_time.LINEAR_ATTENTION) if derived else 1.0
        own = step_time.fixed_beyond_accumulation(curves, measured_model, attn_kind, mlp_kind,
                                                  step_time.copy_rate_measured_at(ctx, derived))
        value = line[0] + line[1] * held - own
        return seconds + (value - (held - measured) * max(own, 0.0) / measured) / rest, note
    return shift


FORMS = {"the measured layers' slope (shipped)": nullcontext,
         "the donor's own cost per expert (shipped until 2026-12-07)":
             lambda: mock.patch.object(step_time, "expert_fixed_line", lambda *_: None),
         "the measured layers' line's value": lambda: mock.patch.object(step_time, "fixed_cost_shift", _value_form())}


def other_forms() -> None:
    errors = {name: [] for name in FORMS}
    for _, run, model, gpu in moved_runs():
        for name, out in errors.items():
            with FORMS[name]():
                out.append(abs(_predicted(run, model, gpu).tokens_per_s_per_gpu / run.measured - 1))
    print("\nforms of the cost an expert, on the same runs (all looked at when the shipped one was chosen: in sample)")
    for name, e in errors.items():
        print(f"  {name:58} {len(e)} runs: median APE {100 * statistics.median(e):.1f}%, max {100 * max(e):.1f}%")


def _robust_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Theil-Sen: the median of the pairwise slopes, the median intercept at it (a host-bound run at few tokens
    would tilt a least-squares line)."""
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1:] if x2 != x1]
    if not slopes:
        return None
    slope = statistics.median(slopes)
    return statistics.median(y - slope * x for x, y in points), slope


def _with_extra(seconds: float):
    shipped = step_time.fixed_cost_shift

    def shift(*args):
        moved, note = shipped(*args)
        return moved + seconds, note
    return shift


def residual_lines() -> None:
    points: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _, run, model, gpu in moved_runs():
        if run.trial.layout.recompute_granularity == "full":
            continue
        predicted = []
        for extra in (0.0, 1e-3):
            with mock.patch.object(step_time, "fixed_cost_shift", _with_extra(extra)):
                predicted.append(_predicted(run, model, gpu))
        inverse = [1 / p.tokens_per_s_per_gpu for p in predicted]
        if inverse[1] > inverse[0]:
            needed = 1e-3 * (1 / run.measured - inverse[0]) / (inverse[1] - inverse[0])
            points.setdefault((str(run.trial.model), gpu.name), []).append((predicted[0].tokens_per_microbatch,
                                                                            needed))
    print("\nthe error left, as seconds a layer would need added per micro-batch: a line (Theil-Sen) against tokens per"
          " micro-batch (full recompute and offload left out)")
    for (model, gpu), pts in sorted(points.items()):
        line = _robust_line(pts)
        fit = (f"fixed {line[0] * 1e3:+6.2f} ms, per 4k tokens {line[1] * 4096e3:+6.2f} ms" if line
               else "one token count")
        print(f"  {model:52} {gpu:5} {len(pts):3} runs: {fit}")


def main() -> int:
    layer_table()
    run_errors()
    other_forms()
    residual_lines()
    return 0


if __name__ == "__main__":
    sys.exit(main())
