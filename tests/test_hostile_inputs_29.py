"""Issue 29, point 6: errors about a file name the file, line and field but never echo its content; a batch
stream is bounded; a large search space says what it is doing within seconds, and an error after that progress
is still one line on stderr."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tuner.cli import main

ROOT = Path(__file__).resolve().parents[1]
# A line of another file (a password line): what a parser may read as a value, and no error may show.
SECRET = "root:x:0:0:SECRET-7f3a:/root:/bin/bash"
GOOD = {"model": "qwen3.6-35b-a3b", "gpu": "h200", "layout": {"ep": 8}}


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


# ---------------------------------------------------------------- errors name the field, never the content

@pytest.mark.parametrize("request_, field", [
    ({**GOOD, "gpu": SECRET}, "GPU"),
    ({**GOOD, "precision": SECRET}, "precision"),
    ({**GOOD, "routing": SECRET}, "routing"),
    ({**GOOD, "framework": SECRET}, "framework"),
    ({**GOOD, "gpus": SECRET}, "gpus"),
    ({**GOOD, "stack": SECRET}, "stack"),
    ({**GOOD, "stack_fix": [SECRET]}, "stack_fix"),
    ({**GOOD, SECRET: 1}, "request key"),
    ({**GOOD, "layout": {"tp": SECRET}}, "tp"),
    ({**GOOD, "layout": {SECRET: 1}}, "layout key"),
    ({**GOOD, "layout": {"ep": 8, "dispatcher": SECRET}}, "dispatcher"),
    ({**GOOD, "layout": {"ep": 8, "exp_avg_dtype": SECRET}}, "exp_avg_dtype"),
    ({**GOOD, "layout": {"ep": 8, "recompute_granularity": SECRET}}, "recompute_granularity"),
    ({**GOOD, "layout": {"ep": 8, "pipeline_model_parallel_layout": SECRET}}, "pipeline layout"),
    ({**GOOD, "seq_len": SECRET}, "seq_len"),
    ({**GOOD, "cuda_graphs": SECRET}, "cuda_graphs"),
])
def test_batch_errors_name_line_and_field_not_content(tmp_path, capsys, request_, field):
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(request_) + "\n")
    assert main(["predict", "--batch", str(path)]) == 1
    captured = capsys.readouterr()
    out = [json.loads(line) for line in captured.out.splitlines()]
    assert "error" not in out[0] and out[1]["line"] == 2
    assert out[1]["error"].startswith("line 2: ") and field in out[1]["error"], out[1]
    assert "SECRET" not in captured.out + captured.err


def one_error_line(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


def test_recipe_that_is_another_file_is_not_echoed(tmp_path, capsys):
    passwd = tmp_path / "passwd"
    passwd.write_text(SECRET + "\n")            # YAML reads a line of text as one string
    line = one_error_line(capsys, ["predict", "--recipe", str(passwd)])
    assert str(passwd) in line and "mapping of recipe fields" in line and "SECRET" not in line
    word = tmp_path / "token"
    word.write_text("hunter2\n")                 # a one-word file: not even a short word is shown at the top
    line = one_error_line(capsys, ["predict", "--recipe", str(word)])
    assert "got text" in line and "hunter2" not in line


def test_recipe_field_value_is_not_echoed(tmp_path, capsys):
    recipe = yaml.safe_load((ROOT / "tests/fixtures/reference_recipes/attune-tp1-pp1-ep8.yaml").read_text())
    recipe["gpu"]["type"] = SECRET
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    line = one_error_line(capsys, ["predict", "--recipe", str(path)])
    assert "GPU" in line and "SECRET" not in line


def test_config_json_values_are_not_echoed(tmp_path, capsys):
    cfg = json.loads((ROOT / "tests/fixtures/qwen3_30b_a3b_config.json").read_text())
    for field, value in (("model_type", SECRET), ("hidden_size", SECRET), ("num_hidden_layers", [SECRET])):
        folder = tmp_path / field
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**cfg, field: value}))
        line = one_error_line(capsys, ["predict", "--model", str(folder), "--gpu", "h200", "--layout", "ep=8"])
        assert "config.json" in line and field in line and "SECRET" not in line, line


def test_loss_curve_header_is_not_echoed(tmp_path, capsys):
    curve = tmp_path / "curve.csv"
    curve.write_text(SECRET + "\n1,2\n")
    code = main(["check-convergence", "--candidate", str(curve), "--reference", str(curve)])
    err = capsys.readouterr().err
    assert code == 2 and "curve.csv" in err and "header" in err and "secret" not in err.lower(), err


def test_cluster_file_values_are_not_echoed(tmp_path):
    from experiments.slime.cluster import ClusterError, load_cluster

    for text in (f"slime_dir: '{SECRET}'\n", f"env:\n  BAD: \"$(cat {SECRET})\"\n", f"env:\n  '{SECRET}': 1\n"):
        path = tmp_path / "cluster.yaml"
        path.write_text(text)
        with pytest.raises(ClusterError) as info:
            load_cluster(str(path))
        assert "cluster.yaml" in str(info.value) and "SECRET" not in str(info.value), str(info.value)


def test_shown_keeps_a_short_word_and_describes_the_rest():
    from cost_model.nouns.names import shown

    assert shown("a100") == "'a100'" and shown(8) == "8" and shown(None) == "null" and shown(float("nan")) == "NaN"
    assert shown(SECRET) == f"a string of {len(SECRET)} characters"
    assert shown("x" * 25) == "a string of 25 characters"      # a long word may be a key or a token
    assert shown([1, 2]) == "a list of 2 items" and shown(10 ** 40) == "an integer too long to show"


# ---------------------------------------------------------------- a batch stream is bounded

STREAM_BOUND_S = 60   # generous: the CLI's imports take seconds on a loaded machine


def batch_from(source) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", "predict", "--batch", "-"], stdin=source,
                          capture_output=True, text=True, env=env(), cwd=ROOT, timeout=STREAM_BOUND_S)


def test_batch_from_dev_zero_ends_with_one_line_naming_the_line():
    with open("/dev/zero", "rb") as zeros:      # NUL bytes without a line end, without end
        proc = batch_from(zeros)
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode != 0 and len(out) == 1, proc.stdout[:300]
    assert out[0]["line"] == 1 and "not text" in out[0]["error"]


@pytest.mark.slow
def test_batch_of_endless_blank_lines_ends():
    # `yes ''`: every line blank, so no request is ever counted; it was read silently forever
    feeder = subprocess.Popen(["yes", ""], stdout=subprocess.PIPE)
    try:
        proc = batch_from(feeder.stdout)
    finally:
        feeder.kill()
        feeder.wait()
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode != 0 and len(out) == 1, proc.stdout[:300]
    assert out[0]["line"] > 1 and "lines in one batch" in out[0]["error"] and f"line {out[0]['line']}" in out[0]["error"]


# ---------------------------------------------------------------- a large space reports progress

# A guard against a hang only: the verdict must not depend on the machine's speed (how soon the line comes on an idle
# machine, about 2 s, is benchmarks/scale.py's to print).
PROGRESS_BOUND_S = 300


@pytest.mark.slow
def test_a_huge_space_shows_counts_and_rate_within_seconds(tmp_path):
    """4,096 GPUs take minutes to score: a counts line (how many scored, how fast) comes while it scores, not only
    at the end (tune shows it after PROGRESS_AFTER_S of scoring)."""
    import select

    start = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "tuner", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--gpus",
                          "4096", "--trials", "1", "--storage", str(tmp_path / "s.db")],
                         cwd=tmp_path, env=env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    lines = []
    try:
        while time.monotonic() - start < PROGRESS_BOUND_S and not any("/s)" in line for line in lines):
            ready, _, _ = select.select([p.stdout], [], [], 1)
            if ready:
                lines.append(p.stdout.readline())
    finally:
        p.kill()
        p.wait()
    assert lines and "scoring the search space" in lines[0] and "4096 x H200" in lines[0], lines
    counts = [line for line in lines if "/s)" in line]
    assert counts and "scored layouts: " in counts[0] and "may fit" in counts[0], lines
    assert not any(line.startswith("trial ") for line in lines), lines   # it came before scoring ended


# tune with its progress counts shown from the first (the shipped tune waits PROGRESS_AFTER_S, 2 s, then one a while)
TUNE_SAYING_PROGRESS_AT_ONCE = ("import sys, tuner.progress as p; "
                                "p.PROGRESS_AFTER_S = p.PROGRESS_EVERY_S = p.PROGRESS_LOG_EVERY_S = 0.0; "
                                "from tuner.cli import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.slow
def test_an_error_after_progress_is_one_line_on_stderr(tmp_path):
    """A space scored with progress shown before tune can say that nothing fits (DeepSeek-V3 on 8 x H100 scores for
    seconds before it does; here the counts are shown from the first, so the verdict does not depend on the
    machine's speed): stderr holds that one line, the progress went to stdout."""
    proc = subprocess.run([sys.executable, "-c", TUNE_SAYING_PROGRESS_AT_ONCE, "--model", "deepseek-v3", "--gpu", "h100",
                           "--gpus", "3", "--storage", str(tmp_path / "s.db")], cwd=tmp_path, env=env(), text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 2
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("tune: error: no layout of DeepSeek-V3 fits on 3 x H100"), err
    assert "scored layouts: " in proc.stdout, proc.stdout    # the progress was shown, on stdout


def test_weighing_a_space_reports_progress(monkeypatch, capsys):
    """After the scoring, the agent predicts the space's layouts under each hypothesis (minutes for hundreds of
    GPUs, silent before): that step reports its counts and rate too."""
    from cost_model.nouns.hardware import load_gpu
    from cost_model.nouns.model_spec import load_model
    from cost_model.nouns.stack import Stack
    from cost_model.nouns.workload import Workload
    from experiments.predicted_runner import PredictedRunner
    from search_space.enumerate import SpaceOptions
    from tuner import progress, study_commands
    from tuner.study import StudyConfig

    config = StudyConfig(load_model("qwen3-30b-a3b"), load_gpu("h200"), 2, Workload(seq_len=4096, global_batch=16),
                         Stack(), SpaceOptions(), steps=10, window=(2, 9))
    runner = PredictedRunner()
    scored = study_commands.score_space(config, runner)
    for name in ("PROGRESS_AFTER_S", "PROGRESS_LOG_EVERY_S", "PROGRESS_EVERY_S"):
        monkeypatch.setattr(progress, name, 0.0)   # report at once: the step is short here
    agent = study_commands.make_proposer("agent", scored, config, runner, progress=progress.Progress())
    out = capsys.readouterr().out
    assert "predictions under the hypotheses: " in out and "/s)" in out, out
    assert agent.total_candidates == len(scored)


def test_no_progress_prints_no_progress(monkeypatch, capsys):
    """--no-progress: a scripted `tune ... > result.txt` gets the result alone, no scoring lines among it."""
    from tuner import progress

    for name in ("PROGRESS_AFTER_S", "PROGRESS_LOG_EVERY_S", "PROGRESS_EVERY_S"):
        monkeypatch.setattr(progress, name, 0.0)
    quiet, loud = progress.Progress(quiet=True), progress.Progress()
    for p in (quiet, loud):
        with p.step("scoring the search space of X ...", after_s=0.0):
            progress.Counter(p, "layouts scored").add(64)
    out = capsys.readouterr()
    assert "layouts scored" in out.out + out.err          # the loud one spoke
    quiet_only = progress.Progress(quiet=True)
    quiet_only("a line", now=True)
    assert capsys.readouterr() == ("", "")
