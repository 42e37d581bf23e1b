"""The agent proposer: spends each real trial where it is expected to teach the most.

It reads the cost model as a set of hypotheses (cost_model/hypotheses.py), each predicting every candidate
layout, and the study's measurements:

- belief: a measured layout's tokens/s is `level x family effect x prediction_h x noise`: log-normal noise
  of sd `sigma` (layout to layout within a family), an unknown level per hypothesis (log-normal prior of sd
  `level_sd`: the runner or cluster may run uniformly faster or slower than the model) and an effect per
  layout family (sd `family_sd`: the model errs alike on one parallel shape and dispatcher). Each
  measurement updates every hypothesis's level (conjugate normal in log space, family effects folded into
  the noise) and weight (prior x marginal likelihood of all measurements), then the measured families'
  effects from what the level leaves (shrunk towards 0); an unmeasured family keeps its prior spread, so
  trying it has value of its own. Failures are information: a layout that ran out of
  memory rules out the layouts of its family predicted to need as much or more.
- value of a trial: P(fits) x expected improvement over the best measured tokens/s under the weighted
  mixture; while the hypotheses still disagree on which layout is best, a layout whose outcome tells
  them apart gains `discriminate` x its spread across hypotheses. P(fits) is the prediction's
  fit_probability under the memory model's measured error (cost_model/memory_fit.py): the candidates
  include borderline layouts, and an out-of-memory run gains nothing and still spends its trial, so a
  borderline layout is tried only where its gain times its chance to fit beats the plain fits'.
- stop: when no untried layout's 95% upper bound beats the best measured by more than `stop_margin`.

Everything it believes is recomputed from the study's trials, so a resumed study continues from the same
posterior; each proposal carries what it tests, what it expects (interval) and the weights it used.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable

from cost_model.hypotheses import Z90, Hypothesis, default_hypotheses, weighted_quantile
from cost_model.memory_fit import percent
from cost_model.nouns.layout import Layout
from tuner.dominated import adds_work, base
from tuner.proposer import Candidate, History, Proposal, Proposer, family

SQRT2 = math.sqrt(2.0)


def _Phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / SQRT2))


def lognormal_ei(mu: float, var: float, best: float) -> float:
    """E[max(Y - best, 0)] for log Y ~ N(mu, var)."""
    if best <= 0:
        return math.exp(mu + var / 2)
    s = math.sqrt(max(var, 1e-12))
    d1 = (mu + var - math.log(best)) / s
    return math.exp(mu + var / 2) * _Phi(d1) - best * _Phi(d1 - s)


def coarse_group(layout: Layout) -> tuple:
    """Layouts the hypotheses cannot rank differently enough to matter: one family, micro-batch, recompute
    granularity and offload on/off. The agent evaluates every hypothesis on the best of each."""
    return family(layout) + (layout.max_tokens_per_gpu, layout.recompute_granularity,
                             layout.optimizer_offload_fraction > 0, layout.exp_avg_dtype)


@dataclass
class Table:
    """The candidates and each hypothesis's predicted tokens/s/GPU for them."""

    hypotheses: tuple[Hypothesis, ...]
    candidates: list[Candidate]
    values: list[list[float]]                      # values[h][i]
    predict_h: Callable[[Hypothesis, Layout], float]
    index: dict = field(default_factory=dict)      # layout key -> i
    extra_sd: Callable[[Candidate], float] | None = None   # a candidate's own extra log sd (tuner.intervals)
    extra_var: list = field(default_factory=list)  # extra_var[i]: its square, per candidate

    @classmethod
    def build(cls, candidates: list[Candidate], hypotheses: tuple[Hypothesis, ...],
              predict_h: Callable[[Hypothesis, Layout], float],
              extra_sd: Callable[[Candidate], float] | None = None) -> "Table":
        """The best candidate (shipped prediction times its chance to fit) of each coarse group, predicted
        under every hypothesis; `extra_sd`: the log sd a candidate's prediction adds to the prior's (a runner
        prediction near its host/GPU crossing)."""
        def score(c: Candidate) -> float:
            return c.prediction.fit_probability * c.prediction.tokens_per_s_per_gpu

        best: dict[tuple, Candidate] = {}
        for c in candidates:
            g = coarse_group(c.layout)
            if g not in best or score(c) > score(best[g]):
                best[g] = c
        t = cls(hypotheses, [], [[] for _ in hypotheses], predict_h, extra_sd=extra_sd)
        for c in sorted(best.values(), key=lambda c: -c.prediction.tokens_per_s_per_gpu):
            t._append(c)
        return t

    def _append(self, c: Candidate) -> int:
        i = len(self.candidates)
        self.candidates.append(c)
        self.index[c.layout.key()] = i
        self.extra_var.append(self.extra_sd(c) ** 2 if self.extra_sd is not None else 0.0)
        same = {}
        for k, h in enumerate(self.hypotheses):
            # hypotheses that differ only in the flex factor agree on layouts that do not use flex
            key = (h.form, h.flex_overhead_factor if c.layout.dispatcher == "flex" else None)
            if key not in same:
                same[key] = self.predict_h(h, c.layout)
            self.values[k].append(same[key])
        return i

    def ensure(self, c: Candidate) -> int:
        """The index of `c`, predicting it under every hypothesis first if it is new (a measured layout)."""
        i = self.index.get(c.layout.key())
        return i if i is not None else self._append(c)


@dataclass(frozen=True)
class Belief:
    weights: tuple[float, ...]        # per hypothesis, sums to 1
    level_mean: tuple[float, ...]     # posterior mean of log level per hypothesis
    level_var: tuple[float, ...]
    sigma: float
    measured: int
    family_sd: float = 0.0
    families: dict = field(default_factory=dict)   # family -> per hypothesis (mean, var) of its log effect


def belief(table: Table, measured: list[tuple[int, float]], sigma: float, level_sd: float,
           family_sd: float = 0.0) -> Belief:
    """The posterior over hypotheses, levels and family effects from measured (candidate index, tokens/s)."""
    t2 = level_sd ** 2
    # each measurement's noise: the layout sd, the family's, and its prediction's own extra (Table.extra_var)
    s2 = [sigma ** 2 + family_sd ** 2 + table.extra_var[i] for i, _ in measured]
    inv = sum(1 / v for v in s2)
    logw, means, vars_ = [], [], []
    for k, h in enumerate(table.hypotheses):
        r = [math.log(y) - math.log(max(table.values[k][i], 1e-9)) for i, y in measured]
        prec = inv + 1 / t2
        weighted = sum(x / v for x, v in zip(r, s2))
        mean = weighted / prec
        means.append(mean)
        vars_.append(1 / prec)
        # marginal likelihood of r ~ N(0, diag(s2) + t2 11^T), in closed form
        quad = sum(x * x / v for x, v in zip(r, s2)) - weighted ** 2 / prec
        logdet = sum(math.log(v) for v in s2) + math.log(1 + t2 * inv)
        logw.append(math.log(max(h.prior, 1e-300)) - 0.5 * (quad + logdet))
    top = max(logw)
    w = [math.exp(x - top) for x in logw]
    total = sum(w)
    families: dict = {}
    if family_sd > 0:
        by_family: dict = {}
        for i, y in measured:
            by_family.setdefault(family(table.candidates[i].layout), []).append((i, y))
        for fam, pts in by_family.items():
            per_h = []
            own = [sigma ** 2 + table.extra_var[i] for i, _ in pts]
            for k in range(len(table.hypotheses)):
                e = [math.log(y) - math.log(max(table.values[k][i], 1e-9)) - means[k] for i, y in pts]
                prec = sum(1 / v for v in own) + 1 / family_sd ** 2
                per_h.append((sum(x / v for x, v in zip(e, own)) / prec, 1 / prec))
            families[fam] = per_h
    return Belief(tuple(x / total for x in w), tuple(means), tuple(vars_), sigma, len(measured), family_sd, families)


@dataclass(frozen=True)
class Outlook:
    """What the agent expects of one candidate."""

    index: int
    mean: float
    low: float
    high: float
    median: float          # the weighted median of the hypotheses' posterior medians
    p_fit: float
    ei: float
    spread: float          # weighted sd of the hypotheses' log means
    value: float


def outlook(table: Table, b: Belief, i: int, best: float, p_fit: float, discriminate: float) -> Outlook:
    fam = b.families.get(family(table.candidates[i].layout))
    effect = fam or [(0.0, b.family_sd ** 2)] * len(b.weights)
    mus = [math.log(max(table.values[k][i], 1e-9)) + b.level_mean[k] + effect[k][0] for k in range(len(b.weights))]
    own = b.sigma ** 2 + table.extra_var[i]
    var = [own + b.level_var[k] + effect[k][1] for k in range(len(b.weights))]
    mean = sum(w * math.exp(m + v / 2) for w, m, v in zip(b.weights, mus, var))
    ei = sum(w * lognormal_ei(m, v, best) for w, m, v in zip(b.weights, mus, var))
    centre = sum(w * m for w, m in zip(b.weights, mus))
    spread = math.sqrt(max(0.0, sum(w * (m - centre) ** 2 for w, m in zip(b.weights, mus))))
    # a 90% band of the mixture: the weighted 5% and 95% points of its components
    low = weighted_quantile([m - Z90 * math.sqrt(v) for m, v in zip(mus, var)], list(b.weights), 0.05)
    high = weighted_quantile([m + Z90 * math.sqrt(v) for m, v in zip(mus, var)], list(b.weights), 0.95)
    value = p_fit * (ei + discriminate * mean * spread)
    median = math.exp(weighted_quantile(mus, list(b.weights), 0.5))
    return Outlook(i, mean, math.exp(low), math.exp(high), median, p_fit, ei, spread, value)


@dataclass(frozen=True)
class AgentPrior:
    """The agent's prior (the module's docstring): sd per layout within a family (`sigma`), per hypothesis's level
    (`level_sd`) and per family (`family_sd`), and the weight of telling the hypotheses apart (`discriminate`)."""

    sigma: float = 0.1
    level_sd: float = 0.5
    family_sd: float = 0.15
    discriminate: float = 0.5


class AgentProposer(Proposer):
    """Expected improvement under the hypotheses' weighted mixture, with trials that tell them apart."""

    name = "agent"
    weighs_fit_risk = True

    def __init__(self, candidates: list[Candidate], layout_params, hypotheses: tuple[Hypothesis, ...] = (),
                 predict_h: Callable[[Hypothesis, Layout], float] | None = None, prior: AgentPrior = AgentPrior(),
                 stop_margin: float | None = 0.03, extra_sd: Callable[[Candidate], float] | None = None):
        """`hypotheses`/`predict_h` default to one hypothesis: the candidates' own predictions; `stop_margin`
        None: never stop before the trials asked for; `extra_sd`: a candidate's own extra log sd over the prior's
        per-layout sd (tuner.intervals.crossing_extra_sd for the runner stack)."""
        self.layout_params = layout_params
        self.by_key = {c.layout.key(): c for c in candidates}
        if predict_h is None:
            hypotheses = tuple(h for h in default_hypotheses() if h.shipped)
            predict_h = lambda h, layout: self.by_key[layout.key()].prediction.tokens_per_s_per_gpu  # noqa: E731
        self.table = Table.build(candidates, hypotheses, predict_h, extra_sd)
        self.sigma, self.level_sd, self.family_sd = prior.sigma, prior.level_sd, prior.family_sd
        self.discriminate, self.stop_margin = prior.discriminate, stop_margin
        self.total_candidates = len(candidates)
        self.stop_reason: str | None = None
        self.last: Belief | None = None
        self._rng = random.Random()   # only to spread proposals between concurrent tuners
        # the outlooks of the last posterior (`outlooks`): its state, candidate index -> Outlook, the bonus
        self._outlook_state, self._outlook_memo, self._disc = None, {}, 0.0
        self._by_base = None   # (candidates then, base layout -> candidate indices): tuner.dominated

    # -- what the study knows
    def _measured(self, history: History) -> list[tuple[int, float]]:
        """The measurements the belief learns from. One that ran short of memory (the allocator retried every
        step: History.strained) measured the allocator as much as the layout: it stays the layout's figure
        (the best measured counts it) but says nothing of the model's level or family (13-30% slow on the runner,
        runner-grids-h100-v32, the v31 probes)."""
        out = []
        strained = getattr(history, "strained", set())
        for layout, value in getattr(history, "measured_layouts", []):
            c = self.by_key.get(layout.key())
            if c is None or layout.key() in strained:
                continue        # measured by another space (the study's options changed): not comparable
            out.append((self.table.ensure(c), value))
        return out

    def _oom_limits(self, history: History) -> dict[tuple, float]:
        """Per family, the smallest predicted peak that ran out of memory: nothing at or above it fits."""
        limits: dict[tuple, float] = {}
        for key, failure, peak in getattr(history, "failed", []):
            c = self.by_key.get(key)
            if failure == "cuda_oom" and c is not None:
                fam = family(c.layout)
                peak = peak if peak is not None else c.prediction.peak_memory_gib
                limits[fam] = min(limits.get(fam, math.inf), peak)
        return limits

    def _p_fit(self, c: Candidate, limits: dict) -> float:
        """The prediction's chance to fit (the memory model's measured error); 0 at or above a peak of its
        family that ran out of memory."""
        if c.prediction.peak_memory_gib >= limits.get(family(c.layout), math.inf):
            return 0.0
        return c.prediction.fit_probability

    def _dominated(self, history: History) -> set[int]:
        """Candidates that add recompute, offload or fp32 moments to a layout that ran (measured, or predicted by
        the cost model's runner) and was predicted a plain fit (tuner.dominated): they cannot run faster, so no trial
        goes to them."""
        keys = [layout.key() for layout, _ in getattr(history, "measured_layouts", [])]
        keys += sorted(getattr(history, "ran", set()) - set(keys))
        measured = [c.layout for k in keys if (c := self.by_key.get(k)) is not None and c.prediction.fits]
        if not measured:
            return set()
        if self._by_base is None or self._by_base[0] != len(self.table.candidates):
            groups: dict[tuple, list[int]] = {}
            for i, c in enumerate(self.table.candidates):
                groups.setdefault(base(c.layout), []).append(i)
            self._by_base = (len(self.table.candidates), groups)
        groups = self._by_base[1]
        return {i for m in measured for i in groups.get(base(m), ())
                if adds_work(self.table.candidates[i].layout, m)}

    def belief(self, history: History) -> Belief:
        return belief(self.table, self._measured(history), self.sigma, self.level_sd, self.family_sd)

    def outlooks(self, history: History) -> tuple[Belief, list[Outlook], float]:
        b = self.belief(history)
        measured = [v for _, v in getattr(history, "measured_layouts", [])]
        best = max(measured) if measured else 0.0
        limits = self._oom_limits(history)
        # A candidate's outlook changes only with the posterior, the best measured and the OOM limits: while
        # they stay (a predicted study, failures that teach nothing) the outlooks are reused, not recomputed.
        state = (b, best, tuple(sorted(limits.items())), len(self.table.candidates))
        if self._outlook_state != state:
            # the discrimination bonus only while the weighted hypotheses disagree on the best layout
            leaders = {max(range(len(self.table.candidates)), key=lambda i: self.table.values[k][i])
                       for k, w in enumerate(b.weights) if w >= 0.05}
            self._outlook_state, self._outlook_memo = state, {}
            self._disc = self.discriminate if len(leaders) > 1 else 0.0
        memo, out = self._outlook_memo, []
        dominated = self._dominated(history)
        for i, c in enumerate(self.table.candidates):
            if c.layout.key() in history.tried or i in dominated:
                continue
            o = memo.get(i)
            if o is None:
                o = memo[i] = outlook(self.table, b, i, best, self._p_fit(c, limits), self._disc)
            out.append(o)
        return b, out, best

    def propose(self, history: History) -> Proposal | None:
        b, outs, best = self.outlooks(history)
        self.last = b
        if not outs:
            self.stop_reason = ("every distinct fitting layout has been tried, or adds recompute or offload to one "
                                "measured to fit (it cannot run faster)")
            return None
        if best > 0 and self.stop_margin is not None:
            live = [o for o in outs if o.p_fit >= 0.5]
            top = max((o.high for o in live), default=0.0)
            if top < best * (1 + self.stop_margin):
                self.stop_reason = (f"stopped: no untried layout's 95% upper bound ({top:,.0f}) beats the best measured "
                                    f"({best:,.0f} tokens/s/GPU) by more than {self.stop_margin:.0%}")
                return None
        # of two equal in value (a layout and its bf16-moments twin), the one needing less memory: once it has run,
        # the other only adds work (tuner.dominated)
        choice = max(outs, key=lambda o: (o.value, -self.table.candidates[o.index].prediction.peak_memory_gib))
        peers = getattr(history, "peers", 1)
        if peers > 1:
            # several tuners propose at once from the same posterior: each takes one of the best `peers`
            # at random, so they rarely race for one layout (tuner.trial_claims settles the races left)
            top = sorted(outs, key=lambda o: -o.value)[:peers]
            choice = self._rng.choice(top)
        c = self.table.candidates[choice.index]
        return Proposal(params=self.layout_params(c.layout), rationale=self._explain(c, choice, b, best),
                        attrs=self._attrs(choice, b))

    def weights(self, b: Belief) -> dict[str, float]:
        return {h.name: round(w, 4) for h, w in zip(self.table.hypotheses, b.weights)}

    def _attrs(self, o: Outlook, b: Belief) -> dict:
        return {"expected": {"mean": o.mean, "median": o.median, "low": o.low, "high": o.high, "p_fit": o.p_fit,
                             "fit_verdict": self.table.candidates[o.index].prediction.fit_verdict},
                "hypothesis_weights": self.weights(b)}

    def _explain(self, c: Candidate, o: Outlook, b: Belief, best: float) -> str:
        disc_part = self.discriminate * o.mean * o.spread
        if b.measured == 0:
            # what it ranked on (the figure after "expects" is the posterior median, which may rank otherwise)
            why = (f"nothing measured yet: the highest value among untried layouts, its mean over the hypotheses "
                   f"({o.mean:,.0f} tokens/s/GPU) times P(fits), with a share for how far they disagree on it "
                   f"({o.spread:.0%} log sd)")
        elif disc_part > o.ei:
            why = (f"tells hypotheses apart: their predictions for it spread {o.spread:.0%} (log sd) and they "
                   f"disagree on the best layout")
        else:
            why = f"highest expected improvement ({o.ei:,.0f} tokens/s/GPU over the best measured {best:,.0f})"
        heavy = sorted(zip(b.weights, self.table.hypotheses), key=lambda x: -x[0])[:3]
        weights = (f"weights equal ({len(b.weights)} hypotheses)" if max(b.weights) - min(b.weights) < 1e-3 else
                   "weights " + ", ".join(f"{h.name} {w:.0%}" for w, h in heavy))
        p = c.prediction
        terms = sorted(p.breakdown.items(), key=lambda kv: -kv[1])[:2]
        top = ", ".join(f"{k} {v / p.step_time_s:.0%}" for k, v in terms)
        borderline = "borderline: " if p.borderline else ""
        fam = "" if b.measured == 0 else (" (its family measured)" if family(c.layout) in b.families
                                          else " (an unmeasured family)")
        remap = p.breakdown.get("allocator_remap", 0.0)
        strain = (f"; no room for the allocator's cache: {remap / (p.step_time_s - remap):.0%} slower "
                  f"(allocator_remap)" if remap > 0 else "")
        # the whole layout: two candidates may differ only in their offload or Adam moments' dtype
        return (f"{why}; {c.layout.long_label}{fam}: expects {o.median:,.0f} "
                f"[{o.low:,.0f}-{o.high:,.0f}] tokens/s/GPU (posterior median, 90%), P(fits) {percent(o.p_fit)} ({borderline}predicted peak "
                f"{p.peak_memory_gib:.1f} of {p.gpu_memory_gib:.1f} GiB); {weights}; largest terms {top}{strain}")

    def after_trial(self, history: History) -> dict:
        """What the last trial taught: the weights and levels after it, against those before."""
        before = self.last
        after = self.belief(history)
        latest = getattr(history, "measured_layouts", [])[-1:]
        if latest and latest[0][0].key() in getattr(history, "strained", set()):
            return {"learnt": "nothing of the model's level: the allocator retried every step (the layout ran short "
                              "of memory); its figure stands for this layout alone",
                    "hypothesis_weights_after": self.weights(after)}
        if before is None or after.measured == before.measured:
            return {"hypothesis_weights_after": self.weights(after)}
        moved = sorted(zip(self.table.hypotheses, before.weights, after.weights), key=lambda x: -abs(x[2] - x[1]))[:2]
        level = math.exp(sum(w * m for w, m in zip(after.weights, after.level_mean)))
        text = (f"level now x{level:.2f} of the predictions; "
                + "; ".join(f"{h.name} {a:.0%} -> {z:.0%}" for h, a, z in moved))
        return {"learnt": text, "hypothesis_weights_after": self.weights(after)}
