"""Issue 29 (part A): what `tune report` and `tune show` print or write of a hostile study. Stored text lands
escaped for its medium (HTML, a figure's text, the terminal), and a report is replaced whole: a kill at any
point, or a second report into the same folder, never leaves a page pointing at deleted or foreign figures."""
import re
import threading
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.test_report_html import PNG_MAGIC, images, make_study
from tuner.cli import main

# markup, a colour code and a window-title sequence (ESC ] ... BEL): what a peer of a shared study can store
EVIL = '"><script>alert(1)</script>\x1b[31m\x1b]0;owned\x07'
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")   # any control character but a tab or a newline


def hostile_study(storage: Path) -> str:
    """make_study's trials plus one whose every stored text is EVIL, in a study whose configuration is EVIL."""
    name = make_study(storage, "s")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{storage}")
    config = study.user_attrs["config"]
    study.set_user_attr("config", dict(config, model=EVIL, gpus=EVIL, gpu=EVIL, workload=dict(
        config["workload"], seq_len=EVIL, global_batch=EVIL, precision=EVIL, framework=EVIL, cuda_graphs=EVIL)))
    attrs = dict(study.trials[1].user_attrs)
    attrs["result"] = dict(attrs["result"], kind=EVIL, source=EVIL)
    attrs["prediction"] = dict(attrs["prediction"], fit_verdict=EVIL, source=EVIL)
    attrs.update(label=EVIL, rationale=EVIL, learnt=EVIL, proposer=EVIL, backend=EVIL, fail_reason=EVIL)
    study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=12345.0, user_attrs=attrs))
    return name


def run(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---------------------------------------------------------------- item 2: escaped for the medium

@pytest.mark.slow
def test_report_page_holds_no_markup_and_no_control_character_of_a_study(tmp_path, capsys):
    storage = tmp_path / "s.db"
    name = hostile_study(storage)
    out = tmp_path / "out"
    code, _, err = run(["report", "--study", name, "--storage", str(storage), "--out", str(out)], capsys)
    assert code == 0, err
    text = (out / "index.html").read_text()
    assert "<script" not in text.lower() and "&lt;script&gt;alert(1)" in text
    # a terminal's escape codes reach neither the page (someone will `cat` it) nor a figure's text
    assert not CONTROL.search(text), repr(CONTROL.search(text))
    assert "\\x1b[31m" in text
    assert "Glyph" not in err   # matplotlib was never handed a control character to draw


@pytest.mark.parametrize("where", ["hypothesis_weights", "breakdown"])
def test_a_stored_name_is_plain_text_in_a_figure(tmp_path, capsys, where):
    """matplotlib reads $...$ in a label as mathematics: a stored hypothesis or step-term name with an unbalanced
    one was a traceback (exit 1) instead of a report."""
    storage = tmp_path / "s.db"
    name = make_study(storage, "s")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{storage}")
    attrs = dict(study.trials[0].user_attrs)
    hostile = "$\\frac{$ and $x^$"
    if where == "hypothesis_weights":
        attrs["hypothesis_weights"] = {hostile: 1.0, "per_token flex 0.8": 0.5}
    else:
        attrs["prediction"] = dict(attrs["prediction"], breakdown={hostile: 3.0, "compute": 5.0})
    study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=99999.0, user_attrs=attrs))
    out = tmp_path / "out"
    code, _, err = run(["report", "--study", name, "--storage", str(storage), "--out", str(out)], capsys)
    assert code == 0 and "Traceback" not in err, err[-300:]
    for ref in images(out / "index.html"):
        assert (out / ref).read_bytes().startswith(PNG_MAGIC)


def test_show_prints_no_terminal_code_of_a_study(tmp_path, capsys):
    storage = tmp_path / "s.db"
    name = hostile_study(storage)
    for fmt in ("table", "csv", "json"):
        code, out, err = run(["show", "--study", name, "--storage", str(storage), "--format", fmt], capsys)
        assert code == 0, err
        assert "\x1b" not in out and "\x07" not in out, fmt
    # a stored verdict that is not a verdict is read as missing, and one warning names the trial and the field
    code, out, err = run(["show", "--study", name, "--storage", str(storage)], capsys)
    warnings = [line for line in err.splitlines() if line.startswith("tune: warning: trial ")]
    assert code == 0 and any("prediction.fit_verdict" in line for line in warnings), err
    assert "\x1b" not in err and "\x1b" not in out


# ---------------------------------------------------------------- item 5: a report is replaced whole

def _second_study(storage: Path) -> str:
    """Another study whose every figure differs from make_study's: no weights (that figure is left out) and one
    more, faster trial."""
    name = make_study(storage, "other", agent_attrs=False)
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{storage}")
    attrs = dict(study.trials[0].user_attrs)
    attrs["prediction"] = dict(attrs["prediction"], tokens_per_s_per_gpu=20000.0)
    attrs["result"] = dict(attrs["result"], tokens_per_s_per_gpu=20000.0, peak_memory_gib=90.0)
    study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=20000.0, user_attrs=attrs))
    return name


class Killed(BaseException):
    """Stands for kill -9: nothing after it runs (a BaseException, so no `except Exception` goes on)."""


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}


def _draw_each_figure_once(monkeypatch) -> None:
    """tuner.report_figures' drawings memoized by their arguments: a report written again draws nothing anew (what
    the kill test checks is the order of the files' changes, not matplotlib, about 1 s a report)."""
    from tuner import report_figures

    memo: dict = {}

    def once(name, real):
        def draw(*args, **kwargs):
            key = (name, repr(args), repr(sorted(kwargs.items())))
            if key not in memo:
                memo[key] = real(*args, **kwargs)
            return memo[key]
        return draw

    for name in ("best_over_trials", "interval_vs_measured", "pareto", "breakdown", "hypothesis_weights"):
        monkeypatch.setattr(report_figures, name, once(name, getattr(report_figures, name)))


@pytest.mark.slow
def test_a_report_killed_at_any_step_leaves_one_whole_page(tmp_path, monkeypatch):
    """Kill the second report into a folder before each file it renames into place or removes, in turn: the page
    there is then the first report's with its own figures, byte for byte, or the second's with all of its own."""
    import os

    from tuner.report_html import write_report

    storage = tmp_path / "s.db"
    first = optuna.load_study(study_name=make_study(storage, "first"), storage=f"sqlite:///{storage}")
    second = optuna.load_study(study_name=_second_study(storage), storage=f"sqlite:///{storage}")
    out = tmp_path / "out"
    out.mkdir()
    write_report(first, out)
    before = _files(out)
    old_page = before["index.html"]
    assert len(images(out / "index.html")) == 6

    _draw_each_figure_once(monkeypatch)   # every attempt below draws the same figures of the second study
    real_replace, real_unlink = os.replace, os.unlink
    for step in range(40):
        # back to the first report's folder, then the second report killed before its step-th change
        for p in out.iterdir():
            real_unlink(p)
        for n, data in before.items():
            (out / n).write_bytes(data)
        calls = {"n": 0}

        def dying(real):
            def op(*args, **kwargs):
                calls["n"] += 1
                if calls["n"] == step + 1:
                    raise Killed()
                return real(*args, **kwargs)
            return op

        monkeypatch.setattr(os, "replace", dying(real_replace))
        monkeypatch.setattr(os, "unlink", dying(real_unlink))
        try:
            write_report(second, out)
            finished = True
        except Killed:
            finished = False
        finally:
            monkeypatch.setattr(os, "replace", real_replace)
            monkeypatch.setattr(os, "unlink", real_unlink)
        page = (out / "index.html").read_bytes()
        refs = images(out / "index.html")
        for ref in refs:
            assert (out / ref).is_file(), f"killed at step {step}: the page points at a missing {ref}"
            assert (out / ref).read_bytes().startswith(PNG_MAGIC)
        if page == old_page:
            for ref in refs:
                assert (out / ref).read_bytes() == before[ref], f"killed at step {step}: the old page shows a new {ref}"
        else:
            assert len(refs) == 5 and "20,000 tokens/s/GPU" in page.decode(), f"killed at step {step}: a page of neither"
        if finished:
            break
    else:
        pytest.fail("the report never finished")
    assert step >= 6   # it was killed between figures, at the page and after it
    # once finished, only the second report's files are left: its page and the figures it points at
    assert sorted(p.name for p in out.iterdir()) == sorted(["index.html", *images(out / "index.html")])


@pytest.mark.slow
def test_two_reports_into_one_folder_leave_a_page_whose_figures_exist(tmp_path, monkeypatch):
    """A report that removes the figures its page does not show must not remove another report's, written
    meanwhile into the same folder: the second waits for the first."""
    import tuner.report_html as report_html

    storage = tmp_path / "s.db"
    first = optuna.load_study(study_name=make_study(storage, "first"), storage=f"sqlite:///{storage}")
    second = optuna.load_study(study_name=_second_study(storage), storage=f"sqlite:///{storage}")
    out = tmp_path / "out"
    out.mkdir()
    paused, resume = threading.Event(), threading.Event()
    real_render = report_html.render_page

    def slow_render(study, *args, **kwargs):
        if study.study_name == "first":   # the first report has drawn its figures, not yet placed its page
            paused.set()
            resume.wait(30)
        return real_render(study, *args, **kwargs)

    monkeypatch.setattr(report_html, "render_page", slow_render)
    errors = []

    def report(study):
        try:
            report_html.write_report(study, out)
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    a = threading.Thread(target=report, args=(first,))
    a.start()
    assert paused.wait(60)
    b = threading.Thread(target=report, args=(second,))
    b.start()
    b.join(3)   # long enough to draw and place a whole report, had it not waited
    resume.set()
    a.join(60)
    b.join(60)
    assert not errors, errors
    refs = images(out / "index.html")
    assert refs and all((out / ref).is_file() for ref in refs), (refs, sorted(p.name for p in out.iterdir()))


# ---------------------------------------------------------------- malformed values are left out of the figures

@pytest.mark.slow
@pytest.mark.parametrize("attr, value", [
    ("prediction.tokens_per_s_per_gpu", "fast"), ("prediction.breakdown", {"compute": "1.5 s"}),
    ("prediction.interval", {"low": "a", "high": 2.0}), ("prediction.interval.quantiles", ["5%", None]),
    ("hypothesis_weights", {"per_token flex 0.8": "heavy"}), ("layout", {"tp": "four"}), ("prediction", [1, 2]),
    ("result.step_time_s", "13 s"),
])
def test_a_malformed_stored_value_is_left_out_of_the_report(tmp_path, capsys, attr, value):
    storage = tmp_path / "s.db"
    good = optuna.load_study(study_name=make_study(storage, "s"), storage=f"sqlite:///{storage}")
    attrs = dict(good.trials[1].user_attrs)   # the measured trial, with an interval and weights
    key, _, rest = attr.partition(".")
    if not rest:
        attrs[key] = value
    elif rest == "interval.quantiles":
        attrs[key] = dict(attrs[key], interval=dict(attrs[key]["interval"], quantiles=value))
    else:
        attrs[key] = dict(attrs[key], **{rest: value})
    # a study of tune's whose first trials carry the value (the best one: every figure draws it; a pruned and a
    # failed one), then make_study's
    study = optuna.create_study(study_name="bad", storage=f"sqlite:///{storage}", direction="maximize")
    study.set_user_attr("config", good.user_attrs["config"])
    for state, v in ((TrialState.COMPLETE, 99999.0), (TrialState.PRUNED, None), (TrialState.FAIL, None)):
        study.add_trial(optuna.trial.create_trial(state=state, value=v, user_attrs=attrs))
    for t in good.trials:
        study.add_trial(optuna.trial.create_trial(state=t.state, value=t.value, user_attrs=t.user_attrs))
    out = tmp_path / "out"
    code, _, err = run(["report", "--study", "bad", "--storage", str(storage), "--out", str(out)], capsys)
    assert code == 0 and "Traceback" not in err, err[-300:]
    refs = images(out / "index.html")
    assert len(refs) == 6 and all((out / ref).read_bytes().startswith(PNG_MAGIC) for ref in refs)
