"""The convergence arm: measured layouts judged against a reference arm; only a pass makes a recipe verified."""
import pytest
import yaml

from candidates import fitting_candidates
from cost_model.nouns.workload import Workload
from experiments.runner import TrialResult, TrialRunner
from search_space.enumerate import SpaceOptions
from cost_model.nouns.layout import Layout
from cost_model.nouns.stack import Stack
from tuner.export import export_rows
from tuner.agent import AgentProposer
from tuner.report import ranked_rows
from cost_model.nouns.layout_codec import to_optuna_params
from tuner.study import StudyConfig, load_or_create, open_storage, run_study
from tuner.verify import default_reference, verify_top

pytestmark = pytest.mark.slow  # studies of measured-looking trials, and the whole space predicted

BASE = [12.8 * 0.85 ** i + 1.0 for i in range(20)]


class CurveRunner(TrialRunner):
    """Measured-looking results whose loss curve depends on the layout: TP 2 trains differently."""

    name = "fake-measured"

    def __init__(self, proxy: bool = False):
        self.proxy = proxy   # a 4-layer run on another stack (the megatron runner's way), not the recipe's job

    def run(self, spec):
        tp = spec.case.layout.tp
        losses = tuple(x * (1.25 if tp == 2 else 1.0) + 0.001 * i for i, x in enumerate(BASE))
        speed = 1000.0 * spec.case.layout.max_tokens_per_gpu / 8192 * (1.2 if tp == 2 else 1.0)
        details = {"window": [5, 19], "steps_run": 20, "global_batch_rows": 16, "seq_len": 4096}
        if self.proxy:
            details.update(notes=["truncated: 4 of 40 layers (--layers)"], runner="megatron",
                           model_run={"name": "m[L4]", "layers": 4})
        return TrialResult(status="ok", kind="measured", source="test runner", tokens_per_s_per_gpu=speed,
                           step_time_s=1.0, peak_memory_gib=50.0, losses=losses, step_time_cv_percent=1.0,
                           details=details)


def test_verified_only_through_a_passing_convergence_arm(tmp_path, qwen36, h200):
    workload = Workload()
    config = StudyConfig(qwen36, h200, 8, workload, Stack(), SpaceOptions(), steps=20, window=(5, 19))
    # three TP1 and three TP2 layouts, all six run: the top four measured hold both kinds
    every = fitting_candidates(qwen36, h200, workload, every=20)
    candidates = [c for c in every if c.layout.tp == 1][:3] + [c for c in every if c.layout.tp == 2][:3]
    study = load_or_create(open_storage(f"sqlite:///{tmp_path / 's.db'}"), "v", config)
    run_study(study, config, CurveRunner(), AgentProposer(candidates, to_optuna_params, stop_margin=None), trials=6,
              progress=False)   # all six: the runner's figures follow no prediction, the stop rule would end early

    reference = default_reference(candidates, 8)
    assert reference.tp == 1 and reference.pp == 1
    verdicts = verify_top(study, config, CurveRunner(), 4, reference)
    assert len(verdicts) == 4
    by_tp = {}
    for v in verdicts:
        layout = next(r.layout for r in ranked_rows(study) if r.number == v["trial"])
        by_tp.setdefault(layout.tp, set()).add(v["result"])
    assert by_tp[1] == {"pass"} and by_tp[2] == {"fail"}, by_tp  # both kinds of layout were judged

    paths = export_rows(ranked_rows(study)[:6], config, tmp_path / "out", study)
    statuses = {}
    for path in paths:
        recipe = yaml.safe_load(path.read_text())
        statuses[recipe["layout"]["tp"]] = statuses.get(recipe["layout"]["tp"], set()) | {recipe["status"]}
        block = recipe["correctness"]
        if recipe["status"] == "verified":
            assert block["convergence"]["result"] == "pass" and block["result"] == "pass"
            assert recipe["result"]["measured"] == "test runner"
            assert recipe["result"]["mfu_note"].startswith("measured: 6 x active params of the model run x")
            assert recipe["result"]["window_tokens"] == 15 * 16 * 4096 and recipe["result"]["runs"] == 1
            assert recipe["result"]["gpu_hours_note"].startswith("measured")
            assert block["summary"] == "passed; convergence passed"
            assert block["reference"] == f"{reference.long_label}: 20 steps, measured by test runner"
        else:
            assert recipe["status"] == "measured"
            assert (block["convergence"] or {}).get("result") in (None, "fail")
            if block["convergence"]["result"] == "fail":
                assert block["result"] == "fail" and block["summary"] == "fail; convergence FAILED"
    assert statuses[2] == {"measured"} and "verified" in statuses[1], statuses


def test_a_proxy_run_is_evidence_not_the_recipes_result(tmp_path, qwen36, h200):
    """A trial that ran 4 of 40 layers on another stack chose the layout; the recipe stays the whole model's
    prediction (status predicted) and lists the proxy run with what ran, however well it converged."""
    workload = Workload()
    config = StudyConfig(qwen36, h200, 8, workload, Stack(), SpaceOptions(), steps=20, window=(5, 19))
    candidates = [c for c in fitting_candidates(qwen36, h200, workload, every=20) if c.layout.tp == 1][:2]
    study = load_or_create(open_storage(f"sqlite:///{tmp_path / 's.db'}"), "p", config)
    run_study(study, config, CurveRunner(proxy=True), AgentProposer(candidates, to_optuna_params, stop_margin=None),
              trials=2, progress=False)
    verify_top(study, config, CurveRunner(proxy=True), 1, default_reference(candidates, 8))
    rows = ranked_rows(study)
    for path, row in zip(export_rows(rows, config, tmp_path / "out", study), rows):
        recipe = yaml.safe_load(path.read_text())
        assert recipe["status"] == "predicted" and recipe["correctness"]["result"] == "not run"
        # the whole model's posterior median on slime (its interval's), not the proxy's figure nor one hypothesis
        assert recipe["result"]["tokens_per_s_per_gpu"] == pytest.approx(
            recipe["result"]["predicted_interval"]["tokens_per_s_per_gpu_median"], abs=0.5)
        [proxy] = recipe["result"]["proxy_runs"]
        assert proxy["tokens_per_s_per_gpu"] == pytest.approx(row.tokens_per_s_per_gpu, abs=0.01)
        assert "m[L4] (4 of 40 layers)" in proxy["ran"] and "megatron runner" in proxy["ran"]
        assert "proxy_runs measured another job" in recipe["result"]["proxy_note"]
        calibration = recipe["result"]["calibration"]   # another stack: no level carries over to slime
        assert calibration["applied"] is False and "megatron runner's stack" in calibration["note"]


def test_a_proxy_on_slimes_own_stack_calibrates_the_target_by_its_measured_ratio():
    from tuner.export import _calibration
    result = {"tokens_per_s_per_gpu": 4000.0, "predicted_interval": {"tokens_per_s_per_gpu_low": 3000,
              "tokens_per_s_per_gpu_median": 4000, "tokens_per_s_per_gpu_high": 5000, "note": "x"}}
    proxy = {"tokens_per_s_per_gpu": 900.0, "predicted_for_the_proxy": 1000.0}
    got = _calibration(result, proxy, {"model_run": {"layers": 4}})
    assert got["applied"] and got["factor"] == 0.9 and got["tokens_per_s_per_gpu"] == 3600.0
    assert got["interval"] == {"low": 2700, "median": 3600, "high": 4500}
    assert _calibration(result, {"tokens_per_s_per_gpu": 900.0}, {})["applied"] is False


def test_default_reference_is_the_simplest_fitting_layout(qwen36, h200):
    workload = Workload()
    candidates = fitting_candidates(qwen36, h200, workload)
    ref = default_reference(candidates, 8)
    smallest = min(c.layout.tp * c.layout.pp * c.layout.cp * c.layout.ep * c.layout.etp for c in candidates)
    assert ref.tp * ref.pp * ref.cp * ref.ep * ref.etp == smallest
    assert isinstance(ref, Layout)
