"""`tune report`: a study as one HTML page and its PNG figures, and its answers to bad input."""
import re
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SECTIONS = ("1. Best tokens/s/GPU over trials", "2. Predicted interval vs measured, per trial", "3. Pareto fronts",
            "4. Where the time goes: the top layouts", "5. Hypothesis weights over trials", "6. The agent's reasons")


def make_study(storage: Path, name: str, agent_attrs: bool = True) -> str:
    """Trials as `tune` stores them: two predicted, one measured, one pruned, one failed when measured. With
    `agent_attrs`, two carry a prediction interval and hypothesis weights, and one what the agent learnt."""
    from cost_model.nouns.case import Case
    from cost_model.nouns.hardware import load_gpu
    from cost_model.nouns.layout_codec import layout_from_values, layout_values
    from cost_model.nouns.model_spec import load_model
    from cost_model.predict import predict
    from cost_model.nouns.workload import Workload
    from experiments.predicted_runner import PredictedRunner
    from experiments.runner import TrialResult, TrialSpec
    from tuner.study import StudyConfig, load_or_create, open_storage

    config = StudyConfig(load_model("qwen3.6-35b-a3b"), load_gpu("h200"), 8, Workload())
    study = load_or_create(open_storage(f"sqlite:///{storage}"), name, config)
    layouts = [layout_from_values({"ep": ep, "recompute_granularity": "full", "recompute_method": "uniform",
                                   "recompute_num_layers": n}, 8, 8192) for ep, n in ((8, 1), (4, 1), (8, 2), (2, 1))]

    def attrs(layout, number, **extra):
        prediction = predict(config.model, config.gpu, config.workload, layout).to_dict()
        if agent_attrs and number < 2:
            central = prediction["tokens_per_s_per_gpu"]
            prediction["interval"] = {"low": 0.8 * central, "median": central, "high": 1.1 * central,
                                      "quantiles": [0.05, 0.95], "hypotheses": 3}
            extra["hypothesis_weights"] = {"per_layer_pass flex 0.8": 1.0 + number, "per_token flex 0.8": 1.0,
                                           "per_step flex 1": 0.5 - 0.2 * number}
        return {"layout": {"world_size": 8, **layout_values(layout)}, "label": layout.long_label,
                "layout_key": layout.key(), "prediction": prediction, "backend": "predict", "proposer": "agent",
                "rationale": f"rationale of trial {number}: exploit the best adjusted prediction", **extra}

    def run(layout):
        return PredictedRunner().run(TrialSpec(Case(config.model, config.gpu, config.workload, layout), 20, (5, 19)))

    predicted = run(layouts[0])
    measured = TrialResult(status="ok", kind="measured", source="test runner", tokens_per_s_per_gpu=9876.0,
                           step_time_s=13.25, peak_memory_gib=120.5, mfu=0.17, usd_per_million_tokens=0.222)
    oom = TrialResult(status="failed", kind="measured", source="test runner", failure_class="cuda_oom", detail="CUDA OOM")
    learnt = {"learnt": "measured 0.83 x the prediction: the EP4 family runs slower than modelled"} if agent_attrs else {}
    trials = [
        (TrialState.COMPLETE, predicted.tokens_per_s_per_gpu, attrs(layouts[0], 0, result=predicted.to_dict())),
        (TrialState.COMPLETE, 9876.0, attrs(layouts[1], 1, result=measured.to_dict(), backend="megatron", **learnt)),
        (TrialState.COMPLETE, run(layouts[2]).tokens_per_s_per_gpu, attrs(layouts[2], 2, result=run(layouts[2]).to_dict())),
        (TrialState.PRUNED, None, attrs(layouts[0], 3, prune_reason="already evaluated in this study")),
        (TrialState.FAIL, None, attrs(layouts[3], 4, result=oom.to_dict(), fail_reason="cuda_oom: CUDA OOM")),
    ]
    for state, value, user_attrs in trials:
        study.add_trial(optuna.trial.create_trial(state=state, value=value, user_attrs=user_attrs))
    return name


def images(page: Path) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', page.read_text())


@pytest.mark.slow
def test_report_writes_a_page_whose_figures_all_exist(tmp_path, capsys):
    storage = tmp_path / "s.db"
    name = make_study(storage, "agent-study")
    out = tmp_path / "report" / "nested"
    assert main(["report", "--study", name, "--storage", str(storage), "--out", str(out)]) == 0
    page = out / "index.html"
    assert capsys.readouterr().out.strip() == str(page)
    text = page.read_text()
    for heading in SECTIONS:
        assert f"<h2>{heading}</h2>" in text
    refs = images(page)
    # each figure is named by its content (a report is replaced whole: tests/test_hostile_report.py)
    assert sorted(re.sub(r"-[0-9a-f]{12}\.png$", ".png", ref) for ref in refs) == sorted(
        ["best.png", "interval.png", "pareto-memory.png", "pareto-cost.png", "breakdown.png", "weights.png"])
    for ref in refs:
        assert "/" not in ref and (out / ref).read_bytes().startswith(PNG_MAGIC) and (out / ref).stat().st_size > 1000
    assert "<script" not in text.lower() and "http://" not in text and "https://" not in text
    # Every figure says what it is: the measured trial's and a predicted trial's values, labelled.
    assert "9,876 tokens/s/GPU (measured)</span>" in text
    assert re.search(r"[\d,]+ tokens/s/GPU \(predicted\)</span>", text)
    assert "best measured 9,876 tokens/s/GPU (trial 1)" in text
    assert "4 trials predicted, 2 with a predicted interval, 1 measured" in text
    assert "rationale of trial 4: exploit" in text and "the EP4 family runs slower than modelled" in text
    assert "already evaluated in this study" in text and "cuda_oom: CUDA OOM" in text
    assert "3 trials carry weights" not in text and "2 trials carry weights" in text
    # The table has one row per trial, in trial order, with state and kind.
    rows = re.findall(r'<tr><td class="num">(\d+)</td><td>(\w+)</td>', text)
    assert rows == [("0", "complete"), ("1", "complete"), ("2", "complete"), ("3", "pruned"), ("4", "failed")]


def test_without_agent_attrs_the_weights_figure_is_a_note(tmp_path):
    storage = tmp_path / "s.db"
    name = make_study(storage, "plain", agent_attrs=False)
    out = tmp_path / "out"
    (out).mkdir()
    (out / "weights.png").write_bytes(b"stale figure of an earlier report")
    assert main(["report", "--study", name, "--storage", str(storage), "--out", str(out)]) == 0
    text = (out / "index.html").read_text()
    assert "no hypothesis weights recorded (proposer agent)" in text
    assert not any(ref.startswith("weights") for ref in images(out / "index.html"))
    assert not (out / "weights.png").exists()
    assert "0 with a predicted interval" in text and "No trial records a predicted interval" in text
    for ref in images(out / "index.html"):
        assert (out / ref).read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("case", ["missing study", "no study flag", "out is a file", "out under a file"])
def test_bad_input_ends_in_one_line(tmp_path, capsys, case):
    storage = tmp_path / "s.db"
    name = make_study(storage, "s", agent_attrs=False)
    if case == "no study flag":   # a storage of one study is reported without --study; of two, it must be named
        make_study(storage, "s2", agent_attrs=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    argv = {"missing study": ["--study", "nope", "--out", str(tmp_path / "o")],
            "no study flag": ["--out", str(tmp_path / "o")],
            "out is a file": ["--study", name, "--out", str(blocker)],
            "out under a file": ["--study", name, "--out", str(blocker / "report")]}[case]
    assert main(["report", "--storage", str(storage), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tune: error: ") and len(err.strip().splitlines()) == 1
    if case == "missing study":
        assert "no study named 'nope'" in err and not (tmp_path / "o").exists()


def test_pareto_optimal_points():
    from tuner.report_figures import pareto_optimal

    # (cost, tokens/s): (2, 5) is beaten by (1, 10); the rest trade cost against speed.
    assert pareto_optimal([(1, 10), (2, 5), (0.5, 3), (2, 12)]) == [True, False, True, True]
    assert pareto_optimal([(1, 10), (1, 10)]) == [True, True]


def test_run_parser_takes_the_new_proposers_and_a_gpu_hour_budget():
    from tuner.options import CliError, run_parser

    base = ["--model", "m", "--gpu", "g"]
    assert run_parser().parse_args(base).proposer == "agent"
    assert run_parser().parse_args(base).gpu_hours is None
    for proposer in ("agent", "tpe", "gp", "random"):
        assert run_parser().parse_args(base + ["--proposer", proposer]).proposer == proposer
    assert run_parser().parse_args(base + ["--gpu-hours", "2.5"]).gpu_hours == 2.5
    with pytest.raises(CliError):
        run_parser().parse_args(base + ["--proposer", "cmaes"])


def test_report_refuses_a_planted_link_and_leaves_its_target_alone(tmp_path, capsys):
    storage = tmp_path / "s.db"
    name = make_study(storage, "s", agent_attrs=False)
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (out / "index.html").symlink_to(victim)
    assert main(["report", "--study", name, "--storage", str(storage), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is a symbolic link" in err and len(err.strip().splitlines()) == 1
    assert victim.read_text() == "keep me"


@pytest.mark.slow
def test_a_stored_script_is_shown_as_text(tmp_path):
    storage = tmp_path / "s.db"
    name = make_study(storage, "s", agent_attrs=False)
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{storage}")
    config = dict(study.user_attrs["config"], gpus='"><script>alert(1)</script>')
    study.set_user_attr("config", config)
    trial = study.trials[0]
    attrs = dict(trial.user_attrs)
    attrs["result"] = dict(attrs["result"], kind='"><script>alert(2)</script>')
    study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=1.0, user_attrs=attrs))
    out = tmp_path / "out"
    assert main(["report", "--study", name, "--storage", str(storage), "--out", str(out)]) == 0
    text = (out / "index.html").read_text()
    assert "<script" not in text.lower() and "&lt;script&gt;alert(1)" in text


@pytest.mark.slow
def test_the_report_leads_with_the_figure_the_table_prints(tmp_path, capsys):
    """A predicted study: the page's best, its figures' best and the ranked table's first row are one figure (the
    median over the hypotheses), not the cost model's single point estimate in some places."""
    storage = tmp_path / "s.db"
    assert main(["--model", "llama3-8b", "--gpu", "h200", "--trials", "4", "--storage", str(storage),
                 "--study", "one", "--no-progress", "--top", "1"]) == 0
    table = capsys.readouterr().out
    first = re.search(r"\n\s*1\s+\d+\s+.+?\s{2}([\d,]+)\s", table).group(1)
    out = tmp_path / "r"
    assert main(["report", "--study", "one", "--storage", str(storage), "--out", str(out)]) == 0
    text = (out / "index.html").read_text()
    assert f"{first} tokens/s/GPU (predicted)" in text
    assert f"best predicted {first} tokens/s/GPU" in text


def test_equal_weights_name_no_heaviest_hypothesis():
    """A predicted-only study never moves the weights: the caption says they are equal, not that one leads."""
    from types import SimpleNamespace

    from tuner.report_figures import hypothesis_weights

    equal = {"per_layer_pass flex 0.6": 1.0, "per_token flex 0.8": 1.0, "shipped": 1.0}
    drawn = hypothesis_weights([SimpleNamespace(number=n, weights=equal) for n in range(3)])
    assert "all 3 weigh the same (33% each)" in drawn.caption and "heaviest" not in drawn.caption
    moved = hypothesis_weights([SimpleNamespace(number=0, weights={**equal, "shipped": 2.0})])
    assert "the heaviest is shipped (50%)" in moved.caption


def test_an_interrupted_report_leaves_no_figure_without_a_page(tmp_path, capsys, monkeypatch):
    from tuner import report_html

    storage = tmp_path / "s.db"
    name = make_study(storage, "agent-study")
    out = tmp_path / "report"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(report_html, "render_page", interrupted)
    assert main(["report", "--study", name, "--storage", str(storage), "--out", str(out)]) == 130
    assert list(out.iterdir()) == []
    assert capsys.readouterr().err.strip() == "tune: report interrupted; nothing it had not finished was written"
