"""The trial runner interface: run one layout, return what happened.

Like Optuna's samplers, one small abstract base and concrete runners beside it: `predicted`
(the cost model answers; no GPU), and later the slime-on-Ray and local Megatron-core runners.
"""
from __future__ import annotations

import abc
import json
from dataclasses import dataclass, field

from cost_model.hardware import GpuSpec
from cost_model.model_spec import ModelSpec
from cost_model.workload import Workload
from search_space.layout import Layout
from search_space.stack import Stack

# Failure classes a runner reports.
FAILURE_CLASSES = ("cuda_oom", "host_oom", "nccl_timeout", "hang", "crash", "invalid_config")


@dataclass(frozen=True)
class TrialSpec:
    model: ModelSpec
    gpu: GpuSpec
    workload: Workload
    layout: Layout
    stack: Stack = Stack()
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
    detail: str = ""
    breakdown: dict = field(default_factory=dict)
    # Added for measured runs (optional; predicted results leave them empty):
    peak_memory_gib_per_rank: tuple[float, ...] = ()   # max_memory_allocated per rank, by rank
    runner: str = ""                                    # the TrialRunner.name that produced the result
    details: dict = field(default_factory=dict)         # runner-specific facts (job id, exit code, log path...)

    def __post_init__(self):
        if self.status not in ("ok", "failed"):
            raise ValueError(f"status must be ok or failed, got {self.status!r}")
        if self.kind not in ("predicted", "measured"):
            raise ValueError(f"kind must be predicted or measured, got {self.kind!r}")
        if self.failure_class is not None and self.failure_class not in FAILURE_CLASSES:
            raise ValueError(f"unknown failure class {self.failure_class!r}")

    def summary(self, max_detail: int = 500) -> str:
        """One line: the figures, labelled predicted or measured, and where they come from; or the failure."""
        if self.status != "ok":
            detail = " ".join(str(self.detail).split())
            return f"failed ({self.failure_class}): {detail[:max_detail]}"
        cv = f" (CV {self.step_time_cv_percent:.1f}%)" if self.step_time_cv_percent is not None else ""
        peak = f", peak {self.peak_memory_gib:.1f} GiB" if self.peak_memory_gib is not None else ""
        return (f"{self.kind} {self.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, step {self.step_time_s:.3f} s{cv}"
                f"{peak} | {self.source}")


def detail_facts(detail) -> dict | None:
    """The facts a runner put in a result's `detail` (a JSON object, or already its dict); None for
    plain text."""
    if isinstance(detail, dict):
        return detail
    if isinstance(detail, str) and detail.startswith("{"):
        try:
            facts = json.loads(detail)
        except json.JSONDecodeError:
            return None
        return facts if isinstance(facts, dict) else None
    return None


class RunnerError(RuntimeError):
    """The runner cannot run trials at all (cluster unreachable, busy too long, misconfigured)."""


class TrialRunner(abc.ABC):
    """Runs one trial of a layout."""

    name: str = ""

    @abc.abstractmethod
    def run(self, spec: TrialSpec) -> TrialResult:
        """Run the trial and return its result; failures are results, not exceptions."""
