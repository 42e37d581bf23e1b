"""The interval tuner makes and reads: a band around a predicted tokens/s/GPU, and what it is from.

A study stores one beside each trial's prediction (`tuner.intervals` makes it), `tune predict --json` prints one,
show, report and the recipes read them. `to_dict` writes exactly the shapes stored so far, so old and new studies
read alike:

- the cost model's (the hypotheses widened by the residual, or a runner's own prediction and residual):
  low, median, high, spread_low, spread_high, error_sd, quantiles, hypotheses, kind, basis;
- the agent's posterior before a trial: low, median, high, quantiles, kind, basis.

`from_dict` reads those and a peer's partial one (a key missing or left out as malformed by tuner.trial_record
reads as None: a band with one end is shown as no band, as before).
"""
from __future__ import annotations

from dataclasses import dataclass

QUANTILES_90 = (0.05, 0.95)
_EXTRAS = ("spread_low", "spread_high", "error_sd")   # stored between high and quantiles (the cost model's shape)


@dataclass(frozen=True)
class Interval:
    low: float | None
    median: float | None
    high: float | None
    quantiles: tuple = QUANTILES_90      # the quantiles low and high stand at (their nominal coverage: 90%)
    kind: str | None = "predicted"
    basis: str | None = None             # what it is from, in words
    spread_low: float | None = None      # the cost model's: its hypotheses' own 5-95% before the residual widened it
    spread_high: float | None = None
    error_sd: float | None = None        # the log-normal sd of the residual it was widened by
    hypotheses: int | None = None        # how many hypotheses it spans

    @property
    def level(self) -> float | None:
        """Its nominal coverage (0.9 for the 5%-95% band), None when the stored quantiles do not say."""
        return round(self.quantiles[-1] - self.quantiles[0], 6) if len(self.quantiles) >= 2 else None

    @property
    def complete(self) -> bool:
        """Both ends are numbers (a peer's band may have lost one as malformed)."""
        return number(self.low) is not None and number(self.high) is not None

    @classmethod
    def of_hypotheses(cls, iv, basis: str | None = None) -> Interval:
        """From the cost model's interval (cost_model.hypotheses.Interval: its per-hypothesis figures dropped)."""
        return cls(low=iv.low, median=iv.median, high=iv.high, spread_low=iv.spread_low, spread_high=iv.spread_high,
                   error_sd=iv.error_sd, quantiles=QUANTILES_90, hypotheses=len(iv.by_hypothesis), basis=basis)

    def to_dict(self) -> dict:
        """The stored shape: the cost model's extras only where it has them, `basis` only where one is named."""
        out = {"low": self.low, "median": self.median, "high": self.high}
        out.update({k: getattr(self, k) for k in _EXTRAS if getattr(self, k) is not None})
        if self.quantiles:
            out["quantiles"] = list(self.quantiles)
        if self.hypotheses is not None:
            out["hypotheses"] = self.hypotheses
        out["kind"] = self.kind
        if self.basis is not None:
            out["basis"] = self.basis
        return out

    @classmethod
    def from_dict(cls, value) -> Interval | None:
        """A stored interval; None when `value` is not a mapping at all."""
        if not isinstance(value, dict):
            return None
        quantiles = value.get("quantiles")
        return cls(low=value.get("low"), median=value.get("median"), high=value.get("high"),
                   quantiles=tuple(quantiles) if isinstance(quantiles, (list, tuple)) else (),
                   kind=value.get("kind"), basis=value.get("basis"),
                   **{k: value.get(k) for k in (*_EXTRAS, "hypotheses")})

    def recipe_block(self, note: str) -> dict:
        """As a recipe's result states it: whole tokens/s/GPU and how the band was made."""
        return {"tokens_per_s_per_gpu_low": round(self.low), "tokens_per_s_per_gpu_median": round(self.median),
                "tokens_per_s_per_gpu_high": round(self.high), "note": note}

    @classmethod
    def from_recipe(cls, block) -> Interval:
        """A recipe's predicted_interval (recipe_block); an end it lacks or that is not a number reads as None."""
        block = block if isinstance(block, dict) else {}
        return cls(**{end: number(block.get(f"tokens_per_s_per_gpu_{end}")) for end in ("low", "median", "high")})

    def scaled(self, factor: float) -> dict:
        """Its ends and median times `factor`, rounded, as a calibrated recipe states them (those it has)."""
        return {k: round(v * factor) for k in ("low", "median", "high") if (v := number(getattr(self, k))) is not None}


def number(value):
    """`value` where it is a number (an int or float, not a bool), else None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
