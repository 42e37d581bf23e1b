"""Proposers decide which layout the study tries next, and say why.

One small abstract base, like Optuna's samplers, and concrete proposers beside it:
- `tuner.agent.AgentProposer` (default): a posterior over the cost model's hypotheses, levels and
  family effects from the measurements so far; expected improvement, trials that tell hypotheses
  apart, failures as information, a stop rule (tuner/agent.py).
- `SamplerProposer`: one of Optuna's samplers (TPE, GP or random) over the trial parameters, for users
  who want a black-box search; its invalid or non-fitting proposals are pruned with the reason.
"""
from __future__ import annotations

import abc
import random
import statistics
from dataclasses import dataclass, field

import optuna

from cost_model.predict import Prediction
from cost_model.nouns.layout import Layout


@dataclass(frozen=True)
class Proposal:
    params: dict | None            # fixed trial parameters, or None to let the Optuna sampler choose
    rationale: str
    attrs: dict = field(default_factory=dict)   # user attributes for the trial (what the proposer expects)


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    prediction: Prediction


@dataclass
class History:
    """What the study knows: every earlier trial's layout key, family and figures."""

    tried: set = field(default_factory=set)                 # layout keys already evaluated or pruned
    measured: list = field(default_factory=list)            # (family, measured tok/s, predicted tok/s)
    measured_layouts: list = field(default_factory=list)    # (Layout, measured tok/s)
    failed: list = field(default_factory=list)              # (layout key, failure_class, predicted peak GiB)
    strained: set = field(default_factory=set)              # layout keys measured with allocator retries each step
    ran: set = field(default_factory=set)                   # layout keys of trials that completed (measured or
                                                            # predicted): their twins that only add work are not tried
    best_value: float | None = None
    peers: int = 1          # tuners working on the study now (this one included); >1 spreads the proposals


def family(layout: Layout) -> tuple:
    """Layouts of one family share the parallel shape and dispatcher; the cost model errs alike on them."""
    return (layout.tp, layout.pp, layout.vpp, layout.cp, layout.ep, layout.etp, layout.dispatcher)


class Proposer(abc.ABC):
    name: str = ""
    weighs_fit_risk: bool = False   # True: it may propose borderline layouts (cost_model/memory_fit.py), weighed
                                    # by their chance to fit; else the study prunes them

    @abc.abstractmethod
    def propose(self, history: History) -> Proposal | None:
        """The next trial to run, or None when there is nothing left worth trying."""

    def sampler(self) -> optuna.samplers.BaseSampler | None:
        """The Optuna sampler the study uses for proposals without fixed parameters."""
        return None

    def after_trial(self, history: History) -> dict:
        """User attributes for the trial that just ended (what it taught), given the history with it."""
        return {}


class SamplerProposer(Proposer):
    """One of Optuna's samplers over the trial parameters: tpe (TPESampler), gp (GPSampler: needs torch
    and scipy) or random (RandomSampler); invalid or non-fitting proposals are pruned with the reason.

    Given the study's `candidates` (the valid layouts predicted to fit) and `to_params` (a layout's trial
    parameters), random draws an untried candidate uniformly, and tpe/gp do so for their first `startup`
    trials: the trial parameters are independent categoricals, and on most GPU counts nearly every draw of
    them is a layout Megatron refuses (16 GPUs: 15 of 15 random draws were), so a sampler left alone never
    completes a trial and has nothing to learn from."""

    SAMPLERS = {"tpe": "TPESampler", "gp": "GPSampler", "random": "RandomSampler"}

    def __init__(self, kind: str = "tpe", seed: int = 0, candidates: list[Candidate] | None = None,
                 to_params=None, startup: int = 10):
        if kind not in self.SAMPLERS:
            raise ValueError(f"unknown sampler {kind!r}; choose from {', '.join(self.SAMPLERS)}")
        self.name = kind
        # a pure random sampler: every proposal is a uniform draw of an untried candidate (not only the first ones)
        self.uniform = kind == "random"
        if kind == "gp":
            import importlib.util
            missing = [m for m in ("torch", "scipy") if importlib.util.find_spec(m) is None]
            if missing:
                raise ImportError(f"--proposer gp needs {' and '.join(missing)} (Optuna's GPSampler): "
                                  f"pip install {' '.join(missing)}")
        self._sampler = getattr(optuna.samplers, self.SAMPLERS[kind])(seed=seed)
        self._seed, self._candidates, self._to_params, self._startup = seed, candidates, to_params, startup

    def propose(self, history: History) -> Proposal | None:
        if self._candidates is not None and (self.uniform or len(history.tried) < self._startup):
            untried = [c for c in self._candidates if c.layout.key() not in history.tried]
            if not untried:
                return None
            # seeded by what the study has tried, so a resumed study does not replay a fresh one's draws
            pick = random.Random(f"{self._seed}/{len(history.tried)}").choice(untried)
            why = "" if self.uniform else f" (the sampler's first {self._startup} trials)"
            return Proposal(params=self._to_params(pick.layout),
                            rationale=f"a random untried layout of the {len(self._candidates):,} valid ones "
                                      f"predicted to fit{why}")
        return Proposal(params=None, rationale=f"Optuna {self.SAMPLERS[self.name]} over the layout parameters")

    def sampler(self) -> optuna.samplers.BaseSampler:
        return self._sampler
