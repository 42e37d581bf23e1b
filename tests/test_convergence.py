"""The convergence check (Megatron-Bridge validate_convergence rules): loss curves, the verdict, the CLI."""
from __future__ import annotations

import json
import math
import random

import pytest

from experiments.checks.convergence import (Curve, CurveError, Thresholds, check, load_curve, main,
                                            recipe_convergence_block)

STEPS = 20


def reference_losses(seed: int = 0) -> list[float]:
    """A 20-step SFT-like curve: ~2.6 falling to ~1.3, with step-to-step noise."""
    rng = random.Random(seed)
    return [1.2 + 1.5 * math.exp(-i / 7) + 0.03 * rng.uniform(-1, 1) for i in range(STEPS)]


def near_identical(ref: list[float], rel: float = 5e-4, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [x * (1 + rel * rng.uniform(-1, 1)) for x in ref]


def curve(losses, norms=None, source="") -> Curve:
    return Curve.from_values(losses, norms, source=source)


def write_csv(path, losses, norms=None, steps=None):
    steps = list(range(len(losses))) if steps is None else steps
    lines = ["step,loss" + (",grad_norm" if norms is not None else "")]
    for i, (s, l) in enumerate(zip(steps, losses)):
        lines.append(f"{s},{l!r}" + (f",{norms[i]!r}" if norms is not None else ""))
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------- the rules
def test_near_identical_curves_pass():
    ref = reference_losses()
    v = check(curve(near_identical(ref), [1.0] * STEPS), curve(ref, [1.1] * STEPS))
    assert v.passed, v.format()
    assert v.correlation > 0.999
    assert v.pointwise_failures == 0 and v.pointwise_failure_share == 0.0
    assert v.final_loss_difference < 1e-3
    assert v.skipped_steps == (0, 1, 2, 3)             # int(20 * 0.2) = 4 leading steps
    assert v.compared_steps == tuple(range(4, 20))
    assert len(v.points) == 16 and all(p.passed for p in v.points)
    assert {r.rule for r in v.rules} == {"finite", "correlation", "pointwise", "final_loss", "outliers"}
    # The tolerance of each step follows the reference loss.
    for p in v.points:
        assert p.tolerance == (0.10 if p.reference > 2.0 else 0.05 if p.reference > 0.5 else 0.02)


def test_identical_curves_pass():
    ref = reference_losses()
    v = check(curve(ref), curve(ref))
    assert v.passed
    assert v.correlation == pytest.approx(1.0) and v.final_loss_difference == 0.0 and v.outliers == 0


def test_lr_times_ten_divergence_fails():
    ref = reference_losses()
    # lr x 10: a faster first drop, then the loss climbs and oscillates (the run diverges).
    cand = [2.7, 2.1, 1.7, 1.6, 1.8, 2.1, 2.5, 2.4, 2.9, 3.3, 3.1, 3.6, 3.9, 3.7, 4.2, 4.6, 4.4, 4.9, 5.3, 5.6]
    v = check(curve(cand), curve(ref))
    assert not v.passed
    assert {"correlation", "pointwise", "final_loss"} <= set(v.failed_rules)
    assert v.correlation < 0


def test_offset_curve_fails_pointwise_and_final_but_not_correlation():
    ref = reference_losses()
    cand = [x + 0.25 for x in ref]            # same shape, other rows: a constant shift
    v = check(curve(cand), curve(ref))
    assert not v.passed
    assert v.rule("correlation").passed       # perfectly correlated ...
    assert not v.rule("pointwise").passed     # ... but 10-20% off at every step
    assert not v.rule("final_loss").passed


def test_step_shifted_data_fails():
    ref = reference_losses()
    longer = [1.2 + 1.5 * math.exp(-i / 7) for i in range(STEPS + 5)]
    cand = longer[5:]                          # the candidate sees the rows 5 steps later
    v = check(curve(cand), curve(ref))
    assert not v.passed
    assert v.pointwise_failures > 0.1 * len(v.points)


def test_nan_loss_fails_even_in_a_skipped_step():
    ref = reference_losses()
    cand = list(ref)
    cand[1] = float("nan")                     # step 1 is skipped from the comparison
    v = check(curve(cand), curve(ref))
    assert not v.passed and v.failed_rules == ["finite"]
    assert v.nonfinite == ("candidate loss at step 1: nan",)


def test_nan_loss_in_compared_steps_fails_every_affected_rule():
    ref = reference_losses()
    cand = list(ref)
    cand[-1] = float("nan")
    v = check(curve(cand), curve(ref))
    assert not v.passed
    assert {"finite", "correlation", "final_loss"} <= set(v.failed_rules)
    assert v.correlation is None
    json.dumps(v.to_dict())                    # NaN becomes a string, the JSON stays standard
    assert v.to_dict()["final_loss_difference"] == "nan"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_grad_norm_fails(bad):
    ref = reference_losses()
    norms = [1.0] * STEPS
    norms[10] = bad
    v = check(curve(ref, norms), curve(ref, [1.0] * STEPS))
    assert not v.passed and v.failed_rules == ["finite"]
    assert "grad norm at step 10" in v.nonfinite[0]


def test_inf_loss_in_reference_fails():
    ref = reference_losses()
    bad = list(ref)
    bad[7] = float("inf")
    assert not check(curve(ref), curve(bad)).passed


def test_length_mismatch_is_a_curve_error():
    ref = reference_losses()
    with pytest.raises(CurveError, match=r"has 18 steps, reference .* has 20.*missing from the candidate: 18, 19"):
        check(curve(ref[:18], source="cand.csv"), curve(ref, source="ref.csv"))


def test_step_mismatch_is_a_curve_error():
    ref = reference_losses()
    a = Curve(tuple(range(20)), tuple(ref))
    b = Curve(tuple(range(1, 21)), tuple(ref))
    with pytest.raises(CurveError, match="cover different steps") as e:
        check(a, b)
    assert "\n" not in str(e.value)


def test_too_few_steps_is_a_curve_error():
    with pytest.raises(CurveError, match="too few steps"):
        check(curve([1.0]), curve([1.0]))
    # two compared points always correlate perfectly: a 2-step curve is no check at all
    with pytest.raises(CurveError, match="at least 5 must remain"):
        check(curve([2.0, 1.0]), curve([2.0, 1.0]))
    assert check(curve([3.0 - 0.1 * i for i in range(10)]), curve([3.0 - 0.1 * i for i in range(10)])).passed


def test_constant_curve_has_undefined_correlation_not_checked():
    """A flat curve has no correlation to test (tests/test_sweep_fixes.py has the flat-against-falling case)."""
    v = check(curve([1.0] * 10), curve([1.0] * 10))
    assert v.correlation is None and v.rule("correlation").passed and not v.rule("correlation").checked
    assert v.passed


def test_tolerance_boundaries():
    t = Thresholds()
    assert t.tolerance_for(2.0001) == 0.10
    assert t.tolerance_for(2.0) == 0.05        # "> 2.0" is high
    assert t.tolerance_for(0.5001) == 0.05
    assert t.tolerance_for(0.5) == 0.02        # "> 0.5" is medium
    assert t.tolerance_for(0.1) == 0.02


def test_failing_share_limit_is_inclusive():
    ref = [3.0 - 0.1 * i for i in range(STEPS)]   # 3.0 .. 1.1
    t = Thresholds(skip_fraction=0.0)

    def with_bad(n):
        cand = list(ref)
        for i in range(2, 2 + n):
            cand[i] *= 1.08 if ref[i] <= 2.0 else 1.12   # just past the step's tolerance
        return check(curve(cand), curve(ref), t)

    assert with_bad(2).pointwise_failures == 2 and with_bad(2).rule("pointwise").passed    # 10%: allowed
    assert with_bad(3).pointwise_failures == 3 and not with_bad(3).rule("pointwise").passed


def test_skip_fraction_leaves_early_steps_out():
    ref = reference_losses()
    cand = list(ref)
    cand[0] *= 1.5                             # a wild first step: skipped by default
    cand[1] *= 1.5
    assert check(curve(cand), curve(ref)).passed
    v = check(curve(cand), curve(ref), Thresholds(skip_fraction=0.0))
    assert v.pointwise_failures == 2 and v.skipped_steps == ()


def test_thresholds_reject_nonsense():
    with pytest.raises(ValueError):
        Thresholds(skip_fraction=1.0)
    with pytest.raises(ValueError):
        Thresholds(max_failing_share=1.5)
    with pytest.raises(ValueError):
        Thresholds(min_correlation=float("nan"))


def test_format_is_a_table_of_every_figure():
    ref = reference_losses()
    text = check(curve(near_identical(ref), source="a.csv"), curve(ref, source="b.csv")).format()
    for word in ("figure", "measured", "threshold", "verdict", "correlation", "point-wise failures",
                 "final loss difference", "NaN/Inf", "result: PASS", ">= 0.95", "<= 3%", "<= 10% of points"):
        assert word in text


# ---------------------------------------------------------------------- reading curves
def test_load_csv_and_json_forms(tmp_path):
    ref = reference_losses()
    norms = [1.0 + 0.01 * i for i in range(STEPS)]
    c1 = load_curve(write_csv(tmp_path / "a.csv", ref, norms))
    (tmp_path / "b.json").write_text(json.dumps([{"step": i, "loss": l, "grad_norm": g}
                                                 for i, (l, g) in enumerate(zip(ref, norms))]))
    (tmp_path / "c.json").write_text(json.dumps({"steps": list(range(STEPS)), "losses": ref, "grad_norms": norms}))
    (tmp_path / "d.json").write_text(json.dumps({"steps": list(range(STEPS)), "losses": ref}))
    c2, c3, c4 = (load_curve(tmp_path / n) for n in ("b.json", "c.json", "d.json"))
    assert c1.steps == c2.steps == c3.steps == c4.steps == tuple(range(STEPS))
    assert c1.losses == c2.losses == c3.losses == c4.losses == tuple(ref)
    assert c1.grad_norms == c2.grad_norms == c3.grad_norms == tuple(norms)
    assert c4.grad_norms is None


def test_load_reads_nan_as_data(tmp_path):
    p = tmp_path / "n.csv"
    p.write_text("step,loss,grad_norm\n0,2.0,1.0\n1,nan,inf\n")
    c = load_curve(p)
    assert math.isnan(c.losses[1]) and math.isinf(c.grad_norms[1])


@pytest.mark.parametrize("name, text, problem", [
    ("a.csv", "step,value\n0,1.0\n", "missing column 'loss'"),
    ("a.csv", "loss\n1.0\n", "missing column 'step'"),
    ("a.csv", "", "empty file"),
    ("a.csv", "step,loss\n", "no data points"),
    ("a.csv", "step,loss\n0,1.0\n1,abc\n", "line 3: non-numeric loss 'abc'"),
    ("a.csv", "step,loss\n0,1.0\nx,2.0\n", "line 3: non-numeric step 'x'"),
    ("a.csv", "step,loss\n0,1.0\n1.5,2.0\n", "not an integer"),
    ("a.csv", "step,loss\n0,1.0\n1,\n", "line 3: missing value for 'loss'"),
    ("a.csv", "step,loss,grad_norm\n0,1.0,1\n1,2.0,x\n", "non-numeric grad_norm"),
    ("a.csv", "step,loss\n0,1.0\n1,2.0\n1,3.0\n", "line 4: duplicate step 1 (first at line 3)"),
    ("a.csv", "step,loss\n0,1.0\n2,2.0\n1,3.0\n", "line 4: steps not sorted: step 1 after step 2"),
    ("a.json", "[{\"step\": 0}]", "record 0: missing field 'loss'"),
    ("a.json", "[{\"step\": 0, \"loss\": \"x\"}]", "record 0: non-numeric loss"),
    ("a.json", "[{\"step\": 0, \"loss\": null}]", "record 0: non-numeric loss null"),
    ("a.json", "[{\"step\": 0, \"loss\": 1, \"grad_norm\": 1}, {\"step\": 1, \"loss\": 1}]",
     "record 1: field 'grad_norm' missing"),
    ("a.json", "[{\"step\": 1, \"loss\": 1}, {\"step\": 1, \"loss\": 1}]", "record 1: duplicate step 1"),
    ("a.json", "[{\"step\": 1, \"loss\": 1}, {\"step\": 0, \"loss\": 1}]", "steps not sorted"),
    ("a.json", "{\"steps\": [0, 1], \"losses\": [1.0]}", "lists of different lengths"),
    ("a.json", "{\"losses\": [1.0]}", "missing field 'steps'"),
    ("a.json", "{\"steps\": [0, 1], \"losses\": [1.0, true]}", "index 1: non-numeric loss true"),
    ("a.json", "[1, 2]", "record 0: expected an object"),
    ("a.json", "{not json", "malformed JSON at line 1"),
    ("a.json", "3", "expected a JSON list"),
])
def test_malformed_curves_raise_one_line(tmp_path, name, text, problem):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(CurveError) as e:
        load_curve(p)
    message = str(e.value)
    assert problem in message
    assert str(p) in message and "\n" not in message


def test_missing_file(tmp_path):
    with pytest.raises(CurveError, match="no such file"):
        load_curve(tmp_path / "nope.csv")


# ---------------------------------------------------------------------- the CLI
def test_main_exit_codes(tmp_path, capsys):
    ref = reference_losses()
    r = write_csv(tmp_path / "ref.csv", ref, [1.0] * STEPS)
    good = write_csv(tmp_path / "good.csv", near_identical(ref), [1.0] * STEPS)
    bad = write_csv(tmp_path / "bad.csv", [x * 1.3 for x in ref])
    short = write_csv(tmp_path / "short.csv", ref[:15])
    broken = tmp_path / "broken.csv"
    broken.write_text("step,loss\n0,oops\n")

    assert main(["--candidate", str(good), "--reference", str(r)]) == 0
    assert "result: PASS" in capsys.readouterr().out
    assert main(["--candidate", str(bad), "--reference", str(r)]) == 1
    assert "result: FAIL" in capsys.readouterr().out
    for cand in (short, broken, tmp_path / "missing.csv"):
        assert main(["--candidate", str(cand), "--reference", str(r)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith("tune: error: ") and captured.err.count("\n") == 1
    assert main(["--candidate", str(good), "--reference", str(r), "--skip-fraction", "1.5"]) == 2
    assert "tune: error: --skip-fraction must lie in [0, 1), got 1.5" in capsys.readouterr().err   # the flag's name
    assert main(["--candidate", str(good), "--reference", str(r), "--min-correlation", "nan"]) == 2
    assert "tune: error: --min-correlation must be a finite number" in capsys.readouterr().err


def test_main_json(tmp_path, capsys):
    ref = reference_losses()
    r = write_csv(tmp_path / "ref.csv", ref)
    c = write_csv(tmp_path / "c.csv", near_identical(ref))
    assert main(["--candidate", str(c), "--reference", str(r), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] is True and out["result"] == "pass"
    assert [x["rule"] for x in out["rules"]] == ["finite", "correlation", "pointwise", "final_loss", "outliers"]
    assert len(out["points"]) == 16 and out["skipped_steps"] == [0, 1, 2, 3]
    assert out["thresholds"]["min_correlation"] == 0.95 and out["thresholds"]["max_final_diff"] == 0.03


def test_thresholds_from_flags(tmp_path, capsys):
    ref = reference_losses()
    r = write_csv(tmp_path / "ref.csv", ref)
    cand = list(ref)
    cand[-1] *= 1.04                           # final loss 4% off (one point-wise failure of 16: allowed)
    c = write_csv(tmp_path / "c.csv", cand)
    args = ["--candidate", str(c), "--reference", str(r), "--json"]
    assert main(args) == 1
    assert json.loads(capsys.readouterr().out)["failed_rules"] == ["final_loss"]
    assert main(args + ["--max-final-diff", "0.05"]) == 0
    capsys.readouterr()

    # --max-failing-share: 2 of 16 compared points off (12.5%) fails at 10%, passes at 15%.
    cand = list(ref)
    cand[5] *= 1.2
    cand[6] *= 1.2
    c2 = write_csv(tmp_path / "c2.csv", cand)
    args = ["--candidate", str(c2), "--reference", str(r), "--json"]
    assert main(args) == 1
    assert "pointwise" in json.loads(capsys.readouterr().out)["failed_rules"]
    assert main(args + ["--max-failing-share", "0.15", "--min-correlation", "0.5"]) == 0
    capsys.readouterr()
    # --skip-fraction: skipping the first 35% (7 steps) leaves both bad points out.
    assert main(args + ["--skip-fraction", "0.35"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["skipped_steps"] == list(range(7)) and out["pointwise_failures"] == 0
    # --min-correlation above what the curves reach fails.
    c3 = write_csv(tmp_path / "c3.csv", near_identical(ref, rel=0.01))
    assert main(["--candidate", str(c3), "--reference", str(r), "--min-correlation", "0.9999"]) == 1
    capsys.readouterr()


def test_recipe_convergence_block():
    ref = reference_losses()
    v = check(curve(near_identical(ref)), curve(ref))
    block = recipe_convergence_block(v, 20, "candidate arm: the measured run; reference arm: the reference recipe")
    assert set(block) == {"steps", "result", "correlation", "final_loss_difference", "pointwise_failures", "note"}
    assert block["steps"] == 20 and block["result"] == "pass" and block["pointwise_failures"] == 0
    assert 0.999 < block["correlation"] <= v.correlation      # floored, never rounded up
    assert block["final_loss_difference"] == pytest.approx(v.final_loss_difference, rel=1e-2)
    assert block["note"].startswith("candidate arm")
    failed = recipe_convergence_block(check(curve([x * 1.3 for x in ref]), curve(ref)), 20, "")
    assert failed["result"] == "fail" and failed["pointwise_failures"] == 16
    nan = list(ref)
    nan[-1] = float("nan")
    b = recipe_convergence_block(check(curve(nan), curve(ref)), 20, "")
    assert b["result"] == "fail" and b["correlation"] is None and b["final_loss_difference"] is None
