"""A stored trial read back as one TrialRecord (`read_trial`), which study (and so the agent), `tune show`,
`tune export` and `tune report` read: each attribute they use is checked against what tune writes, in this one place.

The rule, the same everywhere: a malformed attribute (a peer's or another program's: a wrong type,
a figure that is not a finite number, a layout that is not one, a figure a complete trial must have missing)
never stops the command and never reaches the output as it is. It reads as missing, and stderr gets one line
per such trial naming the trial and the attributes:

    tune: warning: trial 7: result.mfu is not a number; read as missing

A trial whose layout is malformed, or whose result cannot say what its figure is (its kind, status, source,
failure class or the runner's details), cannot be ranked honestly: it is left out of the ranked table, the
recipes and the report's best-of figures, and its line says so; its record (show --format csv/json, the
report's table) keeps what could be read. A stored value that is not JSON at all stops Optuna from reading the
study: that is one line naming the trial and the attribute, and exit 2 (`unreadable_attribute`).
"""
from __future__ import annotations

import json
import math
import sys
import weakref
from dataclasses import dataclass

from optuna.trial import TrialState

from tuner.interval import Interval

NUMBER, INTEGER, TEXT, FLAG = "a number", "an integer", "text", "true or false"


class Mapping:
    """A dict of names to values of one schema, read whole (a breakdown or weights with one bad entry is not
    summed without it)."""

    def __init__(self, item):
        self.item = item


class ListOf:
    def __init__(self, item):
        self.item = item


DETAILS = {"model_run": {"name": TEXT, "layers": INTEGER}, "notes": ListOf(TEXT), "optimizer": TEXT,
           "runner": TEXT, "window": ListOf(INTEGER), "global_batch_rows": INTEGER, "seq_len": INTEGER,
           "steps_run": INTEGER}


def _failure_class(value, path: str):
    from experiments.runner import FAILURE_CLASSES

    return _clean(value, FAILURE_CLASSES, path)


def _detail(value, path: str):
    """A result's message; results stored before `details` kept the runner's facts here, as a JSON object (which
    TrialResult.from_dict moves to `details`): those facts are checked as details are."""
    if isinstance(value, str) and value.startswith("{"):
        try:
            facts = json.loads(value)
        except ValueError:
            return value, []
        return (value, []) if not _clean(facts, DETAILS, path)[1] else (None, [(path, "holds malformed details")])
    if isinstance(value, dict):
        return (value, []) if not _clean(value, DETAILS, path)[1] else (None, [(path, "holds malformed details")])
    return _clean(value, TEXT, path)


def _layout(value, path: str):
    from cost_model.nouns.layout_codec import layout_from_stored

    try:
        layout_from_stored(value)
    except Exception:  # noqa: BLE001 - any stored layout the codec refuses is malformed, whatever it raises
        return None, [(_bad_layout_field(value, path), "is not a layout")]
    return value, []


def _bad_layout_field(value, path: str) -> str:
    """The first field of a stored layout the codec refuses (layout.tp), else the layout as a whole."""
    from cost_model.nouns.layout_codec import text_layout_value

    if not isinstance(value, dict):
        return path
    for key, raw in value.items():
        try:
            if key == "world_size":
                if not _is(INTEGER, raw):
                    return f"{path}.world_size"
            else:
                text_layout_value(key, raw)
        except Exception:  # noqa: BLE001 - as above
            return f"{path}.{_short(key)}"
    return path


RESULT = {"status": ("ok", "failed"), "kind": ("predicted", "measured"), "source": TEXT,
          **{k: NUMBER for k in ("tokens_per_s_per_gpu", "step_time_s", "peak_memory_gib", "mfu",
                                 "usd_per_million_tokens", "step_time_cv_percent", "gpu_hours")},
          **{k: ListOf(NUMBER) for k in ("step_times_s", "losses", "peak_memory_gib_per_rank")},
          "failure_class": _failure_class, "detail": _detail, "breakdown": Mapping(NUMBER), "runner": TEXT,
          "details": DETAILS}
INTERVAL = {"low": NUMBER, "high": NUMBER, "median": NUMBER, "quantiles": ListOf(NUMBER)}
PREDICTION = {**{k: NUMBER for k in ("tokens_per_s_per_gpu", "step_time_s", "peak_memory_gib", "gpu_memory_gib",
                                     "mfu", "usd_per_million_tokens", "fit_probability")},
              "kind": TEXT, "source": TEXT, "fits": FLAG, "fit_verdict": ("fits", "borderline", "does not fit"),
              "reasons": ListOf(TEXT), "breakdown": Mapping(NUMBER), "interval": INTERVAL}
ATTRIBUTES = {"layout": _layout, "result": RESULT, "prediction": PREDICTION, "hypothesis_weights": Mapping(NUMBER),
              **{k: TEXT for k in ("label", "rationale", "learnt", "prune_reason", "fail_reason", "backend",
                                   "proposer", "layout_key", "cost_model")}}
# What a figure stands on: one of these malformed (or anything inside the last three) and the trial is not
# ranked (see the module docstring).
GROUNDS = ("result", "result.status", "result.kind", "result.source", "result.failure_class", "layout",
           "result.detail", "result.details")

_warned: set = set()
# finished trials' records by the id of their FrozenTrial (read_trial), with a reference that drops the entry
# when the trial object goes
_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
_records: dict[int, tuple] = {}


def forget_warnings() -> None:
    """A storage was opened: its malformed trials are named again."""
    _warned.clear()


@dataclass(frozen=True)
class Predicted:
    """The runner's prediction for a trial's layout, as stored and checked: a figure not recorded (or malformed)
    is None; `recorded` says whether the trial has a prediction at all."""
    recorded: bool = False
    kind: str | None = None
    source: str | None = None
    tokens_per_s_per_gpu: float | None = None
    step_time_s: float | None = None
    peak_memory_gib: float | None = None
    gpu_memory_gib: float | None = None          # the GPU's memory it was judged against
    mfu: float | None = None
    usd_per_million_tokens: float | None = None
    fits: bool | None = None                     # before the fit verdicts: whether it fits
    fit_verdict: str | None = None               # fits, borderline or does not fit
    fit_probability: float | None = None
    reasons: list | None = None
    breakdown: dict | None = None                # predicted seconds per term of the step
    interval: Interval | None = None


@dataclass(frozen=True)
class RunResult:
    """The runner's result (measured, or predicted by the predict backend), as stored and checked: a field not
    recorded (or malformed) is None; `recorded` says whether the trial ran at all."""
    recorded: bool = False
    status: str | None = None                    # ok or failed
    kind: str | None = None                      # predicted or measured
    source: str | None = None
    tokens_per_s_per_gpu: float | None = None
    step_time_s: float | None = None
    peak_memory_gib: float | None = None
    mfu: float | None = None
    usd_per_million_tokens: float | None = None
    step_time_cv_percent: float | None = None
    gpu_hours: float | None = None
    step_times_s: list | None = None
    losses: list | None = None
    peak_memory_gib_per_rank: list | None = None
    failure_class: str | None = None
    detail: object = None                        # the runner's message (older results: its facts, see _detail)
    breakdown: dict | None = None
    runner: str | None = None
    details: dict | None = None
    stored: dict | None = None                   # the checked mapping itself, for experiments.runner.TrialResult

    def trial_result(self):
        """As experiments.runner.TrialResult (which moves the facts older results kept in `detail`)."""
        from experiments.runner import TrialResult

        return TrialResult.from_dict(self.stored or {})


_PREDICTED = tuple(f for f in Predicted.__dataclass_fields__ if f not in ("recorded", "interval"))
_RESULT = tuple(f for f in RunResult.__dataclass_fields__ if f not in ("recorded", "stored"))


@dataclass(frozen=True)
class TrialRecord:
    """One stored trial as study, show, export, report and the agent (through study.history_of) read it: each
    attribute checked (a malformed one reads as missing, warned about once: see the module docstring)."""
    number: int
    state: TrialState
    value: object                      # the objective as stored; a number wherever `rankable`
    # what was proposed, and why
    layout: dict | None                # the stored layout values (world_size, tp, ...): parsed_layout() reads them
    layout_key: str | None
    label: str | None
    backend: str | None                # the runner that evaluated it (stored by tune since issue 13)
    proposer: str | None
    rationale: str | None
    hypothesis_weights: dict | None    # the proposer's weights when it proposed this trial
    # what was predicted (figures and interval), and what the run gave
    prediction: Predicted
    result: RunResult
    # what it taught, and why it ended where it did not complete
    learnt: str | None
    prune_reason: str | None
    fail_reason: str | None
    rankable: bool                     # its layout and result are sound enough to rank and export it
    cost_model: str | None = None      # the cost model's code digest when it was priced (tuner.space_cache)

    @property
    def interval(self) -> Interval | None:
        return self.prediction.interval

    @property
    def figures(self) -> Predicted | RunResult:
        """The figures it stands for: its result when it ran, else its prediction (a pruned trial)."""
        return self.result if self.result.recorded else self.prediction

    @property
    def kind(self) -> str | None:
        """Whether `figures` are predicted or measured (None: it has none)."""
        figures = self.figures
        if not figures.recorded:
            return None
        return figures.kind if figures.kind is not None else "predicted"

    @property
    def result_kind(self) -> str:
        """The result's kind; a result that does not say is a prediction's (results before `kind`)."""
        return self.result.kind if self.result.kind is not None else "predicted"

    @property
    def predicted(self) -> float | None:
        """What was predicted: the interval's median (the agent's posterior), else the point prediction."""
        from tuner.intervals import predicted_figure

        return predicted_figure(self.prediction.tokens_per_s_per_gpu, self.interval)

    @property
    def reason(self) -> str | None:
        """Why it was pruned or failed."""
        return self.prune_reason or self.fail_reason

    def parsed_layout(self):
        """Its Layout (cost_model.nouns.layout); only for a record whose layout was read (a rankable one has it)."""
        from cost_model.nouns.layout_codec import layout_from_stored

        return layout_from_stored(self.layout)


def read_trial(t) -> TrialRecord:
    """The trial's record, its malformed attributes left out (warned about once, on stderr). A finished trial's
    attributes no longer change (Optuna refuses to update it), and Optuna's cached storage hands out the same
    FrozenTrial for it on every read: its record is read once, not at each proposal (a study of n trials would
    read n^2 / 2 records)."""
    done = t.state in _FINISHED
    if done:
        hit = _records.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
    record = _record(t)
    if done:
        key = id(t)
        _records[key] = (weakref.ref(t, lambda _, key=key: _records.pop(key, None)), record)
    return record


def _record(t) -> TrialRecord:
    attrs, problems = _read(t)
    prediction, result = attrs.get("prediction") or {}, attrs.get("result") or {}
    return TrialRecord(
        number=t.number, state=t.state, value=t.value, layout=attrs.get("layout"),
        **{k: attrs.get(k) for k in ("layout_key", "label", "backend", "proposer", "rationale", "hypothesis_weights",
                                     "learnt", "prune_reason", "fail_reason", "cost_model")},
        prediction=Predicted(recorded=bool(prediction), interval=Interval.from_dict(prediction.get("interval")),
                             **{k: prediction.get(k) for k in _PREDICTED}),
        result=RunResult(recorded=bool(result), stored=result, **{k: result.get(k) for k in _RESULT}),
        rankable=not any(_grounds(path) for path, _ in problems))


def read_trials(study, states=None) -> list[TrialRecord]:
    """The study's trials in trial order (those in `states` when given), read as records."""
    return [read_trial(t) for t in study.get_trials(deepcopy=False, states=states)]


def _grounds(path: str) -> bool:
    return path in GROUNDS or path == "value" or path.startswith(tuple(g + "." for g in GROUNDS[-3:]))


def _read(t) -> tuple[dict, list]:
    from tuner.optuna_adapter import trial_id_of

    attrs, problems = _clean(t.user_attrs, ATTRIBUTES, "")
    if t.state == TrialState.COMPLETE:
        if "layout" not in attrs and not any(p == "layout" for p, _ in problems):
            problems.append(("layout", "is missing"))
        result = attrs.get("result")
        if isinstance(result, dict) and result.get("status") == "ok" and result.get("tokens_per_s_per_gpu") is None \
                and not any(p.startswith("result") for p, _ in problems):
            problems.append(("result.tokens_per_s_per_gpu", "is missing"))
        if not _is(NUMBER, t.value):   # the objective itself (an edited storage can hold text there)
            problems.append(("value", "is not a number"))
    seen = (trial_id_of(t), t.number, t.datetime_start, tuple(problems))   # once per trial and command
    if problems and seen not in _warned:
        _warned.add(seen)
        print(f"tune: warning: {describe(t.number, problems)}", file=sys.stderr)
    return attrs, problems


def describe(number: int, problems: list) -> str:
    """One line: the trial, its malformed attributes (three at most named), and what is done about them."""
    named = "; ".join(f"{path} {what}" for path, what in problems[:3])
    more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
    left_out = any(_grounds(p) for p, _ in problems)
    return (f"trial {number}: {named}{more}; read as missing" +
            ("; the trial is left out of the ranking" if left_out else ""))


def _is(kind, value) -> bool:
    if kind == NUMBER:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == INTEGER:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == TEXT:
        return isinstance(value, str)
    if kind == FLAG:
        return isinstance(value, bool)
    raise AssertionError(kind)


def _clean(value, schema, path: str):
    """(value with its malformed parts left out, or None when it is malformed whole; [(path, what), ...])."""
    if value is None:
        return None, []
    if callable(schema):   # a check of its own (a layout, a result's detail)
        return schema(value, path)
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return None, [(path, "is not a record")]
        out, problems = dict(value), []
        for key, sub in schema.items():
            if key in value:
                cleaned, bad = _clean(value[key], sub, f"{path}.{key}" if path else key)
                problems += bad
                if cleaned is None:
                    out.pop(key)
                else:
                    out[key] = cleaned
        return out, problems
    if isinstance(schema, (Mapping, ListOf)):
        kind = dict if isinstance(schema, Mapping) else list
        if not isinstance(value, kind):
            return None, [(path, f"is not a {'record' if kind is dict else 'list'}")]
        items = value.items() if kind is dict else enumerate(value)
        for key, item in items:
            if item is None or _clean(item, schema.item, path)[1]:
                where = f"{path}.{key}" if kind is dict else f"{path}[{key}]"
                return None, [(where, f"is not {_what(schema.item)}")]
        return value, []
    if isinstance(schema, tuple):
        return (value, []) if isinstance(value, str) and value in schema else \
            (None, [(path, f"is not one of {', '.join(schema)}")])
    return (value, []) if _is(schema, value) else (None, [(path, f"is not {schema}")])


def _what(schema) -> str:
    return schema if isinstance(schema, str) else "a record"


def unreadable_attribute(engine) -> str | None:
    """Which stored attribute is not JSON (Optuna cannot read a study past it): 'trial 3's attribute result' or
    "the study's attribute config"; None when every one reads."""
    from tuner.optuna_adapter import first_unreadable

    found = first_unreadable(engine)
    if found is None:
        return None
    owner, number, what, name = found
    return ("the study" if owner == "study" else f"trial {number}") + f"'s {what} {_short(name)}"


def _short(name) -> str:
    from cost_model.nouns.names import printable

    text = printable(str(name))
    return text if len(text) <= 40 else text[:37] + "..."
