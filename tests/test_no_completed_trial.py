"""The predict backend spends no trial on a borderline layout its own verdict fails for certain, says so, and refuses
in one line when that leaves none; a predicted failure says it was predicted; a run that leaves its study with no
completed trial says so in one line and exits 1."""
import re
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState

from cost_model.nouns.case import Case
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.workload import Workload
from experiments.predicted_runner import PredictedRunner
from experiments.runner import TrialResult, TrialSpec
from tuner.cli import main
from tuner.options import CliError
from tuner.study import fail_reason_of
from tuner.study_commands import none_completed, runnable_by_prediction

ROOT = Path(__file__).resolve().parents[1]
MIXTRAL = str(ROOT / "benchmarks" / "models" / "mixtral-8x7b" / "config.json")
RUN = ["--model", MIXTRAL, "--gpu", "h200", "--gpus", "2", "--no-progress", "--top", "0"]


def test_every_candidate_borderline_over_the_limit_is_one_line_and_no_study(tmp_path, capsys):
    storage = tmp_path / "s.db"
    assert main([*RUN, "--trials", "3", "--storage", str(storage)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tune: error: no layout of mixtral-8x7b is predicted to fit on 2 x H200")
    assert "borderline" in err[0] and "--backend megatron|slime" in err[0]
    assert not storage.exists()   # nothing recorded: a rerun burns no trial either


def test_the_borderline_layouts_over_the_limit_are_left_out_and_the_rest_complete(tmp_path, capsys):
    storage = tmp_path / "s.db"
    assert main([*RUN, "--seq-len", "4096", "--trials", "3", "--storage", str(storage)]) == 0
    err = capsys.readouterr().err
    left = re.search(r"; ([\d,]+) more borderline ones predicted over the limit are left out", err)
    assert left and int(left.group(1).replace(",", "")) > 0, err
    study = optuna.load_study(study_name="mixtral-8x7b-h200-x2", storage=f"sqlite:///{storage}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    for t in study.trials:   # each ran under the limit by its point prediction
        p = t.user_attrs["prediction"]
        assert p["peak_memory_gib"] <= p["gpu_memory_gib"]


def test_a_predicted_failure_says_it_was_predicted():
    case = Case(load_model("qwen3-30b-a3b"), load_gpu("h200"), Workload(), Layout(world_size=1))
    result = PredictedRunner().run(TrialSpec(case, steps=20, window=(5, 19)))
    assert result.status == "failed" and result.kind == "predicted" and result.failure_class == "cuda_oom"
    reason = fail_reason_of(result)
    assert reason.startswith("predicted out of GPU memory (nothing ran): GPU memory ") and "cuda_oom" not in reason
    measured = TrialResult(status="failed", kind="measured", source="x", failure_class="cuda_oom", detail="CUDA OOM")
    assert fail_reason_of(measured) == "cuda_oom: CUDA OOM"


def test_a_measuring_backend_keeps_its_borderline_candidates():
    over = SimpleNamespace(under_limit=False, fit_probability=0.4, peak_memory_gib=140.0)
    candidates = [("layout", over)]
    assert runnable_by_prediction(candidates, None, SimpleNamespace(figures="measured")) == (candidates, 0)
    config = SimpleNamespace(model=SimpleNamespace(display_name="M"), world_size=2,
                             gpu=SimpleNamespace(display_name="G"))
    with pytest.raises(CliError, match="no layout of M is predicted to fit on 2 x G"):
        runnable_by_prediction([(SimpleNamespace(long_label="L"), SimpleNamespace(
            under_limit=False, fit_probability=0.4, peak_memory_gib=140.0, gpu_memory_gib=139.8))], config,
            SimpleNamespace(figures="predicted"))


def test_no_completed_trial_is_one_line_naming_the_last_reason():
    study = optuna.create_study(study_name="s")
    assert none_completed(study).startswith("no trial of study 's' has completed (0 trials")
    trial = study.ask()
    trial.set_user_attr("fail_reason", "hang: no step for 120 s")
    study.tell(trial, state=TrialState.FAIL)
    line = none_completed(study)
    assert line == ("no trial of study 's' has completed (1 trials, 1 failed or pruned; the last, trial 0: hang: no "
                    "step for 120 s): nothing to rank or export")
    study.tell(study.ask(), 1000.0)
    assert none_completed(study) is None


def test_the_help_says_what_each_exit_code_means(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "1: none of its trials has completed" in out and "2: bad input" in out
