"""How well a layer the profile did not measure is priced from the layers it did: leave one model out.

For every model whose 1- and 2-layer builds the runner profile holds (the shipped H200 profile plus any build
files given), the model's own builds are taken out of the profile and its layer's seconds per micro-batch are
predicted from the remaining layers exactly as `tune` prices an unprofiled model (cost_model.step_time's
runner_layer_terms: the nearest measured layer of the same kind, its GPU work scaled); the measurement is the
difference of that model's 2- and 1-layer builds at each token count, no recompute. All figures measured on
the H200 (the builds; with --gpu, on that GPU type); nothing is simulated.

Then, as for a model whose layer kind the profile never ran (dense Qwen3.5's Gated DeltaNet layers today): every
measured layer of the held-out model's kind taken out, so a layer of its MLP kind with the other attention kind
prices it; every layer of its MLP kind taken out, so the fitted Megatron terms price it; and the other direction,
every Gated DeltaNet layer taken out, so softmax-attention layers price them. The rms log errors are the spreads a
prediction resting on them carries (runner_cross_kind_layer_error_sd from the first and third, over both;
runner_modelled_layer_error_sd from the second).

Usage: python benchmarks/layer_transfer.py [BUILDS.jsonl ...]
       python benchmarks/layer_transfer.py --gpu h100 --alone BUILDS.jsonl ...   the given builds alone, measured on
         that GPU type, each model priced from the others at that type's shipped rates (the synthetic MoE family of
         benchmarks/device/moe_family.sh: a layer timed as another's with other expert counts and top-k); only the
         leave-one-model-out pass
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import yaml

from benchmarks.built_models import load_built_model
from cost_model.constants import default_constants
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import LINEAR_ATTENTION
from cost_model.predict import _step_context, predict
from cost_model.profile import shipped_profile
from cost_model.runner_components import parse_runner_components
from cost_model.nouns.runtime import MEGATRON_RUNNER
from cost_model.step_time import runner_layer_terms
from cost_model.nouns.workload import Workload
from experiments.checks.runner_components import section_from_builds

ROOT = Path(__file__).resolve().parents[1]
def components_without(base, section: dict, rest: list[dict]):
    """`base` (the shipped profile of the GPU type the builds were measured on) with the runner components of the
    builds left (`rest`)."""
    return replace(base, runner=parse_runner_components({**section, "builds": rest}, base.hbm_copy_tb_s * 1e12))


def one_layer(name: str):
    """One layer of a built model (its first)."""
    model = load_built_model(name)
    return replace(model, num_hidden_layers=1, layer_types=model.layer_types[:1], mlp_types=model.mlp_types[:1])


def measured_layer(builds: list[dict], model: str, section_microbatches: int) -> dict:
    """{tokens: seconds per micro-batch} of one layer: the 2-layer build minus the 1-layer one (no recompute)."""
    by_layers = {}
    for b in builds:
        if b["model"] == model and int(b["vocab"]) < 4096 and not b.get("offload"):
            mb = int(b.get("microbatches", section_microbatches))
            by_layers[int(b["layers"])] = {p["tokens"]: p["fwd_bwd_s"] / mb for p in b["points"]
                                           if not p.get("full_recompute")}
    one, two = by_layers.get(1, {}), by_layers.get(2, {})
    return {t: two[t] - one[t] for t in sorted(set(one) & set(two))}


def predicted_layer(model, profile, tokens: float) -> tuple[float, str]:
    """The runner stack's price of one layer of `model` per micro-batch at `tokens`, from `profile`'s components."""
    gpu = load_gpu(profile.gpu_type)
    rows = max(1, int(tokens // 4096))
    workload = Workload(seq_len=4096, global_batch=rows, framework="megatron")
    layout = Layout(1, max_tokens_per_gpu=int(tokens), rows_per_microbatch=rows)
    ctx = _step_context(model, gpu, workload, layout, default_constants(), profile, MEGATRON_RUNNER)
    (attn, mlp), = set(zip(model.layer_types, model.mlp_types))
    terms, source = runner_layer_terms(ctx, attn, mlp, 0.0, 0.0)
    return terms["layers"], source


def modelled_layer(model, profile, tokens: float) -> float:
    """One layer's seconds per micro-batch as the step prices it from `profile` (a measured layer of its kind or,
    without one, the fitted terms): the 2-layer step's layer-work terms less the 1-layer step's."""
    def work(layers: int) -> float:
        m = replace(model, num_hidden_layers=layers, layer_types=model.layer_types[:1] * layers,
                    mlp_types=model.mlp_types[:1] * layers)
        rows = max(1, int(tokens // 4096))
        p = predict(m, load_gpu(profile.gpu_type), Workload(seq_len=4096, global_batch=rows, framework="megatron"),
                    Layout(1, max_tokens_per_gpu=int(tokens), rows_per_microbatch=rows), profile=profile,
                    runtime=MEGATRON_RUNNER)
        return sum(v for k, v in p.breakdown.items() if k not in ("optimizer", "step_overhead", "dp_comm", "offload"))
    return work(2) - work(1)


def kind_out(base, builds: list[dict], section: dict, models: list[str], leave: str) -> dict:
    """Each model's layer priced with no measured layer of its kind left in the profile: `leave` "kind" takes out the
    layers of its attention + MLP kind (a layer of another attention kind with its MLP kind prices it, where the
    profile has one), "mlp" every layer of its MLP kind too (the fitted terms price it)."""
    print("\n" + {"kind": "no measured layer of the held-out model's kind, priced from another attention kind's layer "
                            "of its MLP kind (the models whose MLP kind has one):",
                    "mlp": "no measured layer of the held-out model's MLP kind (the fitted-terms fallback):"}[leave])
    per_model = {}
    for name in models:
        measured = measured_layer(builds, name, int(section["microbatches"]))
        if not measured:
            continue
        kind = next(b["signature"].split("|")[0] for b in builds if b["model"] == name)
        of_its_mlp = [b for b in builds if b["signature"].split("|")[0].endswith("+" + kind.split("+")[1])]
        if leave == "kind":
            rest = [b for b in builds if not b["signature"].startswith(kind + "|")]
            if not any(b in rest for b in of_its_mlp):
                continue   # no layer of its MLP kind left: the fitted terms price it, as in the "mlp" pass
        else:
            rest = [b for b in builds if b not in of_its_mlp]
        comps = components_without(base, section, rest)
        one = one_layer(name)
        per_model[name] = [modelled_layer(one, comps, t) / s - 1 for t, s in measured.items()]
        print(f"{name:18} {kind:22} " + " ".join(f"{t:>6}:{100 * e:+4.0f}%" for t, e in zip(measured, per_model[name])))
    return {**error_summary([e for v in per_model.values() for e in v]), "per_model": per_model}


def error_summary(errors: list[float]) -> dict:
    """Relative errors (predicted / measured - 1) summed up, and printed in one line."""
    logs = [math.log(1 + e) for e in errors]
    apes = [abs(e) for e in errors]
    out = {"points": len(apes), "median_ape": statistics.median(apes), "max_ape": max(apes),
           "rms_log_error": math.sqrt(statistics.mean(x * x for x in logs)), "mean_log_error": statistics.mean(logs),
           "logs": logs}
    print(f"all: {len(apes)} points, median APE {100 * out['median_ape']:.1f}%, max {100 * out['max_ape']:.1f}%, "
          f"rms log error {out['rms_log_error']:.3f} "
          f"(bias included: the mean log error is {out['mean_log_error']:+.3f})")
    return out


def gdn_from_softmax(base, builds: list[dict], section: dict) -> dict:
    """The other direction, the one dense Qwen3.5 takes: each Gated DeltaNet layer the profile measured (Qwen3.6,
    Qwen3-Next) priced with every Gated DeltaNet layer taken out, so a softmax-attention layer of its MLP kind prices
    it; the measurement is the profile's own curve of that layer (builds of the model's kinds, 1 and 2 layers)."""
    print("\nGated DeltaNet layers priced from softmax-attention layers of their MLP kind (all GDN builds out):")
    full = components_without(base, section, builds).runner
    rest = components_without(base, section, [b for b in builds if not b["signature"].startswith(LINEAR_ATTENTION + "+")])
    errors = []
    for sig, curves in full.layers.items():
        kind = sig.split("|")[0]
        if not kind.startswith(LINEAR_ATTENTION + "+"):
            continue
        model = load_built_model(curves.model)
        one = replace(model, num_hidden_layers=1, layer_types=(LINEAR_ATTENTION,), mlp_types=(kind.split("+")[1],))
        errs = [predicted_layer(one, rest, t)[0] / curves.none(t) - 1 for t in curves.none.tokens]
        errors += errs
        print(f"{curves.model:18} {kind:22} " + " ".join(f"{int(t):>6}:{100 * e:+4.0f}%"
                                                          for t, e in zip(curves.none.tokens, errs)))
    return error_summary(errors)


def parse_args(argv: list[str]):
    parser = argparse.ArgumentParser(prog="python benchmarks/layer_transfer.py")
    parser.add_argument("builds", nargs="*", help="runner_components build records (JSON lines)")
    parser.add_argument("--gpu", default="h200", choices=("h200", "h100"),
                        help="the GPU type the builds were measured on (its shipped profile's rates)")
    parser.add_argument("--alone", action="store_true", help="the given builds alone, not the shipped profile's too")
    args = parser.parse_args(argv)
    if args.alone and not args.builds:
        parser.error("--alone prices the given builds from each other: name at least one builds file")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    alone, argv = args.alone, args.builds
    base = shipped_profile(args.gpu)
    section = yaml.safe_load((ROOT / f"cost_model/data/profiles/{args.gpu}.yaml").read_text())["runner_components"]
    records = [json.loads(line) for f in argv for line in Path(f).read_text().splitlines()
               if line.strip()]
    extra = section_from_builds(records, {})["builds"]
    builds = extra if alone else section["builds"] + extra
    if alone:   # the given builds are this GPU type's measurements: no derivation from another type
        section = {k: v for k, v in section.items() if k not in ("builds", "derived", "derivation")}
    models = sorted({b["model"] for b in builds if len({b2["signature"] for b2 in builds if b2["model"] == b["model"]}) == 1})
    print(f"{len(builds)} builds ({len(extra)} from {', '.join(argv) or 'no file given'}); "
          f"models with one layer kind: {', '.join(models)}")
    print(f"{'held-out model':18} {'tokens':>7} {'measured ms':>11} {'predicted':>9} {'err%':>6}  priced from")
    errors, per_model = [], {}
    for name in models:
        measured = measured_layer(builds, name, int(section["microbatches"]))
        if not measured:
            continue
        comps = components_without(base, section, [b for b in builds if b["model"] != name])
        one = one_layer(name)
        for tokens, seconds in measured.items():
            pred, source = predicted_layer(one, comps, tokens)
            err = pred / seconds - 1
            errors.append(abs(err))
            per_model.setdefault(name, []).append(abs(err))
            print(f"{name:18} {tokens:7d} {1e3 * seconds:11.1f} {1e3 * pred:9.1f} {100 * err:+6.1f}  {source[:90]}")
    print()
    for name, errs in per_model.items():
        print(f"{name:18} median APE {100 * statistics.median(errs):5.1f}%  max {100 * max(errs):5.1f}%")
    summary = {"points": len(errors), "median_ape": statistics.median(errors), "max_ape": max(errors),
               "per_model_median_ape": {k: statistics.median(v) for k, v in per_model.items()}}
    print(f"all: {len(errors)} points, median APE {100 * summary['median_ape']:.1f}%, max {100 * summary['max_ape']:.1f}%")
    if alone:
        print(json.dumps(summary))
        return 0
    held = [m for m in models if m in per_model]
    summary["kind_out"] = kind_out(base, builds, section, held, "kind")
    summary["mlp_kind_out"] = kind_out(base, builds, section, held, "mlp")
    swap = gdn_from_softmax(base, builds, section)
    both = summary["kind_out"]["logs"] + swap["logs"]
    summary["gdn_from_softmax"] = swap
    summary["across_kinds_rms_log_error"] = math.sqrt(statistics.mean(x * x for x in both))
    print(f"\nacross attention kinds, both directions: {len(both)} points, rms log error "
          f"{summary['across_kinds_rms_log_error']:.3f}")
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "logs"} if isinstance(v, dict) else v
                      for k, v in summary.items()}))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
