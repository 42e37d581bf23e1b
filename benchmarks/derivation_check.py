"""Judge a derived runner profile against one measured on that GPU type: term by term, on the models both priced.

The shipped H100, B200 and GB200 profiles carry the H200's runner builds priced there by datasheet ratios
(cost_model.runner_components.Derivation). Once `tune profile --model M` measures the runner on such a GPU, this
prices the same 1-GPU runner steps from both profiles (each model the measured profile built, 2 layers, seq 4096,
4k-32k tokens per micro-batch, no recompute and full) and prints, per model and tokens, the derived over the
measured seconds of the layers, the micro-batch's ends, the optimizer and the whole step, then the rms log error
of the step beside the derivation's own sd (Derivation.error_sd, the prior the intervals widen by).

Every figure is a prediction from a profile: "measured" means priced from the builds measured on that GPU.

With --calibrate it fits the derivation to those builds instead of judging it: the HBM ratio from the two
optimizers' seconds per parameter (the CPU optimizer stays as the source's host ran it: the host is not the GPU
type's), the rest ratio as the one that prices the layers and the ends measured on the
target best (least squares in log), and prints the fitted block and the step's errors with it; --write puts that
block into the derived profile's YAML. A calibrated derivation is judged on the models it was not fitted to
(benchmarks/runner_accuracy.py on grids of other models on that GPU type).

Usage: python benchmarks/derivation_check.py MEASURED.yaml [--derived DERIVED.yaml] [--calibrate [--write]]
  (default derived: the shipped profile of MEASURED's GPU type)
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import re
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_model.nouns.hardware import load_gpu  # noqa: E402
from cost_model.nouns.layout import Layout  # noqa: E402
from benchmarks.built_models import load_built_model  # noqa: E402
from cost_model.nouns.model_spec import ModelError  # noqa: E402
from cost_model.nouns.workload import Workload  # noqa: E402
from cost_model.predict import predict  # noqa: E402
from cost_model.profile import ProfileError, load_profile, profile_from_dict, shipped_profile  # noqa: E402
from experiments.megatron.model_run import trial_model  # noqa: E402

TERMS = ("layers", "microbatch_ends", "optimizer")
TOKENS = (4096, 8192, 16384, 32768)
FULL = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)


def compare(measured, derived, gpu) -> list[dict]:
    """One row per (model, tokens, recompute): each term's derived and measured seconds."""
    out = []
    models = sorted({c.model for c in measured.runner.layers.values() if not c.borrowed})   # its own builds
    for name in models:
        try:
            model = trial_model(load_built_model(name), 2)
        except ModelError:
            continue
        for tokens in TOKENS:
            for recompute in ({}, FULL):
                layout = Layout(1, max_tokens_per_gpu=tokens, rows_per_microbatch=max(1, tokens // 4096), **recompute)
                work = Workload(framework="megatron", seq_len=4096, global_batch=max(8, 2 * tokens // 4096))
                m = predict(model, gpu, work, layout, precision_aware_optimizer=False, profile=measured)
                d = predict(model, gpu, work, layout, precision_aware_optimizer=False, profile=derived)
                if m.breakdown.get("layers", 0) <= 0 or d.breakdown.get("layers", 0) <= 0:
                    continue
                out.append({"model": name, "tokens": tokens, "recompute": "full" if recompute else "none",
                            **{f"{t}_ratio": d.breakdown[t] / m.breakdown[t] for t in TERMS if m.breakdown[t] > 0},
                            "work_ratio": (d.breakdown["layers"] + d.breakdown["microbatch_ends"])
                            / (m.breakdown["layers"] + m.breakdown["microbatch_ends"]),
                            # the step's time terms: not allocator_remap, which follows each profile's memory
                            "step_ratio": _time_s(d) / _time_s(m)})
    return out


def _time_s(p) -> float:
    """A prediction's step seconds without its allocator_remap term (cost_model.allocator_strain)."""
    return p.step_time_s - p.breakdown.get("allocator_remap", 0.0)


def _with(profile, d):
    """The profile with derivation `d`, parsed again: the parser reads the HBM ratio too (the fixed costs' floor)."""
    raw = copy.deepcopy(profile.raw)
    raw["runner_components"]["derived"] = {"compute": d.compute, "hbm": d.hbm, "rest": d.rest, "cpu": d.cpu,
                                           "basis": d.basis,
                                           "calibration": d.calibration, "calibration_sd": d.calibration_sd,
                                           "rest_linear": d.rest_linear, "calibration_linear": d.calibration_linear}
    return profile_from_dict(raw, "calibration")


def _rms(rows, key="step_ratio") -> float:
    return math.sqrt(statistics.fmean(math.log(r[key]) ** 2 for r in rows))


def _golden(error, lo: float = math.log(0.3), hi: float = math.log(3.0)) -> float:
    """The minimum of `error` over [lo, hi] by golden section (each step keeps one inner point and its error and
    prices only the new one)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = error(a), error(b)
    for _ in range(40):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = error(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = error(b)
    return (lo + hi) / 2


def calibrate_linear(measured, derived, gpu) -> tuple:
    """The derivation with only `rest_linear` fitted, to a Gated DeltaNet model's builds measured on the target: the
    rest ratio of its GDN layers that prices its layers best (the ends hold no GDN layer), every other ratio held
    (the attention kinds' rest stays what the other model's builds fitted)."""
    d = derived.runner.derived
    models = sorted({c.model for c in measured.runner.layers.values() if not c.borrowed})

    def error(log_rest: float) -> float:
        trial = dataclasses.replace(d, rest_linear=math.exp(log_rest))
        return _rms(compare(measured, _with(derived, trial), gpu), "layers_ratio")

    fitted = dataclasses.replace(d, rest_linear=round(math.exp(_golden(error)), 4),
                                 calibration_linear=f"{', '.join(models)} builds measured on {measured.device} "
                                                    f"({measured.date})")
    return fitted, compare(measured, _with(derived, fitted), gpu)


def calibrate(measured, derived, gpu) -> tuple:
    """The derivation fitted to the builds both profiles priced: hbm from the optimizers' seconds per parameter,
    rest minimising the rms log error of the layers and the ends together (golden section in log)."""
    d = derived.runner.derived
    hbm = derived.runner.optimizer_s_per_param / measured.runner.optimizer_s_per_param
    # No host ratio: the CPU optimizer runs on the host, which is not the GPU type's. Two H100 hosts' `tune profile`
    # offload builds measured 7.6e-10 and 1.35e-9 s a parameter, either side of the H200 host's 1.22e-9, so one
    # host's ratio would price every H100 user's host as that one's (runner_host_cpu_error_sd carries the spread).
    cpu = None

    def error(log_rest: float) -> float:
        trial = dataclasses.replace(d, hbm=hbm, rest=math.exp(log_rest), cpu=cpu)
        return _rms(compare(measured, _with(derived, trial), gpu), "work_ratio")

    rest = math.exp(_golden(error))
    models = sorted({c.model for c in measured.runner.layers.values() if not c.borrowed})   # its own builds
    fitted = dataclasses.replace(
        d, hbm=round(hbm, 4), rest=round(rest, 4), cpu=cpu, basis=d.basis.replace("by datasheet ratios", "by calibrated ratios"),
        calibration=f"{', '.join(models)} builds measured on {measured.device} ({measured.date})")
    rows = compare(measured, _with(derived, fitted), gpu)
    return dataclasses.replace(fitted, calibration_sd=round(_rms(rows), 4)), rows


def write_derivation(path: str, d) -> None:
    """Replace the runner_components.derived block of a profile YAML in place (the rest of the file as it is)."""
    text = Path(path).read_text()
    cpu = "" if d.cpu is None else f"cpu: {d.cpu}, "
    linear = ("" if d.rest_linear is None else
              f",\n    rest_linear: {d.rest_linear}, calibration_linear: {json.dumps(d.calibration_linear)}")
    block = (f"  derived: {{compute: {d.compute}, hbm: {d.hbm}, rest: {d.rest}, {cpu}"
             f"calibration_sd: {d.calibration_sd},\n"
             f"    basis: {json.dumps(d.basis)},\n    calibration: {json.dumps(d.calibration)}{linear}}}\n")
    new, n = re.subn(r"^  derived: \{.*?\}\n", block, text, count=1, flags=re.M | re.S)
    if n != 1:
        raise SystemExit(f"derivation_check: {path} has no runner_components.derived block to replace")
    Path(path).write_text(new)


def _calibrated(args, measured, derived, gpu):
    """The derived profile with its derivation fitted (--calibrate: hbm and rest; --calibrate-linear: rest_linear
    alone), printed, and written with --write; None where no model was priced from both profiles' builds."""
    before = compare(measured, derived, gpu)
    if not before:
        print("derivation_check: no model priced from the runner builds of both profiles", file=sys.stderr)
        return None
    if args.calibrate_linear:
        fitted, rows = calibrate_linear(measured, derived, gpu)
        print(f"calibrated on {fitted.calibration_linear}: a Gated DeltaNet layer's rest x{fitted.rest_linear} (the "
              f"rest held: hbm x{fitted.hbm}, rest x{fitted.rest_ratio}); step rms log error {_rms(before):.3f} -> "
              f"{_rms(rows):.3f} on these builds (in sample)")
    else:
        fitted, rows = calibrate(measured, derived, gpu)
        print(f"calibrated on {fitted.calibration}: hbm x{fitted.hbm} (optimizer), rest x{fitted.rest}, the CPU "
              f"optimizer as the source's host ran it (this host's is not the GPU type's); step rms log "
              f"error {_rms(before):.3f} -> {fitted.calibration_sd:.3f} on these builds (in sample); error_sd "
              f"{derived.runner.derived.error_sd:.3f} -> {fitted.error_sd:.3f}")
    if args.write:
        target = args.derived or str(Path(__file__).resolve().parents[1] / "cost_model/data/profiles"
                                     / f"{measured.gpu_type}.yaml")
        write_derivation(target, fitted)
        load_profile(target)   # what was written parses
        print(f"written to {target}")
    return _with(derived, fitted)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("measured")
    ap.add_argument("--derived")
    ap.add_argument("--calibrate", action="store_true", help="fit the derivation to the measured builds")
    ap.add_argument("--calibrate-linear", action="store_true",
                    help="fit only the Gated DeltaNet layers' rest ratio to a GDN model's builds, the rest held")
    ap.add_argument("--write", action="store_true", help="with --calibrate or --calibrate-linear: write the fitted "
                                                          "block into the derived profile (--derived, or the shipped one)")
    args = ap.parse_args(argv)
    try:
        measured = load_profile(args.measured)
        derived = load_profile(args.derived) if args.derived else shipped_profile(measured.gpu_type)
    except ProfileError as e:
        print(f"derivation_check: {e}", file=sys.stderr)
        return 2
    if measured.runner is None or measured.runner.derived is not None:
        print(f"derivation_check: {args.measured} has no runner builds measured on its GPU (tune profile --model M "
              f"measures them)", file=sys.stderr)
        return 2
    if derived is None or derived.runner is None or derived.runner.derived is None:
        print("derivation_check: the profile to judge has no derived runner components", file=sys.stderr)
        return 2
    gpu = load_gpu(measured.gpu_type)
    if args.calibrate or args.calibrate_linear:
        derived = _calibrated(args, measured, derived, gpu)
        if derived is None:
            return 1
    rows = compare(measured, derived, gpu)
    if not rows:
        print("derivation_check: no model priced from the runner builds of both profiles", file=sys.stderr)
        return 1
    print(f"derived: {derived.runner.derived.basis}; judged against the builds {measured.runner.source}")
    print(f"{'model':40}{'tokens':>8} {'recompute':9}" + "".join(f"{t:>17}" for t in TERMS) + f"{'step':>8}")
    for r in rows:
        print(f"{r['model']:40}{r['tokens']:>8} {r['recompute']:9}"
              + "".join(f"{r.get(t + '_ratio', float('nan')):>17.3f}" for t in TERMS) + f"{r['step_ratio']:>8.3f}")
    logs = [math.log(r["step_ratio"]) for r in rows]
    rms = math.sqrt(statistics.fmean(x * x for x in logs))
    median = statistics.median(r["step_ratio"] for r in rows)
    print(f"step, derived over measured: median {median:.3f}, rms log error "
          f"{rms:.3f} over {len(rows)} steps; the derivation's sd (the prior the intervals add) "
          f"{derived.runner.derived.error_sd:.3f}")
    print(json.dumps({"steps": len(rows), "median_step_ratio": median,
                      "rms_log_error": rms, "derivation_sd": derived.runner.derived.error_sd}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
