"""A study's trials: the ranked table of completed ones, and one record per trial as CSV or JSON."""
from __future__ import annotations

import json

from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from cost_model.nouns.layout import Layout
from cost_model.nouns.names import printable as printable_text
from cost_model.memory_fit import BORDERLINE, fit_label
from cost_model.term_sources import HOSTS_DIFFER
from experiments.runner import allocator_retries_per_step
from tuner.interval import Interval, number
from tuner.trial_record import Predicted, TrialRecord, read_trials


@dataclass(frozen=True)
class Row:
    number: int
    layout: Layout
    tokens_per_s_per_gpu: float
    peak_memory_gib: float | None
    mfu: float | None
    usd_per_million_tokens: float | None
    kind: str            # predicted or measured
    source: str
    predicted_tokens_per_s_per_gpu: float | None
    rationale: str
    predicted_low: float | None = None      # the prediction's 90% interval (cost_model.hypotheses)
    predicted_high: float | None = None
    fit: str = "-"                          # the prediction's fit verdict: "fits", "borderline (61%)", ...
    breakdown: dict | None = None           # the prediction's seconds per term of the step
    short_of_memory: bool = False           # measured with the allocator retrying every step (its figure is low)
    p_fit: float | None = None              # the prediction's chance to fit, where it is borderline

    @property
    def expected_tokens_per_s_per_gpu(self) -> float:
        """What the row is ranked by: a predicted borderline layout's figure times its chance to fit (an
        out-of-memory run delivers nothing: the agent's own rule, tuner.agent), every other row's figure."""
        if self.kind != "measured" and self.p_fit is not None:
            return self.tokens_per_s_per_gpu * self.p_fit
        return self.tokens_per_s_per_gpu


def ranked_rows(study: optuna.Study) -> list[Row]:
    """The complete trials, best first. A trial whose stored layout or figures are malformed (another
    program's, a peer's) is left out or shows '-', never a traceback."""
    rows = []
    for r in read_trials(study, states=(TrialState.COMPLETE,)):
        if not r.rankable:   # malformed layout or result: warned about, left out (tuner.trial_record)
            continue
        result, interval = r.result, r.interval or NO_INTERVAL
        rows.append(Row(
            number=r.number, layout=r.parsed_layout(),
            tokens_per_s_per_gpu=r.value, peak_memory_gib=number(result.peak_memory_gib),
            mfu=number(result.mfu), usd_per_million_tokens=number(result.usd_per_million_tokens),
            kind=_kind_of(r), source=printable(result.source or ""),
            predicted_tokens_per_s_per_gpu=r.predicted, rationale=printable(r.rationale or ""),
            predicted_low=number(interval.low), predicted_high=number(interval.high),
            fit=fit_of(r.prediction), breakdown=r.prediction.breakdown if r.prediction else None,
            short_of_memory=bool(allocator_retries_per_step(result.details)),
            p_fit=_borderline_p(r.prediction),
        ))
    # Measured rows first among equals: a measurement outranks a prediction of the same figure.
    return sorted(rows, key=lambda r: (-r.expected_tokens_per_s_per_gpu, r.kind != "measured"))


EARLIER_MODEL = "predicted (earlier cost model)"


def _kind_of(r) -> str:
    """predicted or measured; a prediction by a cost model other than this one (a study resumed after an upgrade,
    or made before trials recorded theirs) says so: its figure is not what `tune predict` gives now."""
    from tuner.space_cache import cost_model_digest

    kind = printable(r.result_kind)
    if kind == "predicted" and r.cost_model != cost_model_digest():
        return EARLIER_MODEL
    return kind


def _borderline_p(prediction: Predicted | None) -> float | None:
    """A borderline prediction's chance to fit (None for a plain fit or a verdict recorded without one)."""
    if prediction is None or prediction.fit_verdict != BORDERLINE:
        return None
    p = number(prediction.fit_probability)
    return p if p is not None and 0.0 <= p <= 1.0 else None


def fit_of(prediction: Predicted) -> str:
    """A trial's predicted fit verdict; a prediction recorded before the verdicts says only whether it fit. The
    verdict is stored text (a peer's may be anything): printed as text, its terminal codes shown escaped."""
    verdict = prediction.fit_verdict
    if not verdict:
        return "fits" if prediction.fits else "-"
    probability = number(prediction.fit_probability)
    return printable(fit_label(str(verdict), probability or 0.0))


def format_table(rows: list[Row], limit: int | None = None, precision: str = "bf16") -> str:
    """The ranked rows as a text table, with what its figures come from; `precision`: the workload's (an fp8 run's
    MFU, the leaderboard's, is of the dense bf16 peak, which the table says)."""
    header = ("#", "trial", "layout", "tokens/s/GPU", "predicted 90%", "peak GiB", "fit", "MFU", "$/1M tok",
              "figures")
    lines = []
    for i, r in enumerate(rows[:limit] if limit else rows, 1):
        interval = (f"{r.predicted_low:,.0f}-{r.predicted_high:,.0f}" if r.predicted_low is not None
                    and r.predicted_high is not None else "-")
        lines.append((str(i), str(r.number), r.layout.long_label, f"{r.tokens_per_s_per_gpu:,.0f}", interval,
                      _fmt(r.peak_memory_gib, "{:.1f}"), r.fit, _fmt(r.mfu, "{:.1%}"),
                      _fmt(r.usd_per_million_tokens, "{:.3f}"),
                      r.kind + (" (allocator retried every step: short of memory)" if r.short_of_memory else "")))
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(header)]
    right = {0, 1, 3, 4, 5, 7, 8}

    def fmt_line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [fmt_line(header), fmt_line(["-" * w for w in widths])] + [fmt_line(l) for l in lines]
    sources = sorted({r.source for r in rows[:limit] if r.source} if limit else {r.source for r in rows if r.source})
    for s in sources:
        out.append(f"figures from: {s}")
    if precision != "bf16":
        out.append(f"MFU: of the GPU's dense bf16 peak, as the leaderboard's, for {precision} GEMMs too")
    if any(r.kind == EARLIER_MODEL for r in (rows[:limit] if limit else rows)):
        out.append(f"{EARLIER_MODEL}: the figure an earlier version of the cost model gave when the trial ran (its "
                   f"MFU may divide by another peak); `tune predict` and an export price the layout with today's")
    if any(r.expected_tokens_per_s_per_gpu != r.tokens_per_s_per_gpu for r in (rows[:limit] if limit else rows)):
        out.append("ranked by tokens/s/GPU, a predicted borderline layout's times its chance to fit (an out-of-memory "
                   "run delivers nothing)")
    return "\n".join(out)


def counts_line(study: optuna.Study) -> str:
    from tuner.trial_claims import is_lost_claim

    trials = study.get_trials(deepcopy=False)
    lost = sum(1 for t in trials if is_lost_claim(t))
    count = {s: sum(1 for t in trials if t.state == s) for s in (TrialState.COMPLETE, TrialState.PRUNED,
                                                                   TrialState.FAIL)}
    races = f"; {lost} more were layouts another tuner claimed first, not run" if lost else ""
    return (f"study '{printable(study.study_name)}': {len(trials) - lost} trials ({count[TrialState.COMPLETE]} complete, "
            f"{count[TrialState.PRUNED] - lost} pruned, {count[TrialState.FAIL]} failed{races})")


# One record per trial (`tune show --format csv|json`): its figures come from its result when it ran,
# else from its prediction (a pruned trial), and `kind` says which.
LAYOUT_COLUMNS = ("tp", "pp", "vpp", "cp", "ep", "etp", "max_tokens_per_gpu")
TRIAL_COLUMNS = ("number", "state", "kind", "label", "layout_args", *LAYOUT_COLUMNS, "tokens_per_s_per_gpu", "step_time_s",
                 "peak_memory_gib", "mfu", "usd_per_million_tokens", "predicted_tokens_per_s_per_gpu", "predicted_low",
                 "predicted_high", "source", "backend", "reason", "rationale", "learnt")
FIGURES = ("tokens_per_s_per_gpu", "step_time_s", "peak_memory_gib", "mfu", "usd_per_million_tokens")
NO_INTERVAL = Interval(None, None, None)   # a trial stored without one: its columns read as missing
STATES = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed",
          TrialState.RUNNING: "running", TrialState.WAITING: "waiting"}


def printable(value):
    """Text from a study as it may be printed (cost_model.nouns.names.printable: a peer's terminal escape codes shown
    as \\x1b); a number or None as it is, anything else as text."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return printable_text(str(value))



def recorded_precision(study: optuna.Study) -> str:
    """The precision the study's recorded workload trains in (bf16 where it is missing or malformed)."""
    precision = as_dict(as_dict(study.user_attrs.get("config")).get("workload")).get("precision")
    return precision if precision in ("bf16", "fp8") else "bf16"


def as_dict(value) -> dict:
    """A stored value that should be a mapping, or {} (a study's config is not read through trial_record)."""
    return value if isinstance(value, dict) else {}


def trial_row(r: TrialRecord) -> dict:
    """One trial's row of TRIAL_COLUMNS; a malformed attribute (another program's, a peer's) reads as missing."""
    figures, layout, interval = r.figures, as_dict(r.layout), r.interval or NO_INTERVAL
    return {"number": r.number, "state": STATES[r.state], "kind": printable(r.kind),
            "label": printable(r.label), "layout_args": _layout_args(r),
            **{k: number(layout.get(k)) for k in LAYOUT_COLUMNS},
            **{k: number(getattr(figures, k)) for k in FIGURES},
            "predicted_tokens_per_s_per_gpu": r.predicted,
            "predicted_low": number(interval.low), "predicted_high": number(interval.high),
            "source": printable(figures.source), "backend": printable(r.backend),
            "reason": printable(r.reason), "rationale": printable(r.rationale), "learnt": printable(r.learnt)}


def _layout_args(r: TrialRecord) -> str | None:
    """The trial's layout as `tune predict --layout` takes it (every field that differs from its default), so a row
    can be priced again; None where the trial has no sound layout."""
    from cost_model.nouns.layout import InvalidLayout
    from cost_model.nouns.layout_codec import layout_pairs

    try:
        layout = r.parsed_layout() if r.layout else None
    except (InvalidLayout, KeyError, TypeError, ValueError):   # another program's, a peer's: read as missing
        return None
    return printable(" ".join(layout_pairs(layout))) if layout is not None else None


def trials_frame(study: optuna.Study, limit: int | None = None):
    """Every trial in trial order, one row each (a pandas DataFrame with TRIAL_COLUMNS)."""
    import pandas as pd

    return pd.DataFrame.from_records(_records(study, limit), columns=list(TRIAL_COLUMNS))


def _records(study: optuna.Study, limit: int | None, best_first: bool = False) -> list[dict]:
    """The trials' rows in trial order; `best_first`: the table's ranked trials first, in its order, then the rest."""
    records = read_trials(study)
    if best_first:
        rank = {row.number: i for i, row in enumerate(ranked_rows(study))}
        records.sort(key=lambda r: (rank.get(r.number, len(rank)), r.number))
    return [trial_row(r) for r in (records[:limit] if limit else records)]


def trials_csv(study: optuna.Study, limit: int | None = None) -> str:
    """The trials as CSV. A layout column whose values are whole numbers prints them as integers, as JSON does:
    pandas stores a column with a missing value (a trial without a layout) as floats, which print as 1.0."""
    import numbers

    frame = trials_frame(study, limit)
    for column in LAYOUT_COLUMNS:
        values = frame[column].dropna()
        if all(isinstance(v, numbers.Real) and float(v).is_integer() for v in values):
            frame[column] = frame[column].astype("Int64")
    return frame.to_csv(index=False)


def trials_json(study: optuna.Study, limit: int | None = None, best_first: bool = False) -> str:
    """A JSON array of trial records (`best_first`: ranked as the table is); a figure a trial does not have is
    null."""
    return json.dumps([{k: _short(r.get(k)) for k in TRIAL_COLUMNS} for r in _records(study, limit, best_first)],
                      indent=1)


# A share of the step above which the CPU optimizer's host is worth a word (the shipped profile never ran on it).
OFFLOAD_NOTE_SHARE = 0.1


def offload_note(row, own_profile: bool) -> str | None:
    """A note when the best layout's predicted step is partly its offloaded optimizer's on the CPU, priced from the
    host that measured the shipped profile (`own_profile`: a `tune profile` of the user's machine priced it)."""
    if own_profile or row is None or row.kind != "predicted" or not row.layout.offloaded or not row.breakdown:
        return None
    values, step = _step_seconds(row.breakdown)
    share = values.get("offload", 0.0) / step if step > 0 else 0.0
    if share < OFFLOAD_NOTE_SHARE:
        return None
    return (f"the best layout offloads the optimizer: {share:.0%} of its predicted step is the CPU's, priced as the "
            f"host that measured the shipped profile ran it; {HOSTS_DIFFER} (then pass --profile)")


def _step_seconds(breakdown: dict) -> tuple[dict, float]:
    """A stored breakdown's numeric terms (seconds a step) and their sum."""
    values = {k: v for k, v in breakdown.items() if isinstance(v, (int, float))}
    return values, sum(values.values())


def _short(value):
    """A float to 6 significant digits (the figures' precision, not the binary noise)."""
    return float(f"{value:.6g}") if isinstance(value, float) else value


def _fmt(value, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


# Terms of a step that do not grow with the tokens it trains: a larger global batch spreads them over more tokens.
PER_STEP_TERMS = ("step_overhead", "optimizer", "offload", "dp_comm", "pp_bubble")
PER_STEP_NOTE_SHARE = 0.3


def per_step_note(breakdown: dict | None, global_batch: int, seq_len: int, world_size: int) -> str | None:
    """A note when the best layout's predicted step is mostly per-step costs (its `breakdown`, seconds per term):
    the global batch gives each GPU few tokens a step, and a larger one would amortize them."""
    if not breakdown:
        return None
    values, step = _step_seconds(breakdown)
    fixed = {k: values.get(k, 0.0) for k in PER_STEP_TERMS}
    if step <= 0 or sum(fixed.values()) / step < PER_STEP_NOTE_SHARE:
        return None
    top = ", ".join(f"{k} {v / step:.0%}" for k, v in sorted(fixed.items(), key=lambda kv: -kv[1]) if v / step >= 0.02)
    return (f"the best layout's predicted step is {sum(fixed.values()) / step:.0%} per-step costs ({top}): "
            f"--global-batch {global_batch} x --seq-len {seq_len} gives each of the {world_size} GPUs "
            f"{global_batch * seq_len / world_size:,.0f} tokens a step; a larger global batch spreads them over more "
            f"tokens (tokens/s here is for the batch given)")

