"""What the cost model does not know, carried as hypotheses: a prediction is a central figure and an interval.

slime's step on the reference recipes holds time no measured rate explains (host launches, syncs,
Python). The shipped model puts it per layer pass (`layer_launch_overhead_s`, exposed where a pass's GPU
work is shorter) and fits it, with the CPU-Adam share, to the two leaderboard recipes: two constants,
two points. Other forms fit those two points exactly as well and rank the space differently, so each is
kept as a hypothesis, calibrated on the same evidence (benchmarks/calibrate_hypotheses.py writes
data/hypotheses.yaml):

  per_layer_pass   launch time per layer pass, exposed where the pass's GPU work is shorter (shipped)
  per_token        seconds per token a GPU's data-parallel rank processes in a step
  per_microbatch   seconds per micro-batch of the step
  per_step         seconds per step
  pass_and_token   half of the shipped per-pass constant, the rest per token

crossed with the flex dispatcher's effect on that time (`flex_overhead_factor`, an estimate: 0.6, 0.8,
1.0). The Megatron framework's constants are fitted to public rows with their own form; there only the
flex factor varies. A hypothesis predicts through `predict` with its constants, plus its extra term in the
breakdown (`unexplained`). Pure: no I/O beyond the package's data file, read once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources

from cost_model.nouns.user_file import parse_yaml

from cost_model.constants import Constants, default_constants
from cost_model.nouns.errors import AttuneError
from cost_model.nouns.hardware import GpuSpec
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import ModelSpec
from cost_model.predict import Prediction, predict, step_time_only
from cost_model.profile import HardwareProfile
from cost_model.nouns.workload import Workload

FORMS = ("per_layer_pass", "per_token", "per_microbatch", "per_step", "pass_and_token")
FLEX_FACTORS = (0.6, 0.8, 1.0)
SHIPPED = ("per_layer_pass", 0.8)
INTERVAL_QUANTILES = (0.05, 0.95)


_CONSTANTS: dict = {}   # (hypothesis, id(base constants)) -> (base constants, constants under it)


class HypothesisError(AttuneError, ValueError):
    """A hypotheses file that cannot be used."""


@dataclass(frozen=True)
class Hypothesis:
    """One way the unexplained time could behave, with the constants calibrated under it."""

    form: str
    flex_overhead_factor: float
    layer_launch_overhead_s: float      # the per-pass part (0 for forms without one)
    unexplained: float                  # the form's coefficient: s per token, per micro-batch or per step
    cpu_adam_share_of_profile: float
    prior: float = 1.0
    source: str = ""

    @property
    def name(self) -> str:
        return f"{self.form} flex {self.flex_overhead_factor:g}"

    @property
    def shipped(self) -> bool:
        return (self.form, self.flex_overhead_factor) == SHIPPED

    def constants(self, c: Constants) -> Constants:
        """`c` under this hypothesis: the same object for the same `c`, so the layer and rate memos keyed by the
        constants' identity hit across the thousands of layouts the agent weighs under each hypothesis."""
        key = (self, id(c))
        hit = _CONSTANTS.get(key)
        if hit is not None and hit[0] is c:
            return hit[1]
        if len(_CONSTANTS) >= 256:
            _CONSTANTS.clear()
        out = replace(c, layer_launch_overhead_s=self.layer_launch_overhead_s,
                      flex_overhead_factor=self.flex_overhead_factor,
                      cpu_adam_share_of_profile=self.cpu_adam_share_of_profile)
        _CONSTANTS[key] = (c, out)
        return out

    def extra_s(self, num_microbatches: int, layout: Layout, workload: Workload) -> float:
        """Seconds this form adds to a step beyond what `predict` counts with its constants."""
        if workload.framework != "slime" or self.form == "per_layer_pass":
            return 0.0
        if self.form in ("per_token", "pass_and_token"):
            base = self.unexplained * workload.tokens_per_step / (layout.dp * layout.cp)
        elif self.form == "per_microbatch":
            base = self.unexplained * num_microbatches
        else:
            base = self.unexplained
        return base * (self.flex_overhead_factor if layout.dispatcher == "flex" else 1.0)


def predict_under(h: Hypothesis, model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout,
                  constants: Constants | None = None, profile: HardwareProfile | None = None,
                  **kw) -> Prediction:
    """`predict` under hypothesis `h`: its constants, and its extra term as `unexplained` in the breakdown."""
    c = constants or default_constants()
    p = predict(model, gpu, workload, layout, h.constants(c), profile, **kw)
    extra = h.extra_s(p.num_microbatches, layout, workload)
    if extra == 0.0:
        return p
    step = p.step_time_s + extra
    scale = p.step_time_s / step
    breakdown = {**p.breakdown, "unexplained": extra}
    return replace(p, step_time_s=step, breakdown=breakdown, tokens_per_s_per_gpu=p.tokens_per_s_per_gpu * scale,
                   mfu=p.mfu * scale, usd_per_million_tokens=p.usd_per_million_tokens / scale)


def tokens_per_s_under(h: Hypothesis, model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout,
                       constants: Constants | None = None, profile: HardwareProfile | None = None,
                       step: tuple[float, int] | None = None) -> float:
    """`predict_under(...).tokens_per_s_per_gpu` without the memory model (the agent's table of every
    candidate under every hypothesis needs only this), for predict's default stack options. `step`:
    `step_time_only`'s (seconds, micro-batches) for this layout under a hypothesis with the same `step_constants`
    (it is not computed again; a caller pricing other stack options passes it)."""
    c = constants or default_constants()
    seconds, n_mb = step or step_time_only(model, gpu, workload, layout, h.constants(c), profile)
    tokens = workload.tokens_per_step / seconds / layout.world_size
    extra = h.extra_s(n_mb, layout, workload)
    return tokens if extra == 0.0 else tokens * (seconds / (seconds + extra))   # predict_under's arithmetic, to the bit


def step_constants(h: Hypothesis, layout: Layout, workload: Workload) -> tuple:
    """The constants of `h` that `step_time_only` reads for this layout: hypotheses that agree on them give it
    the same step time (the forms differ mostly in their extra term). The launch constant is slime's own (a
    Megatron run reads the Megatron one), the flex factor scales it on the flex dispatcher only, and the CPU-Adam
    share prices an offloaded optimizer only (cost_model.step_time)."""
    launch = h.layer_launch_overhead_s if workload.framework == "slime" else None
    return (launch, h.flex_overhead_factor if layout.dispatcher == "flex" else None,
            h.cpu_adam_share_of_profile if layout.offloaded else None)


def weighted_quantile(values: list[float], weights: list[float], q: float) -> float:
    """The q-quantile of a discrete weighted distribution (the smallest value whose cumulative weight reaches q)."""
    pairs = sorted(zip(values, weights))
    total = sum(w for _, w in pairs)
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= q * total - 1e-12:
            return v
    return pairs[-1][0]


@dataclass(frozen=True)
class Interval:
    """Tokens/s/GPU: the hypotheses' weighted 5% / 50% / 95% quantiles (`spread_low`, `median`,
    `spread_high`), widened by the residual every fitted hypothesis keeps (`error_sd`, log-normal) to the
    90% interval `low`..`high`; and each hypothesis's figure."""

    low: float
    median: float
    high: float
    spread_low: float
    spread_high: float
    error_sd: float
    by_hypothesis: tuple[tuple[str, float, float], ...]   # (name, weight, tokens/s/GPU)

    def to_dict(self) -> dict:
        return {"low": self.low, "median": self.median, "high": self.high, "spread_low": self.spread_low,
                "spread_high": self.spread_high, "error_sd": self.error_sd, "quantiles": list(INTERVAL_QUANTILES),
                "hypotheses": len(self.by_hypothesis)}

    def drivers(self) -> list[str]:
        """What the spread comes from: the weighted figure of each form and each flex factor, widest first."""
        out = []
        for key, label in ((lambda n: n.split(" flex ")[0], "form"), (lambda n: "flex " + n.split(" flex ")[1], "flex")):
            groups: dict[str, list] = {}
            for name, w, v in self.by_hypothesis:
                groups.setdefault(key(name), []).append((w, v))
            means = {g: sum(w * v for w, v in xs) / max(sum(w for w, _ in xs), 1e-12) for g, xs in groups.items()}
            if len(means) > 1:
                spread = max(means.values()) - min(means.values())
                parts = ", ".join(f"{g} {v:,.0f}" for g, v in sorted(means.items(), key=lambda kv: -kv[1]))
                out.append((spread, f"{label}: {parts}"))
        return [text for _, text in sorted(out, reverse=True)]


Z90 = 1.645   # the 5% and 95% points of a standard normal


def interval_of(values: list[tuple[Hypothesis, float, float]], error_sd: float) -> Interval:
    """(hypothesis, weight, tokens/s/GPU) triples as an Interval, widened by a log-normal residual `error_sd`."""
    xs = [v for _, _, v in values]
    total = sum(w for _, w, _ in values) or 1.0
    ws = [w / total for _, w, _ in values]
    lo, hi = INTERVAL_QUANTILES
    spread_low, spread_high = weighted_quantile(xs, ws, lo), weighted_quantile(xs, ws, hi)
    return Interval(low=spread_low * math.exp(-Z90 * error_sd), median=weighted_quantile(xs, ws, 0.5),
                    high=spread_high * math.exp(Z90 * error_sd), spread_low=spread_low, spread_high=spread_high,
                    error_sd=error_sd, by_hypothesis=tuple((h.name, w, v) for (h, _, v), w in zip(values, ws)))


def predict_interval(hypotheses: tuple[Hypothesis, ...], model: ModelSpec, gpu: GpuSpec, workload: Workload,
                     layout: Layout, constants: Constants | None = None, profile: HardwareProfile | None = None,
                     **kw) -> Interval:
    """The interval of tokens/s/GPU over `hypotheses`, each weighted by its prior (`reweighted` sets them)."""
    c = constants or default_constants()
    triples = [(h, w, p.tokens_per_s_per_gpu)
               for h, w, p in predictions_under(hypotheses, model, gpu, workload, layout, c, profile, **kw)]
    return interval_of(triples, residual_sd(c, workload))


def predictions_under(hypotheses: tuple[Hypothesis, ...], model: ModelSpec, gpu: GpuSpec, workload: Workload,
                      layout: Layout, constants: Constants | None = None, profile: HardwareProfile | None = None,
                      **kw) -> list[tuple[Hypothesis, float, Prediction]]:
    """(hypothesis, weight, prediction) for each hypothesis that applies to the workload, weighted by its prior
    (`reweighted` sets them)."""
    return [(h, h.prior, predict_under(h, model, gpu, workload, layout, constants, profile, **kw))
            for h in applicable(hypotheses, workload)]


def reweighted(hypotheses: tuple[Hypothesis, ...], weights: dict[str, float]) -> tuple[Hypothesis, ...]:
    """`hypotheses` with the weights by name as their priors (the others keep theirs)."""
    return tuple(replace(h, prior=weights[h.name]) if h.name in weights else h for h in hypotheses)


def residual_sd(c: Constants, workload: Workload) -> float:
    """The log-normal residual of a prediction for this workload: LoRA and VLM runs have their own (no fit sees
    their rows, and they miss by more), every other run the held-out residual of the rows the constants fit."""
    return c.prediction_error_sd_lora_vlm if workload.frozen_weights or workload.images_per_row \
        else c.prediction_error_sd


def applicable(hypotheses: tuple[Hypothesis, ...], workload: Workload) -> tuple[Hypothesis, ...]:
    """The hypotheses that differ for this framework: every form for slime; the shipped form's flex
    variants for Megatron (its constants are fitted to public rows in their own form)."""
    if workload.framework == "slime":
        return hypotheses
    return tuple(h for h in hypotheses if h.form == SHIPPED[0])


def parse_hypotheses(data: dict, origin: str = "hypotheses file") -> tuple[Hypothesis, ...]:
    rows = data.get("hypotheses") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise HypothesisError(f"{origin}: expected a mapping with a non-empty 'hypotheses' list")
    out = []
    for i, r in enumerate(rows):
        try:
            h = Hypothesis(form=str(r["form"]), flex_overhead_factor=float(r["flex_overhead_factor"]),
                           layer_launch_overhead_s=float(r["layer_launch_overhead_s"]),
                           unexplained=float(r["unexplained"]),
                           cpu_adam_share_of_profile=float(r["cpu_adam_share_of_profile"]),
                           prior=float(r.get("prior", 1.0)), source=str(r.get("source", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise HypothesisError(f"{origin}: hypothesis {i + 1}: {type(e).__name__}: {e}") from None
        if h.form not in FORMS or not all(math.isfinite(x) and x >= 0 for x in (
                h.flex_overhead_factor, h.layer_launch_overhead_s, h.unexplained, h.cpu_adam_share_of_profile, h.prior)):
            raise HypothesisError(f"{origin}: hypothesis {i + 1} ({h.name}): unknown form or a negative/non-finite value")
        out.append(h)
    return tuple(out)


@lru_cache(maxsize=1)
def default_hypotheses() -> tuple[Hypothesis, ...]:
    text = resources.files("cost_model").joinpath("data/hypotheses.yaml").read_text()
    origin = "cost_model/data/hypotheses.yaml"
    return parse_hypotheses(parse_yaml(text, origin, HypothesisError, shipped=True), origin)
