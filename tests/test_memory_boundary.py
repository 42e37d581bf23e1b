"""benchmarks/memory_boundary.py on the CPU: the plan is a runner suite at the predicted boundary, and
--report judges a (synthetic) results file."""
import json

import pytest

from benchmarks import memory_boundary as mb
from experiments.runner import TrialResult


@pytest.fixture(scope="module")
def planned():
    return mb.plan_trials("h200", steps=4)


def test_plan_covers_models_gpus_and_the_boundary(planned):
    trials, notes = planned
    assert not notes
    layouts = {t["name"].split(mb.SEP)[0] for t in trials}
    assert len(layouts) >= 12 and len(trials) == 2 * len(layouts)
    assert {t["model"] for t in trials} >= {"qwen3.6-35b-a3b", "qwen3-30b-a3b", "llama3-8b"}
    assert {t["gpus"] for t in trials} == {1, 2}
    assert {t["seq_len"] for t in trials} <= {4096, 8192}
    for fit, up in zip(trials[::2], trials[1::2]):
        assert fit["name"].endswith("--fit") and up["name"].endswith("--up")
        assert fit["expect"].startswith("fits") and up["expect"].startswith("cuda_oom")
        assert fit["replace_gdn"] is False and up["layers"] > fit["layers"]


def test_plan_uses_the_runners_own_prediction(planned, h200):
    """The fit trial is the largest layer count predict_run calls a fit; the up trial one step more."""
    from cost_model.nouns.case import Case
    from cost_model.nouns.layout_codec import layout_from_stored
    from cost_model.nouns.model_spec import load_model
    from cost_model.nouns.workload import Workload
    from experiments.megatron.model_run import predict_run, trial_model
    trials, _ = planned
    for t in trials[:4] + trials[-4:]:
        layout = layout_from_stored({**t["layout"], "world_size": t["gpus"]})
        case = Case(trial_model(load_model(t["model"]), t["layers"], replace_gdn=False), h200,
                    Workload(seq_len=t["seq_len"], global_batch=t["global_batch"], framework="megatron"), layout)
        assert predict_run(case).under_limit is t["name"].endswith("--fit"), t["name"]


@pytest.mark.torch
def test_plan_writes_suites_the_runner_reads_each_under_nine_minutes(tmp_path):
    from experiments.megatron.suite import parse_suite
    timing = mb.Timing(overhead_s=20, step_ratio=1.5, oom_s=15, source="test")
    paths = mb.write_plan(tmp_path / "bnd.json", steps=4, timing=timing)
    total = 0
    for path in paths:
        doc = json.loads(path.read_text())
        assert doc["estimated_wall_s"] <= mb.SUITE_BUDGET_S
        total += doc["estimated_wall_s"]
        trials, meta = parse_suite(path)
        assert meta["budget_s"] == mb.SUITE_BUDGET_S and all(t.steps == 4 and t.layers for t in trials)
        assert all(t.workload.framework == "megatron" and not t.replace_gdn for t in trials)
    assert 240 <= total <= 600                               # about 8 minutes on 2 H200s
    slow = mb.Timing(overhead_s=60, step_ratio=3, oom_s=40, source="slow")
    assert len(mb.split_suites(mb.plan_trials()[0], slow, 4)) >= 2


def test_timing_comes_from_the_measured_suite():
    t = mb.timing_from_results()
    assert "megatron-h200-suite.jsonl" in t.source
    assert 5 < t.overhead_s < 40 and 1 < t.step_ratio < 3 and 5 < t.oom_s < 40


def _line(name, status, predicted_fits, predicted_peak, device_peak=None, failure=None, allocated=None):
    details = {"model_run": {"layers": int(name.split(mb.SEP)[1][1:])},
               "prediction_for_model_run": {"fits": predicted_fits, "peak_memory_gib": predicted_peak - 1,
                                            "memory_gib": {"usable": 139.8, "allocated": predicted_peak - 11,
                                                           "device_peak": predicted_peak}}}
    if device_peak is not None:
        details["memory_gib_per_rank"] = {"0": {"peak_allocated": allocated or device_peak - 11,
                                                "peak_reserved": device_peak - 9.2, "device_peak": device_peak},
                                          "1": {"peak_allocated": (allocated or device_peak - 11) - 1,
                                                "peak_reserved": device_peak - 10, "device_peak": device_peak - 1}}
    r = TrialResult(status=status, kind="measured", source="test", failure_class=failure, details=details,
                    peak_memory_gib=device_peak)
    return {"trial": name, "gpus": 2, **r.to_dict()}


def test_report_counts_false_fits_false_refusals_and_the_peak_error(tmp_path, capsys):
    lines = [_line("a--L6--fit", "ok", True, 132.0, device_peak=130.0),
             _line("a--L7--up", "failed", False, 150.0, failure="cuda_oom"),
             _line("b--L10--fit", "ok", True, 135.0, device_peak=136.0),
             _line("b--L11--up", "ok", False, 141.0, device_peak=138.5),             # a false refusal
             _line("c--L4--fit", "failed", True, 138.0, failure="cuda_oom"),           # a false fit
             _line("c--L5--up", "failed", False, 146.0, failure="cuda_oom"),
             _line("d--L8--fit", "failed", True, 120.0, failure="crash"),              # says nothing about memory
             _line("d--L9--up", "failed", False, 141.0, failure="cuda_oom")]
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert mb.main(["--report", str(path)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    v = json.loads(out[-1])
    assert (v["false_fits"], v["false_refusals"], v["refusals"], v["other_failures"]) == (1, 1, 4, 1)
    assert v["false_fit_trials"] == ["c L4"] and v["false_refusal_trials"] == ["b L11"]
    assert v["false_refusal_rate"] == 0.25 and v["pass"] is False
    assert v["median_device_peak_error"] == pytest.approx(statistics_median([2 / 130, 1 / 136]), abs=1e-4)
    assert v["outside_pytorch_gib"] == {"median": 9.2, "max": 9.2}
    assert any("b" in line and "L 11" in line and "ran" in line for line in out)


def statistics_median(xs):
    import statistics
    return statistics.median(xs)


def test_report_passes_a_clean_boundary(tmp_path):
    lines = [_line("a--L6--fit", "ok", True, 132.0, device_peak=130.0),
             _line("a--L7--up", "failed", False, 150.0, failure="cuda_oom")]
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    v = mb.report([str(path)], out=open("/dev/null", "w"))
    assert v["pass"] is True and v["median_device_peak_error"] == pytest.approx(2 / 130, abs=1e-4)


def test_report_reads_stored_runner_results():
    """The older suites' lines (runner facts under `detail`) read too."""
    v = mb.report([str(mb.ROOT / "benchmarks/results/megatron-h200-suite.jsonl")], out=open("/dev/null", "w"))
    assert v["trials"] == 9 and v["refusals"] == 1 and v["false_refusals"] == 0


def test_rejudge_judges_the_current_plan_by_stored_runs(capsys):
    """The stored H200 boundary runs judged with the current model's plan: every planned trial but the
    listed ones was measured, nothing predicted to fit ran out of memory, and the verdict withholds a pass
    while a planned trial is unmeasured."""
    import glob
    files = sorted(glob.glob(str(mb.ROOT / "benchmarks" / "results" / "memory-boundary-h200-*.jsonl")))
    v = mb.rejudge(files)
    planned = mb.plan_trials()[0]
    assert v["judged"] + len(v["not_measured"]) + v["other_failures"] == len(planned)
    assert v["judged"] >= 20 and v["false_fits"] == 0
    assert v["median_allocated_error"] < 0.01
    assert v["pass"] is (not v["not_measured"] and v["false_refusal_rate"] <= mb.MAX_FALSE_REFUSAL_RATE
                         and v["median_device_peak_error"] <= mb.MAX_MEDIAN_PEAK_ERROR)
    assert "the current model's plan" in capsys.readouterr().out
