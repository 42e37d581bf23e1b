"""Proposers decide which layout the study tries next, and say why.

One small abstract base, like Optuna's samplers, and concrete proposers beside it:
- `AgentProposer` (default): reads the cost model's ranking and breakdowns and the measurements
  so far; exploits the best adjusted prediction, hedges across layout families, and corrects
  each family's predictions by what its measured trials showed.
- `SamplerProposer`: Optuna's own sampler (TPE by default) over the trial parameters, for users
  who want a black-box search; its invalid or non-fitting proposals are pruned with the reason.
"""
from __future__ import annotations

import abc
import statistics
from dataclasses import dataclass, field

import optuna

from cost_model.predict import Prediction
from cost_model.layout import Layout


@dataclass(frozen=True)
class Proposal:
    params: dict | None            # fixed trial parameters, or None to let the Optuna sampler choose
    rationale: str


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    prediction: Prediction


@dataclass
class History:
    """What the study knows: every earlier trial's layout key, family and figures."""

    tried: set = field(default_factory=set)                 # layout keys already evaluated or pruned
    measured: list = field(default_factory=list)            # (family, measured tok/s, predicted tok/s)
    best_value: float | None = None


def family(layout: Layout) -> tuple:
    """Layouts of one family share the parallel shape and dispatcher; the cost model errs alike on them."""
    return (layout.tp, layout.pp, layout.vpp, layout.cp, layout.ep, layout.etp, layout.dispatcher)


def family_label(layout: Layout) -> str:
    return f"{layout.label} {layout.dispatcher}"


class Proposer(abc.ABC):
    name: str = ""

    @abc.abstractmethod
    def propose(self, history: History) -> Proposal | None:
        """The next trial to run, or None when there is nothing left worth trying."""

    def sampler(self) -> optuna.samplers.BaseSampler | None:
        """The Optuna sampler the study uses for proposals without fixed parameters."""
        return None


class SamplerProposer(Proposer):
    name = "tpe"

    def __init__(self, seed: int = 0):
        self._sampler = optuna.samplers.TPESampler(seed=seed)

    def propose(self, history: History) -> Proposal:
        return Proposal(params=None, rationale="Optuna TPE sampler over the ten layout parameters")

    def sampler(self) -> optuna.samplers.BaseSampler:
        return self._sampler


class AgentProposer(Proposer):
    """Exploit the best adjusted prediction; every `hedge_every`-th trial, try the best untried family.

    Measured trials correct predictions: each family's predictions are scaled by the median ratio of
    measured to predicted throughput in that family (or over all families when it has none yet).
    """

    name = "agent"

    def __init__(self, candidates: list[Candidate], layout_params, hedge_every: int = 2):
        self.layout_params = layout_params
        self.hedge_every = hedge_every
        self._proposed = 0
        # Among layouts the cost model cannot tell apart (same family, micro-batch and predicted
        # throughput), keep the one with the most memory headroom: the others add nothing to learn.
        best: dict[tuple, Candidate] = {}
        for c in candidates:
            key = (family(c.layout), c.layout.max_tokens_per_gpu, round(c.prediction.tokens_per_s_per_gpu, 0))
            if key not in best or c.prediction.peak_memory_gib < best[key].prediction.peak_memory_gib:
                best[key] = c
        self.candidates = sorted(best.values(), key=lambda c: -c.prediction.tokens_per_s_per_gpu)
        self.total_candidates = len(candidates)

    def _corrections(self, history: History) -> tuple[dict, float]:
        by_family: dict[tuple, list[float]] = {}
        for fam, measured, predicted in history.measured:
            if predicted:
                by_family.setdefault(fam, []).append(measured / predicted)
        ratios = [r for rs in by_family.values() for r in rs]
        overall = statistics.median(ratios) if ratios else 1.0
        return {f: statistics.median(rs) for f, rs in by_family.items()}, overall

    def propose(self, history: History) -> Proposal | None:
        untried = [c for c in self.candidates if c.layout.key() not in history.tried]
        if not untried:
            return None
        corrections, overall = self._corrections(history)

        def adjusted(c: Candidate) -> float:
            return c.prediction.tokens_per_s_per_gpu * corrections.get(family(c.layout), overall)

        ranked = sorted(untried, key=adjusted, reverse=True)
        leader = max(self.candidates, key=adjusted)  # the best layout, tried or not
        self._proposed += 1
        hedge = self._proposed % self.hedge_every == 0
        choice, why = ranked[0], "exploit"
        if hedge:
            tried_families = {fam for fam, _, _ in history.measured} | self._tried_families(history)
            for c in ranked:
                if family(c.layout) not in tried_families:
                    choice, why = c, "hedge"
                    break
        return Proposal(params=self.layout_params(choice.layout),
                        rationale=self._explain(choice, leader, why, corrections, overall))

    def _tried_families(self, history: History) -> set:
        return {family(c.layout) for c in self.candidates if c.layout.key() in history.tried}

    def _explain(self, c: Candidate, leader: Candidate, why: str, corrections: dict, overall: float) -> str:
        p = c.prediction
        terms = sorted(p.breakdown.items(), key=lambda kv: -kv[1])[:3]
        top = ", ".join(f"{k} {v / p.step_time_s:.0%}" for k, v in terms)
        fam = family(c.layout)
        corr = corrections.get(fam)
        corr_text = (f"scaled by {corr:.2f} from this family's measured trials" if corr is not None
                     else f"scaled by {overall:.2f} (all measured trials)" if overall != 1.0 else "no measurements yet")
        head = (f"exploit: highest adjusted prediction among {len(self.candidates)} distinct fitting layouts"
                if why == "exploit" else
                f"hedge: best layout of an untried family ({family_label(c.layout)}), "
                f"{p.tokens_per_s_per_gpu / leader.prediction.tokens_per_s_per_gpu:.0%} of the best prediction; "
                f"guards against the cost model erring on the leader's family")
        return (f"{head}; predicted {p.tokens_per_s_per_gpu:,.0f} tokens/s/GPU ({corr_text}); "
                f"largest terms: {top}; peak {p.peak_memory_gib:.1f} of {p.gpu_memory_gib:.1f} GiB")
