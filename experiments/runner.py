"""The trial runner interface: run one layout, return what happened.

Like Optuna's samplers, one small abstract base and concrete runners beside it: `predicted`
(the cost model answers; no GPU), `slime` (slime jobs on a Ray cluster) and `megatron`
(megatron-core on this machine's GPUs).
"""
from __future__ import annotations

import abc
import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from cost_model.nouns.case import Case
from cost_model.nouns.errors import AttuneError
from cost_model.nouns.stack import Stack

# Failure classes a runner reports.
FAILURE_CLASSES = ("cuda_oom", "host_oom", "nccl_timeout", "hang", "crash", "invalid_config", "too_few_steps")
# Failures that cannot change when the same layout runs again on the same runner (a timeout or a hang
# may be the machine's, not the layout's, so those may be retried).
PERMANENT_FAILURES = ("invalid_config", "crash", "cuda_oom")


@dataclass(frozen=True)
class TrialSpec:
    """What a runner is asked to run: one case, for `steps` steps, timed over `window` (first, last step)."""
    case: Case
    steps: int = 20
    window: tuple[int, int] = (5, 19)


@dataclass(frozen=True)
class TrialResult:
    status: str                          # "ok" or "failed"
    kind: str                            # "predicted" or "measured"
    source: str                          # where the figures come from
    tokens_per_s_per_gpu: float | None = None
    step_time_s: float | None = None
    peak_memory_gib: float | None = None
    mfu: float | None = None
    usd_per_million_tokens: float | None = None
    step_times_s: tuple[float, ...] = ()
    losses: tuple[float, ...] = ()
    step_time_cv_percent: float | None = None
    gpu_hours: float | None = None
    failure_class: str | None = None
    detail: str = ""                     # one human-readable message: a failure's evidence, a prediction's reasons
    breakdown: dict = field(default_factory=dict)
    peak_memory_gib_per_rank: tuple[float, ...] = ()   # max_memory_allocated per rank, by rank (measured runs)
    runner: str = ""                                    # the TrialRunner.name that produced the result
    # Runner-specific facts, JSON-able: job id, exit code, log path, the model actually run, notes...
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in ("ok", "failed"):
            raise ValueError(f"status must be ok or failed, got {self.status!r}")
        if self.kind not in ("predicted", "measured"):
            raise ValueError(f"kind must be predicted or measured, got {self.kind!r}")
        if self.failure_class is not None and self.failure_class not in FAILURE_CLASSES:
            raise ValueError(f"unknown failure class {self.failure_class!r}")
        if not isinstance(self.details, dict):
            raise TypeError(f"details must be a dict, got {type(self.details).__name__}")

    def summary(self, max_detail: int = 500) -> str:
        """One line: the figures, labelled predicted or measured, and where they come from; or the failure."""
        if self.status != "ok":
            detail = " ".join(str(self.detail).split())
            return f"failed ({self.failure_class}): {detail[:max_detail]}"
        cv = f" (CV {self.step_time_cv_percent:.1f}%)" if self.step_time_cv_percent is not None else ""
        peak = f", peak {self.peak_memory_gib:.1f} GiB" if self.peak_memory_gib is not None else ""
        return (f"{self.kind} {self.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, step {self.step_time_s:.3f} s{cv}"
                f"{peak} | {self.source}")

    def to_dict(self) -> dict:
        """The stored form (a study's user attribute, a suite's JSONL line): plain JSON values."""
        return json.loads(json.dumps(_finite(asdict(self)), default=str))

    @classmethod
    def from_dict(cls, data: dict) -> "TrialResult":
        """A stored result read back. Results stored before `details` existed kept the runner's facts as a
        JSON object in `detail` (its message under "message"); they move to `details`."""
        data = dict(data)
        detail = data.get("detail")
        facts = None
        if isinstance(detail, dict):
            facts = dict(detail)
        elif isinstance(detail, str) and detail.startswith("{"):
            try:
                facts = json.loads(detail)
            except json.JSONDecodeError:
                facts = None
        if isinstance(facts, dict):
            data["detail"] = str(facts.pop("message", ""))
            data["details"] = {**facts, **(data.get("details") or {})}
        for name in ("step_times_s", "losses", "peak_memory_gib_per_rank"):
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def allocator_retries_per_step(details: dict | None) -> float | None:
    """The caching allocator's retries per step of a measured trial: the median over the steps counted, the largest
    over the ranks, from its details in the form both real runners store (`allocator_churn_per_rank`: rank ->
    {"alloc_retries": [one count per step]}); None where the runner kept no counters. More than 0: the steps ran
    short of memory, each retry freeing the cache and mapping it again, and their time is the allocator's as much
    as the layout's."""
    churn = details.get("allocator_churn_per_rank") if isinstance(details, dict) else None
    per_rank = []
    for c in (churn.values() if isinstance(churn, dict) else ()):
        steps = c.get("alloc_retries") if isinstance(c, dict) else None
        if isinstance(steps, list) and steps and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                      for x in steps):   # stored by a peer: anything else is no count
            per_rank.append(sorted(steps)[len(steps) // 2])
    return max(per_rank) if per_rank else None


def _finite(value):
    """Non-finite floats as None (JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunnerError(AttuneError, RuntimeError):
    """The runner cannot run trials at all (cluster unreachable, busy too long, misconfigured)."""


class TrialRunner(abc.ABC):
    """Runs one trial of a layout.

    Besides `run`, a runner says what its stack can run (`stack`), which model a trial of a catalog
    model trains (`model_run`) and what the cost model predicts for that (`predict`): the study ranks
    layouts by `predict`, so what is ranked is what the runner measures."""

    name: str = ""               # how studies and results name it (--backend); nothing dispatches on it
    figures: str = "measured"    # what kind of figures `run` returns: "measured" or "predicted"
    # True: a trial trains the model's first `layers` layers, and `layers` None lets the runner pick a count per
    # layout; a study then fixes one count for all its trials (layouts compare only on one model run)
    truncates_layers: bool = False
    # True: `predict` prices the runner's own model run on its own stack, not the cost model's step in the
    # study's framework; the study's intervals and the agent use that prediction's residual, not the
    # cost model's hypotheses (tuner.intervals)
    prices_own_run: bool = False

    @property
    def stack(self) -> Stack:
        """What this runner's software can run; by default everything (slime's image)."""
        return Stack()

    def model_run(self, model):
        """The model a trial of `model` trains (the same model unless the runner truncates it)."""
        return model

    def predict(self, case: Case, profile=None):
        """The cost model's prediction for what a trial of `case` runs (cost_model.predict.Prediction).
        Raises InvalidLayout when this runner cannot run the case's layout for its model run."""
        from cost_model.predict import predict

        return predict(case.model, case.gpu, case.workload, case.layout, profile=profile)

    def scores_shipped_cost_model(self, profile=None) -> bool:
        """Whether `predict` is the cost model's own prediction with the shipped constants and `profile`, what
        the ceilings of a pruned space bound (tuner.space_pruning)."""
        return False

    def memory_verdict(self, case: Case, profile=None):
        """The memory side of `predict` alone (cost_model.predict.MemoryVerdict), when this runner can give it
        cheaper than `predict`; None: ask `predict` (scoring a space then prices every layout in full)."""
        return None

    @abc.abstractmethod
    def run(self, spec: TrialSpec) -> TrialResult:
        """Run the trial and return its result; failures are results, not exceptions."""
