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
    from cost_model.hardware import load_gpu
    from cost_model.hypotheses import default_hypotheses, predict_interval
    from cost_model.layout import Layout
    from cost_model.model_spec import load_model
    from cost_model.workload import Workload

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
