"""The memory boundary benchmark: does the cost model call fits and OOMs right at the limit of the card?

    python benchmarks/memory_boundary.py --plan OUT.json [--gpu h200] [--steps 4]
    python -m experiments.megatron --suite OUT.json --out RESULTS.jsonl      (on the GPU machine)
    python benchmarks/memory_boundary.py --report RESULTS.jsonl [RESULTS2.jsonl ...]

--plan writes a megatron-runner suite (experiments/megatron/suite.py's format): for each layout of
LAYOUTS (Qwen3.6-35B-A3B with its Gated DeltaNet layers, Qwen3-30B-A3B and Llama3-8B on 1 and 2 GPUs),
the largest layer count the cost model predicts to fit and the next step up (one more pipeline stage's
worth of layers), each a trial of a few steps. The prediction is the runner's own
(experiments.megatron.model_run.predict_run on trial_model(model, layers, replace_gdn=False)), so a trial's
result line carries the very prediction it is judged by. Its wall time is estimated from the measured
suite benchmarks/results/megatron-h200-suite.jsonl (start-up and first step from trial_wall_s, the steps
at the measured/predicted step-time ratio, an OOM's time from its failed trials); when the estimate
exceeds SUITE_BUDGET_S the suite is split (OUT.json, OUT.part2.json, ...).

--report reads the result lines and prints, per layout, the predicted and measured device-level peak
(the runner's `device_peak`: the largest total - free of torch.cuda.mem_get_info) and what each trial
did; then false fits (predicted to fit, ran out of memory), false refusals (predicted not to fit, ran),
the median device-peak error of the runs that fit, and the measured memory outside PyTorch (device peak -
reserved peak) and allocator reserve (reserved / allocated peak - 1) that the profile's figures should
match; the last line is one JSON object. Pass: no false fit, at most one in five refusals false, median
device-peak error within 5%.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_model.nouns.case import Case  # noqa: E402
from cost_model.nouns.hardware import load_gpu  # noqa: E402
from cost_model.nouns.layout_codec import layout_from_stored  # noqa: E402
from cost_model.nouns.model_spec import load_model  # noqa: E402
from cost_model.nouns.workload import Workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TIMING_SOURCE = ROOT / "benchmarks" / "results" / "megatron-h200-suite.jsonl"
SUITE_BUDGET_S = 540           # each suite under 9 minutes
SEP = "--"                      # trial names: <layout id>--L<layers>--fit|up
MAX_FALSE_REFUSAL_RATE = 0.2
MAX_MEDIAN_PEAK_ERROR = 0.05

# The layouts: 1 and 2 GPUs, three models, no recompute and full recompute, TP/EP/PP/DP, 4,096- and
# 8,192-token rows; rows per micro-batch set so the boundary falls inside each model's depth.
LAYOUTS = (
    dict(id="qwen36-1g-tp1-mt4096", model="qwen3.6-35b-a3b", gpus=1, seq_len=4096,
         layout=dict(max_tokens_per_gpu=4096, rows_per_microbatch=1)),
    dict(id="qwen36-1g-full1-mt16384", model="qwen3.6-35b-a3b", gpus=1, seq_len=8192,
         layout=dict(max_tokens_per_gpu=16384, rows_per_microbatch=2, recompute_granularity="full",
                     recompute_method="uniform", recompute_num_layers=1)),
    dict(id="qwen36-2g-ep2-mt8192", model="qwen3.6-35b-a3b", gpus=2, seq_len=4096,
         layout=dict(ep=2, max_tokens_per_gpu=8192, rows_per_microbatch=2)),
    dict(id="qwen36-2g-ep2-full1-mt32768", model="qwen3.6-35b-a3b", gpus=2, seq_len=8192,
         layout=dict(ep=2, max_tokens_per_gpu=32768, rows_per_microbatch=4, recompute_granularity="full",
                     recompute_method="uniform", recompute_num_layers=1)),
    dict(id="qwen36-2g-pp2-mt8192", model="qwen3.6-35b-a3b", gpus=2, seq_len=8192,
         layout=dict(pp=2, max_tokens_per_gpu=8192, rows_per_microbatch=1)),
    dict(id="qwen3-1g-tp1-mt8192", model="qwen3-30b-a3b", gpus=1, seq_len=4096,
         layout=dict(max_tokens_per_gpu=8192, rows_per_microbatch=2)),
    dict(id="qwen3-2g-ep2-mt16384", model="qwen3-30b-a3b", gpus=2, seq_len=8192,
         layout=dict(ep=2, max_tokens_per_gpu=16384, rows_per_microbatch=2)),
    dict(id="qwen3-2g-tp2-ep2-mt8192", model="qwen3-30b-a3b", gpus=2, seq_len=4096,
         layout=dict(tp=2, etp=1, ep=2, max_tokens_per_gpu=8192, rows_per_microbatch=2)),
    dict(id="llama8b-1g-tp1-mt8192", model="llama3-8b", gpus=1, seq_len=8192,
         layout=dict(max_tokens_per_gpu=8192, rows_per_microbatch=1)),
    dict(id="llama8b-1g-full1-mt16384", model="llama3-8b", gpus=1, seq_len=8192,
         layout=dict(max_tokens_per_gpu=16384, rows_per_microbatch=2, recompute_granularity="full",
                     recompute_method="uniform", recompute_num_layers=1)),
    dict(id="llama8b-2g-dp2-mt32768", model="llama3-8b", gpus=2, seq_len=8192,
         layout=dict(max_tokens_per_gpu=32768, rows_per_microbatch=4)),
    dict(id="llama8b-2g-tp2-mt32768", model="llama3-8b", gpus=2, seq_len=4096,
         layout=dict(tp=2, max_tokens_per_gpu=32768, rows_per_microbatch=8)),
)


# ------------------------------------------------------------------------------------------ plan
def _predict(case: Case, layers: int):
    from experiments.megatron.model_run import predict_run, trial_model
    return predict_run(case.replace(model=trial_model(case.model, layers, replace_gdn=False)))


def global_batch(layout) -> int:
    """The smallest global batch the runner accepts with at least max(2, PP) micro-batches per step (the
    pipeline's in-flight micro-batches are then those of a long run)."""
    per_mb = layout.dp * layout.rows_per_microbatch
    n_mb = max(2, layout.pp)
    if layout.vpp > 1:
        n_mb = -(-n_mb // layout.pp) * layout.pp
    return per_mb * n_mb


def boundary(case: Case) -> tuple[int | None, object, int | None, object]:
    """(largest layer count predicted to fit, its prediction, the next step up, its prediction); a step
    is PP x VPP layers. The step up is None when the whole model is predicted to fit. The boundary is the
    point prediction's (Prediction.under_limit): this benchmark measures the memory model's error at the
    limit, which benchmarks/memory_error.py turns into the error "fits" is judged with."""
    step = case.layout.pp * case.layout.vpp
    fit = fit_p = None
    for n in range(step, case.model.num_hidden_layers + 1, step):
        p = _predict(case, n)
        if not p.under_limit:
            return fit, fit_p, n, p
        fit, fit_p = n, p
    return fit, fit_p, None, None


@dataclass(frozen=True)
class Timing:
    """Wall-time figures of a measured suite: seconds of start-up and first step beyond the steady steps,
    measured/predicted step time, seconds an OOM trial takes."""

    overhead_s: float
    step_ratio: float
    oom_s: float
    source: str

    def trial_s(self, predicted_step_s: float, steps: int, expect_oom: bool) -> float:
        if expect_oom:
            return self.oom_s
        return self.overhead_s + steps * predicted_step_s * self.step_ratio


def timing_from_results(path: Path = TIMING_SOURCE) -> Timing:
    """The figures of a measured suite's result lines (defaults where it has none)."""
    from experiments.runner import TrialResult
    overheads, ratios, ooms = [], [], []
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    for line in lines:
        r = TrialResult.from_dict(line)
        d = r.details
        if r.status == "ok" and d.get("trial_wall_s") and len(r.step_times_s) > 1:
            steady = statistics.median(r.step_times_s[1:])
            overheads.append(d["trial_wall_s"] - steady * len(r.step_times_s))
            predicted = (d.get("prediction_for_model_run") or {}).get("step_time_s")
            if predicted:
                ratios.append(r.step_time_s / predicted)
        elif r.failure_class == "cuda_oom" and line.get("elapsed_s") and line["elapsed_s"] < 60:
            ooms.append(float(line["elapsed_s"]))
    med = lambda xs, default: statistics.median(xs) if xs else default  # noqa: E731
    return Timing(overhead_s=med(overheads, 20.0), step_ratio=med(ratios, 2.0), oom_s=med(ooms, 15.0),
                  source=f"{path.name}: {len(overheads)} runs, {len(ooms)} OOMs")


def plan_trials(gpu_name: str = "h200", steps: int = 4, layouts=LAYOUTS) -> tuple[list[dict], list[str]]:
    """(the suite's trials with their estimated seconds, notes on layouts left out)."""
    gpu = load_gpu(gpu_name)
    trials, notes = [], []
    for spec in layouts:
        layout = layout_from_stored({**spec["layout"], "world_size": spec["gpus"]})
        gb = global_batch(layout)
        case = Case(load_model(spec["model"]), gpu, Workload(seq_len=spec["seq_len"], global_batch=gb,
                                                             framework="megatron"), layout)
        fit, fit_p, up, up_p = boundary(case)
        if fit is None or up is None:
            notes.append(f"{spec['id']}: left out ({'nothing' if fit is None else 'every layer count'} is predicted "
                         f"to fit)")
            continue
        for n, p, role in ((fit, fit_p, "fit"), (up, up_p, "up")):
            verdict = "fits" if p.under_limit else "cuda_oom"
            trials.append(dict(name=f"{spec['id']}{SEP}L{n}{SEP}{role}", gpus=spec["gpus"], model=spec["model"],
                               layers=n, replace_gdn=False, seq_len=spec["seq_len"], global_batch=gb,
                               layout=dict(spec["layout"]),
                               expect=f"{verdict}: needs {p.memory.total:.1f} of {p.gpu_memory_gib:.1f} GiB "
                                      f"(expected device peak {p.memory.device_peak:.1f})",
                               _step_s=p.step_time_s, _oom=not p.under_limit, _prediction=p))
    return trials, notes


def split_suites(trials: list[dict], timing: Timing, steps: int, budget_s: float = SUITE_BUDGET_S) -> list[list]:
    """Trials in order, cut into suites whose estimated wall time stays under `budget_s` (a layout's two
    trials stay together)."""
    suites, current, spent = [], [], 0.0
    pairs = [trials[i:i + 2] for i in range(0, len(trials), 2)]
    for pair in pairs:
        cost = sum(timing.trial_s(t["_step_s"], steps, t["_oom"]) for t in pair)
        if current and spent + cost > budget_s:
            suites.append(current)
            current, spent = [], 0.0
        current += pair
        spent += cost
    if current:
        suites.append(current)
    return suites


def suite_document(trials: list[dict], timing: Timing, steps: int, part: str) -> dict:
    estimate = sum(timing.trial_s(t["_step_s"], steps, t["_oom"]) for t in trials)
    about = (f"Memory boundary benchmark{part} (benchmarks/memory_boundary.py --plan): per layout the largest layer "
             f"count the cost model predicts to fit on the runner's stack and the next step up; {len(trials)} "
             f"trials of {steps} steps. Estimated wall time {estimate:.0f} s ({timing.source}: start-up and first "
             f"step {timing.overhead_s:.0f} s, steps x {timing.step_ratio:.2f} the predicted time, an OOM "
             f"{timing.oom_s:.0f} s). Judge with: python benchmarks/memory_boundary.py --report RESULTS.jsonl")
    clean = [{k: v for k, v in t.items() if not k.startswith("_")} for t in trials]
    return {"about": about,
            "defaults": {"steps": steps, "window": [1, steps - 1], "timeout_s": 180, "hang_timeout_s": 90,
                         "backend": "auto", "replace_gdn": False, "budget_s": SUITE_BUDGET_S},
            "trials": clean, "estimated_wall_s": round(estimate)}


def write_plan(out: Path, gpu_name: str = "h200", steps: int = 4, timing: Timing | None = None) -> list[Path]:
    timing = timing or timing_from_results()
    trials, notes = plan_trials(gpu_name, steps)
    suites = split_suites(trials, timing, steps)
    paths = []
    for i, suite in enumerate(suites):
        path = out if i == 0 else out.with_name(f"{out.stem}.part{i + 1}{out.suffix}")
        part = f" (part {i + 1} of {len(suites)})" if len(suites) > 1 else ""
        doc = suite_document(suite, timing, steps, part)
        path.write_text(json.dumps(doc, indent=1) + "\n")
        paths.append(path)
        print(f"{path}: {len(suite)} trials, estimated {doc['estimated_wall_s']} s")
    for t in trials:
        print(f"  {t['name']:46s} {t['expect']}")
    for n in notes:
        print(f"  {n}")
    return paths


# ------------------------------------------------------------------------------------------ report
@dataclass(frozen=True)
class Trial:
    """One result line, as the report reads it."""

    layout: str
    layers: int | None
    role: str                    # fit or up (from the name), "" for a trial of another suite
    status: str
    failure_class: str | None
    predicted_fits: bool | None
    predicted_peak: float | None       # the expected device-level peak (memory_gib.device_peak)
    predicted_needed: float | None     # what the prediction says the GPU must hold (peak_memory_gib)
    usable: float | None
    device_peak: float | None     # measured, max over ranks
    allocated_peak: float | None
    reserved_peak: float | None
    outside: float | None         # device peak - reserved peak, max over ranks
    predicted_allocated: float | None

    @property
    def ran(self) -> bool:
        return self.status == "ok"

    @property
    def oom(self) -> bool:
        return self.failure_class == "cuda_oom"


def _max(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def read_trial(line: dict) -> Trial:
    """A result line of the megatron runner (a suite's JSONL) as a Trial."""
    from experiments.runner import TrialResult
    r = TrialResult.from_dict(line)
    d = r.details
    name = str(line.get("trial") or "")
    parts = name.split(SEP)
    layout, role = (parts[0], parts[2]) if len(parts) == 3 else (name, "")
    pred = d.get("prediction_for_model_run") or {}
    mem = pred.get("memory_gib") or {}
    ranks = list((d.get("memory_gib_per_rank") or {}).values())
    device = [m.get("device_peak", m.get("device_peak_used")) for m in ranks]
    outside = [dev - m["peak_reserved"] for m, dev in zip(ranks, device)
               if dev is not None and m.get("peak_reserved") is not None]
    layers = (d.get("model_run") or {}).get("layers")
    # the point prediction (what the layout needs within the usable memory): `fits` is the verdict under the
    # memory model's error since issue 25, and a borderline layout under the limit is predicted to run
    need = mem.get("needed", mem.get("total"))
    point = need <= mem["usable"] if need is not None and mem.get("usable") is not None else pred.get("fits")
    return Trial(layout=layout, layers=layers, role=role, status=r.status, failure_class=r.failure_class,
                 predicted_fits=point, predicted_peak=mem.get("device_peak", pred.get("peak_memory_gib")),
                 predicted_needed=pred.get("peak_memory_gib"), usable=mem.get("usable"), device_peak=_max(device),
                 allocated_peak=_max([m.get("peak_allocated") for m in ranks]),
                 reserved_peak=_max([m.get("peak_reserved") for m in ranks]), outside=_max(outside),
                 predicted_allocated=mem.get("allocated"))


def verdicts(trials: list[Trial]) -> dict:
    """The benchmark's figures over the trials that say something about memory."""
    judged = [t for t in trials if t.predicted_fits is not None and (t.ran or t.oom)]
    false_fits = [t for t in judged if t.predicted_fits and t.oom]
    refusals = [t for t in judged if not t.predicted_fits]
    false_refusals = [t for t in refusals if t.ran]
    errors = [t.predicted_peak / t.device_peak - 1 for t in judged
              if t.ran and t.predicted_fits and t.device_peak and t.predicted_peak]
    alloc = [t.predicted_allocated / t.allocated_peak - 1 for t in judged
             if t.ran and t.allocated_peak and t.predicted_allocated]
    outside = [t.outside for t in trials if t.outside is not None]
    reserve = [t.reserved_peak / t.allocated_peak - 1 for t in trials if t.ran and t.allocated_peak and t.reserved_peak]
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    rate = len(false_refusals) / len(refusals) if refusals else 0.0
    median_error = med([abs(e) for e in errors])
    out = dict(trials=len(trials), judged=len(judged), other_failures=len(trials) - len(judged),
               false_fits=len(false_fits), refusals=len(refusals), false_refusals=len(false_refusals),
               false_refusal_rate=round(rate, 3),
               median_device_peak_error=None if median_error is None else round(median_error, 4),
               median_device_peak_signed_error=None if not errors else round(med(errors), 4),
               median_allocated_error=None if not alloc else round(med([abs(e) for e in alloc]), 4),
               outside_pytorch_gib=None if not outside else dict(median=round(med(outside), 2),
                                                                 max=round(max(outside), 2)),
               allocator_reserve_fraction=None if not reserve else dict(median=round(med(reserve), 4),
                                                                        max=round(max(reserve), 4)),
               false_fit_trials=[f"{t.layout} L{t.layers}" for t in false_fits],
               false_refusal_trials=[f"{t.layout} L{t.layers}" for t in false_refusals])
    out["pass"] = bool(judged and not false_fits and rate <= MAX_FALSE_REFUSAL_RATE
                       and median_error is not None and median_error <= MAX_MEDIAN_PEAK_ERROR)
    return out


def _fmt(x, spec=".1f") -> str:
    return "-" if x is None else format(x, spec)


def _row(t: Trial) -> str:
    did = "ran" if t.ran else f"failed ({t.failure_class})"
    pred = "fits" if t.predicted_fits else ("OOM" if t.predicted_fits is not None else "?")
    err = (f"{t.predicted_peak / t.device_peak - 1:+.1%}" if t.ran and t.device_peak and t.predicted_peak else "")
    return (f"  {t.layout[:34]:34s} L{_fmt(t.layers, 'd') if t.layers else '-':>3} {t.role or '-':3s} "
            f"predicted {pred:4s} needs {_fmt(t.predicted_needed):>6} peak {_fmt(t.predicted_peak):>6} of "
            f"{_fmt(t.usable):>6} | {did:24s} device peak "
            f"{_fmt(t.device_peak):>6} {err:>7} | allocated {_fmt(t.allocated_peak):>6} (pred "
            f"{_fmt(t.predicted_allocated)}) reserved {_fmt(t.reserved_peak):>6} outside {_fmt(t.outside)}")


def report(paths: list[str], out=None) -> dict:
    out = out or sys.stdout
    lines = [json.loads(x) for p in paths for x in Path(p).read_text().splitlines() if x.strip()]
    trials = [read_trial(line) for line in lines]
    print("per trial: the cost model's prediction (the runner's own, from the result line) and what ran; "
          "GiB, device peak = max over ranks of total - free (torch.cuda.mem_get_info)", file=out)
    for t in sorted(trials, key=lambda t: (t.layout, t.layers or 0)):
        print(_row(t), file=out)
    v = verdicts(trials)
    print(f"false fits (predicted to fit, ran out of memory): {v['false_fits']} {v['false_fit_trials']}", file=out)
    print(f"false refusals (predicted not to fit, ran): {v['false_refusals']} of {v['refusals']} "
          f"({v['false_refusal_rate']:.0%}) {v['false_refusal_trials']}", file=out)
    print(f"median |device peak error| of the runs predicted to fit: {_fmt(v['median_device_peak_error'], '.1%')} "
          f"(signed {_fmt(v['median_device_peak_signed_error'], '+.1%')}); allocated peak "
          f"{_fmt(v['median_allocated_error'], '.1%')}", file=out)
    print(f"measured outside PyTorch per rank (device peak - reserved peak), GiB: {v['outside_pytorch_gib']}; "
          f"allocator reserve (reserved / allocated peak - 1): {v['allocator_reserve_fraction']}", file=out)
    print(json.dumps(v), file=out)
    return v


def rejudge(paths: list[str], gpu_name: str = "h200", out=None) -> dict:
    """The current model's plan judged by result lines already measured: each planned trial (the largest
    layer count the model predicts to fit and the step up) takes the run of the same layout and layer
    count from `paths` (whatever prediction it was made with) and the current prediction. Planned trials
    no file measured are listed; the verdict then counts only the measured ones and says so."""
    out = out or sys.stdout
    measured = {}
    for path in paths:
        for x in Path(path).read_text().splitlines():
            if x.strip():
                t = read_trial(json.loads(x))
                seen = measured.get((t.layout, t.layers))
                if seen is None or not (seen.ran or seen.oom):   # a run that says something about memory wins
                    measured[(t.layout, t.layers)] = t
    trials, missing = [], []
    for planned in plan_trials(gpu_name)[0]:
        layout_id, role, p = planned["name"].split(SEP)[0], planned["name"].split(SEP)[2], planned["_prediction"]
        t = measured.get((layout_id, planned["layers"]))
        if t is None:
            missing.append(planned["name"])
            continue
        trials.append(replace(t, role=role, predicted_fits=p.under_limit, predicted_peak=p.memory.device_peak,
                              predicted_needed=p.memory.total, usable=p.gpu_memory_gib,
                              predicted_allocated=p.memory.allocated))
    print("the current model's plan, judged by runs measured earlier (predictions: this model; runs: the files)",
          file=out)
    for t in sorted(trials, key=lambda t: (t.layout, t.layers or 0)):
        print(_row(t), file=out)
    v = verdicts(trials)
    v["not_measured"] = missing
    if missing:
        v["pass"] = False
        print(f"not measured yet (run them to complete the verdict): {missing}", file=out)
    print(f"false fits: {v['false_fits']} {v['false_fit_trials']}; false refusals: {v['false_refusals']} of "
          f"{v['refusals']} ({v['false_refusal_rate']:.0%}) {v['false_refusal_trials']}; median |device peak error| "
          f"{_fmt(v['median_device_peak_error'], '.1%')}; allocated {_fmt(v['median_allocated_error'], '.1%')}",
          file=out)
    print(json.dumps(v), file=out)
    return v


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", metavar="OUT.json", help="write the suite (split when longer than 9 minutes)")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--report", nargs="+", metavar="RESULTS.jsonl", help="judge a suite's result lines")
    parser.add_argument("--rejudge", nargs="+", metavar="RESULTS.jsonl",
                        help="judge the current model's plan by runs these files measured")
    args = parser.parse_args(argv)
    if sum(map(bool, (args.plan, args.report, args.rejudge))) != 1:
        parser.error("give one of --plan OUT.json, --report RESULTS.jsonl, --rejudge RESULTS.jsonl")
    if args.rejudge:
        return 0 if rejudge(args.rejudge, args.gpu)["pass"] else 1
    if args.plan:
        write_plan(Path(args.plan), args.gpu, args.steps)
        return 0
    return 0 if report(args.report)["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
