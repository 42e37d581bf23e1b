"""A trial records the cost model that priced it: a study resumed after the model changed tells its earlier
predictions from today's (tune show's `figures` column and a footnote), instead of ranking both as one."""
from types import SimpleNamespace

import optuna

import tuner.space_cache
from tuner.cli import main
from tuner.report import EARLIER_MODEL, _kind_of, format_table, ranked_rows
from tuner.space_cache import cost_model_digest


def test_a_prediction_by_another_cost_model_says_so(tmp_path, capsys, monkeypatch):
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert main(["--model", "qwen3-30b-a3b", "--gpu", "h200", "--gpus", "2", "--trials", "2", "--storage", url,
                 "--out", str(tmp_path / "out"), "--no-progress", "--top", "0"]) == 0
    capsys.readouterr()
    study = optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url)
    assert {t.user_attrs.get("cost_model") for t in study.get_trials()} == {cost_model_digest()}
    assert {r.kind for r in ranked_rows(study)} == {"predicted"}
    monkeypatch.setattr(tuner.space_cache, "cost_model_digest", lambda: "0" * 12)   # the model changed since
    rows = ranked_rows(study)
    assert {r.kind for r in rows} == {EARLIER_MODEL}
    assert "the figure an earlier version of the cost model gave" in format_table(rows)


def test_a_trial_that_recorded_no_cost_model_predates_this_one():
    old = SimpleNamespace(result_kind="predicted", cost_model=None)
    measured = SimpleNamespace(result_kind="measured", cost_model=None)
    assert _kind_of(old) == EARLIER_MODEL and _kind_of(measured) == "measured"
