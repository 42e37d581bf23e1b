"""A recipe's command and launch run the job its figures price: fp8 flags for an fp8 prediction, a launch that stops
for a job slime's command does not set up (a Megatron-LM/Bridge step, LoRA, CUDA graphs), slime's MODEL_ARGS script
only for the model it defines, the format's MFU with a note saying what it counts, and no flag of another model
family (a Qwen loss mask for Llama, expert flags for a dense model, the dispatcher named twice)."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from cost_model.metrics import format_mfu
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.workload import Workload
from cost_model.predict import predict
from recipes.recipe import build_recipe, load_recipe, recipe_name, recipe_path, write_recipe
from recipes.slime_command import FP8_ARGS, slime_launch, slime_model_script, slime_run

ROOT = Path(__file__).resolve().parents[1]
MIXTRAL = ROOT / "benchmarks" / "models" / "mixtral-8x7b" / "config.json"
ARGS = json.loads((ROOT / "tests" / "data" / "slime_megatron_args.json").read_text())["options"]
MOE_LAYOUT = Layout(8, ep=8, max_tokens_per_gpu=8192, recompute_granularity="full", recompute_method="uniform",
                    recompute_num_layers=1)
FLEX = MOE_LAYOUT.replace(dispatcher="flex")
UNPRICED = {
    "megatron": (dict(framework="megatron"), "--framework megatron"),
    "lora": (dict(framework="megatron", peft="lora"), "--peft lora"),
    "graphs-full": (dict(framework="megatron", cuda_graphs="full"), "--cuda-graphs full"),
    "graphs-partial": (dict(framework="megatron", cuda_graphs="partial"), "--cuda-graphs partial"),
}


def command_words(run: str) -> list[str]:
    """The python command's words of a recipe's `run` or a launch (comments and other lines left out)."""
    text = "\n".join(line for line in run.splitlines() if not line.lstrip().startswith("#")).replace("\\\n", " ")
    # a launch's command starts "$@" (the ray job submit words on a running cluster: slime_command._ray_job_lines)
    return next(line for line in text.splitlines()
                if line.strip().removeprefix('"$@" ').startswith("python3 ")).split()


def recipe_of(model, gpu, workload, layout) -> dict:
    return build_recipe(model, gpu, workload, layout, predict(model, gpu, workload, layout))


# ------------------------------------------------------------------ fp8
def test_an_fp8_recipe_trains_in_the_fp8_the_cost_model_prices():
    model, gpu, layout = load_model("qwen3-30b-a3b"), load_gpu("h100"), MOE_LAYOUT
    fp8, bf16 = Workload(precision="fp8"), Workload()
    # the flags say what the profile measured the fp8 GEMM rates with: e4m3 operands, one fp32 scale per tensor
    method = " ".join(yaml.safe_load((ROOT / "cost_model" / "data" / "profiles" / "h100.yaml").read_text())["notes"])
    assert "gemm_fp8: torch._scaled_mm e4m3 x e4m3, per-tensor fp32 scales" in method
    assert FP8_ARGS == ("--fp8-format", "e4m3", "--fp8-recipe", "tensorwise")   # tensorwise: per-tensor scaling
    for flag, value in zip(FP8_ARGS[::2], FP8_ARGS[1::2]):   # Megatron's own flags and choices at slime's pin
        assert ARGS[flag]["source"] == "megatron" and value in ARGS[flag]["choices"]
    # the prediction prices the GEMMs in fp8, so a command without the flags would be another job
    priced, plain = predict(model, gpu, fp8, layout).breakdown, predict(model, gpu, bf16, layout).breakdown
    assert priced["compute_experts"] < plain["compute_experts"] and priced["compute_mlp"] < plain["compute_mlp"]
    for text in (recipe_of(model, gpu, fp8, layout)["run"], slime_launch(model, gpu, fp8, layout)):
        words = command_words(text)
        fmt, recipe = words[words.index("--fp8-format") + 1], words[words.index("--fp8-recipe") + 1]
        assert (fmt, recipe) == ("e4m3", "tensorwise")
    for text in (slime_run(model, gpu, bf16, layout), slime_launch(model, gpu, bf16, layout)):
        assert not [w for w in command_words(text) if w.startswith("--fp8")]


# ------------------------------------------------------------------ a job slime's command does not set up
def _stand_in(tmp_path: Path) -> dict:
    """Every path the launch asks for, set, and a slime checkout whose train_async.py leaves a file if it runs."""
    slime = tmp_path / "slime"
    (slime / "scripts" / "models").mkdir(parents=True)
    (slime / "train_async.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('ran')\n")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "pretokenized_sft_rollout.py").write_text("")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").symlink_to(sys.executable)
    return {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLIME_DIR": str(slime), "HF_CKPT": "/h", "TORCH_DIST": "/t",
            "SFT_DATA": "/d", "PROFILE_DIR": "/p", "ATTUNE_SLIME_FILES": str(tmp_path / "files")}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("case", sorted(UNPRICED))
def test_the_launch_of_a_job_slime_does_not_set_up_stops_in_one_line(case, tmp_path):
    fields, named = UNPRICED[case]
    model, gpu, workload = load_model("llama3-8b"), load_gpu("h100"), Workload(seq_len=4096, global_batch=64, **fields)
    layout = Layout(8, tp=2)
    path = tmp_path / "r.launch.sh"
    path.write_text(slime_launch(model, gpu, workload, layout, rollout_dir=str(tmp_path / "files")))
    for env in (_stand_in(tmp_path), {"PATH": "/usr/bin:/bin"}):   # every path set, or none: it stops at once
        done = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=60)
        lines = done.stderr.splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0].startswith("not launched: ") and named in lines[0] and "another job" in lines[0]
        assert not (tmp_path / "ran").exists()
    recipe = recipe_of(model, gpu, workload, layout)
    assert named in recipe["stack"]["framework"] and "stops at once" in recipe["stack"]["framework"]
    assert any(line.startswith("# NOT THE PRICED JOB: ") and named in line for line in recipe["run"].splitlines())


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_launch_of_slimes_own_job_runs(tmp_path):
    model, gpu = load_model("llama3-8b"), load_gpu("h100")
    path = tmp_path / "r.launch.sh"
    path.write_text(slime_launch(model, gpu, Workload(), Layout(8, tp=2), rollout_dir=str(tmp_path / "files")))
    done = subprocess.run(["bash", str(path)], env=_stand_in(tmp_path), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").read_text() == "ran"
    assert "NOT THE PRICED JOB" not in slime_run(model, gpu, Workload(), Layout(8, tp=2))


# ------------------------------------------------------------------ slime's MODEL_ARGS script: its model only
def _config_in(tmp_path: Path, folder: str, data: dict) -> Path:
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))
    return path


def test_a_config_in_a_folder_named_like_a_catalog_model_gets_its_own_model_args(tmp_path):
    gpu, workload = load_gpu("h200"), Workload()
    mixtral = load_model(str(_config_in(tmp_path, "qwen3-30b-a3b", json.loads(MIXTRAL.read_text()))))
    assert mixtral.name == "qwen3-30b-a3b" and slime_model_script(mixtral) is None
    run, launch = slime_run(mixtral, gpu, workload, MOE_LAYOUT), slime_launch(mixtral, gpu, workload, MOE_LAYOUT)
    assert "qwen3-30B-A3B.sh" in run.splitlines()[0] and "built from its config" in run.splitlines()[0]
    assert "source " not in launch and "MODEL_ARGS=(--num-layers 32 " in launch   # Mixtral's 32 layers
    # the catalog model itself, and its config.json in a folder of another name, get slime's script
    catalog = yaml.safe_load((ROOT / "cost_model" / "catalog" / "models" / "qwen3-30b-a3b.yaml").read_text())
    catalog.pop("_attune")
    copy = load_model(str(_config_in(tmp_path, "Qwen3-30B-A3B", catalog)))
    for model in (load_model("qwen3-30b-a3b"), copy):
        assert slime_model_script(model) == "scripts/models/qwen3-30B-A3B.sh"
        assert "source scripts/models/qwen3-30B-A3B.sh   # MODEL_ARGS" in slime_launch(model, gpu, workload, MOE_LAYOUT)
    # another RoPE base is another model to slime's script (it sets --rotary-base)
    other_base = load_model(str(_config_in(tmp_path, "qwen3-30b-a3b-long", {**catalog, "rope_theta": 5e6})))
    assert slime_model_script(other_base) is None


def test_predict_recipe_out_of_such_a_config_builds_its_model_args(tmp_path, capsys):
    from tuner.cli import main

    path = _config_in(tmp_path, "qwen3-30b-a3b", json.loads(MIXTRAL.read_text()))
    out = tmp_path / "r.yaml"
    assert main(["predict", "--model", str(path), "--gpu", "h200", "--layout", "ep=8", "--recipe-out", str(out)]) == 0
    capsys.readouterr()
    first = yaml.safe_load(out.read_text())["run"].splitlines()[0]
    assert "built from its config: --num-layers 32 " in first and "source <slime>" not in first


# ------------------------------------------------------------------ MFU: the format's, and what it counts
def test_an_fp8_recipes_mfu_is_the_formats_and_its_note_says_so():
    model, gpu, workload = load_model("qwen3-30b-a3b"), load_gpu("h100"), Workload(precision="fp8")
    recipe = recipe_of(model, gpu, workload, MOE_LAYOUT)
    result, n = recipe["result"], model.params.active_non_embedding
    bf16 = 6 * n * result["tokens_per_s_per_gpu"] / (gpu.bf16_tflops * 1e12)
    assert result["mfu"] == pytest.approx(bf16, abs=1e-4)
    assert result["predicted"]["mfu"] == pytest.approx(6 * n * result["predicted"]["tokens_per_s_per_gpu"]
                                                       / (gpu.bf16_tflops * 1e12), rel=1e-4)
    note = result["mfu_note"]
    assert note.startswith(f"predicted: 6 x active params x tokens/s per GPU / {gpu.bf16_tflops:g} TFLOP/s")
    assert "bf16 peak" in note and f"fp8 peak ({gpu.fp8_tflops:g} TFLOP/s)" in note
    assert f"({result['mfu'] * gpu.bf16_tflops / gpu.fp8_tflops:.1%})" in note


def test_a_lora_recipes_mfu_says_a_frozen_base_does_two_thirds_of_the_work():
    model, gpu = load_model("llama3-8b"), load_gpu("h100")
    lora = Workload(seq_len=4096, global_batch=64, framework="megatron", peft="lora")
    result = recipe_of(model, gpu, lora, Layout(8))["result"]
    assert result["mfu"] == pytest.approx(format_mfu(model.params.active_non_embedding,
                                                     result["tokens_per_s_per_gpu"], gpu), abs=1e-4)
    note = result["mfu_note"]
    assert "4 x N" in note and "about 2/3 of this figure" in note and f"({result['mfu'] * 2 / 3:.1%})" in note
    full = recipe_of(model, gpu, Workload(seq_len=4096, global_batch=64, framework="megatron"), Layout(8))
    assert "2/3" not in full["result"]["mfu_note"] and "fp8" not in full["result"]["mfu_note"]


def test_a_measured_fp8_recipes_mfu_is_the_formats():
    """predict and the runners give the format's MFU (metrics.format_mfu); a measured recipe keeps the trial's and its
    note names the bf16 peak it divides by."""
    from cost_model.predict import predict
    from tuner.export import _record_measurement

    model, gpu, workload = load_model("qwen3-30b-a3b"), load_gpu("h100"), Workload(precision="fp8")
    p = predict(model, gpu, workload, MOE_LAYOUT)
    assert p.mfu == pytest.approx(format_mfu(model.params.active_non_embedding, p.tokens_per_s_per_gpu, gpu))
    recipe = recipe_of(model, gpu, workload, MOE_LAYOUT)
    tokens = 5000.0
    trial_mfu = format_mfu(model.params.active_non_embedding, tokens, gpu)   # a runner's figure
    result = SimpleNamespace(step_time_cv_percent=1.0, mfu=trial_mfu, gpu_hours=0.5, source="measured on a stand-in",
                             trial_result=lambda: SimpleNamespace(details={}))
    config = SimpleNamespace(model=model, gpu=gpu, workload=workload, window=(5, 19), steps=20)
    _record_measurement(recipe, SimpleNamespace(number=0, tokens_per_s_per_gpu=tokens), SimpleNamespace(result=result),
                        config, SimpleNamespace(user_attrs={}))
    assert recipe["status"] == "measured"
    assert recipe["result"]["mfu"] == trial_mfu == pytest.approx(6 * model.params.active_non_embedding * tokens
                                                                 / (gpu.bf16_tflops * 1e12))
    assert recipe["result"]["mfu_note"].startswith("measured: 6 x active params of the model run x tokens/s per GPU / "
                                                   f"{gpu.bf16_tflops:g} TFLOP/s")


# ------------------------------------------------------------------ flags of another family
def test_the_loss_mask_is_named_for_qwen_templates_only():
    gpu, workload = load_gpu("h200"), Workload()
    masks = {}
    for name, layout in (("llama3-8b", Layout(8)), ("qwen3-30b-a3b", MOE_LAYOUT), ("qwen3.6-35b-a3b", MOE_LAYOUT),
                         ("deepseek-v3", Layout(256, pp=8, ep=32, etp=1, max_tokens_per_gpu=8192))):
        words = command_words(slime_run(load_model(name), gpu, workload, layout))
        masks[name] = words[words.index("--loss-mask-type") + 1] if "--loss-mask-type" in words else None
    mixtral = command_words(slime_run(load_model(str(MIXTRAL)), gpu, workload, MOE_LAYOUT))
    assert masks == {"llama3-8b": None, "qwen3-30b-a3b": "qwen3", "qwen3.6-35b-a3b": "qwen3_5", "deepseek-v3": None}
    assert "--loss-mask-type" not in mixtral
    for value in masks.values():
        assert value is None or value in ARGS["--loss-mask-type"]["choices"]


def test_a_config_built_moe_launch_names_its_dispatcher_once():
    model, gpu, workload = load_model(str(MIXTRAL)), load_gpu("h200"), Workload()
    for layout, dispatcher in ((MOE_LAYOUT, "alltoall"), (FLEX, "flex")):
        launch = slime_launch(model, gpu, workload, layout)
        line = next(line for line in launch.splitlines() if line.startswith("MODEL_ARGS=("))
        words = shlex.split(line[len("MODEL_ARGS=("):line.rindex(")")]) + command_words(launch)
        assert words.count("--moe-token-dispatcher-type") == 1, launch
        assert words[words.index("--moe-token-dispatcher-type") + 1] == dispatcher
        run = slime_run(model, gpu, workload, layout)   # its comment line holds the built MODEL_ARGS
        assert (run.splitlines()[0].split() + command_words(run)).count("--moe-token-dispatcher-type") == 1


def test_a_dense_models_recipe_has_no_expert_flags_and_no_dispatcher(tmp_path):
    gpu, workload = load_gpu("h200"), Workload()
    dense, layout = load_model("llama3-8b"), Layout(8, tp=2)
    recipe = recipe_of(dense, gpu, workload, layout)
    words = command_words(recipe["run"])
    assert "--expert-model-parallel-size" not in words and "--expert-tensor-parallel-size" not in words
    assert words[words.index("--tensor-model-parallel-size") + 1] == "2"
    assert recipe["layout"]["dispatcher"] is None and "ETP" not in recipe["layout"]["summary"]
    path = write_recipe(recipe, recipe_path(tmp_path, dense, gpu, recipe_name(layout)))
    assert load_recipe(path).case.layout == layout   # null reads back as the layout it was
    moe = recipe_of(load_model("qwen3-30b-a3b"), gpu, workload, MOE_LAYOUT)
    moe_words = command_words(moe["run"])
    assert moe_words[moe_words.index("--expert-model-parallel-size") + 1] == "8"
    assert moe["layout"]["dispatcher"] == "alltoall" and "EP 8" in moe["layout"]["summary"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_on_a_running_ray_cluster_the_launch_submits_the_exports_as_the_jobs_runtime_env(tmp_path):
    """A cluster's actors see none of the launch's exports (Ray starts them in its own processes; slime's rollout
    manager imports attune's rollout function there): with RAY_ADDRESS the job goes through `ray job submit` with
    them as its runtime environment, as slime's run scripts submit theirs."""
    model, gpu = load_model("llama3-8b"), load_gpu("h100")
    path = tmp_path / "r.launch.sh"
    path.write_text(slime_launch(model, gpu, Workload(), Layout(8, tp=2), rollout_dir=str(tmp_path / "files")))
    env = _stand_in(tmp_path)
    ray = tmp_path / "bin" / "ray"   # a stand-in that records its arguments, then runs the entrypoint after --
    ray.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$(dirname "$0")/../ray-args"\n'
                   'while [ "$1" != "--" ]; do shift; done; shift; cd /; exec "$@"\n')
    ray.chmod(0o755)
    done = subprocess.run(["bash", str(path)], env={**env, "RAY_ADDRESS": "http://head:8265"}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").read_text() == "ran"   # the entrypoint's path holds from any working directory
    args = (tmp_path / "ray-args").read_text().splitlines()
    assert args[:4] == ["job", "submit", "--address", "http://head:8265"] and args[4] == "--runtime-env-json"
    env_vars = json.loads(args[5])["env_vars"]
    assert env_vars["PYTHONPATH"].split(":")[:2] == [env["ATTUNE_SLIME_FILES"], env["SLIME_DIR"]]
    assert env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and env_vars["NCCL_NVLS_ENABLE"] in ("0", "1")
    (tmp_path / "ran").unlink()
    assert subprocess.run(["bash", str(path)], env=env, timeout=60).returncode == 0   # no cluster named: no submit
    assert (tmp_path / "ran").exists() and (tmp_path / "ray-args").stat().st_mtime <= (tmp_path / "ran").stat().st_mtime


def test_the_ep_overlap_runs_with_more_than_one_cuda_connection():
    """Megatron's EP all-to-all overlap needs CUDA_DEVICE_MAX_CONNECTIONS > 1 (its MoE README); the recipe env had 1."""
    from recipes.slime_command import slime_env

    gpu = load_gpu("h200")
    overlap = Layout(16, pp=2, vpp=2, ep=8, dispatcher="flex", overlap_moe_expert_parallel_comm=True)
    assert slime_env(overlap, gpu)["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    assert slime_env(Layout(16, pp=2, vpp=2, ep=8, dispatcher="flex"), gpu)["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
