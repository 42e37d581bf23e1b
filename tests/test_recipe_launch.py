"""The runnable launch `tune export` writes beside each recipe: bash that runs the recipe's run from a slime
checkout (here a stand-in checkout whose train_async.py records its arguments)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.workload import Workload
from recipes.recipe import STEPS_PER_RUN
from recipes.slime_command import slime_launch, slime_run

LAYOUT = Layout(8, ep=8, max_tokens_per_gpu=16384, recompute_granularity="full", recompute_method="uniform",
                recompute_num_layers=1, dispatcher="flex")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _launch(tmp_path: Path) -> Path:
    text = slime_launch(load_model("qwen3.6-35b-a3b"), load_gpu("h200"), Workload(), LAYOUT,
                        num_rollout=STEPS_PER_RUN, title="r.yaml", rollout_dir=str(tmp_path / "files"))
    path = tmp_path / "r.launch.sh"
    path.write_text(text)
    return path


def _checkout(tmp_path: Path) -> Path:
    slime = tmp_path / "slime"
    (slime / "scripts" / "models").mkdir(parents=True)
    (slime / "scripts" / "models" / "qwen3.5-35B-A3B.sh").write_text("MODEL_ARGS=(--num-layers 40 --hidden-size 2048)\n")
    (slime / "train_async.py").write_text(
        "import json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'nvls': os.environ.get('NCCL_NVLS_ENABLE'),\n"
        "           'path': os.environ.get('PYTHONPATH', '')}, open(os.environ['ATTUNE_TEST_OUT'], 'w'))\n")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "pretokenized_sft_rollout.py").write_text("")
    bin_dir = tmp_path / "bin"                       # `python3` is this interpreter; no nvidia-smi on the PATH
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    return slime


def test_the_launch_runs_the_recipes_command_from_a_slime_checkout(tmp_path):
    path = _launch(tmp_path)
    slime = _checkout(tmp_path)
    out = tmp_path / "argv.json"
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLIME_DIR": str(slime), "HF_CKPT": "/ckpt/hf",
           "TORCH_DIST": "/ckpt/dist", "SFT_DATA": "/data/rows.jsonl", "PROFILE_DIR": "/prof",
           "ATTUNE_TEST_OUT": str(out)}
    done = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    ran = json.loads(out.read_text())
    argv = ran["argv"]
    assert argv[:4] == ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8"]
    assert argv[4:8] == ["--num-layers", "40", "--hidden-size", "2048"]           # MODEL_ARGS where the recipe puts it
    assert argv[argv.index("--hf-checkpoint") + 1] == "/ckpt/hf" and argv[argv.index("--prompt-data") + 1] == "/data/rows.jsonl"
    assert argv[argv.index("--expert-model-parallel-size") + 1] == "8" and argv[argv.index("--max-tokens-per-gpu") + 1] == "16384"
    assert "--moe-flex-dispatcher-backend" in argv and "--moe-enable-deepep" not in argv and "--async" not in argv
    assert ran["nvls"] == "0" and ran["path"].split(":")[0] == str(tmp_path / "files")
    # every flag of the recipe's own run block is in the launch but the format's --async (slime's async entry)
    recipe_flags = {w for w in slime_run(load_model("qwen3.6-35b-a3b"), load_gpu("h200"), Workload(), LAYOUT,
                                         num_rollout=STEPS_PER_RUN).split() if w.startswith("--")}
    assert recipe_flags - set(argv) == {"--async"}


def test_the_launch_stops_at_once_on_an_unset_path(tmp_path):
    path = _launch(tmp_path)
    done = subprocess.run(["bash", str(path)], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and "SLIME_DIR" in done.stderr


@pytest.mark.slow
def test_export_writes_an_executable_launch_beside_each_recipe(tmp_path):
    from tuner.cli import main

    storage = tmp_path / "s.db"
    assert main(["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--trials", "2", "--storage", str(storage),
                 "--top", "0", "--no-progress"]) == 0
    assert main(["export", "--study", "llama3-8b-h100-x8", "--storage", str(storage), "--out", str(tmp_path / "r"),
                 "--top", "2"]) == 0
    recipes = sorted((tmp_path / "r").rglob("*.yaml"))
    launches = sorted((tmp_path / "r").rglob("*.launch.sh"))
    assert len(recipes) == 2 and [p.name for p in launches] == [r.stem + ".launch.sh" for r in recipes]
    for p in launches:
        assert os.access(p, os.X_OK)
        assert subprocess.run(["bash", "-n", str(p)], capture_output=True).returncode == 0
        text = p.read_text()
        assert '"$@" python3 "$SLIME_DIR"/train_async.py' in text and "<slime entry module>" not in text
