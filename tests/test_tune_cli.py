"""The `tune` command end to end on the predicted backend, and its answers to bad input."""
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tuner.cli import main

REFERENCE = Path(__file__).resolve().parent / "fixtures" / "reference_recipes"
ROOT = Path(__file__).resolve().parents[1]
BASE = ["--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--no-progress"]
# The main job's space (8 GPUs) is scored in about 12 s on 2 cores: test_tune_ranks_exports_and_resumes runs it as a
# user does; the other studies here are made on 4 GPUs (about 2 s).
SMALL = ["--gpus", "4"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load(storage: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{storage}")


@pytest.mark.slow
def test_tune_ranks_exports_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(BASE + ["--trials", "6"]) == 0
    out = capsys.readouterr().out
    assert "6 trials (6 complete" in out
    assert "predicted" in out and "tokens/s/GPU" in out
    recipes = sorted((tmp_path / "studies" / "recipes" / "qwen3.6-35b-a3b" / "h200").glob("*.yaml"))
    assert len(recipes) == 3
    for path in recipes:
        data = yaml.safe_load(path.read_text())
        assert data["status"] == "predicted" and data["layout"]["label"]

    storage = tmp_path / "studies" / "attune.sqlite3"
    first = load(storage, "qwen3.6-35b-a3b-h200-x8")
    first_values = {t.number: (t.value, t.user_attrs["layout_key"]) for t in first.trials}

    assert main(BASE + ["--trials", "4"]) == 0
    assert "10 trials (10 complete" in capsys.readouterr().out
    study = load(storage, "qwen3.6-35b-a3b-h200-x8")
    keys = [t.user_attrs["layout_key"] for t in study.trials]
    assert len(keys) == len(set(keys)) == 10, "a finished layout was evaluated again"
    for t in study.trials[:6]:
        assert (t.value, t.user_attrs["layout_key"]) == first_values[t.number]
    for t in study.trials:
        assert t.user_attrs["rationale"]
        assert t.user_attrs["result"]["kind"] == "predicted"
        assert t.user_attrs["prediction"]["breakdown"]


def test_show_without_study_takes_the_storages_only_study_and_names_them_when_several(tmp_path, monkeypatch,
                                                                                       capsys):
    monkeypatch.chdir(tmp_path)
    small = ["--model", "llama3-8b", "--gpu", "h200", "--no-progress", "--trials", "1", "--top", "0"]
    assert main(small + ["--gpus", "2"]) == 0
    capsys.readouterr()
    assert main(["show"]) == 0
    assert "1 trials (1 complete" in capsys.readouterr().out
    assert main(small + ["--gpus", "1"]) == 0
    capsys.readouterr()
    assert main(["show"]) == 2
    err = capsys.readouterr().err
    assert "holds 2 studies" in err and "llama3-8b-h200-x1" in err and "llama3-8b-h200-x2" in err


@pytest.mark.slow
def test_show_and_export(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(BASE + SMALL + ["--trials", "3", "--study", "s1", "--top", "0"]) == 0
    capsys.readouterr()
    assert main(["show", "--study", "s1"]) == 0
    out = capsys.readouterr().out
    assert out.count("predicted") >= 3 and "figures from: attune cost model" in out
    assert main(["export", "--study", "s1", "--top", "2", "--out", str(tmp_path / "r")]) == 0
    paths = capsys.readouterr().out.split()
    assert len(paths) == 2 and all(Path(p).exists() for p in paths)


@pytest.mark.slow
def test_sampler_proposer_prunes_what_cannot_be_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(BASE + SMALL + ["--trials", "25", "--proposer", "tpe", "--study", "tpe", "--top", "0"]) == 0
    study = load(tmp_path / "studies" / "attune.sqlite3", "tpe")
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert pruned, "TPE over the raw parameters proposes invalid or unfitting layouts"
    for t in pruned:
        reason = t.user_attrs["prune_reason"]
        assert reason.startswith(("invalid layout", "world size", "predicted not to fit", "already evaluated",
                                  "VPP", "the flex dispatcher", "overlap_d2h_h2d", "decoder_", "account_for_",
                                  "decoder_first/last", "pipeline_model_parallel_layout"))


def test_predict_json_for_a_layout(capsys):
    assert main(["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--gpus", "8", "--layout", "ep=8",
                 "recompute_granularity=full", "recompute_method=uniform", "recompute_num_layers=1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("tokens_per_s_per_gpu", "step_time_s", "peak_memory_gib", "host_memory_gib_per_node", "fits", "mfu",
                "usd_per_million_tokens", "breakdown"):
        assert key in out
    assert out["kind"] == "predicted" and out["fits"] is True


def test_predict_without_a_layout_says_its_default_does_not_fit_and_how_to_search(capsys):
    assert main(["predict", "--model", "qwen3.5-27b", "--gpu", "h200", "--gpus", "8"]) == 0
    captured = capsys.readouterr()
    assert "DOES NOT FIT" in captured.out
    assert "no --layout given" in captured.err and "`tune --model qwen3.5-27b --gpu h200 --gpus 8`" in captured.err
    assert main(["predict", "--model", "qwen3.5-27b", "--gpu", "h200", "--gpus", "8", "--layout", "tp=4"]) == 0
    assert "no --layout given" not in capsys.readouterr().err


def test_predict_explain_table(capsys):
    assert main(["predict", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--layout", "ep=8"]) == 0
    out = capsys.readouterr().out
    assert "predicted" in out and "tokens/s/GPU" in out


def test_predict_recipe_writes_recipe(tmp_path, capsys):
    out = tmp_path / "x.yaml"
    assert main(["predict", "--recipe", str(REFERENCE / "attune-tp1-pp1-ep8.yaml"), "--recipe-out", str(out)]) == 0
    ref = yaml.safe_load((REFERENCE / "attune-tp1-pp1-ep8.yaml").read_text())
    got = yaml.safe_load(out.read_text())
    for key in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "max_tokens_per_gpu", "recompute", "offload", "dispatcher"):
        assert got["layout"][key] == ref["layout"][key]


def run_tune(*args, cwd):
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True, text=True,
                          env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"})


def assert_one_line_error(proc, *needles):
    # exactly one line: a space scored for seconds before it can say that nothing fits (DeepSeek-V3 on 3 GPUs takes
    # 2-4 s on 2 cores) shows its progress on stdout when stderr is no terminal (tuner.progress)
    assert proc.returncode == 2, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.slow
def test_bad_input_gives_one_line_and_exit_2(tmp_path):
    bad_json = tmp_path / "config.json"
    bad_json.write_text('{"model_type": "qwen3_moe", "hidden_size": ')
    bad_recipe = tmp_path / "recipe.yaml"
    bad_recipe.write_text("model: [unclosed\n")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00binary")
    cases = [
        (["--model", "qwen9-1t", "--gpu", "h200"], "unknown model"),
        (["--model", "qwen3.6-35b-a3b", "--gpu", "a100"], "unknown GPU 'a100'"),
        (["--model", str(bad_json), "--gpu", "h200"], "config.json"),
        (["--model", "qwen3.5-397b-a17b", "--gpu", "h100", "--gpus", "1"], "fits on 1 x H100"),
        (["--model", "deepseek-v3", "--gpu", "h200", "--gpus", "3"], "3 x H200"),
        # the default 128 rows cannot give each DP rank of 1,000 GPUs a row: the batch is named, not the GPU count
        (["--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--gpus", "1000"], "--global-batch 150"),
        # a pruned space whose every shape's memory floor is over the card: the nearest layout, not "no valid layout"
        (["--model", "gpt-oss-120b", "--gpu", "h100", "--gpus", "8"], "fits on 8 x H100: the nearest, "),
        (["predict", "--recipe", str(bad_recipe)], "recipe.yaml"),
        (["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--layout", "tp=3"], "TP x PP x CP"),
        (["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--layout", "ep=7"], "EP"),
        (["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--layout", "bogus=1"], "unknown layout key"),
        (["--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--storage", "postgresql://nobody@127.0.0.1:1/x"],
         "cannot open study storage"),
        (["show", "--study", "nope", "--storage", str(tmp_path / "empty.db")], "no such file"),   # and none made
        (["profile"], "no CUDA GPU found"),
        (["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--layout", "ep=8", "--profile",
          str(bad_recipe)], "malformed YAML"),
        (["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--layout", "ep=8", "--profile",
          str(tmp_path / "missing.yaml")], "missing.yaml: no such file"),
        (["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--layout", "ep=8", "--profile",
          str(binary)], "binary.yaml: not UTF-8 text"),
        (["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--layout", "ep=8", "--profile",
          str(tmp_path)], "is a directory, not a profile"),
        (["check-convergence", "--candidate", str(binary), "--reference", str(binary)], "binary.yaml: not UTF-8"),
    ]
    for args, needle in cases:
        assert_one_line_error(run_tune(*args, cwd=tmp_path), needle)
    assert not (tmp_path / "empty.db").exists()


@pytest.mark.slow
def test_corrupt_or_foreign_study_is_left_untouched(tmp_path):
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not sqlite" * 100)
    before = digest(corrupt)
    assert_one_line_error(run_tune("--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--storage", str(corrupt),
                                   cwd=tmp_path), "not an SQLite database")
    assert digest(corrupt) == before

    good = tmp_path / "good.db"
    assert run_tune("--model", "qwen3.6-35b-a3b", "--gpu", "h200", *SMALL, "--storage", str(good), "--study", "mine",
                    "--trials", "2", "--top", "0", cwd=tmp_path).returncode == 0
    snapshot = tmp_path / "snapshot.db"
    shutil.copy(good, snapshot)
    before = [(t.number, t.value, t.state) for t in load(good, "mine").trials]
    # The same study name for another model is refused before anything is written.
    assert_one_line_error(run_tune("--model", "qwen3-30b-a3b", "--gpu", "h200", *SMALL, "--storage", str(good),
                                   "--study", "mine", cwd=tmp_path), "was created for qwen3.6-35b-a3b")
    assert [(t.number, t.value, t.state) for t in load(good, "mine").trials] == before


def test_catalog_commands(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "qwen3.6-35b-a3b" in out and "deepseek-v3" in out and "llama3.1-405b" in out
    assert main(["gpus", "--json"]) == 0
    gpus = json.loads(capsys.readouterr().out)
    assert {g["name"] for g in gpus} == {"h100", "h200", "b200", "gb200"}
    for g in gpus:
        assert set(g["sources"]) >= {"bf16_tflops", "hbm_tb_s", "nvlink_gb_s", "usd_per_gpu_hour"}
        profile = g["profile"]
        assert profile["provenance"] == ("measured" if g["name"] == "h200" else "derived")
        for key in ("gemm_bf16_large_tflops", "hbm_copy_tb_s", "all_reduce_busbw_gb_s_at_256MB",
                    "all_to_all_busbw_gb_s_at_256MB", "h2d_gb_s", "date"):
            assert profile[key], key


def test_profile_flag_changes_predictions(tmp_path, capsys):
    from cost_model.derive_profile import derive_profile
    from cost_model.nouns.hardware import load_gpu
    from cost_model.profile import shipped_profile
    from experiments.checks.hardware_profile import write_profile

    # An "H200" whose collectives run at B200 NVLink speed: the EP all-to-all must get cheaper.
    faster = derive_profile(shipped_profile("h200").raw, load_gpu("h200"), load_gpu("b200"))
    path = tmp_path / "p.yaml"
    write_profile(faster, path)
    args = ["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--layout", "ep=8", "--json"]
    assert main(args + ["--profile", str(path)]) == 2   # a B200 profile priced as an H200: refused
    assert "a profile of b200" in capsys.readouterr().err
    faster["gpu_type"] = "h200"   # the what-if made explicit: an H200 profile with B200 collectives
    write_profile(faster, path)
    assert main(args) == 0
    shipped = json.loads(capsys.readouterr().out)
    assert main(args + ["--profile", str(path)]) == 0
    custom = json.loads(capsys.readouterr().out)
    assert custom["breakdown"]["ep_comm"] == pytest.approx(shipped["breakdown"]["ep_comm"] / 2, rel=1e-6)
    assert "derived profile" in custom["source"] and "measured profile" in shipped["source"]


def test_predict_batch_answers_each_line_in_order(tmp_path, capsys):
    requests = [
        {"model": "qwen3.6-35b-a3b", "gpu": "h200", "gpus": 8, "layout": {"ep": 8, "recompute_granularity": "full",
                                                                          "recompute_method": "uniform",
                                                                          "recompute_num_layers": 1}},
        {"model": "qwen3.6-35b-a3b", "gpu": "h200", "layout": {"tp": 3}},
        "not json",
        {"recipe": str(REFERENCE / "attune-tp1-ep8-mt16k.yaml")},
        {"model": "qwen3-30b-a3b", "gpu": "h100", "gpus": 16, "precision": "fp8", "routing": "balanced",
         "framework": "megatron", "layout": {"ep": 16}},
        {"model": "qwen3.6-35b-a3b", "gpu": "h200", "bogus": 1},
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in requests) + "\n")
    assert main(["predict", "--batch", str(path)]) == 1   # 1: some lines got an error object
    lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    assert len(lines) == len(requests) and [l["line"] for l in lines] == list(range(1, len(requests) + 1))
    assert lines[0]["fits"] and lines[0]["label"].startswith("TP1 PP1 EP8 DP8")
    assert "error" in lines[1] and "line 2" in lines[1]["error"] and "TP x PP x CP" in lines[1]["error"]
    assert "error" in lines[2] and "malformed JSON" in lines[2]["error"]
    assert lines[3]["layout"]["max_tokens_per_gpu"] == 16384 and lines[3]["kind"] == "predicted"
    assert lines[4]["gpus"] == 16 and lines[4]["tokens_per_s_per_gpu"] > 0
    assert "unknown request key" in lines[5]["error"]
    # The same request through flags gives the same answer as through the batch.
    assert main(["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--gpus", "8", "--layout", "ep=8",
                 "recompute_granularity=full", "recompute_method=uniform", "recompute_num_layers=1", "--json"]) == 0
    single = json.loads(capsys.readouterr().out)
    assert single["tokens_per_s_per_gpu"] == lines[0]["tokens_per_s_per_gpu"]


def test_predict_explain_prints_time_and_memory_tables(capsys):
    assert main(["predict", "--recipe", str(REFERENCE / "attune-tp1-pp1-ep8.yaml"), "--explain"]) == 0
    out = capsys.readouterr().out
    assert "every figure is predicted" in out
    for needle in ("step time", "launch_overhead", "ep_comm", "memory per GPU", "optimizer", "activations",
                   "host memory per node"):
        assert needle in out


@pytest.mark.slow
def test_trial_backends_answer_bad_setups_in_one_line(tmp_path):
    base = ["--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--gpus", "1"]
    assert_one_line_error(run_tune("trial", "--backend", "megatron", *base, "--layout", "ep=1", cwd=tmp_path),
                          "no CUDA GPU found")
    assert_one_line_error(run_tune("trial", "--backend", "slime", *base, "--layout", "ep=1", cwd=tmp_path),
                          "--ray-address and --slime-dir")
    # a model the runner cannot build is refused for what it is, before any GPU is looked for or a study made
    assert_one_line_error(run_tune("--backend", "megatron", "--model", "moonlight-16b-a3b", "--gpu", "h200",
                                   "--storage", str(tmp_path / "s.db"), cwd=tmp_path), "MLA models are not supported")
    assert not (tmp_path / "s.db").exists()


@pytest.mark.slow
@pytest.mark.ray
def test_unreachable_ray_cluster_is_one_line(tmp_path):
    assert_one_line_error(run_tune("--backend", "slime", "--model", "qwen3.6-35b-a3b", "--gpu", "h200",
                                   "--ray-address", "http://127.0.0.1:9", "--slime-dir", "/x", "--storage",
                                   str(tmp_path / "s.db"), cwd=tmp_path), "cannot reach the Ray cluster")


@pytest.mark.torch   # the megatron backend is made only where torch and megatron-core import
@pytest.mark.parametrize("flags,cpu_init", [([], True), (["--verify-top", "2"], True), (["--verify-top", "0"], False)])
def test_megatron_trials_that_may_become_convergence_arms_share_initial_weights(monkeypatch, flags, cpu_init):
    """`tune --backend megatron` measures each layout once and re-uses that run as its convergence arm,
    so every trial starts from the same (CPU-initialised, layout-independent) weights unless no arm runs."""
    import experiments.megatron.runner as mr
    from tuner.backends import make_runner
    from tuner.options import run_parser

    monkeypatch.setattr(mr, "visible_gpus", lambda: 2)
    args = run_parser().parse_args(["--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--backend", "megatron",
                                     "--layers", "4", *flags])
    runner = make_runner(args)
    assert isinstance(runner, mr.MegatronRunner) and runner.layers == 4
    assert runner.cpu_init is cpu_init


@pytest.mark.torch
def test_megatron_rows_flag_is_checked_before_any_trial(monkeypatch, tmp_path):
    import experiments.megatron.runner as mr
    from tuner.backends import make_runner
    from tuner.options import CliError, run_parser

    monkeypatch.setattr(mr, "visible_gpus", lambda: 2)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"tokens": [1, 2, 3]}\n')
    base = ["--model", "llama3-8b", "--gpu", "h200", "--backend", "megatron", "--rows"]
    assert make_runner(run_parser().parse_args([*base, str(rows)])).rows_file == str(rows)
    rows.write_text('{"tokens": "abc"}\n')
    with pytest.raises(CliError, match="rows.jsonl:1: 'tokens' must be"):
        make_runner(run_parser().parse_args([*base, str(rows)]))
    with pytest.raises(CliError, match="missing.jsonl: cannot read"):
        make_runner(run_parser().parse_args([*base, str(tmp_path / "missing.jsonl")]))


# ---------------------------------------------------------------- tune show --format, files that cannot be used

def handmade_study(storage: Path) -> str:
    """A study with one trial of each kind, as `tune` stores them: predicted, measured, pruned, failed."""
    from cost_model.nouns.case import Case
    from cost_model.nouns.hardware import load_gpu
    from cost_model.nouns.layout_codec import layout_from_values, layout_values
    from cost_model.nouns.model_spec import load_model
    from cost_model.predict import predict
    from cost_model.nouns.workload import Workload
    from experiments.predicted_runner import PredictedRunner
    from experiments.runner import TrialResult, TrialSpec
    from tuner.intervals import prediction_interval
    from tuner.study import StudyConfig, load_or_create, open_storage

    config = StudyConfig(load_model("qwen3.6-35b-a3b"), load_gpu("h200"), 8, Workload())
    study = load_or_create(open_storage(f"sqlite:///{storage}"), "hand", config)

    def attrs(layout, with_interval=True, **extra):
        p = predict(config.model, config.gpu, config.workload, layout)
        prediction = p.to_dict()
        if with_interval:   # as the predict backend stores it
            prediction["interval"] = prediction_interval(config, PredictedRunner(), layout, p).to_dict()
        return {"layout": {"world_size": 8, **layout_values(layout)}, "label": layout.long_label,
                "layout_key": layout.key(), "prediction": prediction, "backend": "predict", **extra}

    fits = layout_from_values({"ep": 8, "recompute_granularity": "full", "recompute_method": "uniform",
                               "recompute_num_layers": 1}, 8, 8192)
    other = layout_from_values({"ep": 4, "recompute_granularity": "full", "recompute_method": "uniform",
                                "recompute_num_layers": 1}, 8, 8192)
    predicted = PredictedRunner().run(TrialSpec(Case(config.model, config.gpu, config.workload, fits), 20, (5, 19)))
    measured = TrialResult(status="ok", kind="measured", source="test runner", tokens_per_s_per_gpu=1234.5,
                           step_time_s=2.5, peak_memory_gib=60.25, mfu=0.125, usd_per_million_tokens=0.75)
    trials = [
        (TrialState.COMPLETE, predicted.tokens_per_s_per_gpu, attrs(fits, result=predicted.to_dict())),
        (TrialState.COMPLETE, 1234.5, attrs(other, False, result=measured.to_dict(), backend="megatron")),
        (TrialState.PRUNED, None, attrs(fits, prune_reason="already evaluated in this study")),
        (TrialState.FAIL, None, {"fail_reason": "interrupted: the tuner stopped while this trial ran"}),
    ]
    for state, value, user_attrs in trials:
        study.add_trial(optuna.trial.create_trial(state=state, value=value, user_attrs=user_attrs))
    return "hand"


def test_show_csv_has_one_row_per_trial(tmp_path, capsys):
    import io

    import pandas as pd

    from tuner.report import TRIAL_COLUMNS

    storage = tmp_path / "s.db"
    name = handmade_study(storage)
    assert main(["show", "--study", name, "--storage", str(storage), "--format", "csv"]) == 0
    frame = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert tuple(frame.columns) == TRIAL_COLUMNS
    assert list(frame["number"]) == [0, 1, 2, 3]
    assert frame.iloc[1]["ep"] == 4 and frame.iloc[1]["tp"] == 1
    assert list(frame["state"]) == ["complete", "complete", "pruned", "failed"]
    assert list(frame["kind"].fillna("")) == ["predicted", "measured", "predicted", ""]
    assert list(frame["backend"].fillna("")) == ["predict", "megatron", "predict", ""]
    measured = frame.iloc[1]
    assert (measured["tokens_per_s_per_gpu"], measured["step_time_s"], measured["peak_memory_gib"], measured["mfu"],
            measured["usd_per_million_tokens"]) == (1234.5, 2.5, 60.25, 0.125, 0.75)
    assert measured["source"] == "test runner" and measured["label"].startswith("TP1 PP1 EP4")
    assert frame.iloc[0]["tokens_per_s_per_gpu"] == frame.iloc[0]["predicted_tokens_per_s_per_gpu"] > 0
    assert frame.iloc[2]["reason"] == "already evaluated in this study"
    assert frame.iloc[3]["reason"].startswith("interrupted") and pd.isna(frame.iloc[3]["tokens_per_s_per_gpu"])

    assert main(["show", "--study", name, "--storage", str(storage), "--format", "csv", "--limit", "2"]) == 0
    assert list(pd.read_csv(io.StringIO(capsys.readouterr().out))["number"]) == [0, 1]


def test_show_prints_a_peers_escape_codes_as_text(tmp_path, capsys):
    storage = tmp_path / "s.db"
    name = handmade_study(storage)
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{storage}")
    t = study.trials[1]
    study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=1.0, user_attrs={
        **t.user_attrs, "result": {**t.user_attrs["result"], "source": "\x1b]0;owned\x07\x1b[2J", "mfu": "x"}}))
    for fmt in ("csv", "json", "table"):
        assert main(["show", "--study", name, "--storage", str(storage), "--format", fmt]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out, fmt
    assert "owned" in out


def test_show_json_is_a_list_of_trial_records(tmp_path, capsys):
    from tuner.report import TRIAL_COLUMNS

    storage = tmp_path / "s.db"
    name = handmade_study(storage)
    assert main(["show", "--study", name, "--storage", str(storage), "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["number"] for r in records] == [0, 1, 2, 3]
    assert all(tuple(r) == TRIAL_COLUMNS for r in records)
    assert (records[1]["tp"], records[1]["pp"], records[1]["ep"]) == (1, 1, 4)
    assert records[1] | {"rationale": None} == {
        "number": 1, "state": "complete", "kind": "measured", "label": records[1]["label"],
        "layout_args": ("ep=4 max_tokens_per_gpu=8192 rows_per_microbatch=1 recompute_granularity=full "
                        "recompute_method=uniform recompute_num_layers=1"),
        **{k: records[1][k] for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "max_tokens_per_gpu")},
        "tokens_per_s_per_gpu": 1234.5, "step_time_s": 2.5, "peak_memory_gib": 60.25, "mfu": 0.125,
        "usd_per_million_tokens": 0.75, "predicted_tokens_per_s_per_gpu": records[1]["predicted_tokens_per_s_per_gpu"],
        "predicted_low": records[1]["predicted_low"], "predicted_high": records[1]["predicted_high"],
        "source": "test runner", "backend": "megatron", "reason": None, "rationale": None, "learnt": None}
    assert records[1]["predicted_low"] is None     # made by hand without an interval: none is invented
    assert records[3]["kind"] is None and records[3]["tokens_per_s_per_gpu"] is None
    assert records[0]["source"].startswith("attune cost model")

    # The default format is the ranked table of completed trials, as before.
    assert main(["show", "--study", name, "--storage", str(storage)]) == 0
    out = capsys.readouterr().out
    assert "4 trials (2 complete, 1 pruned, 1 failed)" in out and "figures from: test runner" in out


@pytest.mark.torch   # with torch importable, the message names megatron-core alone
def test_megatron_backend_without_torch_or_megatron_core_says_what_to_install(tmp_path, capsys, monkeypatch):
    import tuner.backends as backends

    real = backends._find_spec
    monkeypatch.setattr(backends, "_find_spec", lambda m: None if m == "megatron.core" else real(m))
    code = main(["trial", "--backend", "megatron", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--gpus", "1",
                 "--layout", "ep=1", "--layers", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "missing here: megatron-core" in err[0] and "pip install 'attune-llm[megatron]'" in err[0]


@pytest.mark.slow
def test_show_export_and_report_print_json_with_json(tmp_path, capsys):
    storage = tmp_path / "s.db"
    name = handmade_study(storage)
    common = ["--study", name, "--storage", str(storage)]
    assert main(["show", *common, "--format", "json"]) == 0
    expected = capsys.readouterr().out
    assert main(["show", *common, "--json"]) == 0
    assert capsys.readouterr().out == expected and isinstance(json.loads(expected), list)
    assert main(["show", *common, "--json", "--format", "csv"]) == 2
    assert "ask for two formats" in capsys.readouterr().err
    assert main(["export", *common, "--out", str(tmp_path / "recipes"), "--top", "1", "--json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["study"] == name and len(exported["recipes"]) == 1 and Path(exported["recipes"][0]).is_file()
    pytest.importorskip("matplotlib")
    assert main(["report", *common, "--out", str(tmp_path / "report"), "--json"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert page["study"] == name and Path(page["page"]).name == "index.html" and Path(page["page"]).is_file()


def test_the_run_and_every_subcommand_print_json_with_json(tmp_path, capsys):
    """`--json`: stdout holds one JSON object (numbers as numbers), whatever else goes to stderr."""
    storage = tmp_path / "s.db"
    args = ["--model", "llama3-8b", "--gpu", "h200", "--gpus", "2", "--trials", "2", "--storage", str(storage),
            "--out", str(tmp_path / "recipes"), "--no-progress", "--json"]
    assert main(args) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["backend"] == "predict" and run["figures"] == "predicted" and len(run["trials"]) == 2
    assert isinstance(run["trials"][0]["tokens_per_s_per_gpu"], float) and run["trials"][0]["tp"] == 1
    assert len(run["recipes"]) == 2 and all(Path(p).is_file() for p in run["recipes"])
    out = tmp_path / "b200.yaml"
    assert main(["profile", "--derive", "b200", "--from", "h200", "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"profile": str(out), "gpu_type": "b200", "derived_from": "h200"}
    for sub in (["models", "--json"], ["gpus", "--json"],
                ["predict", "--model", "llama3-8b", "--gpu", "h200", "--gpus", "2", "--layout", "tp=2", "--json"]):
        assert main(sub) == 0
        json.loads(capsys.readouterr().out)


def test_files_that_cannot_be_read_or_written_end_in_one_line(tmp_path, capsys):
    storage = tmp_path / "s.db"
    name = handmade_study(storage)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    layout = ["--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--layout", "ep=8"]
    cases = [
        (["predict", "--batch", str(tmp_path / "missing.jsonl")], "missing.jsonl: no such file"),
        (["predict", *layout, "--recipe-out", str(blocker / "r.yaml")], "a-file"),
        (["export", "--study", name, "--storage", str(storage), "--out", str(blocker)], "a-file"),
    ]
    for args, needle in cases:
        assert_main_fails_in_one_line(args, needle, capsys)


@pytest.mark.slow
def test_storage_that_cannot_be_made_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "studies").symlink_to(tmp_path / "nowhere")  # the default storage's folder cannot be made
    assert_main_fails_in_one_line(["--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--no-progress"], "studies", capsys)
    (tmp_path / "a-file").write_text("not a folder")
    assert_main_fails_in_one_line(["--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--no-progress", "--storage",
                                   str(tmp_path / "a-file" / "s.db")], "cannot open study storage", capsys)


def assert_main_fails_in_one_line(args, needle, capsys):
    assert main(args) == 2, args
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tune: error: ") and needle in err[0], (args, err)


def test_flags_a_recipe_or_a_batch_gives_are_refused_not_ignored(tmp_path, capsys):
    recipe = str(REFERENCE / "attune-tp1-pp1-ep8.yaml")
    assert main(["predict", "--recipe", recipe, "--gpu", "h100", "--layout", "tp=2"]) == 2
    assert "drop --gpu, --layout" in capsys.readouterr().err
    assert main(["predict", "--recipe", recipe, "--usd-per-gpu-hour", "3", "--json"]) == 0   # the price may change
    capsys.readouterr()
    batch = tmp_path / "b.jsonl"
    batch.write_text(json.dumps({"recipe": recipe, "gpu": "h100", "layout": {"tp": 2}}) + "\n")
    assert main(["predict", "--batch", str(batch), "--model", "llama3-8b"]) == 2
    assert "drop --model" in capsys.readouterr().err
    main(["predict", "--batch", str(batch)])
    assert "drop gpu, layout" in json.loads(capsys.readouterr().out.splitlines()[0])["error"]


def test_flags_of_measured_runs_are_named_when_the_backend_predicts(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--model", "llama3-8b", "--gpu", "h100", "--gpus", "2", "--trials", "1", "--no-progress", "--top",
                 "0", "--layers", "4", "--steps", "5"]) == 0
    assert "note: --steps, --layers only apply to measured runs; the predict backend ignores them" in \
        capsys.readouterr().err
    assert main(["--model", "llama3-8b", "--gpu", "h100", "--gpus", "2", "--trials", "1", "--no-progress", "--top",
                 "0", "--gpu-hours", "0.001", "--stop-margin", "0.5", "--study", "b"]) == 0
    assert "note: --gpu-hours, --stop-margin only apply to measured runs" in capsys.readouterr().err
    from tuner.options import PARSERS
    from tuner.study_commands import agent_only_flags

    parse = PARSERS["run"]().parse_args
    base = ["--model", "llama3-8b", "--gpu", "h100", "--backend", "megatron", "--stop-margin", "0.5"]
    assert agent_only_flags(parse([*base, "--proposer", "tpe"])) == ["--stop-margin"]
    assert agent_only_flags(parse(base)) == []   # the agent reads it


def test_one_posterior_in_the_table_the_recipe_and_predict(tmp_path, monkeypatch, capsys):
    """The figure a predicted layout is ranked by (the posterior median over the hypotheses) is the one its recipe
    and `tune predict --recipe` lead with, not the one hypothesis the breakdown prices (issue 26)."""
    monkeypatch.chdir(tmp_path)
    assert main(BASE + SMALL + ["--trials", "3", "--top", "1"]) == 0
    capsys.readouterr()
    study = load(tmp_path / "studies" / "attune.sqlite3", "qwen3.6-35b-a3b-h200-x4")
    best = max((t for t in study.trials if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    [path] = (tmp_path / "studies" / "recipes" / "qwen3.6-35b-a3b" / "h200").glob("*.yaml")
    result = yaml.safe_load(path.read_text())["result"]
    assert result["tokens_per_s_per_gpu"] == pytest.approx(best.value, abs=0.01)
    assert result["tokens_per_s_per_gpu"] == pytest.approx(result["predicted_interval"]["tokens_per_s_per_gpu_median"],
                                                           abs=0.5)
    # the breakdown's own figure is one hypothesis: here not the median, so the test tells the two apart
    assert abs(result["predicted"]["tokens_per_s_per_gpu"] / result["tokens_per_s_per_gpu"] - 1) > 0.01
    assert main(["predict", "--recipe", str(path)]) == 0
    line = capsys.readouterr().out
    assert f"predicted {best.value:,.0f} [" in line and "(posterior median, 90%, 15 hypotheses)" in line
    assert f"{result['predicted']['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, step" in line   # said what it is
    assert f"MFU {result['mfu']:.1%}" in line
    assert main(["predict", "--recipe", str(path), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["headline_tokens_per_s_per_gpu"] == pytest.approx(best.value, abs=0.01)
    assert answer["tokens_per_s_per_gpu"] == pytest.approx(result["predicted"]["tokens_per_s_per_gpu"], abs=0.1)
    # the rest of the headline at the same figure: the recipe's and the text line's MFU and $/1M tokens
    assert answer["headline_mfu"] == pytest.approx(result["mfu"], abs=5e-4)
    assert answer["headline_usd_per_million_tokens"] == pytest.approx(result["usd_per_million_tokens"], abs=0.005)


def test_a_global_batch_smaller_than_the_gpu_count_is_named_once():
    """Fewer rows than GPUs: a step of a few hundred tokens per GPU, which says little about a real run at that
    scale; tune says so in one note (and nothing when every GPU gets a row)."""
    from types import SimpleNamespace

    from cost_model.nouns.workload import Workload
    from tuner.study_commands import small_batch_notes

    small = SimpleNamespace(workload=Workload(seq_len=8192, global_batch=128), world_size=4096)
    (note,) = small_batch_notes(small)
    assert "128 rows" in note and "4,096 GPUs" in note and "256 tokens a step" in note and "--global-batch" in note
    assert small_batch_notes(SimpleNamespace(workload=Workload(seq_len=8192, global_batch=128), world_size=64)) == ()


@pytest.mark.slow
def test_a_recipe_of_a_users_config_json_is_priced_with_that_file(tmp_path, capsys):
    """A recipe exported from a config.json names a model the catalog lacks: --model PATH gives it, checked by the
    architecture digest the recipe records (another config is refused in one line)."""
    config = ROOT / "benchmarks" / "models" / "mixtral-8x7b" / "config.json"
    storage, out = tmp_path / "s.db", tmp_path / "rec"
    assert main(["--model", str(config), "--gpu", "h200", "--trials", "2", "--top", "1", "--no-progress",
                 "--storage", str(storage), "--out", str(out)]) == 0
    recipe = str(next(out.rglob("*.yaml")))
    capsys.readouterr()
    assert main(["predict", "--recipe", recipe]) == 2
    assert "pass that file with --model PATH" in capsys.readouterr().err
    assert main(["predict", "--recipe", recipe, "--model", str(config), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] in (True, False)
    other = ROOT / "benchmarks" / "models" / "mixtral-8x22b" / "config.json"
    assert main(["predict", "--recipe", recipe, "--model", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exported from a model of architecture" in err[0]


def test_the_runs_json_lists_the_tables_ten_best_in_its_order(tmp_path, monkeypatch, capsys):
    from tuner.report import ranked_rows

    monkeypatch.chdir(tmp_path)
    assert main(["--model", "llama3-8b", "--gpu", "h100", "--gpus", "4", "--trials", "14", "--no-progress", "--top",
                 "0", "--json", "--storage", "s.db", "--study", "j"]) == 0
    listed = [t["number"] for t in json.loads(capsys.readouterr().out)["trials"]]
    ranked = [r.number for r in ranked_rows(optuna.load_study(study_name="j", storage="sqlite:///s.db"))]
    assert len(ranked) == 14 and listed == ranked[:10] and listed != sorted(listed)   # not trial order
