"""The 20-step convergence check of a recipe: a candidate loss curve against a reference curve.

    tune check-convergence --candidate A --reference B [--json] [--min-correlation 0.95]
        [--max-final-diff 0.03] [--max-failing-share 0.10] [--skip-fraction 0.2]

Exit codes: 0 the candidate passes, 1 it fails, 2 unusable input (one line on stderr).

The rules are Megatron-Bridge's `validate_convergence`, re-implemented here (no code copied) from
NVIDIA-NeMo/Megatron-Bridge @ 067f987df03b8355b03192d88d70f1709fedf51a:

- scripts/performance/utils/evaluate.py L145-328, `validate_convergence`:
  - L172-186 default thresholds; L196-202 skip the first `int(n * skip_first_percent_loss)` points of
    both curves (floor; the skipped points take part in no rule below);
  - L204-213 Pearson correlation of the remaining points (np.corrcoef); it fails when < threshold;
  - L215-258 per-point relative difference |cur - gold| / |gold| (|cur| when gold == 0) against a
    tolerance chosen by the *reference* (golden) loss: gold > 2.0 -> 10%, 0.5 < gold <= 2.0 -> 5%,
    gold <= 0.5 -> 2%; a point fails when its difference > its tolerance; the rule fails when the
    failing share > max_outlier_ratio (10%);
  - L260-274 final loss difference |cur[-1] - gold[-1]| / gold[-1] (|cur[-1]| when gold == 0); it
    fails when > final_loss_tolerance (3%);
  - L276-294 3-sigma outliers of the residuals cur - gold (mean and population std); the rule fails
    when their share > max_outlier_ratio (the same 10% setting as the point-wise rule).
- scripts/performance/utils/evaluate.py L766-771 and L920: any NaN or Inf grad norm in the current
  run fails the check.
- scripts/performance/argument_parser.py L999-1023, the pipeline's flags: correlation 0.95,
  tolerances 0.10 / 0.05 / 0.02 (boundaries 2.0 and 0.5), max outlier ratio 0.1, 3 sigma, and
  skip_first_percent_loss 0.20 (the function's own default is 0.0). That file's
  --final_loss_tolerance default is 0.05; the function default, and this project's rule
  (shared/reference/recipe-format.md), is 0.03, which is used here.

Where this check is stricter than the original, on purpose:
- a NaN/Inf loss or grad norm anywhere in either curve (skipped steps included) fails. In the
  original a NaN loss slips through: NaN comparisons are False, so NaN correlation, NaN point and
  NaN final differences all "pass"; only the grad-norm scan catches a divergence;
- a correlation left undefined by a NaN/Inf fails instead of passing silently; one left undefined by a flat curve
  (either curve constant after the skip: it has no shape to correlate) is not checked, and the output says so
  ("undefined (a flat curve): not checked"); the other rules judge it, so identical flat curves pass while a flat
  candidate against a falling reference fails by the point-wise and final-loss rules (the original's NaN
  correlation passes silently);
- the curves must cover exactly the same steps: a length or step mismatch is an input error
  (`CurveError`), never a silent truncation or a NaN-filled gap.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from cost_model.nouns.names import printable
from experiments.checks.loss_curve import Curve, CurveError, load_curve

__all__ = ["Curve", "CurveError", "Thresholds", "Verdict", "check", "load_curve", "main", "recipe_convergence_block"]


# ---------------------------------------------------------------------- thresholds and verdict
@dataclass(frozen=True)
class Thresholds:
    """validate_convergence's settings (defaults: the Megatron-Bridge pipeline's, final loss 3%)."""

    min_correlation: float = 0.95
    high_loss_tolerance: float = 0.10      # reference loss > high_loss_above
    medium_loss_tolerance: float = 0.05    # medium_loss_above < reference loss <= high_loss_above
    low_loss_tolerance: float = 0.02       # reference loss <= medium_loss_above
    high_loss_above: float = 2.0
    medium_loss_above: float = 0.5
    max_failing_share: float = 0.10        # point-wise failures, and 3-sigma outliers (one setting, as upstream)
    max_final_diff: float = 0.03
    skip_fraction: float = 0.2
    outlier_sigma: float = 3.0

    def __post_init__(self) -> None:
        def finite(name: str) -> float:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"threshold {name} must be a finite number, got {value!r}")
            return float(value)

        for name in ("min_correlation", "high_loss_tolerance", "medium_loss_tolerance", "low_loss_tolerance",
                     "high_loss_above", "medium_loss_above", "max_failing_share", "max_final_diff",
                     "skip_fraction", "outlier_sigma"):
            finite(name)
        if not -1.0 <= self.min_correlation <= 1.0:
            raise ValueError(f"min_correlation must lie in [-1, 1], got {self.min_correlation}")
        for name in ("high_loss_tolerance", "medium_loss_tolerance", "low_loss_tolerance", "max_final_diff",
                     "outlier_sigma"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.max_failing_share <= 1.0:
            raise ValueError(f"max_failing_share must lie in [0, 1], got {self.max_failing_share}")
        if not 0.0 <= self.skip_fraction < 1.0:
            raise ValueError(f"skip_fraction must lie in [0, 1), got {self.skip_fraction}")
        if self.medium_loss_above > self.high_loss_above:
            raise ValueError("medium_loss_above must not exceed high_loss_above")

    def tolerance_for(self, reference_loss: float) -> float:
        """Relative tolerance of one step, chosen by the reference loss (evaluate.py L218-224)."""
        if reference_loss > self.high_loss_above:
            return self.high_loss_tolerance
        if reference_loss > self.medium_loss_above:
            return self.medium_loss_tolerance
        return self.low_loss_tolerance

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class PointResult:
    step: int
    candidate: float
    reference: float
    relative_diff: float
    tolerance: float
    passed: bool


@dataclass(frozen=True)
class RuleResult:
    rule: str           # short key
    figure: str         # readable name
    measured: Any       # the figure (None when undefined)
    measured_text: str
    threshold: Any
    threshold_text: str
    passed: bool
    checked: bool = True   # False: the rule could not apply (a flat curve's correlation) and passes, saying so


@dataclass(frozen=True)
class Verdict:
    passed: bool
    rules: tuple[RuleResult, ...]
    thresholds: Thresholds
    steps_total: int
    skipped_steps: tuple[int, ...]
    compared_steps: tuple[int, ...]
    correlation: float | None
    final_loss_difference: float
    final_step: int
    pointwise_failures: int
    pointwise_failure_share: float
    outliers: int
    outlier_share: float
    nonfinite: tuple[str, ...]
    points: tuple[PointResult, ...]
    candidate_source: str = ""
    reference_source: str = ""

    @property
    def failed_rules(self) -> list[str]:
        return [r.rule for r in self.rules if not r.passed]

    def rule(self, key: str) -> RuleResult:
        for r in self.rules:
            if r.rule == key:
                return r
        raise KeyError(key)

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "result": "pass" if self.passed else "fail",
            "failed_rules": self.failed_rules,
            "candidate": self.candidate_source,
            "reference": self.reference_source,
            "steps_total": self.steps_total,
            "skipped_steps": list(self.skipped_steps),
            "compared_steps": list(self.compared_steps),
            "correlation": _json_float(self.correlation),
            "final_step": self.final_step,
            "final_loss_difference": _json_float(self.final_loss_difference),
            "pointwise_failures": self.pointwise_failures,
            "pointwise_failure_share": _json_float(self.pointwise_failure_share),
            "outliers": self.outliers,
            "outlier_share": _json_float(self.outlier_share),
            "nonfinite": list(self.nonfinite),
            "rules": [{"rule": r.rule, "figure": r.figure, "measured": _json_value(r.measured),
                       "threshold": _json_value(r.threshold), "threshold_text": r.threshold_text,
                       "passed": r.passed, "checked": r.checked} for r in self.rules],
            "points": [{"step": p.step, "candidate": _json_float(p.candidate),
                        "reference": _json_float(p.reference), "relative_diff": _json_float(p.relative_diff),
                        "tolerance": p.tolerance, "passed": p.passed} for p in self.points],
            "thresholds": self.thresholds.to_dict(),
        }

    def format(self) -> str:
        out = []
        if self.candidate_source or self.reference_source:
            out.append(f"convergence check: candidate {self.candidate_source or '?'} "
                       f"vs reference {self.reference_source or '?'}")
        skipped = (f"first {len(self.skipped_steps)} skipped (steps {self.skipped_steps[0]}..{self.skipped_steps[-1]})"
                   if self.skipped_steps else "none skipped")
        out.append(f"{self.steps_total} steps, {skipped} by skip fraction {self.thresholds.skip_fraction:g}; "
                   f"{len(self.compared_steps)} compared")
        out.append("")
        rows = [("figure", "measured", "threshold", "verdict")]
        rows += [(r.figure, r.measured_text, r.threshold_text,
                  "not checked" if not r.checked else "pass" if r.passed else "FAIL") for r in self.rules]
        out += _table(rows)
        out.append("")
        rows = [("step", "candidate", "reference", "rel. diff", "tolerance", "verdict")]
        for p in self.points:
            rows.append((str(p.step), _fmt_loss(p.candidate), _fmt_loss(p.reference),
                         _fmt_pct(p.relative_diff), f"<= {_fmt_pct(p.tolerance)}", "pass" if p.passed else "FAIL"))
        out += _table(rows)
        if self.nonfinite:
            out.append("")
            shown = list(self.nonfinite[:8])
            more = f" (and {len(self.nonfinite) - 8} more)" if len(self.nonfinite) > 8 else ""
            out.append("non-finite values: " + "; ".join(shown) + more)
        out.append("")
        out.append("result: PASS" if self.passed else f"result: FAIL ({', '.join(self.failed_rules)})")
        return "\n".join(out)


def _json_float(x: float | None) -> float | str | None:
    if x is None:
        return None
    if math.isfinite(x):
        return float(x)
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _json_value(x: Any) -> Any:
    if isinstance(x, float):
        return _json_float(x)
    return x


def _fmt_loss(x: float) -> str:
    return f"{x:.6f}" if math.isfinite(x) else str(x)


def _fmt_pct(x: float) -> str:
    if not math.isfinite(x):
        return str(x)
    return f"{100 * x:.4g}%"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


# ---------------------------------------------------------------------- the check
def _unit_scaled(values: Sequence[float]) -> list[float]:
    """Values divided by their largest magnitude: Pearson's r and the outlier count do not change, and
    squares of losses near the float limit (a diverged run) no longer overflow."""
    top = max((abs(v) for v in values), default=0.0)
    return [v / top for v in values] if top > 0 else list(values)


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation (what np.corrcoef gives); None when undefined (a constant or non-finite curve)."""
    n = len(xs)
    if n < 2 or not all(math.isfinite(v) for v in (*xs, *ys)):
        return None
    xs, ys = _unit_scaled(xs), _unit_scaled(ys)
    mx = math.fsum(xs) / n
    my = math.fsum(ys) / n
    dx = [x - mx for x in xs]
    dy = [y - my for y in ys]
    sxx = math.fsum(d * d for d in dx)
    syy = math.fsum(d * d for d in dy)
    if sxx == 0.0 or syy == 0.0:
        return None
    r = math.fsum(a * b for a, b in zip(dx, dy)) / math.sqrt(sxx * syy)
    return max(-1.0, min(1.0, r))


def _flat(values: Sequence[float]) -> bool:
    """A finite curve without variance (as `_pearson` computes it): its correlation is undefined, not failed."""
    if not all(math.isfinite(v) for v in values):
        return False
    scaled = _unit_scaled(values)
    mean = math.fsum(scaled) / len(scaled)
    return math.fsum((v - mean) ** 2 for v in scaled) == 0.0


def _correlation_rule(cur: Sequence[float], gold: Sequence[float], t: Thresholds) -> tuple[float | None, RuleResult]:
    """The correlation and its rule. A flat curve (no variance) has no correlation to test: the rule is not checked
    and passes, saying so; the other rules judge the curves. Undefined by a NaN/Inf, it fails."""
    correlation = _pearson(cur, gold)
    if correlation is None and (_flat(cur) or _flat(gold)):
        return None, RuleResult("correlation", "correlation", None, "undefined (a flat curve): not checked",
                                t.min_correlation, f">= {t.min_correlation:g}", True, checked=False)
    return correlation, RuleResult(
        "correlation", "correlation", correlation,
        "undefined" if correlation is None else f"{correlation:.6f}",
        t.min_correlation, f">= {t.min_correlation:g}",
        correlation is not None and not correlation < t.min_correlation)


def _relative(current: float, reference: float) -> float:
    # evaluate.py L227-230 (point-wise) and L263 (final): relative to the reference; absolute when it is 0.
    if reference != 0:
        return abs(current - reference) / abs(reference)
    return abs(current)


def _describe_step_mismatch(candidate: Curve, reference: Curve) -> str:
    def listing(values: list[int]) -> str:
        shown = ", ".join(str(v) for v in values[:6])
        return shown + (f" ... ({len(values)} in all)" if len(values) > 6 else "")

    c_name = candidate.source or "candidate"
    r_name = reference.source or "reference"
    cs, rs = set(candidate.steps), set(reference.steps)
    parts = []
    if len(candidate) != len(reference):
        parts.append(f"candidate {c_name} has {len(candidate)} steps, reference {r_name} has {len(reference)}")
    else:
        parts.append(f"candidate {c_name} and reference {r_name} cover different steps")
    only_r = sorted(rs - cs)
    only_c = sorted(cs - rs)
    if only_r:
        parts.append(f"missing from the candidate: {listing(only_r)}")
    if only_c:
        parts.append(f"missing from the reference: {listing(only_c)}")
    return "; ".join(parts) + " (the curves must cover the same steps; nothing is truncated)"


def _nonfinite(candidate: Curve, reference: Curve) -> list[str]:
    """Any NaN/Inf loss or grad norm, in either curve, at any step (skipped ones included): each fails the check."""
    nonfinite: list[str] = []
    for label, curve in (("candidate", candidate), ("reference", reference)):
        for what, values in (("loss", curve.losses), ("grad norm", curve.grad_norms)):
            if values is None:
                continue
            for step, value in zip(curve.steps, values):
                if not math.isfinite(value):
                    nonfinite.append(f"{label} {what} at step {step}: {value}")
    return nonfinite


def _outliers(residuals: list[float], sigma: float) -> int:
    """Residuals more than `sigma` population standard deviations from their mean (each non-finite one counts)."""
    m = len(residuals)
    if all(math.isfinite(r) for r in residuals):
        residuals = _unit_scaled(residuals)
        mean = math.fsum(residuals) / m
        std = math.sqrt(math.fsum((r - mean) ** 2 for r in residuals) / m)   # population std, as np.std
        return sum(1 for r in residuals if abs(r - mean) > sigma * std)
    return sum(1 for r in residuals if not math.isfinite(r))


# Fewer compared points make the rules vacuous: two points always correlate perfectly, while a 0.95 correlation of
# 5 is unlikely by chance (p about 0.01); the recipes' curves have 20 steps, 16 compared (`--steps 8`: 7).
MIN_COMPARED_STEPS = 5


def check(candidate: Curve, reference: Curve, thresholds: Thresholds = Thresholds()) -> Verdict:
    """Compare a candidate loss curve with a reference curve under validate_convergence's rules."""
    if candidate.steps != reference.steps:
        raise CurveError(_describe_step_mismatch(candidate, reference))
    t = thresholds
    n = len(reference)
    # evaluate.py L197: int(n * fraction), i.e. the floor.
    n_skip = max(0, int(n * t.skip_fraction))
    if n - n_skip < MIN_COMPARED_STEPS:
        raise CurveError(f"too few steps to compare: {n} steps, {n_skip} skipped by skip fraction "
                         f"{t.skip_fraction:g}, at least {MIN_COMPARED_STEPS} must remain")
    steps = candidate.steps
    skipped = steps[:n_skip]
    compared = steps[n_skip:]
    cur = candidate.losses[n_skip:]
    gold = reference.losses[n_skip:]
    m = len(compared)

    nonfinite = _nonfinite(candidate, reference)
    finite_rule = RuleResult(
        "finite", "NaN/Inf loss or grad norm", len(nonfinite), str(len(nonfinite)), 0,
        "none (all steps, both curves)", not nonfinite)

    correlation, corr_rule = _correlation_rule(cur, gold, t)

    points = []
    for step, c, g in zip(compared, cur, gold):
        tol = t.tolerance_for(g)
        diff = _relative(c, g)
        ok = math.isfinite(diff) and not diff > tol
        points.append(PointResult(step, c, g, diff, tol, ok))
    failures = sum(1 for p in points if not p.passed)
    share = failures / m
    tol_used = sorted({p.tolerance for p in points})
    point_rule = RuleResult(
        "pointwise", "point-wise failures", failures, f"{failures} of {m} ({100 * share:.4g}%)",
        t.max_failing_share,
        f"<= {100 * t.max_failing_share:g}% of points (tolerance {'/'.join(_fmt_pct(x) for x in tol_used)})",
        not share > t.max_failing_share)

    final_diff = _relative(cur[-1], gold[-1])
    final_rule = RuleResult(
        "final_loss", f"final loss difference (step {compared[-1]})", final_diff, _fmt_pct(final_diff),
        t.max_final_diff, f"<= {100 * t.max_final_diff:g}%",
        math.isfinite(final_diff) and not final_diff > t.max_final_diff)

    outliers = _outliers([c - g for c, g in zip(cur, gold)], t.outlier_sigma)
    outlier_share = outliers / m
    outlier_rule = RuleResult(
        "outliers", f"{t.outlier_sigma:g}-sigma residual outliers", outliers,
        f"{outliers} of {m} ({100 * outlier_share:.4g}%)", t.max_failing_share,
        f"<= {100 * t.max_failing_share:g}% of points", not outlier_share > t.max_failing_share)

    rules = (finite_rule, corr_rule, point_rule, final_rule, outlier_rule)
    return Verdict(
        passed=all(r.passed for r in rules), rules=rules, thresholds=t, steps_total=n,
        skipped_steps=tuple(skipped), compared_steps=tuple(compared), correlation=correlation,
        final_loss_difference=final_diff, final_step=compared[-1], pointwise_failures=failures,
        pointwise_failure_share=share, outliers=outliers, outlier_share=outlier_share,
        nonfinite=tuple(nonfinite), points=tuple(points),
        candidate_source=candidate.source, reference_source=reference.source)


# ---------------------------------------------------------------------- recipe block
def recipe_convergence_block(verdict: Verdict, steps: int | None = None, note: str = "") -> dict:
    """The recipe's `correctness.convergence` block.

    correlation is floored to 5 decimals (never shown as 1.0 unless it is), the final loss difference
    (relative) kept to 3 significant digits; None where undefined.
    """
    corr = verdict.correlation
    corr_out = None if corr is None else math.floor(corr * 1e5) / 1e5
    fd = verdict.final_loss_difference
    fd_out = float(f"{fd:.3g}") if math.isfinite(fd) else None
    return {
        "steps": int(steps if steps is not None else verdict.steps_total),
        "result": "pass" if verdict.passed else "fail",
        "correlation": corr_out,
        "final_loss_difference": fd_out,
        "pointwise_failures": int(verdict.pointwise_failures),
        "note": note,
    }


# ---------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    d = Thresholds()
    p = argparse.ArgumentParser(
        prog="tune check-convergence",
        description="Compare a candidate loss curve with a reference curve (Megatron-Bridge validate_convergence "
                    "rules). Exit 0 pass, 1 fail, 2 unusable input.")
    p.add_argument("--candidate", required=True, help="candidate curve: CSV step,loss[,grad_norm] or JSON")
    p.add_argument("--reference", required=True, help="reference curve, same formats and steps")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.add_argument("--min-correlation", type=float, default=d.min_correlation,
                   help=f"minimum Pearson correlation (default {d.min_correlation})")
    p.add_argument("--max-final-diff", type=float, default=d.max_final_diff,
                   help=f"maximum relative final loss difference (default {d.max_final_diff})")
    p.add_argument("--max-failing-share", type=float, default=d.max_failing_share,
                   help=f"maximum share of failing points and of 3-sigma outliers (default {d.max_failing_share})")
    p.add_argument("--skip-fraction", type=float, default=d.skip_fraction,
                   help=f"share of leading steps left out of the comparison (default {d.skip_fraction})")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    given = ("min_correlation", "max_final_diff", "max_failing_share", "skip_fraction")
    try:
        thresholds = Thresholds(**{name: getattr(args, name) for name in given})
    except ValueError as e:   # named as the flag that gave it
        text = str(e)
        for name in given:
            text = text.replace(f"threshold {name}", name).replace(name, "--" + name.replace("_", "-"))
        print(f"tune: error: {printable(' '.join(text.split()))}", file=sys.stderr)
        return 2
    try:
        candidate = load_curve(args.candidate)
        reference = load_curve(args.reference)
        verdict = check(candidate, reference, thresholds)
    except CurveError as e:
        print(f"tune: error: {e.one_line()}", file=sys.stderr)   # a file name may hold a newline or an escape
        return 2
    except ValueError as e:
        print(f"tune: error: {printable(' '.join(str(e).split()))}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=2))
    else:
        print(verdict.format())
    return 0 if verdict.passed else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
