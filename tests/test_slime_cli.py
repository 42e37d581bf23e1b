"""The slime backend through the command line: the --cluster file, `tune trial --dry-run`, and `tune` and
`tune trial` end to end on a local CPU Ray cluster with the slime stand-in (tests/slime_standin.py) as slime.

The Ray cluster and the fake slime checkout are the fixtures of tests/test_slime_runner.py (a Ray head of this
module's own, started once for it)."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from experiments.slime.cluster import ClusterConfig, ClusterError, load_cluster
from experiments.slime.runner import SlimeRunner
from test_slime_runner import STANDIN, fake_slime, ray_cluster  # noqa: F401  (fixtures)
from tuner.cli import main

EXAMPLE = Path(__file__).resolve().parent / "fixtures" / "slime_cluster.yaml"
TARGET = ["--model", "qwen3.6-35b-a3b", "--gpu", "h200"]
LAYOUT = ["--layout", "ep=8", "recompute_granularity=full", "recompute_method=uniform", "recompute_num_layers=1"]


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tune: error: "), err
    return err[len("tune: error: "):].strip()


def _dry_run(capsys, *flags, layout=()) -> dict:
    assert main(["trial", "--backend", "slime", *TARGET, "--dry-run", *flags, *LAYOUT, *layout]) == 0
    return json.loads(capsys.readouterr().out)


# --- the cluster file ----------------------------------------------------------------------------------------


def test_the_example_cluster_file_and_flags_over_it(tmp_path):
    cluster = load_cluster(str(EXAMPLE))
    assert (cluster.ray_address, cluster.slime_dir, cluster.profile_dir) == ("http://ray-head:8265", "/root/slime",
                                                                            "/data/profiles")
    assert cluster.env == {"WANDB_MODE": "offline"} and cluster.missing_paths() == []
    over = cluster.with_overrides(profile_dir="/other", sft_data=None)
    assert over.profile_dir == "/other" and over.sft_data == cluster.sft_data
    runner = SlimeRunner(over, connect=False)
    assert runner.paths["PROFILE_DIR"] == "/other" and runner.paths["HF_CKPT"] == "/data/Qwen3.6-35B-A3B"
    assert ClusterConfig().missing_paths() == ["hf_checkpoint", "torch_dist", "sft_data", "profile_dir"]


@pytest.mark.parametrize("text, message", [
    ("ray_address: [unclosed\n", r"malformed YAML at line 2 column 1: "),
    ("- a\n- b\n", r"must be a YAML mapping of cluster fields, got list"),
    ("ray_adress: http://h:8265\n", r"unknown field ray_adress \(known: "),
    ("profile_dir: profiles\n", r"profile_dir must be an absolute path on the cluster, got 'profiles'"),
    ("sft_data: 3\n", r"sft_data must be a non-empty string, got 3"),
    ("env: [A, B]\n", r"env must be a mapping of variable names to values, got list"),
    ("env: {NCCL_NVLS_ENABLE: '$(nvidia-smi | wc -l)'}\n", r"env.NCCL_NVLS_ENABLE is a shell command"),
    ("env: {'1BAD': x}\n", r"env: '1BAD' is not an environment variable name"),
    ("slime_commit: main\n", r"slime_commit must be a git commit hash"),
])
def test_a_bad_cluster_file_is_one_line_naming_the_field(tmp_path, text, message):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    with pytest.raises(ClusterError, match=rf"^--cluster {path}: {message}") as info:
        load_cluster(str(path))
    assert "\n" not in str(info.value)


def test_the_cli_refuses_a_missing_path_or_file_in_one_line(tmp_path, capsys):
    data = yaml.safe_load(EXAMPLE.read_text())
    del data["profile_dir"]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    base = ["trial", "--backend", "slime", *TARGET, *LAYOUT, "--dry-run"]
    assert main([*base, "--cluster", str(path)]) == 2
    assert _error(capsys) == ("the slime backend needs the cluster path profile_dir ($PROFILE_DIR, slime's "
                              "--tensorboard-dir; or --profile-dir): set it in the --cluster file")
    assert main([*base, "--cluster", str(tmp_path / "none.yaml")]) == 2
    assert _error(capsys) == f"{tmp_path / 'none.yaml'}: no such file"
    assert main(["trial", "--backend", "megatron", *TARGET, *LAYOUT, "--dry-run"]) == 2
    assert "--dry-run prints the Ray job of --backend slime" in _error(capsys)
    # a model whose slime script slime does not ship: refused before anything is submitted
    assert main(["trial", "--backend", "slime", "--model", "qwen3.5-397b-a17b", "--gpu", "h200", "--gpus", "64",
                 "--layout", "ep=64", "--cluster", str(EXAMPLE), "--dry-run"]) == 2
    assert _error(capsys).startswith("slime @624b824 has no scripts/models/qwen3.5-397B-A17B.sh (the MODEL_ARGS "
                                     "of Qwen3.5-397B-A17B)")


def test_dry_run_prints_the_job_and_connects_to_nothing(capsys):
    # the example's ray_address (http://ray-head:8265) does not resolve: a dry run never connects
    job = _dry_run(capsys, "--cluster", str(EXAMPLE), "--profile-dir", "/flag/profiles", "--steps", "8")
    words = shlex.split(job["entrypoint"])
    assert words[:2] == ["bash", "-c"] and words[3:6] == ["attune-slime", "/root/slime",
                                                          "/root/slime/scripts/models/qwen3.5-35B-A3B.sh"]
    assert words[6:8] == ["python3", "train_async.py"] and "--async" not in words
    assert words[words.index("--tensorboard-dir") + 1] == "/flag/profiles"        # the flag over the file
    assert words[words.index("--num-rollout") + 1] == "8"
    assert "NVLINK_COUNT=$(nvidia-smi topo -m" in words[2]
    env = job["runtime_env"]["env_vars"]
    assert env["WANDB_MODE"] == "offline" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "NCCL_NVLS_ENABLE" not in env and all("$(" not in v and "`" not in v for v in env.values())
    assert list(job["computed_on_cluster"]) == ["NCCL_NVLS_ENABLE"]
    assert sorted(job["working_dir_files"]) == ["peak_memory_hook.py", "pretokenized_sft_rollout.py"]
    assert all(Path(f["from"]).is_file() for f in job["working_dir_files"].values())
    assert job["metadata"]["attune_runner"] == "slime" and job["ray_address"] == "http://ray-head:8265"
    flex = _dry_run(capsys, "--cluster", str(EXAMPLE), layout=["dispatcher=flex"])
    assert "--moe-flex-dispatcher-backend deepep" in flex["command"] and "--moe-enable-deepep" not in flex["command"]
    assert flex["runtime_env"]["env_vars"]["NVSHMEM_DISABLE_NCCL"] == "1"


def test_dry_run_warns_when_the_layout_is_predicted_not_to_fit_and_keeps_the_whole_layout(capsys):
    # no --layout: the default EP1 layout, predicted at about 300 GiB of 139.8
    assert main(["trial", "--backend", "slime", *TARGET, "--dry-run", "--cluster", str(EXAMPLE)]) == 0
    captured = capsys.readouterr()
    job = json.loads(captured.out)
    assert captured.err.startswith("tune: warning: ") and captured.err.count("\n") == 1, captured.err
    assert "does not fit" in captured.err and "GiB usable of H200" in captured.err
    assert [n for n in job["notes"] if n.startswith("predicted does not fit (")]
    assert job["metadata"]["layout"].startswith("world_size=8|") and job["metadata"]["layout"].endswith("exp_avg_dtype=fp32")
    fits = _dry_run(capsys, "--cluster", str(EXAMPLE))     # the EP8 full-recompute layout: no warning
    assert not [n for n in fits["notes"] if n.startswith("predicted")]


# --- end to end on a local Ray cluster -----------------------------------------------------------------------


@pytest.fixture
def cluster_file(tmp_path, ray_cluster, fake_slime):  # noqa: F811
    """A cluster file for the local Ray cluster, the fake slime checkout and the stand-in as slime's entry."""
    path = tmp_path / "slime_cluster.yaml"
    path.write_text(yaml.safe_dump({
        "ray_address": ray_cluster.address, "slime_dir": fake_slime.slime_dir, "hf_checkpoint": "/nonexistent/hf",
        "torch_dist": "/nonexistent/dist", "sft_data": fake_slime.rows, "profile_dir": "/nonexistent/prof",
        "python": sys.executable, "entry_module": STANDIN, "env": {"ATTUNE_STANDIN_STEP_S": "0.05"},
        "log_dir": str(tmp_path / "logs")}))
    return str(path)


def _jobs(ray_cluster) -> list[str]:  # noqa: F811
    return sorted(j.submission_id or j.job_id for j in ray_cluster.client.list_jobs())


@pytest.mark.ray
@pytest.mark.slow
def test_tune_runs_measured_trials_on_ray_and_resumes(tmp_path, cluster_file, ray_cluster, capsys):  # noqa: F811
    """Two trials and the convergence arm of both, then one more trial resumed: every Ray job of a study's life, each
    kind run (a job costs 5-10 s on 2 cores), on 4 GPUs (a space scored in about 2 s; 8 GPUs: about 12 s)."""
    storage = tmp_path / "study.db"
    argv = ["--backend", "slime", "--cluster", cluster_file, *TARGET, "--gpus", "4", "--seq-len", "64", "--global-batch", "8",
            "--steps", "8", "--storage", str(storage), "--study", "ray", "--out", str(tmp_path / "recipes"),
            "--no-progress", "--stop-margin", "off"]   # the stand-in measures every layout alike: no early stop
    before = len(_jobs(ray_cluster))
    # as a user runs it: 2 trials, then the convergence arm of the top 2 (a reference run, the trials' curves)
    assert main([*argv, "--trials", "2", "--verify-top", "2"]) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    trials = optuna.load_study(study_name="ray", storage=f"sqlite:///{storage}").trials
    assert len(trials) == 2 and before + 2 <= len(_jobs(ray_cluster)) <= before + 3, out.err
    assert out.out.count(": convergence pass (") == 2, out.out + out.err
    recipes = sorted((tmp_path / "recipes").rglob("*.yaml"))
    assert len(recipes) == 2 and all(yaml.safe_load(p.read_text())["status"] == "verified" for p in recipes)
    for t in trials:
        result = t.user_attrs["result"]
        assert t.state == optuna.trial.TrialState.COMPLETE, t.user_attrs.get("fail_reason")
        assert result["kind"] == "measured" and t.user_attrs["backend"] == "slime"
        assert result["details"]["log_source"].startswith("tail_job_logs")   # streamed (its end may be read again)
        assert result["details"]["computed_on_cluster"] == ["NCCL_NVLS_ENABLE"]
        assert t.value == result["tokens_per_s_per_gpu"] > 0
    first = [t.user_attrs["layout_key"] for t in trials]
    assert len(set(first)) == 2
    assert main([*argv, "--trials", "1", "--verify-top", "0"]) == 0, capsys.readouterr().err
    trials = optuna.load_study(study_name="ray", storage=f"sqlite:///{storage}").trials
    keys = [t.user_attrs["layout_key"] for t in trials]
    assert len(trials) == 3 and keys[:2] == first and len(set(keys)) == 3          # resumed, no layout twice
    assert all(t.user_attrs["result"]["kind"] == "measured" for t in trials)


@pytest.mark.ray
@pytest.mark.slow
def test_tune_trial_and_its_dry_run_on_ray(tmp_path, cluster_file, ray_cluster, capsys):  # noqa: F811
    base = ["trial", "--backend", "slime", "--cluster", cluster_file, *TARGET, *LAYOUT, "--seq-len", "64",
            "--global-batch", "8", "--steps", "8"]
    jobs = _jobs(ray_cluster)
    assert main([*base, "--dry-run"]) == 0
    job = json.loads(capsys.readouterr().out)
    assert _jobs(ray_cluster) == jobs                                   # a dry run submits nothing
    assert all("$(" not in v for v in job["runtime_env"]["env_vars"].values())
    assert job["runtime_env"]["env_vars"]["ATTUNE_STANDIN_STEP_S"] == "0.05"
    assert main([*base, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["status"] == "ok" and result["kind"] == "measured" and result["runner"] == "slime"
    assert result["tokens_per_s_per_gpu"] > 0 and len(result["step_times_s"]) == 8 - 2
    assert len(_jobs(ray_cluster)) == len(jobs) + 1
    log = Path(result["details"]["log_path"]).read_text()
    assert "attune: NCCL_NVLS_ENABLE=" in log and "computed on the cluster" in log
