"""The interval a study records beside each prediction, and what the agent proposer predicts with.

For a runner that predicts with the cost model's own framework (the predict backend, slime) the interval
is the hypotheses' spread widened by the residual (cost_model.hypotheses). The megatron runner's model
run is predicted in the Megatron framework, where only the flex factor varies; its interval is the residual
around the runner's own prediction, and its level against measurements is what the agent learns.
"""
from __future__ import annotations

from cost_model.constants import default_constants
from cost_model.hypotheses import (Hypothesis, applicable, default_hypotheses, interval_of, predict_interval,
                                   residual_sd, tokens_per_s_under)
from cost_model.layout import Layout
from cost_model.predict import Prediction


def uses_hypotheses(runner) -> bool:
    """Whether the runner's predictions are the cost model's in its own framework (not a model run)."""
    return runner.name != "megatron"


def interval_dict(config, runner, layout: Layout, prediction: Prediction) -> dict:
    """The predicted interval of tokens/s/GPU for a trial's layout, as the study stores it."""
    if uses_hypotheses(runner):
        iv = predict_interval(default_hypotheses(), config.model, config.gpu, config.workload, layout,
                              profile=config.profile)
        return {**iv.to_dict(), "kind": "predicted", "basis": "hypotheses (cost_model/hypotheses.py) and residual"}
    shipped = next(h for h in default_hypotheses() if h.shipped)
    c = default_constants()
    measured_stack = prediction.breakdown.get("layers", 0.0) > 0   # priced from the runner's measured components
    sd = c.runner_prediction_error_sd if measured_stack else residual_sd(c, config.workload)
    iv = interval_of([(shipped, 1.0, prediction.tokens_per_s_per_gpu)], sd)
    basis = ("the runner's own prediction from its measured components and their residual on runner runs"
             if measured_stack else "the runner's own prediction and the model's residual (Megatron framework: one form)")
    return {**iv.to_dict(), "kind": "predicted", "basis": basis}


def hypothesis_predictor(config, runner):
    """(hypotheses, predict_h) for the agent: tokens/s/GPU of a layout under a hypothesis."""
    if uses_hypotheses(runner):
        def predict_h(h: Hypothesis, layout: Layout) -> float:
            return tokens_per_s_under(h, config.model, config.gpu, config.workload, layout, profile=config.profile)
        return applicable(default_hypotheses(), config.workload), predict_h   # 3 for Megatron, as predict
    shipped = tuple(h for h in default_hypotheses() if h.shipped)

    def runner_h(h: Hypothesis, layout: Layout) -> float:
        return runner.predict(config.case(layout), config.profile).tokens_per_s_per_gpu
    return shipped, runner_h
