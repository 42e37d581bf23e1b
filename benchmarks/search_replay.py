"""Proposers replayed on measured grids: how many real trials each needs, with the measurements as the truth.

    python benchmarks/search_replay.py [--seeds 20] [--proposers agent,predicted,tpe,random]

A grid is the set of layouts one measured runner suite ran for one model on one GPU count (the megatron
runner on H200, benchmarks/results/; the suites in benchmarks/). Every proposer picks among the grid's layouts
only; the truth is what each layout measured, and a layout that failed (out of memory, crash) costs its trial
and its GPU time and yields nothing. Nothing here is simulated: a proposer is only ever told a measured figure.

- agent: tuner.agent.AgentProposer over the grid with the cost model's predictions for what the runner runs
  (the megatron runner stack, cost_model.runner_components), deterministic;
- predicted: the layouts in the cost model's predicted order (greedy), deterministic;
- tpe, gp: Optuna's samplers over the grid's layout parameters (a proposal outside the grid costs nothing);
- random: the grid in random order.
Samplers and random order run --seeds seeds each.

Per grid and overall it prints the trials to reach within 3% of the grid's best measured layout (median,
p90), the mean regret after k = 1..5 trials (1 - best found / grid's best) and the GPU-hours spent to get
there (each trial's wall time x its GPUs, as recorded); the last line is one JSON object.

What the grids are: the 2026-12-02 runner grids (3-9 layouts, none repeated), the v2 grids (10 layouts each;
llama3-8b L6 every layout and qwen3-30b-a3b L4 half its layouts run twice in separate device calls, so their
best is confirmed by a repeat and their repeat noise is printed; llama3-70b L2 and qwen3.6 L4 once), and two
small earlier GDN suites, and the v3 grids (Llama3-8B L4 seq 8192, Qwen3-235B-A22B L1, Qwen3.6 L5, Qwen3-Next L2 seq
8192; measured after the components became least-squares lines, Llama3-8B and Qwen3-235B twice). A line that timed no step after its warm-up is a failed trial here
(benchmarks/measured_runs.py). Predictions use the code and shipped profile as they are now; the profile's
method was changed after the first grids were looked at (see benchmarks/runner_accuracy.py), the v2 grids were
looked at when the components became lines, the v3 grids fit nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_model.nouns.case import Case  # noqa: E402
from cost_model.nouns.hardware import load_gpu  # noqa: E402
from cost_model.hypotheses import default_hypotheses  # noqa: E402
from cost_model.nouns.layout_codec import to_optuna_params  # noqa: E402
from cost_model.nouns.model_spec import load_model  # noqa: E402
from experiments.megatron.model_run import predict_run, trial_model  # noqa: E402
from benchmarks.measured_runs import load_runs  # noqa: E402
from tuner.agent import AgentPrior, AgentProposer  # noqa: E402
from tuner.intervals import prediction_extra_sd, prior_parts, runner_stack_sd  # noqa: E402
from tuner.proposer import Candidate, History, SamplerProposer  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.03
K = 5
# (results, suite): the measured runner suites whose layouts are alternatives for one model run.
SOURCES = (("runner-grids-h200-2026-12-02.jsonl", "runner_grids_h200_suite.json"),
           ("runner-grids-h200-v2-2026-12-02.jsonl", "runner_grids_h200_v2_suite.json"),
           ("runner-grids-h200-v3-2026-12-02.jsonl", "runner_grids_h200_v3_suite.json"),
           ("runner-grids-h200-v4-2026-12-02.jsonl", "runner_grids_h200_v4_suite.json"),
           ("runner-grids-h200-v5-2026-12-02.jsonl", "runner_grids_h200_v5_suite.json"),
           ("runner-grids-h200-v6-2026-12-02.jsonl", "runner_grids_h200_v6_suite.json"),
           ("runner-grids-h200-v7-2026-12-02.jsonl", "runner_grids_h200_v7_suite.json"),
           ("runner-grids-h200-v8-2026-12-02.jsonl", "runner_grids_h200_v8_suite.json"),
           ("runner-grids-h200-v9-llama2-2026-12-03.jsonl", "runner_grids_h200_v9_suite.json"),
           ("runner-grids-h200-v9-q36-2026-12-03.jsonl", "runner_grids_h200_v9_suite.json"),
           ("runner-grids-h200-v11-dense-2026-12-03.jsonl", "runner_grids_h200_v11_suite.json"),
           ("runner-grids-h200-v11-q36-2026-12-03.jsonl", "runner_grids_h200_v11_suite.json"),
           ("runner-grids-h200-v11-bound-2026-12-03.jsonl", "runner_grids_h200_v11_suite.json"),
           ("runner-grids-h200-v12-2026-12-03.jsonl", "runner_grids_h200_v12_suite.json"),
           ("runner-grids-h200-v13-nemo-2026-12-03.jsonl", "runner_grids_h200_v13_suite.json"),
           ("runner-grids-h200-v13-q36-2026-12-03.jsonl", "runner_grids_h200_v13_suite.json"),
           ("runner-grids-h200-v13-qn-2026-12-03.jsonl", "runner_grids_h200_v13_suite.json"),
           ("runner-grids-h200-v16-a-2026-12-03.jsonl", "runner_grids_h200_v16_suite.json"),
           ("runner-grids-h200-v16-b-2026-12-03.jsonl", "runner_grids_h200_v16_suite.json"),
           ("runner-grids-h200-v17-a-2026-12-03.jsonl", "runner_grids_h200_v17_suite.json"),
           ("runner-grids-h200-v17-b-2026-12-03.jsonl", "runner_grids_h200_v17_suite.json"),
           ("runner-grids-h200-v17-c-2026-12-03.jsonl", "runner_grids_h200_v17_suite.json"),
           ("runner-grids-h200-v17-d-2026-12-04.jsonl", "runner_grids_h200_v17_suite.json"),
           ("runner-grids-h200-v18-a-2026-12-04.jsonl", "runner_grids_h200_v18_suite.json"),
           ("runner-grids-h200-v18-b-2026-12-04.jsonl", "runner_grids_h200_v18_suite.json"),
           ("runner-grids-h200-v18-c-2026-12-04.jsonl", "runner_grids_h200_v18_suite.json"),
           ("runner-grids-h200-v18-d-2026-12-04.jsonl", "runner_grids_h200_v18_suite.json"),
           ("runner-grids-h200-v19-a-2026-12-04.jsonl", "runner_grids_h200_v19_suite.json"),
           ("runner-grids-h200-v19-b-2026-12-04.jsonl", "runner_grids_h200_v19_suite.json"),
           ("runner-grids-h200-v19-c-2026-12-04.jsonl", "runner_grids_h200_v19_suite.json"),
           ("runner-grids-h200-v19-d-2026-12-04.jsonl", "runner_grids_h200_v19_suite.json"),
           ("runner-grids-h200-v20-a-2026-12-04.jsonl", "runner_grids_h200_v20_suite.json"),
           ("runner-grids-h200-v20-b-2026-12-04.jsonl", "runner_grids_h200_v20_suite.json"),
           ("runner-grids-h200-v20-c-2026-12-04.jsonl", "runner_grids_h200_v20_suite.json"),
           ("runner-grids-h200-v20-d-2026-12-04.jsonl", "runner_grids_h200_v20_suite.json"),
           ("runner-grids-h200-v21-2026-12-04.jsonl", "runner_grids_h200_v21_suite.json"),
           ("runner-grids-h200-v22-a-2026-12-04.jsonl", "runner_grids_h200_v22_suite.json"),
           ("runner-grids-h200-v22-b-2026-12-04.jsonl", "runner_grids_h200_v22_suite.json"),
           ("runner-grids-h200-v22-c-2026-12-04.jsonl", "runner_grids_h200_v22_suite.json"),
           ("runner-grids-h200-v22-d-2026-12-04.jsonl", "runner_grids_h200_v22_suite.json"),
           ("runner-grids-h200-v23-a-2026-12-04.jsonl", "runner_grids_h200_v23_suite.json"),
           ("runner-grids-h200-v23-b-2026-12-04.jsonl", "runner_grids_h200_v23_suite.json"),
           ("runner-grids-h200-v23-c-2026-12-04.jsonl", "runner_grids_h200_v23_suite.json"),
           ("runner-grids-h200-v23-d-2026-12-04.jsonl", "runner_grids_h200_v23_suite.json"),
           ("runner-grids-h200-v24-a-2026-12-04.jsonl", "runner_grids_h200_v24_suite.json"),
           ("runner-grids-h200-v24-b-2026-12-04.jsonl", "runner_grids_h200_v24_suite.json"),
           *((f"runner-grids-h200-v25-{k}-2026-12-05.jsonl", "runner_grids_h200_v25_suite.json") for k in "abcd"),
           ("runner-grids-h200-v25-e-2026-12-06.jsonl", "runner_grids_h200_v25_suite.json"),
           ("runner-grids-h200-v26-a-2026-12-06.jsonl", "runner_grids_h200_v26_suite.json"),
           ("runner-grids-h200-v26-b-2026-12-06.jsonl", "runner_grids_h200_v26_suite.json"),
           ("runner-grids-h100-v27-a-2026-12-06.jsonl", "runner_grids_h100_v27_suite.json"),
           ("runner-grids-h100-v28-a-2026-12-06.jsonl", "runner_grids_h100_v28_suite.json"),
           ("runner-grids-h200-v29-a-2026-12-06.jsonl", "runner_grids_h200_v29_suite.json"),
           ("runner-grids-h100-v31-a-2026-12-06.jsonl", "runner_grids_h100_v31_suite.json"),
           ("runner-grids-h100-v32-a-2026-12-06.jsonl", "runner_grids_h100_v32_suite.json"),
           ("runner-grids-h100-v28-qn-2026-12-06.jsonl", "runner_grids_h100_v28_suite.json"),
           ("runner-grids-h100-v33-2026-12-06.jsonl", "runner_grids_h100_v33_suite.json"),
           ("runner-grids-h100-v35-a-2026-12-06.jsonl", "runner_grids_h100_v35_suite.json"),
           ("runner-grids-h100-v35-b-2026-12-06.jsonl", "runner_grids_h100_v35_suite.json"),
           *((f"runner-grids-h100-v36-{k}-2026-12-06.jsonl", "runner_grids_h100_v36_suite.json") for k in "abc"),
           *((f"runner-grids-h200-v30-{k}-2026-12-06.jsonl", "runner_grids_h200_v30_suite.json") for k in "abc"),
           *((f"runner-grids-h100-v37-{k}-2026-12-07.jsonl", "runner_grids_h100_v37_suite.json") for k in "abcd"),
           ("runner-grids-h100-v41-a-2026-12-07.jsonl", "runner_grids_h100_v41_suite.json"),
           *((f"runner-grids-h100-v42-{k}-2026-12-07.jsonl", "runner_grids_h100_v42_suite.json") for k in "ab"),
           ("runner-grids-h100-v43-a-2026-12-07.jsonl", "runner_grids_h100_v43_suite.json"),
           *((f"runner-grids-h100-v44-{k}-2026-12-07.jsonl", "runner_grids_h100_v44_suite.json") for k in "ab"),
           *((f"runner-grids-h100-v45-{k}-2026-12-07.jsonl", "runner_grids_h100_v45_suite.json") for k in "ab"),
           ("runner-grids-h100-v46-a-2026-12-07.jsonl", "runner_grids_h100_v46_suite.json"),
           ("runner-grids-h100-v47-a-2026-12-07.jsonl", "runner_grids_h100_v47_suite.json"),
           ("megatron-h200-gdn-suite.jsonl", "megatron_h200_gdn_suite.json"),
           ("x2-h200-vs-leaderboard-gdn-suite.jsonl", "x2_vs_leaderboard_gdn_suite.json"))


@dataclass
class Grid:
    name: str
    cands: list          # Candidate(layout, runner prediction), every layout of the grid
    truth: dict          # layout key -> measured tokens/s/GPU (absent: the layout failed)
    hours: dict          # layout key -> GPU-hours its trial took
    spreads: list = None  # (max - min) / mean of each layout measured more than once
    repeated: set = None  # layout keys measured more than once
    prior_sd: float = 0.0  # the runner stack's prediction sd for this grid's model (what `tune` gives the agent)
    strained: set = field(default_factory=set)  # layout keys whose allocator retried every step (as `tune` reads them)

    @property
    def best(self) -> float:
        return max(self.truth.values())


def load_grids(min_layouts: int = 3) -> list[Grid]:
    """The grids of SOURCES: a suite's layouts of one model run, over however many device calls measured them (a
    layout measured in two calls is one candidate, its figure their mean and their spread its repeat noise)."""
    groups: dict = {}
    for result, suite in SOURCES:
        path = ROOT / "benchmarks" / "results" / result
        if not path.exists():
            continue
        for run in load_runs(ROOT / "benchmarks" / suite, path):
            t = run.trial
            key = (suite, t.model, t.layers, t.gpus, t.workload.seq_len, t.workload.global_batch, run.gpu)
            groups.setdefault(key, []).append(run)
    grids = []
    for (suite, model, layers, gpus, seq, gb, gpu_type), runs in groups.items():
        if len(runs) < min_layouts or not any(r.ok for r in runs):
            continue
        gpu = load_gpu(gpu_type)
        cands, hours, spreads, repeated, figures, strained = [], {}, [], set(), {}, set()
        for run in runs:
            t = run.trial
            k = t.layout.key()
            if k not in figures:   # its first call: the candidate and its GPU-hours
                model_run = trial_model(load_model(t.model), t.layers if isinstance(t.layers, int) else None,
                                        t.replace_gdn)
                p = predict_run(Case(model_run, gpu, replace(t.workload, framework="megatron"),
                                     t.layout), run.runtime)
                cands.append(Candidate(t.layout, p))
                hours[k] = run.seconds[0] * gpus / 3600
            figures.setdefault(k, []).extend([run.measured] if run.ok else [])
            if run.strained:
                strained.add(k)
            if run.spread is not None:
                spreads.append(run.spread)
                repeated.add(k)
        truth = {k: sum(f) / len(f) for k, f in figures.items() if f}
        for k, f in figures.items():
            if len(f) > 1:   # measured in more than one call
                spreads.append((max(f) - min(f)) / truth[k])
                repeated.add(k)
        on = "" if gpu.name == "h200" else f" on {gpu.display_name}"
        name = f"{model} L{layers} x{gpus}{on} seq {seq} gb {gb} ({suite.removesuffix('_suite.json')})"
        grids.append(Grid(name, cands, truth, hours, spreads, repeated, runner_stack_sd(model_run, gpu), strained))
    return grids


@dataclass
class Outcome:
    trials: int          # to reach within 3% of the best (len(grid) + 1: never)
    regret: list         # after k = 1..K trials
    hours: float         # GPU-hours until reached (or all tried)


def outcome(grid: Grid, order: list) -> Outcome:
    best, found, regret, hours, reached = grid.best, 0.0, [], 0.0, None
    for n, key in enumerate(order, 1):
        hours += grid.hours[key] if reached is None else 0.0
        found = max(found, grid.truth.get(key, 0.0))
        if reached is None and found >= best * (1 - TARGET):
            reached = n
        if n <= K:
            regret.append(1 - found / best)
    while len(regret) < K:
        regret.append(1 - found / best)
    return Outcome(reached or len(grid.cands) + 1, regret, hours)


def agent_order(grid: Grid, bands: list | None = None) -> list:
    """The agent's order over the grid, with `tune`'s prior for the runner stack; `bands` collects, per trial,
    (trial number, low, high, measured or None) of the 90% band it printed before the trial."""
    cands = [c for c in grid.cands if c.prediction.may_fit]
    by_params = {json.dumps(to_optuna_params(c.layout), sort_keys=True): c for c in cands}
    level_sd, family_sd, sigma = prior_parts(grid.prior_sd)
    agent = AgentProposer(cands, to_optuna_params, default_hypotheses(),
                          lambda h, l: next(c.prediction.tokens_per_s_per_gpu for c in cands if c.layout == l),
                          AgentPrior(sigma=sigma, level_sd=level_sd, family_sd=family_sd), stop_margin=None,
                          extra_sd=lambda c: prediction_extra_sd(c.prediction, shipped=True))   # as tune gives it
    h, order = History(), []
    while len(order) < len(cands):
        p = agent.propose(h)
        if p is None:
            break
        c = by_params[json.dumps(p.params, sort_keys=True)]
        key = c.layout.key()
        order.append(key)
        if bands is not None:
            e = p.attrs["expected"]
            bands.append((len(order), e["low"], e["high"], grid.truth.get(key)))
        h.tried.add(key)
        if key in grid.truth:
            h.measured_layouts.append((c.layout, grid.truth[key]))
            if key in grid.strained:
                h.strained.add(key)
        else:
            h.failed.append((key, "cuda_oom", c.prediction.peak_memory_gib))
    return order


def predicted_order(grid: Grid) -> list:
    cands = sorted((c for c in grid.cands if c.prediction.may_fit), key=lambda c: -c.prediction.tokens_per_s_per_gpu)
    return [c.layout.key() for c in cands]


def random_order(grid: Grid, seed: int) -> list:
    keys = [c.layout.key() for c in grid.cands]
    random.Random(seed).shuffle(keys)
    return keys


# A sampler whose last STALL_ASKS proposals were all tried or outside the grid has stalled (GP's acquisition, with
# pruned trials unseen, proposes the same point again: 200 asks per layout took minutes a seed on a 12-layout grid).
STALL_ASKS = 100


def sampler_order(grid: Grid, kind: str, seed: int) -> list:
    """Optuna's sampler over the grid's layout parameters; proposals outside the grid cost nothing."""
    params = {c.layout.key(): to_optuna_params(c.layout) for c in grid.cands}
    names = sorted({k for p in params.values() for k in p})
    values = {n: sorted({json.dumps(p.get(n)) for p in params.values()}) for n in names}
    dists = {n: optuna.distributions.CategoricalDistribution(v) for n, v in values.items() if len(v) > 1}
    lookup = {tuple(json.dumps(p.get(n)) for n in dists): key for key, p in params.items()}
    study = optuna.create_study(direction="maximize", sampler=SamplerProposer(kind, seed).sampler())
    order, seen, stalled = [], set(), 0
    while len(order) < len(grid.cands) and stalled < STALL_ASKS:
        t = study.ask(dists)
        key = lookup.get(tuple(t.params[n] for n in dists))
        if key is None or key in seen:
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
            stalled += 1
            continue
        stalled = 0
        seen.add(key)
        order.append(key)
        if key in grid.truth:
            study.tell(t, grid.truth[key])
        else:
            study.tell(t, state=optuna.trial.TrialState.FAIL)
    order += [k for k in params if k not in seen]   # a sampler that stalls is charged the rest in grid order
    return order


def pct(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--proposers", default="agent,predicted,tpe,gp,random")
    ap.add_argument("--min-layouts", type=int, default=3, help="leave out grids with fewer layouts")
    ap.add_argument("--suite", default="", help="only the grids of suites whose file name contains this (e.g. v19: "
                    "the grids held out from every change so far)")
    args = ap.parse_args(argv)
    proposers = args.proposers.split(",")
    grids = [g for g in load_grids(args.min_layouts) if args.suite in g.name]
    if not grids:
        print(f"search_replay: no grid of a suite matching {args.suite!r}", file=sys.stderr)
        return 2
    every: dict = {p: [] for p in proposers}
    bands: list = []
    behind = []   # (grid, agent's regret after 2, P(fits) of the grid's best) where the agent is behind
    for g in grids:
        per = {}
        for p in proposers:
            if p == "agent":
                outs = [outcome(g, agent_order(g, bands))]
            elif p == "predicted":
                outs = [outcome(g, predicted_order(g))]
            elif p == "random":
                outs = [outcome(g, random_order(g, s)) for s in range(args.seeds)]
            else:
                outs = [outcome(g, sampler_order(g, p, s)) for s in range(args.seeds)]
            per[p] = outs
            every[p] += outs
        failed = len(g.cands) - len(g.truth)
        best_key = max(g.truth, key=g.truth.get)
        noise = (f"repeat noise median {100 * statistics.median(g.spreads):.1f}% over {len(g.spreads)} layouts run "
                 f"twice; best {'confirmed by a repeat' if best_key in g.repeated else 'measured once'}"
                 if g.spreads else "no repeats")
        print(f"{g.name}: {len(g.cands)} layouts ({failed} failed), best {g.best:,.0f} tokens/s/GPU measured; {noise}")
        if {"agent", "predicted"} <= per.keys() and per["agent"][0].regret[1] > per["predicted"][0].regret[1]:
            fit = next(c.prediction.fit_probability for c in g.cands if c.layout.key() == best_key)
            behind.append((g.name, per["agent"][0].regret[1], fit))
        for p, outs in per.items():
            t = [o.trials for o in outs]
            reg = [statistics.mean(o.regret[k] for o in outs) for k in range(K)]
            print(f"  {p:9} trials to 3%: median {statistics.median(t):g}, p90 {pct(t, 0.9):g}; mean regret after 1..5: "
                  + " ".join(f"{100 * r:.1f}%" for r in reg)
                  + f"; GPU-hours {statistics.median(o.hours for o in outs):.3f}")
    summary = {}
    print(f"\noverall ({len(grids)} grids, measured; agent and predicted order once per grid, "
          f"samplers and random {args.seeds} seeds each):")
    for p, outs in every.items():
        t = [o.trials for o in outs]
        reg = [statistics.mean(o.regret[k] for o in outs) for k in range(K)]
        summary[p] = {"median_trials_to_3pct": statistics.median(t), "p90_trials_to_3pct": pct(t, 0.9),
                      "mean_regret_after_k": [round(r, 4) for r in reg],
                      "median_gpu_hours": round(statistics.median(o.hours for o in outs), 4)}
        print(f"  {p:9} trials to 3%: median {statistics.median(t):g}, p90 {pct(t, 0.9):g}; mean regret after 1..5: "
              + " ".join(f"{100 * r:.1f}%" for r in reg))
    if {"agent", "predicted"} <= every.keys():
        # "lower than the predicted order's" can only hold where the predicted order leaves some regret
        floor = [o.regret[1] for o in every["predicted"]]
        if not any(floor):
            ties = sum(o.regret[1] == 0 for o in every["agent"])
            print(f"  after 2 trials the predicted order has found every grid's best ({len(floor)} of {len(floor)}): "
                  f"no proposer's regret can be lower there; the agent has too on {ties} of {len(every['agent'])}")
    for name, regret, fit in behind:
        why = (f"its best layout was predicted borderline (P(fits) {fit:.0%}): the agent tried layouts sure to fit "
               f"first, the predicted order ignores the risk and that layout happened to fit" if fit < 0.9 else
               "the agent explored")
        print(f"  agent behind the predicted order after 2 trials: {name}, regret {100 * regret:.1f}%; {why}")
    held = [(n, lo, hi, y) for n, lo, hi, y in bands if y is not None]
    inside = sum(lo <= y <= hi for _, lo, hi, y in held)
    first = [hi / lo for n, lo, hi, _ in bands if n == 1]
    third = [hi / lo for n, lo, hi, _ in bands if n == 3]
    intervals = {"inside": inside, "measured": len(held),
                 "median_width_first_trial": statistics.median(first) if first else None,
                 "median_width_after_2_trials": statistics.median(third) if third else None}
    print(f"agent's 90% band printed before each trial: holds {inside} of {len(held)} measurements; width (high/low) "
          f"before the first trial median x{intervals['median_width_first_trial'] or float('nan'):.2f}, after 2 trials "
          f"x{intervals['median_width_after_2_trials'] or float('nan'):.2f}")
    print("labels: every figure here is measured (grid truth); the predictions that order the agent and the predicted "
          "order come from the cost model, whose runner components were shaped looking at the v1-v4 grids "
          "(benchmarks/runner_accuracy.py: in sample), the v5 grid held out; the v6 grid (Mixtral-8x7B) held out for "
          "tokens/s, in sample for memory (unfused_glu_backward_tensors was fitted on it); the v7 grid (Mixtral-8x22B) "
          "held out for tokens/s, in sample for memory (unfused_moe_act_recompute_tensors); the v8 and v9 grids held "
          "out for tokens/s (predictions committed before they ran), in sample for memory since the 2026-12-03 "
          "change (offload and dense SwiGLU backward: v5, v8, v9, v10 looked at); the v11-v18 grids ran with predictions "
          "committed before them, then every grid up to v18 was looked at when a component's fixed cost per micro-batch "
          "was floored at its gradient accumulation (2026-12-04): in sample since; the v19 grids (Qwen3-8B, "
          "Mixtral-8x22B at seq 16k, Qwen3.6 at 5 layers seq 8k), v20 (Qwen3-30B-A3B seq 2k, whole Qwen3-4B, Qwen3.6 "
          "at 3 layers) and v21 (whole Qwen3-1.7B) ran after that, predictions committed before: held out, but for "
          "v19/v20's memory (the q/k-norm count) and v20/v21's scaled-layer tokens/s (runner_scaled_work_exponent), "
          "looked at since; v22 (Codestral-22B, whole Qwen3-0.6B, Qwen3.6 at 5 layers seq 2k, Qwen3-Next at 3 layers "
          "seq 2k) ran after those, predictions committed before: held out, but for Qwen3-0.6B's tokens/s (the dense "
          "host floor), looked at since; v23 (whole SmolLM2-360M and TinyLlama-1.1B, Qwen3.6 at 3 layers seq 2k) ran "
          "after those, predictions committed before: held out; v24 (whole Phi-3-mini, Phi-3.5-MoE at 3 layers, "
          "Qwen3-30B-A3B and Qwen3.6 at 4 layers seq 1k) ran after the MoE host floors, predictions committed before: "
          "held out; v25 (Qwen3.5-35B-A3B with its real GDN at 4 layers, Ministral-8B at 8 layers, a synthetic "
          "32-expert MoE at 3 layers; 5 runs each) ran 2026-12-05 and 2026-12-06, predictions committed before: "
          "held out; v26 (GLM-4.5-Air at 2 layers, Qwen2.5-7B at 8, whole Qwen3.5-0.8B with its real GDN) ran "
          "2026-12-06, predictions committed before: held out, but for Qwen3.5-0.8B's selective recompute (a GDN "
          "layer's selective launches), looked at since; v27 (1 x H100) ran 2026-12-06, predictions committed before, "
          "then looked at for tokens/s (the H100 derivation's calibration); v28 (1 x H100: Mixtral-8x7B at 1 layer, "
          "Ministral-8B at 6) ran 2026-12-06, predictions committed before: held out; v29 (Qwen3.5-4B at 12 "
          "layers, Qwen3.5-27B at 6 layers seq 2k, both with real GDN) ran 2026-12-06, predictions committed "
          "before: held out; v31 (1 x H100: Qwen2.5-14B at 5 layers, Qwen1.5-MoE-A2.7B at 3, Qwen3.6 at 2 layers "
          "seq 6k) ran 2026-12-06, predictions committed before: held out; v32 (1 x H100: Qwen2.5-32B at 2 layers, "
          "Qwen2-57B-A14B at 1, Qwen3.6 at 2 layers seq 2k) ran 2026-12-06, predictions committed before: held out; "
          "v28's Qwen3-Next-80B-A3B trials (1 x H100, 1 layer, real GDN) ran 2026-12-06 (seventh session), "
          "predictions committed with v28: held out; v33 (1 x H100: Qwen3-14B at 2 layers) ran 2026-12-06 (ninth "
          "session), predictions committed before: held out; v35 (1 x H100: Mistral-NeMo-12B at 4 layers, GLM-4.5-Air at 1, "
          "Qwen3.6 at 2 layers seq 6k) ran 2026-12-06 (tenth session), predictions committed before: held out, but for "
          "the Qwen3.6 layouts that repeat v31's; v36 (1 x H100: Codestral-22B at 5 layers, Qwen3.6 at 2 layers seq 8k, "
          "Qwen3-Next at 1 layer seq 8k) ran 2026-12-06 (eleventh session), predictions committed before: held out; "
          "v30 (1 x H200: Qwen2.5-14B at 10 layers, Qwen1.5-MoE-A2.7B at 6, Qwen3.6 at 4 layers seq 6k) ran 2026-12-06 "
          "(eleventh and twelfth sessions), predictions committed before: held out; v37's trials without GDN layers "
          "(1 x H100: Mistral-Small-24B at 2 layers, Phi-3.5-MoE at 1) ran 2026-12-07 (thirteenth session), predictions "
          "committed before: held out, and its GDN trials (Qwen3.5-4B at 8 layers, Qwen3.6 at 1 layer seq 16k) "
          "2026-12-07 (fourteenth session): held out; the five MoE runs whose allocator cache has no room (v25, v31, "
          "v32, v34) were looked at for the allocator_remap term (2026-12-07, fifteenth session); "
          "v41 (1 x H100: Qwen3-30B-A3B and Qwen2.5-7B at 4 layers) ran 2026-12-07 (sixteenth session), predictions "
          "committed before: held out; "
          "v42 (1 x H100: Yi-6B and a synthetic GDN-dense model at 8 layers) and v43 (1 x H100: Mistral-7B-v0.3 at 8 "
          "layers, a synthetic 32-expert MoE at 2) ran 2026-12-07 (seventeenth session), predictions committed before: "
          "held out; "
          "v44 (1 x H100: MiMo-7B's shape at 6 layers, Qwen3.6 at 1 layer seq 8k) and v45 (1 x H100: OLMoE-1B-7B's shape "
          "at 5 layers) ran 2026-12-07 (twentieth session; v45's predicted no-fit layout in the twenty-first), "
          "predictions committed before: held out; v46 (1 x H100: Granite-3.0-3B-A800M's shape at 8 layers) ran "
          "2026-12-07 (twenty-first session), predictions committed before: held out; v47 (1 x H100: Falcon3-7B at 4 "
          "layers, ERNIE-4.5-21B-A3B's shape at 3) ran 2026-12-07 (twenty-second session), predictions committed "
          "before: held out; the grids of MoE models priced from a layer with another expert count (v46's Granite "
          "and v47's ERNIE shapes among them) are looked at since the per-expert fixed cost (twenty-second session) "
          "and its slope through the measured layers (twenty-third; runner_accuracy EXPERT_COUNT_LOOKED_AT); "
          "a layout whose allocator retried every step (counted from v32 on) is told to the agent as `tune` tells it "
          "(History.strained) (--suite v19 ... v32 replays them alone)")
    print(json.dumps({"grids": [g.name for g in grids], "seeds": args.seeds, "proposers": summary,
                      "intervals": intervals}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
