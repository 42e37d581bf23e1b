"""The recipe's correctness block: component tests and convergence verdicts, and the status they allow."""
import pytest

from cost_model.nouns.layout import Layout
from cost_model.predict import predict
from cost_model.nouns.workload import Workload
from recipes.correctness import record_component_test, record_convergence
from recipes.recipe import build_recipe

PASS = {"steps": 20, "result": "pass", "correlation": 0.99999, "final_loss_difference": 0.0022,
        "pointwise_failures": 0, "note": "candidate arm: trial 3"}
ADAM = {"test": "precision-aware Adam", "shape": "one MoE layer", "gpu": "H200", "date": "2026-11-29",
        "result": "pass", "detail": "worst tensor 5e-5", "note": "elementwise"}


@pytest.fixture
def recipe(qwen36, h200):
    layout = Layout(8, ep=8)
    return build_recipe(qwen36, h200, Workload(), layout, predict(qwen36, h200, Workload(), layout))


def test_a_predicted_recipe_stays_predicted_whatever_is_recorded(recipe):
    assert recipe["status"] == "predicted" and recipe["correctness"]["result"] == "not run"
    record_component_test(recipe, ADAM)
    record_convergence(recipe, PASS, "TP1 EP8")
    assert recipe["status"] == "predicted"  # nothing was measured
    assert recipe["correctness"]["result"] == "pass"


def test_measured_becomes_verified_only_with_a_passing_verdict_and_no_failed_component_test(recipe):
    recipe["status"] = "measured"
    record_component_test(recipe, ADAM)
    block = recipe["correctness"]
    assert recipe["status"] == "measured" and block["result"] == "not run"
    assert block["summary"] == "not run; 1 of 1 component test passed on this image; convergence not checked"
    record_convergence(recipe, PASS, "TP1 PP1 EP8 DP8: 20 steps")
    assert recipe["status"] == "verified" and block["result"] == "pass"
    assert block["summary"] == "passed; 1 of 1 component test passed on this image; convergence passed"
    assert block["convergence"] == PASS and block["reference"] == "TP1 PP1 EP8 DP8: 20 steps"
    assert "validate_convergence" in block["rules"]
    # The same test re-run and failing replaces the earlier entry and withdraws verified.
    record_component_test(recipe, {**ADAM, "result": "fail"})
    assert len(block["component_tests"]) == 1
    assert recipe["status"] == "measured" and block["result"] == "fail"
    assert block["summary"] == "fail; 0 of 1 component test passed on this image; convergence passed"


@pytest.mark.parametrize("result,block_result,summary", [
    ("fail", "fail", "fail; convergence FAILED"),
    ("unusable", "not run", "not run; convergence not checked (unusable)"),
    ("not run", "not run", "not run; convergence not checked (not run)")])
def test_a_failed_or_unusable_verdict_never_verifies(recipe, result, block_result, summary):
    recipe["status"] = "measured"
    record_convergence(recipe, {**PASS, "result": result}, "ref")
    assert recipe["status"] == "measured" and recipe["correctness"]["result"] == block_result
    assert recipe["correctness"]["summary"] == summary
