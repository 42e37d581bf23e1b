"""benchmarks.constant_fit: a constant fitted on the in-sample runs, each model held out in turn, the held-out runs
predicted with the in-sample fit (here on made-up runs whose error is known: value - each run's truth)."""
import math

from benchmarks.constant_fit import ConstantFit, apes


def _runs(model, truths, in_sample=True):
    return [{"model": model, "truth": t, "in_sample": in_sample, "trial": f"{model}-{i}"} for i, t in enumerate(truths)]


def test_the_fit_is_the_least_squares_value_and_each_model_held_out_is_fitted_on_the_others(capsys):
    fit = ConstantFit(tuple(x / 10 for x in range(0, 21)), lambda r, v: v - r["truth"], 0.0, lambda v: f"v {v:g}")
    ins = _runs("a", [1.0, 1.0]) + _runs("b", [0.4, 0.4])
    held = _runs("c", [0.8], in_sample=False)
    out = fit.report(ins, held)
    assert out["value"] == 0.7 and out["in_sample_runs"] == 4
    text = capsys.readouterr().out
    assert "a                                                  2 runs  fitted without it v 0.4" in text
    assert "fitted without it v 1" in text          # model b held out: fitted on a alone
    # leave-one-model-out: each model predicted 0.6 off; the baseline (0) is 1.0 and 0.4 off
    assert out["lomo_max_ape"] == apes([0.6])[1] and out["lomo_max_ape_baseline"] == apes([-1.0])[1]
    assert out["held_out_runs"] == 1 and out["held_out_max_ape"] == apes([0.7 - 0.8])[1]
    assert all(math.isnan(x) for x in apes([]))   # nothing to judge: not a number
