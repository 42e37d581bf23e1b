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
- an undefined correlation (a constant curve after the skip) fails instead of passing silently;
- the curves must cover exactly the same steps: a length or step mismatch is an input error
  (`CurveError`), never a silent truncation or a NaN-filled gap.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from cost_model.user_file import read_user_text
from cost_model.errors import AttuneError


class CurveError(AttuneError, ValueError):
    """A loss curve that cannot be read or compared; the message is one line."""


# ---------------------------------------------------------------------- curves
@dataclass(frozen=True)
class Curve:
    """A loss curve: strictly increasing integer steps, one loss (and optionally a grad norm) each."""

    steps: tuple[int, ...]
    losses: tuple[float, ...]
    grad_norms: tuple[float, ...] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        where = self.source or "curve"
        if len(self.steps) != len(self.losses):
            raise CurveError(f"{where}: {len(self.steps)} steps but {len(self.losses)} losses")
        if self.grad_norms is not None and len(self.grad_norms) != len(self.steps):
            raise CurveError(f"{where}: {len(self.steps)} steps but {len(self.grad_norms)} grad norms")
        if not self.steps:
            raise CurveError(f"{where}: no data points")
        for i in range(1, len(self.steps)):
            if self.steps[i] == self.steps[i - 1]:
                raise CurveError(f"{where}: duplicate step {self.steps[i]}")
            if self.steps[i] < self.steps[i - 1]:
                raise CurveError(f"{where}: steps not sorted: step {self.steps[i]} after step {self.steps[i - 1]}")

    def __len__(self) -> int:
        return len(self.steps)

    @classmethod
    def from_values(cls, losses: Iterable[float], grad_norms: Iterable[float] | None = None, *,
                    first_step: int = 0, source: str = "") -> "Curve":
        losses = tuple(float(x) for x in losses)
        norms = None if grad_norms is None else tuple(float(x) for x in grad_norms)
        return cls(tuple(range(first_step, first_step + len(losses))), losses, norms, source)


def _number(value: Any, what: str, where: str) -> float:
    """A loss or grad norm: a JSON number or a numeric string; NaN/Inf are data (the check fails on them)."""
    if isinstance(value, bool) or value is None:
        raise CurveError(f"{where}: non-numeric {what} {json.dumps(value)}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise CurveError(f"{where}: non-numeric {what} {value!r}")


def _step(value: Any, where: str) -> int:
    if isinstance(value, bool) or value is None:
        raise CurveError(f"{where}: non-numeric step {json.dumps(value)}")
    if isinstance(value, int):
        return value
    number: float | None = None
    if isinstance(value, float):
        number = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                raise CurveError(f"{where}: non-numeric step {value!r}") from None
    if number is None:
        raise CurveError(f"{where}: non-numeric step {value!r}")
    if not math.isfinite(number) or number != int(number):
        raise CurveError(f"{where}: step {value!r} is not an integer")
    return int(number)


def _build(path: str, rows: list[tuple[str, Any, Any, Any]], has_norm: bool) -> Curve:
    """rows: (where, step, loss, grad_norm) in file order; checks order and duplicates per row."""
    if not rows:
        raise CurveError(f"{path}: no data points")
    steps: list[int] = []
    losses: list[float] = []
    norms: list[float] = []
    seen: dict[int, str] = {}
    for where, step_raw, loss_raw, norm_raw in rows:
        step = _step(step_raw, where)
        if step in seen:
            raise CurveError(f"{where}: duplicate step {step} (first at {seen[step].split(': ', 1)[-1]})")
        if steps and step < steps[-1]:
            raise CurveError(f"{where}: steps not sorted: step {step} after step {steps[-1]}")
        seen[step] = where
        steps.append(step)
        losses.append(_number(loss_raw, "loss", where))
        if has_norm:
            norms.append(_number(norm_raw, "grad_norm", where))
    return Curve(tuple(steps), tuple(losses), tuple(norms) if has_norm else None, path)


def _parse_csv(path: str, text: str) -> Curve:
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    rows: list[tuple[str, Any, Any, Any]] = []
    cols: dict[str, int] = {}
    for line_no, record in enumerate(reader, start=1):
        if not record or all(not cell.strip() for cell in record):
            continue
        if header is None:
            header = [cell.strip().lower() for cell in record]
            for name in ("step", "loss"):
                if name not in header:
                    raise CurveError(f"{path}: missing column '{name}' in the header line "
                                     f"(found: {', '.join(header) or 'nothing'}; expected step,loss[,grad_norm])")
            for name in ("step", "loss", "grad_norm"):
                if header.count(name) > 1:
                    raise CurveError(f"{path}: column '{name}' appears twice in the header")
                if name in header:
                    cols[name] = header.index(name)
            continue
        where = f"{path}: line {line_no}"
        values = {}
        for name, index in cols.items():
            if index >= len(record) or not record[index].strip():
                raise CurveError(f"{where}: missing value for '{name}'")
            values[name] = record[index]
        rows.append((where, values["step"], values["loss"], values.get("grad_norm")))
    if header is None:
        raise CurveError(f"{path}: empty file (expected a header step,loss[,grad_norm])")
    return _build(path, rows, "grad_norm" in cols)


def _parse_json(path: str, text: str) -> Curve:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CurveError(f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    rows: list[tuple[str, Any, Any, Any]] = []
    if isinstance(data, list):
        has_norm = bool(data) and isinstance(data[0], dict) and "grad_norm" in data[0]
        for i, rec in enumerate(data):
            where = f"{path}: record {i}"
            if not isinstance(rec, dict):
                raise CurveError(f"{where}: expected an object with 'step' and 'loss', got {type(rec).__name__}")
            for name in ("step", "loss"):
                if name not in rec:
                    raise CurveError(f"{where}: missing field '{name}'")
            if ("grad_norm" in rec) != has_norm:
                raise CurveError(f"{where}: field 'grad_norm' {'missing' if has_norm else 'present'} "
                                 f"(record 0 {'has' if has_norm else 'lacks'} it)")
            rows.append((where, rec["step"], rec["loss"], rec.get("grad_norm")))
        return _build(path, rows, has_norm)
    if isinstance(data, dict):
        for name in ("steps", "losses"):
            if name not in data:
                raise CurveError(f"{path}: missing field '{name}' (expected {{\"steps\": [...], \"losses\": [...]"
                                 f"[, \"grad_norms\": [...]]}} or a list of {{step, loss[, grad_norm]}} records)")
        names = ("steps", "losses", "grad_norms") if "grad_norms" in data else ("steps", "losses")
        for name in names:
            if not isinstance(data[name], list):
                raise CurveError(f"{path}: field '{name}' must be a list, got {type(data[name]).__name__}")
        lengths = {name: len(data[name]) for name in names}
        if len(set(lengths.values())) > 1:
            raise CurveError(f"{path}: lists of different lengths: "
                             + ", ".join(f"{name} {n}" for name, n in lengths.items()))
        has_norm = "grad_norms" in data
        for i in range(lengths["steps"]):
            rows.append((f"{path}: index {i}", data["steps"][i], data["losses"][i],
                         data["grad_norms"][i] if has_norm else None))
        return _build(path, rows, has_norm)
    raise CurveError(f"{path}: expected a JSON list of records or an object with 'steps' and 'losses', "
                     f"got {type(data).__name__}")


def load_curve(path: str | Path) -> Curve:
    """Read a loss curve from CSV (header step,loss[,grad_norm]) or JSON.

    JSON: a list of {"step", "loss"[, "grad_norm"]} records, or {"steps": [...], "losses": [...]
    [, "grad_norms": [...]]}. The format follows the suffix (.csv / .json), else the first character.
    NaN and Inf values are read as data (the check fails on them). Anything malformed raises
    CurveError with one line naming the file and the problem.
    """
    name = str(path)
    p = Path(path)
    text = read_user_text(p, CurveError, "loss curve")
    suffix = p.suffix.lower()
    if suffix == ".json" or (suffix != ".csv" and text.lstrip()[:1] in ("[", "{")):
        return _parse_json(name, text)
    return _parse_csv(name, text)


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
                       "passed": r.passed} for r in self.rules],
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
        rows += [(r.figure, r.measured_text, r.threshold_text, "pass" if r.passed else "FAIL") for r in self.rules]
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
def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation (what np.corrcoef gives); None when undefined (a constant or non-finite curve)."""
    n = len(xs)
    if n < 2 or not all(math.isfinite(v) for v in (*xs, *ys)):
        return None
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


def check(candidate: Curve, reference: Curve, thresholds: Thresholds = Thresholds()) -> Verdict:
    """Compare a candidate loss curve with a reference curve under validate_convergence's rules."""
    if candidate.steps != reference.steps:
        raise CurveError(_describe_step_mismatch(candidate, reference))
    t = thresholds
    n = len(reference)
    # evaluate.py L197: int(n * fraction), i.e. the floor.
    n_skip = max(0, int(n * t.skip_fraction))
    if n - n_skip < 2:
        raise CurveError(f"too few steps to compare: {n} steps, {n_skip} skipped by skip fraction "
                         f"{t.skip_fraction:g}, at least 2 must remain")
    steps = candidate.steps
    skipped = steps[:n_skip]
    compared = steps[n_skip:]
    cur = candidate.losses[n_skip:]
    gold = reference.losses[n_skip:]
    m = len(compared)

    # Any NaN/Inf loss or grad norm, in either curve, at any step (skipped ones included), fails.
    nonfinite: list[str] = []
    for label, curve in (("candidate", candidate), ("reference", reference)):
        for what, values in (("loss", curve.losses), ("grad norm", curve.grad_norms)):
            if values is None:
                continue
            for step, value in zip(curve.steps, values):
                if not math.isfinite(value):
                    nonfinite.append(f"{label} {what} at step {step}: {value}")
    finite_rule = RuleResult(
        "finite", "NaN/Inf loss or grad norm", len(nonfinite), str(len(nonfinite)), 0,
        "none (all steps, both curves)", not nonfinite)

    correlation = _pearson(cur, gold)
    corr_rule = RuleResult(
        "correlation", "correlation", correlation,
        "undefined" if correlation is None else f"{correlation:.6f}",
        t.min_correlation, f">= {t.min_correlation:g}",
        correlation is not None and not correlation < t.min_correlation)

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

    residuals = [c - g for c, g in zip(cur, gold)]
    if all(math.isfinite(r) for r in residuals):
        mean = math.fsum(residuals) / m
        std = math.sqrt(math.fsum((r - mean) ** 2 for r in residuals) / m)   # population std, as np.std
        outliers = sum(1 for r in residuals if abs(r - mean) > t.outlier_sigma * std)
    else:
        outliers = sum(1 for r in residuals if not math.isfinite(r))
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
    try:
        thresholds = Thresholds(min_correlation=args.min_correlation, max_final_diff=args.max_final_diff,
                                max_failing_share=args.max_failing_share, skip_fraction=args.skip_fraction)
        candidate = load_curve(args.candidate)
        reference = load_curve(args.reference)
        verdict = check(candidate, reference, thresholds)
    except CurveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=2))
    else:
        print(verdict.format())
    return 0 if verdict.passed else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
