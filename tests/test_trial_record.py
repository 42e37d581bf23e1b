"""The one interval type and the one trial record: stored shapes read and written as before (issue 30)."""
from __future__ import annotations

import json

import pytest

from tuner.interval import Interval

# the two shapes tune has stored beside a prediction (tuner.intervals), exactly as written, key order included
COST_MODEL = {"low": 1953.1, "median": 3424.5, "high": 6034.2, "spread_low": 2400.0, "spread_high": 4600.0,
              "error_sd": 0.23, "quantiles": [0.05, 0.95], "hypotheses": 8, "kind": "predicted",
              "basis": "hypotheses (cost_model/hypotheses.py) and residual"}
POSTERIOR = {"low": 1000.0, "median": None, "high": 2000.0, "quantiles": [0.05, 0.95], "kind": "predicted",
             "basis": "the agent's posterior before this trial (0 measured before it): the hypotheses' mixture, "
                      "levels learnt from the measurements"}


@pytest.mark.parametrize("stored", [COST_MODEL, POSTERIOR])
def test_stored_interval_shapes_read_and_write_back_byte_for_byte(stored):
    iv = Interval.from_dict(stored)
    assert json.dumps(iv.to_dict()) == json.dumps(stored)
    assert iv.level == 0.9 and iv.complete


def test_the_cost_models_interval_is_stored_as_before():
    from cost_model.nouns.hardware import load_gpu
    from cost_model.hypotheses import default_hypotheses, predict_interval
    from cost_model.nouns.layout import Layout
    from cost_model.nouns.model_spec import load_model
    from cost_model.nouns.workload import Workload

    iv = predict_interval(default_hypotheses(), load_model("qwen3-30b-a3b"), load_gpu("h200"), Workload(),
                          Layout(8, ep=8))
    before = {**iv.to_dict(), "kind": "predicted", "basis": "b"}   # how tuner.intervals wrote it
    assert json.dumps(Interval.of_hypotheses(iv, basis="b").to_dict()) == json.dumps(before)


def test_a_peers_partial_interval_reads_with_what_it_has():
    iv = Interval.from_dict({"low": 5, "median": 7})
    assert (iv.low, iv.median, iv.high, iv.quantiles, iv.level, iv.complete) == (5, 7, None, (), None, False)
    assert Interval.from_dict("band") is None and Interval.from_dict(None) is None


def test_a_recipes_interval_block_scales_as_before():
    block = Interval(1000.4, 2000.6, 3000.5).recipe_block("n")
    assert block == {"tokens_per_s_per_gpu_low": 1000, "tokens_per_s_per_gpu_median": 2001,
                     "tokens_per_s_per_gpu_high": 3000, "note": "n"}
    assert Interval.from_recipe(block).scaled(1.5) == {"low": 1500, "median": 3002, "high": 4500}
    assert Interval.from_recipe({"tokens_per_s_per_gpu_low": "x"}).scaled(2.0) == {}


def _frozen(number=0, state=None, value=None, **attrs):
    import optuna
    from optuna.trial import TrialState

    state = state or TrialState.COMPLETE
    t = optuna.trial.create_trial(state=state, value=value if state == TrialState.COMPLETE else None,
                                  params={}, distributions={}, user_attrs=attrs)
    t.number = number
    return t


LAYOUT = {"world_size": 8, "tp": 1, "pp": 1, "ep": 8}


def test_a_trial_reads_as_one_record():
    from tuner.trial_record import forget_warnings, read_trial

    forget_warnings()
    prediction = {"tokens_per_s_per_gpu": 3000.0, "kind": "predicted", "interval": POSTERIOR}
    result = {"status": "ok", "kind": "measured", "source": "a run", "tokens_per_s_per_gpu": 2500.0}
    r = read_trial(_frozen(3, value=2500.0, layout=LAYOUT, layout_key="k", label="L", backend="megatron",
                           proposer="agent", rationale="why", hypothesis_weights={"h": 1.0}, prediction=prediction,
                           result=result, learnt="level x0.8"))
    assert (r.number, r.value, r.layout_key, r.label, r.backend, r.proposer, r.rationale, r.learnt) == \
        (3, 2500.0, "k", "L", "megatron", "agent", "why", "level x0.8")
    assert r.rankable and r.kind == r.result_kind == "measured" and r.figures is r.result
    assert (r.result.status, r.result.source, r.result.tokens_per_s_per_gpu, r.result.mfu) == \
        ("ok", "a run", 2500.0, None)
    assert r.result.trial_result().tokens_per_s_per_gpu == 2500.0 and r.prediction.tokens_per_s_per_gpu == 3000.0
    assert r.interval == Interval.from_dict(POSTERIOR) and r.predicted == 3000.0   # the posterior has no median
    assert r.parsed_layout().ep == 8 and r.reason is None


def test_a_malformed_attribute_reads_as_missing_with_one_warning(capsys):
    from optuna.trial import TrialState

    from tuner.trial_record import forget_warnings, read_trial

    forget_warnings()
    t = _frozen(7, state=TrialState.PRUNED, prune_reason=5, prediction={"mfu": "high", "interval": "band"})
    r, again = read_trial(t), read_trial(t)
    assert r == again and r.prune_reason is None and r.interval is None
    assert not r.prediction.recorded and not r.result.recorded and r.kind is None
    assert r.rankable   # a pruned trial is never ranked: only a complete one's grounds count
    assert capsys.readouterr().err.count("tune: warning: trial 7:") == 1


def test_a_complete_trial_without_a_layout_is_not_ranked():
    from tuner.trial_record import read_trial

    r = read_trial(_frozen(1, value=1.0, result={"status": "ok", "kind": "predicted", "tokens_per_s_per_gpu": 1.0}))
    assert not r.rankable and r.layout is None
