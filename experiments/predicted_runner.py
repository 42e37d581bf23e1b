"""The runner that needs no GPU: the cost model answers, and says so."""
from __future__ import annotations

from cost_model.nouns.case import Case
from cost_model.constants import Constants
from cost_model.hypotheses import Hypothesis, default_hypotheses, predictions_under, weighted_quantile
from cost_model.predict import MemoryVerdict, Prediction, memory_verdict, predict, predict_from_verdict
from cost_model.profile import HardwareProfile
from experiments.runner import TrialResult, TrialRunner, TrialSpec


class PredictedRunner(TrialRunner):
    """Its stack is everything (the default Stack): it predicts slime's image."""

    name = "predict"
    figures = "predicted"

    def __init__(self, constants: Constants | None = None, profile: HardwareProfile | None = None):
        self.constants = constants
        self.profile = profile

    def predict(self, case: Case, profile: HardwareProfile | None = None,
                verdict: MemoryVerdict | None = None) -> Prediction:
        """`verdict`: this runner's `memory_verdict` for the same case, when asked first (not computed again)."""
        if verdict is not None:
            return predict_from_verdict(verdict, case.gpu, case.workload)
        return predict(case.model, case.gpu, case.workload, case.layout, self.constants, profile or self.profile)

    def scores_shipped_cost_model(self, profile: HardwareProfile | None = None) -> bool:
        return self.constants is None and self.profile in (None, profile)

    def memory_verdict(self, case: Case, profile: HardwareProfile | None = None) -> MemoryVerdict:
        return memory_verdict(case.model, case.gpu, case.workload, case.layout, self.constants, profile or self.profile)

    def central(self, case: Case) -> tuple[Hypothesis, Prediction, int]:
        """The prediction under the hypothesis at the weighted median of the cost model's hypotheses (their prior
        weights): what a run of the layout is expected to do, not the most optimistic reading of it."""
        every = predictions_under(default_hypotheses(), case.model, case.gpu, case.workload, case.layout,
                                  constants=self.constants, profile=self.profile)
        median = weighted_quantile([p.tokens_per_s_per_gpu for _, _, p in every], [w for _, w, _ in every], 0.5)
        h, _, p = next(x for x in every if x[2].tokens_per_s_per_gpu == median)
        return h, p, len(every)

    def run(self, spec: TrialSpec) -> TrialResult:
        p = self.predict(spec.case)
        if not p.under_limit:   # the point prediction: a borderline layout under the limit runs
            return TrialResult(status="failed", kind="predicted", source=p.source, failure_class="cuda_oom"
                               if p.memory.total > p.gpu_memory_gib else "host_oom",
                               detail="; ".join(p.reasons), peak_memory_gib=p.peak_memory_gib)
        h, p, n = self.central(spec.case)
        return TrialResult(
            status="ok", kind="predicted",
            source=f"{p.source}; the median of its {n} hypotheses (cost_model/hypotheses.py)",
            details={"hypothesis": h.name},
            tokens_per_s_per_gpu=p.tokens_per_s_per_gpu, step_time_s=p.step_time_s,
            peak_memory_gib=p.peak_memory_gib, mfu=p.mfu, usd_per_million_tokens=p.usd_per_million_tokens,
            breakdown=dict(p.breakdown),
        )
