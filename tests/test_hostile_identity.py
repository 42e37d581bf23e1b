"""Issue 29, points 3 and 6: a study or recipe read back with another model of its name (a config.json named like
a catalog model, a config.json edited after tuning) is refused in one line with exit 2, writing nothing; a
recipe that records no model is priced and says so; YAML merge keys are refused naming the file and line; a
quoted or arrayed parallel-size flag in a recipe's run command is checked against its layout."""
from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml

from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import CATALOG_DIR, load_model
from cost_model.predict import predict
from cost_model.nouns.workload import Workload
from recipes.recipe import RecipeError, build_recipe, load_recipe, write_recipe
from tuner.cli import main

REFERENCE = Path(__file__).resolve().parent / "fixtures" / "reference_recipes" / "attune-tp1-pp1-ep8.yaml"
RUN = ["--gpu", "h100", "--gpus", "8", "--trials", "1", "--no-progress", "--top", "0"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def four_layer_llama(folder: str = "llama3-8b") -> Path:
    """The catalog's Llama3-8B at 4 layers, as ./<folder>/config.json (a folder named like the catalog key)."""
    data = yaml.safe_load((CATALOG_DIR / "llama3-8b.yaml").read_text())
    data.pop("_attune")
    Path(folder).mkdir()
    path = Path(folder, "config.json")
    path.write_text(json.dumps(dict(data, num_hidden_layers=4)))
    return path


def recipe_of(model, path: Path) -> Path:
    """A predicted recipe of `model` on 8 x H100 written to `path`, as export writes one."""
    gpu, workload, layout = load_gpu("h100"), Workload(seq_len=8192, global_batch=128), Layout(8)
    return write_recipe(build_recipe(model, gpu, workload, layout, predict(model, gpu, workload, layout)), path)


# ------------------------------------------------------------------ export (point 3)
@pytest.mark.slow
def test_export_with_another_model_of_the_name_names_the_study_and_both_sources(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--model", "llama3-8b", *RUN, "--storage", "s.db", "--study", "cat"]) == 0
    config = four_layer_llama()
    capsys.readouterr()
    assert main(["export", "--study", "cat", "--storage", "s.db", "--out", "r", "--model", str(config)]) == 2
    line = one_line(capsys)
    assert "study 'cat'" in line and "catalog's architecture" in line, line
    assert f"--model {config}" in line and "another model's" in line, line
    assert not Path("r").exists()


@pytest.mark.slow
def test_export_with_another_catalog_model_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--model", "qwen3-30b-a3b", *RUN, "--storage", "s.db", "--study", "cat"]) == 0
    capsys.readouterr()
    assert main(["export", "--study", "cat", "--storage", "s.db", "--out", "r", "--model", "llama3-8b"]) == 2
    line = one_line(capsys)
    assert "study 'cat' was tuned on qwen3-30b-a3b" in line and "catalog's llama3-8b" in line, line
    assert not Path("r").exists()
    assert main(["export", "--study", "cat", "--storage", "s.db", "--out", "r", "--model", "qwen3-30b-a3b"]) == 0


@pytest.mark.slow
def test_export_of_a_config_edited_after_tuning_names_the_study_and_the_recorded_digest(tmp_path, capsys,
                                                                                      monkeypatch):
    from tuner.model_identity import architecture_digest

    monkeypatch.chdir(tmp_path)
    config = four_layer_llama("m1")
    tuned = architecture_digest(load_model(str(config)))
    assert main(["--model", "m1", *RUN, "--storage", "s.db", "--study", "s"]) == 0
    data = json.loads(config.read_text())
    config.write_text(json.dumps(dict(data, num_hidden_layers=8)))   # edited after tuning
    now = architecture_digest(load_model(str(config)))
    capsys.readouterr()
    assert main(["export", "--study", "s", "--storage", "s.db", "--out", "r"]) == 2
    line = one_line(capsys)
    assert "study 's'" in line and tuned in line and now in line and "m1/config.json" in line, line
    assert not Path("r").exists()


# ------------------------------------------------------------------ resume (point 3)
@pytest.mark.slow
def test_a_catalog_study_is_not_resumed_with_a_config_json_named_like_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--model", "llama3-8b", *RUN, "--storage", "s.db", "--study", "s"]) == 0
    four_layer_llama()
    capsys.readouterr()
    assert main(["--model", "./llama3-8b", *RUN, "--storage", "s.db", "--study", "s"]) == 2
    assert "study 's'" in one_line(capsys)
    study = optuna.load_study(study_name="s", storage="sqlite:///s.db")
    assert "architecture" not in study.user_attrs["config"]     # still the catalog model's study
    assert len(study.trials) == 1


# ------------------------------------------------------------------ predict --recipe (point 3)
def test_predict_refuses_a_recipe_of_a_config_json_named_like_a_catalog_model(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    small = load_model(str(four_layer_llama()))
    path = recipe_of(small, tmp_path / "r" / "small.yaml")
    assert load_recipe(path).case.model == load_model("llama3-8b")   # its name reads back as the catalog's
    capsys.readouterr()
    assert main(["predict", "--recipe", str(path)]) == 2
    line = one_line(capsys)
    assert str(path) in line and "result.active_params.architecture" in line and "another model's" in line, line
    assert capsys.readouterr().out == ""


def test_predict_takes_a_recipes_config_json_under_another_name_and_refuses_an_edited_one(tmp_path, capsys,
                                                                                         monkeypatch):
    """The same config.json copied to a Hugging Face-style folder of another name is the same model: the recipe is
    priced, at the figure it records; the copy edited is still refused."""
    monkeypatch.chdir(tmp_path)
    config = four_layer_llama("mine")
    path = recipe_of(load_model(str(config)), tmp_path / "r.yaml")
    Path("Other-Name").mkdir()
    Path("Other-Name", "config.json").write_text(config.read_text())
    capsys.readouterr()
    assert main(["predict", "--recipe", str(path), "--model", "Other-Name", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    recorded = yaml.safe_load(path.read_text())["result"]["predicted"]["tokens_per_s_per_gpu"]
    assert answer["model"] == "mine" and answer["tokens_per_s_per_gpu"] == pytest.approx(recorded, rel=1e-5)
    data = json.loads(config.read_text())
    Path("Other-Name", "config.json").write_text(json.dumps(dict(data, num_hidden_layers=8)))
    assert main(["predict", "--recipe", str(path), "--model", "Other-Name"]) == 2
    assert "another model's" in one_line(capsys)


def test_predict_batch_answers_a_mismatched_recipe_with_an_error_object(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = recipe_of(load_model(str(four_layer_llama())), tmp_path / "small.yaml")
    Path("b.jsonl").write_text(json.dumps({"recipe": str(path)}) + "\n" + json.dumps({"recipe": str(REFERENCE)}))
    assert main(["predict", "--batch", "b.jsonl"]) == 1
    first, second = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert "another model's" in first["error"]
    assert "tokens_per_s_per_gpu" in second and "not checked" in second["notes"][0]


def test_a_recipe_without_a_model_digest_is_priced_and_said_unchecked(capsys):
    assert main(["predict", "--recipe", str(REFERENCE), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["model"] == "qwen3.6-35b-a3b"   # stdout stays the answer
    assert "records no model architecture" in out.err and "not checked" in out.err


def test_an_exported_catalog_recipe_records_its_digest_and_predicts_without_a_note(tmp_path, capsys):
    path = recipe_of(load_model("llama3-8b"), tmp_path / "r.yaml")
    assert yaml.safe_load(path.read_text())["result"]["active_params"]["architecture"]
    assert main(["predict", "--recipe", str(path)]) == 0
    out = capsys.readouterr()
    assert out.err == "" and "Llama3-8B on 8 x H100" in out.out


def test_a_recipe_of_another_model_of_the_name_does_not_replace_one_of_the_catalog(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "r.yaml"
    recipe_of(load_model("llama3-8b"), target)
    before = target.read_bytes()
    small = load_model(str(four_layer_llama("Llama3-8B")))   # its display name is the catalog's
    with pytest.raises(RecipeError, match="another model of that name"):
        recipe_of(small, target)
    assert target.read_bytes() == before


# ------------------------------------------------------------------ YAML merge keys (point 6)
def test_a_merge_key_in_a_recipe_is_refused_naming_the_file_and_line(tmp_path, capsys):
    text = REFERENCE.read_text()
    text = "gpu_base: &g\n  type: H200\n" + text.replace("gpu:\n  type: H200\n", "gpu:\n  <<: *g\n")
    assert "<<: *g" in text
    path = tmp_path / "merged.yaml"
    path.write_text(text)
    capsys.readouterr()
    assert main(["predict", "--recipe", str(path)]) == 2
    line = one_line(capsys)
    assert f"{path}: line 6 column 3: YAML merge keys (<<) are not accepted" in line, line


def test_a_merge_key_in_a_cluster_file_is_refused_naming_the_file_and_line(tmp_path):
    from experiments.slime.cluster import ClusterError, load_cluster

    path = tmp_path / "cluster.yaml"
    path.write_text("ray_address: http://head:8265\nenv:\n  NCCL_DEBUG: WARN\n  <<: {NCCL_IB_DISABLE: '1'}\n")
    with pytest.raises(ClusterError) as err:
        load_cluster(str(path))
    assert str(err.value) == (f"--cluster {path}: line 4 column 3: YAML merge keys (<<) are not accepted: write the "
                              f"merged keys out")


# ------------------------------------------------------------------ the run command's flags (point 6)
def _edited(tmp_path, old: str, new: str) -> Path:
    text = REFERENCE.read_text()
    assert old in text
    path = tmp_path / "edited.yaml"
    path.write_text(text.replace(old, new))
    return path


TP = "    --tensor-model-parallel-size 1 \\\n"
APOSTROPHE = "  python3 -m <slime entry module> --async \\\n"   # a comment with an apostrophe goes above it


@pytest.mark.parametrize("old, new", [
    (TP, "    --tensor-model-parallel-size '4' \\\n"),
    (TP, '    --tensor-model-parallel-size "4" \\\n'),
    # a comment's apostrophe made the command unsplittable, and the word split kept the flag's quotes
    (TP, "    '--tensor-model-parallel-size' 4 \\\n"),
    # a bash array's first word: `ARGS=(--flag`
    (APOSTROPHE, "  PERF_ARGS=(--tensor-model-parallel-size 4)\n" + APOSTROPHE),
])
def test_a_quoted_or_arrayed_parallel_size_is_checked_against_the_layout(tmp_path, old, new):
    path = _edited(tmp_path, old, new)
    if "'--tensor" in new:
        path.write_text(path.read_text().replace(APOSTROPHE, "  # slime's entry\n" + APOSTROPHE))
    with pytest.raises(RecipeError, match="sets --tensor-model-parallel-size 4 but the layout has TP 1"):
        load_recipe(path)


def test_a_comment_apostrophe_does_not_refuse_a_quoted_value_that_matches(tmp_path):
    path = _edited(tmp_path, APOSTROPHE, "  # slime's entry\n" + APOSTROPHE)
    path.write_text(path.read_text().replace(TP, "    --tensor-model-parallel-size '1' \\\n"))
    assert load_recipe(path).case.layout.tp == 1
