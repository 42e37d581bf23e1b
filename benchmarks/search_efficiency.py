"""How many real trials each proposer needs to reach within 3% of the true best layout.

    python benchmarks/search_efficiency.py [--seeds 20] [--proposers agent,tpe,random,gp] [--max-trials 60]
                                           [--scenarios NAME,...]

Synthetic ground truths, unknown to the proposers: per scenario and seed, the truth is one hypothesis of
cost_model/hypotheses.py drawn at random, each breakdown term scaled by its own log-normal factor (sd drawn
in 0.2-0.4), and the memory limit moved by a factor drawn in [-5%, +5%] (a layout predicted to fit can run
out of memory, and one predicted just over the limit can fit). A proposer sees only the cost model; every
layout it sends to the truth is a real trial (an OOM counts, with its GPU-hours to the failure). Trials to
reach within 3% of the truth's best layout (over the scenario's whole space) are counted; a run that has not
reached it after --max-trials counts as max-trials + 1 ("not reached"). GPU-hours: each trial 20 steps of
the true step time on all the scenario's GPUs, plus 5 minutes of start-up.

The scenario spaces are the search space with fewer values of the non-parallel dimensions (one full
recompute depth, offload 0 or 1, bf16 moments, VPP up to 2), so that the truth can be computed for every
layout; every proposer searches the same space. A replay of the measured grids in benchmarks/results/
(the megatron runner's H200 suites) follows: there the truth is the measurements themselves.
The last line is one JSON object with `median_trials_to_3pct` per proposer.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import optuna

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_model.nouns.hardware import load_gpu  # noqa: E402
from cost_model.hypotheses import default_hypotheses, predict_under  # noqa: E402
from cost_model.nouns.layout_codec import from_optuna_params, to_optuna_params  # noqa: E402
from cost_model.nouns.model_spec import load_model  # noqa: E402
from cost_model.predict import predict  # noqa: E402
from cost_model.nouns.stack import Stack  # noqa: E402
from cost_model.nouns.workload import Workload  # noqa: E402
from search_space.enumerate import SpaceOptions, enumerate_layouts  # noqa: E402
from tuner.agent import AgentPrior, AgentProposer  # noqa: E402
from tuner.proposer import Candidate, History, SamplerProposer  # noqa: E402
from tuner.space_params import distributions  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.03
OPTIONS = SpaceOptions(rows_per_microbatch=(1, 2, 4), full_recompute_layers=(1,), offload_fractions=(0.0, 1.0),
                       exp_avg_dtypes=("bf16",), max_vpp=2)
SCENARIOS = {
    "qwen3.6-35b-a3b-h200x8": ("qwen3.6-35b-a3b", "h200", 8),
    "qwen3.6-35b-a3b-h200x32": ("qwen3.6-35b-a3b", "h200", 32),
    "qwen3-30b-a3b-h100x16": ("qwen3-30b-a3b", "h100", 16),
    "qwen3.6-35b-a3b-b200x8": ("qwen3.6-35b-a3b", "b200", 8),
    "gpt-oss-120b-h200x64": ("gpt-oss-120b", "h200", 64),
}


@dataclass
class Space:
    """A scenario's layouts (shipped prediction within 5% of the memory limit) and each hypothesis's
    breakdown of them, computed when first needed."""

    name: str
    model: object
    gpu: object
    gpus: int
    workload: Workload
    layouts: list
    shipped: list                  # Prediction per layout (the shipped model)
    cache: dict

    def breakdown(self, h, i: int) -> dict:
        key = (h.form, h.flex_overhead_factor if self.layouts[i].dispatcher == "flex" else None, i)
        if key not in self.cache:
            self.cache[key] = predict_under(h, self.model, self.gpu, self.workload, self.layouts[i]).breakdown
        return self.cache[key]

    def tps(self, h, i: int) -> float:
        return self.workload.tokens_per_step / sum(self.breakdown(h, i).values()) / self.gpus


def build_space(name: str) -> Space:
    model_name, gpu_name, gpus = SCENARIOS[name]
    model, gpu, wl = load_model(model_name), load_gpu(gpu_name), Workload()
    layouts, shipped = [], []
    for layout in enumerate_layouts(model, gpus, wl, Stack(), OPTIONS):
        p = predict(model, gpu, wl, layout)
        if p.peak_memory_gib <= p.gpu_memory_gib * 1.05:
            layouts.append(layout)
            shipped.append(p)
    return Space(name, model, gpu, gpus, wl, layouts, shipped, {})


@dataclass(frozen=True)
class Truth:
    hypothesis: object
    multipliers: dict
    memory_shift: float
    values: dict          # layout index -> true tokens/s (for the layouts it fits)
    best: float


def draw_truth(space: Space, seed: int) -> Truth:
    rng = random.Random(seed)
    hyps = default_hypotheses()
    h = rng.choice(hyps)
    sd = rng.uniform(0.2, 0.4)
    terms = set(space.shipped[0].breakdown) | {"unexplained"}
    mult = {k: math.exp(rng.gauss(0.0, sd)) for k in sorted(terms)}
    shift = rng.uniform(-0.05, 0.05)
    values = {}
    for i, p in enumerate(space.shipped):
        if p.peak_memory_gib <= p.gpu_memory_gib * (1 + shift):
            step = sum(v * mult.get(k, 1.0) for k, v in space.breakdown(h, i).items())
            values[i] = space.workload.tokens_per_step / step / space.gpus
    return Truth(h, mult, shift, values, max(values.values()))


def gpu_hours(space: Space, truth: Truth, i: int) -> float:
    tps = truth.values.get(i)
    step = space.workload.tokens_per_step / (tps * space.gpus) if tps else 60.0
    return space.gpus * (300 + 20 * step) / 3600


def run_agent(space: Space, truth: Truth, max_trials: int) -> tuple[int, float]:
    cands = [Candidate(l, p) for l, p in zip(space.layouts, space.shipped) if p.may_fit]   # as tune's agent gets
    index = {l.key(): i for i, l in enumerate(space.layouts)}
    agent = AgentProposer(cands, to_optuna_params, default_hypotheses(),
                          lambda h, l: space.tps(h, index[l.key()]), AgentPrior(level_sd=0.25))
    by_params = {json.dumps(to_optuna_params(c.layout), sort_keys=True): c for c in cands}
    h, hours = History(), 0.0
    for n in range(1, max_trials + 1):
        p = agent.propose(h)
        if p is None:
            break
        c = by_params[json.dumps(p.params, sort_keys=True)]
        i = index[c.layout.key()]
        h.tried.add(c.layout.key())
        hours += gpu_hours(space, truth, i)
        if i in truth.values:
            h.measured_layouts.append((c.layout, truth.values[i]))
            if truth.values[i] >= truth.best * (1 - TARGET):
                return n, hours
        else:
            h.failed.append((c.layout.key(), "cuda_oom", c.prediction.peak_memory_gib))
    return max_trials + 1, hours


def run_sampler(kind: str, space: Space, truth: Truth, max_trials: int, seed: int) -> tuple[int, float]:
    index = {l.key(): i for i, l in enumerate(space.layouts)}
    study = optuna.create_study(direction="maximize", sampler=SamplerProposer(kind, seed).sampler())
    dists = distributions(space.model, space.gpus, OPTIONS, space.workload)
    real, hours, seen = 0, 0.0, set()
    for _ in range(max_trials * 50):           # proposals outside the space or predicted not to fit cost nothing
        t = study.ask(dists)
        try:
            layout = from_optuna_params(t.params, space.gpus, space.workload.seq_len)
        except Exception:  # noqa: BLE001 - an invalid combination of parameters
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
            continue
        i = index.get(layout.key())
        if i is None or not space.shipped[i].fits or i in seen:
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
            continue
        seen.add(i)
        real += 1
        hours += gpu_hours(space, truth, i)
        if i in truth.values:
            study.tell(t, truth.values[i])
            if truth.values[i] >= truth.best * (1 - TARGET):
                return real, hours
        else:
            study.tell(t, state=optuna.trial.TrialState.FAIL)
        if real >= max_trials:
            break
    return max_trials + 1, hours


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


# ------------------------------------------------------------------------------------------ replay
REPLAYS = (("megatron-h200-suite.jsonl", "megatron_h200_suite.json"),
           ("megatron-h200-gdn-suite.jsonl", "megatron_h200_gdn_suite.json"))


def replay_grid(result: str, suite: str, seeds: int) -> dict:
    """The measured grid as the truth: the agent (with the runner's own predictions) and random order."""
    from cost_model.nouns.case import Case
    from experiments.megatron.model_run import predict_run, trial_model
    from experiments.megatron.suite import parse_suite
    trials = {t.name: t for t in parse_suite(ROOT / "benchmarks" / suite)[0]}
    rows = [json.loads(x) for x in (ROOT / "benchmarks" / "results" / result).read_text().splitlines() if x.strip()]
    cands, truth = [], {}
    for r in rows:
        t = trials.get(r["trial"])
        if t is None or t.layout.world_size != 1:
            continue          # one GPU count per replay: the 1-GPU layouts compete with each other
        p = predict_run(Case(trial_model(load_model(t.model), t.layers, t.replace_gdn), load_gpu("h200"),
                             replace(t.workload, framework="megatron"), t.layout))
        cands.append(Candidate(t.layout, p))
        if r["status"] == "ok":
            truth[t.layout.key()] = r["tokens_per_s_per_gpu"]
    best = max(truth.values())
    agent = AgentProposer(cands, to_optuna_params, default_hypotheses(),
                          lambda h, l: next(c.prediction.tokens_per_s_per_gpu for c in cands if c.layout == l))
    h, n = History(), 0
    while True:
        p = agent.propose(h)
        if p is None:
            break
        c = next(c for c in cands if to_optuna_params(c.layout) == p.params)
        n += 1
        h.tried.add(c.layout.key())
        if c.layout.key() in truth:
            h.measured_layouts.append((c.layout, truth[c.layout.key()]))
            if truth[c.layout.key()] >= best * (1 - TARGET):
                break
        else:
            h.failed.append((c.layout.key(), "crash", None))
    order_counts = []
    for s in range(seeds):
        order = list(cands)
        random.Random(s).shuffle(order)
        order_counts.append(next(k + 1 for k, c in enumerate(order) if truth.get(c.layout.key(), 0) >= best * (1 - TARGET)))
    return {"grid": result, "layouts": len(cands), "agent_trials": n, "random_median_trials": statistics.median(order_counts)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--proposers", default="agent,tpe,random")
    ap.add_argument("--max-trials", type=int, default=60)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = ap.parse_args(argv)
    proposers = args.proposers.split(",")
    trials: dict[str, list[int]] = {p: [] for p in proposers}
    hours: dict[str, list[float]] = {p: [] for p in proposers}
    for name in args.scenarios.split(","):
        t0 = time.time()
        space = build_space(name)
        per = {p: [] for p in proposers}
        for seed in range(args.seeds):
            truth = draw_truth(space, seed)
            for p in proposers:
                n, gh = (run_agent(space, truth, args.max_trials) if p == "agent"
                         else run_sampler(p, space, truth, args.max_trials, seed))
                per[p].append(n)
                trials[p].append(n)
                hours[p].append(gh)
        line = "; ".join(f"{p} median {statistics.median(v):g}, p90 {pct(v, 0.9):g}" for p, v in per.items())
        print(f"{name}: {len(space.layouts):,} layouts, {args.seeds} seeds ({time.time() - t0:.0f} s): trials to within "
              f"3% of the true best: {line}", flush=True)
    for p in proposers:
        reached = sum(1 for n in trials[p] if n <= args.max_trials)
        print(f"{p}: median {statistics.median(trials[p]):g} trials, p90 {pct(trials[p], 0.9):g}, reached "
              f"{reached}/{len(trials[p])}; median {statistics.median(hours[p]):.1f} GPU-hours")
    replays = []
    for result, suite in REPLAYS:
        if (ROOT / "benchmarks" / "results" / result).exists():
            r = replay_grid(result, suite, args.seeds)
            replays.append(r)
            print(f"replay {r['grid']} (1-GPU layouts, measured): agent {r['agent_trials']} trials, random order median "
                  f"{r['random_median_trials']:g} of {r['layouts']} to within 3% of the best measured")
    print(json.dumps({"median_trials_to_3pct": {p: statistics.median(v) for p, v in trials.items()},
                      "p90_trials_to_3pct": {p: pct(v, 0.9) for p, v in trials.items()},
                      "median_gpu_hours": {p: round(statistics.median(v), 2) for p, v in hours.items()},
                      "seeds": args.seeds, "max_trials": args.max_trials, "replays": replays}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
