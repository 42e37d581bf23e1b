"""The interval a study records beside each prediction, and what the agent proposer predicts with.

One posterior: a trial the agent proposed stores the band the agent printed before it (`posterior_interval`), and
the agent's prior is the stack's own prediction error (`agent_prior`), so before any measurement that band is the
prediction's interval. Without the agent: for a runner that predicts with the cost model's own framework (the
predict backend, slime) the hypotheses' spread widened by the residual (cost_model.hypotheses); for the megatron
runner the runner stack's residual around its own prediction.
"""
from __future__ import annotations

import math

from cost_model.constants import default_constants
from cost_model.hypotheses import (Hypothesis, applicable, default_hypotheses, interval_of, predict_interval,
                                   residual_sd, step_constants, tokens_per_s_under)
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import LINEAR_ATTENTION
from cost_model.profile import shipped_profile
from cost_model.predict import Prediction, step_time_only
from cost_model.step_time import RANK_TERMS, RUNNER_FALLBACK_TERMS, runner_host_to_gpu
from tuner.interval import QUANTILES_90, Interval, number


def uses_hypotheses(runner) -> bool:
    """Whether the runner's predictions are the cost model's in its own framework (not its own model run)."""
    return not runner.prices_own_run


def prediction_interval(config, runner, layout: Layout, prediction: Prediction) -> Interval:
    """The predicted interval of tokens/s/GPU for a trial's layout (the study stores its to_dict)."""
    if uses_hypotheses(runner):
        iv = predict_interval(default_hypotheses(), config.model, config.gpu, config.workload, layout,
                              profile=config.profile)
        return Interval.of_hypotheses(iv, basis="hypotheses (cost_model/hypotheses.py) and residual")
    iv = own_prediction_interval(config.model, config.gpu, config.workload, prediction, config.profile)
    basis = ("the runner's own prediction from its measured components and their residual on runner runs"
             if runner_priced(prediction) else
             "the runner's own prediction and the model's residual (Megatron framework: one form)")
    return Interval.of_hypotheses(iv, basis=basis)


def runner_priced(prediction: Prediction) -> bool:
    """Whether the megatron runner's measured components priced the step (its `layers` term)."""
    return prediction.breakdown.get("layers", 0.0) > 0


def own_prediction_interval(model, gpu, workload, prediction: Prediction, profile=None):
    """A prediction alone (no spread of hypotheses) widened by its stack's error: the runner stack's measured one
    where its components priced the step (`runner_stack_sd`), else the model's held-out residual."""
    shipped = next(h for h in default_hypotheses() if h.shipped)
    sd = (runner_stack_sd(model, gpu, profile, prediction) if runner_priced(prediction)
          else residual_sd(default_constants(), workload))
    return interval_of([(shipped, 1.0, prediction.tokens_per_s_per_gpu)], sd)


def prediction_sd(config, runner) -> float:
    """The log-normal sd of the runner's predictions on runs no fit saw: the runner stack's own (measured on its
    grids) when the runner prices what it runs from measured components, else the model's held-out residual."""
    c = default_constants()
    if uses_hypotheses(runner):
        return residual_sd(c, config.workload)
    return runner_stack_sd(config.model, config.gpu, config.profile)


def measures_layers(model, gpu, profile=None) -> bool:
    """Whether the profile (default: the one shipped for the GPU) measured every layer kind of `model` on the runner."""
    profile = profile or shipped_profile(gpu.name)
    return profile is not None and profile.runner is not None and profile.runner.measures_layers_of(model)


def scales_linear_layers(model, gpu, profile=None) -> bool:
    """Whether the profile (default: the one shipped for the GPU) times `model`'s Gated DeltaNet layer as another
    model's measured one (runner_scaled_linear_work_exponent prices it)."""
    profile = profile or shipped_profile(gpu.name)
    if profile is None or profile.runner is None or not model.has_linear_attention:
        return False
    kinds = {m for a, m in zip(model.layer_types, model.mlp_types) if a == LINEAR_ATTENTION}
    donors = [found[0] for m in kinds if (found := profile.runner.layer_for(model, LINEAR_ATTENTION, m)) is not None]
    return any(d is not None and d.startswith(f"{LINEAR_ATTENTION}+") for d in donors)


def runner_stack_sd(model, gpu, profile=None, prediction: Prediction | None = None) -> float:
    """The runner stack's prediction sd for `model`: its residual where the profile measured every layer kind of
    the model, the larger one where a layer is timed as another model's of its kind, larger still where as a
    layer of another attention kind (cost_model constants); with the fitted terms' error where a layer kind has no
    measured layer of its MLP kind either (`modelled_extra_sd`); for a `prediction` near or past its host/GPU
    crossing, with the crossing's extra variance (`crossing_extra_sd`); with components derived from another GPU
    type's, the derivation's (`Derivation.error_sd`)."""
    c = default_constants()
    shipped = is_shipped(profile, gpu)
    profile = profile or shipped_profile(gpu.name)
    crossed, fitted = _unmeasured(model, profile)
    base = (c.runner_prediction_error_sd if measures_layers(model, gpu, profile) else
            c.runner_cross_kind_layer_error_sd if crossed else c.runner_scaled_layer_error_sd)
    derived = profile.runner.derivation_for(model) if profile is not None and profile.runner is not None else None
    if derived is not None:
        base = math.hypot(base, derived.error_sd)   # measured on another GPU type
    if prediction is None:
        return math.hypot(base, _fitted_share_sd(model, fitted))
    return math.hypot(base, _fitted_share_sd(model, fitted, prediction), prediction_extra_sd(prediction, shipped))


def is_shipped(profile, gpu) -> bool:
    """Whether predictions use the GPU type's shipped profile (None: the default), which never measured the user's
    host."""
    return profile is None or profile is shipped_profile(gpu.name)


def unmeasured_host_sd(prediction: Prediction) -> float:
    """The log sd a runner prediction from a shipped profile carries for the user's host, which that profile never
    measured: its CPU optimizer (`host_cpu_extra_sd`) and its speed at issuing kernels (`host_launch_extra_sd`)."""
    return math.hypot(host_cpu_extra_sd(prediction), host_launch_extra_sd(prediction))


def host_launch_extra_sd(prediction: Prediction) -> float:
    """The log sd the host's speed at issuing kernels adds to a runner prediction from a shipped profile, whose host
    floors are another machine's (runner_host_launch_error_sd: their spread over machines). A micro-batch takes
    (host^p + GPU^p)^(1/p): half the change in its log between a host e^sd slower and e^sd faster, times the
    micro-batches' share of the step. Near 0 well below the crossing, the whole spread where the host sets the step."""
    ctx = prediction.context
    step = prediction.step_time_s
    if ctx is None or ctx.runner is None or not step:
        return 0.0
    ratio = runner_host_to_gpu(ctx)
    if ratio <= 0:
        return 0.0
    c = default_constants()
    sd, p = c.runner_host_launch_error_sd, c.runner_host_overlap_exponent
    if (ratio * math.exp(sd)) ** p < 1e-4:   # far below the GPU even on a host e^sd slower: no term of noise
        return 0.0

    def log_over_gpu(r: float) -> float:
        return math.log1p(r ** p) / p
    swing = (log_over_gpu(ratio * math.exp(sd)) - log_over_gpu(ratio * math.exp(-sd))) / 2
    breakdown = prediction.breakdown or {}
    share = sum(breakdown.get(k, 0.0) for k in (*RANK_TERMS, "pp_bubble")) / step
    return swing * min(share, 1.0)


def host_cpu_extra_sd(prediction: Prediction) -> float:
    """The log sd the host's CPU adds to a runner prediction from a shipped profile: the offloaded optimizer step runs
    on a host that profile never measured (runner_host_cpu_error_sd, the spread measured over hosts), times that
    step's share of the step; 0 without offload."""
    step = prediction.step_time_s
    offload = (prediction.breakdown or {}).get("offload", 0.0)
    if not step or offload <= 0:
        return 0.0
    return default_constants().runner_host_cpu_error_sd * offload / step


def multi_gpu_extra_sd(prediction: Prediction) -> float:
    """The log sd a runner-priced prediction on more than one GPU adds (its communication and overlap modelled):
    runner_multi_gpu_error_sd over runner_prediction_error_sd, in quadrature; 0 on one GPU."""
    ctx = prediction.context
    if ctx is None or ctx.runner is None or ctx.layout.world_size <= 1:
        return 0.0
    c = default_constants()
    return math.sqrt(max(c.runner_multi_gpu_error_sd ** 2 - c.runner_prediction_error_sd ** 2, 0.0))


def modelled_extra_sd(model, gpu, profile=None, prediction: Prediction | None = None) -> float:
    """The log sd the fitted terms add where a layer kind of `model` has no measured layer of its MLP kind in the
    runner profile: runner_modelled_layer_error_sd times the share of the `prediction`'s step they price (without a
    prediction, the share of the model's layers they price); 0 where a measured layer prices every kind."""
    _, fitted = _unmeasured(model, profile or shipped_profile(gpu.name))
    return _fitted_share_sd(model, fitted, prediction)


def _unmeasured(model, profile) -> tuple[list[str], list[str]]:
    return profile.runner.unmeasured_kinds(model) if profile is not None and profile.runner else ([], [])


def _fitted_share_sd(model, fitted: list[str], prediction: Prediction | None = None) -> float:
    if not fitted:
        return 0.0
    kinds = [f"{a}+{m}" for a, m in zip(model.layer_types, model.mlp_types)]
    share = sum(k in fitted for k in kinds) / len(kinds)
    if prediction is not None and prediction.step_time_s > 0:
        fitted_s = sum(prediction.breakdown.get(k, 0.0) for k in RUNNER_FALLBACK_TERMS)
        share = min(1.0, fitted_s / prediction.step_time_s)
    return share * default_constants().runner_modelled_layer_error_sd


# From this host/GPU time ratio of a micro-batch (cost_model.step_time.runner_host_to_gpu) a runner prediction is
# as uncertain as the host's speed: the runs there err 2x as widely (runner_host_crossing_error_sd).
CROSSING_RATIO = 0.75


def at_crossing(prediction: Prediction) -> bool:
    """Whether a runner-priced prediction's host time is CROSSING_RATIO or more of its GPU time (False without the
    prediction's inputs or off the runner's stack)."""
    ctx = prediction.context
    return ctx is not None and ctx.runner is not None and runner_host_to_gpu(ctx) >= CROSSING_RATIO


def crossing_extra_sd(prediction: Prediction) -> float:
    """The log sd a runner-priced prediction adds `at_crossing` (0 elsewhere): runner_host_crossing_error_sd over
    runner_prediction_error_sd, in quadrature."""
    if not at_crossing(prediction):
        return 0.0
    c = default_constants()
    return math.sqrt(max(c.runner_host_crossing_error_sd ** 2 - c.runner_prediction_error_sd ** 2, 0.0))


def agent_prior(config, runner) -> tuple[float, float, float]:
    """(level sd, family sd, per-layout sd) of the agent's prior: the stack's prediction sd split evenly over the
    three, so the band it prints before any trial is the prediction's own (on the runner grids the level sd per
    grid is 0.018 and the residual within a grid 0.026: about even between level and layouts)."""
    return prior_parts(prediction_sd(config, runner))


def candidate_extra_sd(config, runner):
    """(candidate -> its extra log sd) for the agent: the host/GPU crossing's (`crossing_extra_sd`), more than one
    GPU's (`multi_gpu_extra_sd`) and, from a shipped profile, the unmeasured host's (`unmeasured_host_sd`: its CPU
    optimizer under offload, its speed at issuing kernels) on a runner that prices its own run from measured
    components; None where the hypotheses price the step."""
    if uses_hypotheses(runner):
        return None
    shipped = is_shipped(config.profile, config.gpu)

    def extra(candidate) -> float:
        p = candidate.prediction
        if p.context is None:   # a prediction read back from the study's cache keeps no inputs: priced again
            p = runner.predict(config.case(candidate.layout), config.profile)
        return prediction_extra_sd(p, shipped)
    return extra


def prediction_extra_sd(prediction: Prediction, shipped: bool) -> float:
    """One runner prediction's extra log sd beyond its stack's (`candidate_extra_sd`): the crossing's, more than one
    GPU's and, with a shipped profile, the unmeasured host's."""
    return math.hypot(crossing_extra_sd(prediction), multi_gpu_extra_sd(prediction),
                      unmeasured_host_sd(prediction) if shipped else 0.0)


def prior_parts(sd: float) -> tuple[float, float, float]:
    """`sd` split evenly over level, family and layout (`agent_prior`)."""
    part = sd / 3 ** 0.5
    return part, part, part


def hypothesis_predictor(config, runner):
    """(hypotheses, predict_h) for the agent: tokens/s/GPU of a layout under a hypothesis."""
    if uses_hypotheses(runner):
        # the agent asks every hypothesis of one layout in turn, and most agree on the constants its step time
        # reads (cost_model.hypotheses.step_constants): that step is priced once per layout
        c, last = default_constants(), {}

        def predict_h(h: Hypothesis, layout: Layout) -> float:
            if last.get("layout") is not layout:
                last.clear()
                last["layout"] = layout
            key = step_constants(h, layout, config.workload)
            step = last.get(key)
            if step is None:
                step = last[key] = step_time_only(config.model, config.gpu, config.workload, layout, h.constants(c),
                                                  config.profile)
            return tokens_per_s_under(h, config.model, config.gpu, config.workload, layout, c, config.profile, step)
        return applicable(default_hypotheses(), config.workload), predict_h   # 3 for Megatron, as predict
    shipped = tuple(h for h in default_hypotheses() if h.shipped)

    def runner_h(h: Hypothesis, layout: Layout) -> float:
        return runner.predict(config.case(layout), config.profile).tokens_per_s_per_gpu
    return shipped, runner_h


def measured_before(history) -> int:
    return len(getattr(history, "measured_layouts", []) or [])


def posterior_interval(expected, measured: int) -> Interval | None:
    """The agent's posterior for this trial's layout, as a prediction's interval: the band it printed before the
    trial (None when no agent proposed it)."""
    if not isinstance(expected, dict) or not all(isinstance(expected.get(k), (int, float)) for k in ("low", "high")):
        return None
    median = expected.get("median", expected.get("mean"))
    return Interval(low=expected["low"], median=median, high=expected["high"], quantiles=QUANTILES_90,
                    basis=f"the agent's posterior before this trial ({measured} measured before it): "
                          f"the hypotheses' mixture, levels learnt from the measurements")


def predicted_figure(point, interval: Interval | None) -> float | None:
    """What was predicted for a trial, from its point prediction (tokens/s/GPU) and interval: the posterior median
    the interval holds, else the point prediction (None where neither is a number)."""
    median = number(interval.median) if interval is not None else None
    return median if median is not None else number(point)
