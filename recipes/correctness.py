"""A recipe's `correctness` block: recording component tests and convergence verdicts, and what they
make of the recipe's status.

The block's fields (reference/recipe-format.md): result, summary, reference, configuration,
component_tests [ {test, shape, gpu, date, result, detail, note} ], convergence {steps, result,
correlation, final_loss_difference, pointwise_failures, note}, rules.

Status rule: `predicted` (nothing ran) -> `measured` (throughput measured) -> `verified` (measured,
its convergence arm passed, and no component test failed). Nothing else makes a recipe verified.
"""
from __future__ import annotations

from cost_model.nouns.errors import AttuneError

CONVERGENCE_RULES = ("convergence: Megatron-Bridge validate_convergence rules and pipeline thresholds "
                     "(experiments/checks/convergence.py)")


class CorrectnessError(AttuneError, ValueError):
    """A recipe whose correctness block is not the format's mapping (a hand-edited or hostile file). One line."""


def correctness_block(recipe: dict) -> dict:
    """The recipe's correctness block, checked: a mapping whose component_tests is a list of mappings."""
    block = recipe.get("correctness") if isinstance(recipe, dict) else None
    if not isinstance(block, dict):
        raise CorrectnessError(f"recipe field 'correctness' must be a mapping, got {type(block).__name__}")
    tests = block.get("component_tests") or []
    if not isinstance(tests, list) or not all(isinstance(t, dict) for t in tests):
        raise CorrectnessError("recipe field 'correctness.component_tests' must be a list of mappings")
    if not isinstance(block.get("convergence") or {}, dict):
        raise CorrectnessError("recipe field 'correctness.convergence' must be a mapping")
    return block


def record_component_test(recipe: dict, entry: dict) -> dict:
    """Add a component test result (replacing an earlier result of the same test), then update the
    block's result, summary and the recipe's status."""
    block = correctness_block(recipe)
    tests = [t for t in (block.get("component_tests") or []) if t.get("test") != entry["test"]]
    block["component_tests"] = tests + [entry]
    return _settle(recipe)


def record_convergence(recipe: dict, verdict: dict, reference: str) -> dict:
    """Set the convergence verdict of the recipe's measured run against `reference` (a description of
    the reference arm), then update the block's result, summary and the recipe's status."""
    block = correctness_block(recipe)
    block["convergence"] = dict(verdict)
    block["reference"] = reference
    block["rules"] = CONVERGENCE_RULES
    return _settle(recipe)


def _settle(recipe: dict) -> dict:
    block = correctness_block(recipe)
    tests = block.get("component_tests") or []
    failed_tests = [t for t in tests if t.get("result") != "pass"]
    conv = (block.get("convergence") or {}).get("result")
    parts = []
    if tests:
        n_pass = len(tests) - len(failed_tests)
        parts.append(f"{n_pass} of {len(tests)} component test{'s' if len(tests) != 1 else ''} passed on this image")
    if conv in ("pass", "fail"):
        parts.append(f"convergence {'passed' if conv == 'pass' else 'FAILED'}")
    else:  # never run, or its reference arm failed / left no usable curve
        parts.append("convergence not checked" + (f" ({conv})" if conv else ""))
    if failed_tests or conv == "fail":
        block["result"] = "fail"
    elif conv == "pass":
        block["result"] = "pass"
    else:
        block["result"] = "not run"
    block["summary"] = f"{'passed' if block['result'] == 'pass' else block['result']}; " + "; ".join(parts)
    if recipe.get("status") in ("measured", "verified"):
        recipe["status"] = "verified" if block["result"] == "pass" else "measured"
    return recipe
