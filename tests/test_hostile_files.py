"""Issue 15, part B: hostile user files, numbers read from files, names. Every case ends in one line naming
the file and the problem, exit 2 through the CLI, nothing written; names never add a shell line or reach
the terminal with control characters."""
from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cost_model.nouns.model_spec import ModelError, load_model
from cost_model.nouns.names import clean_name, file_name
from cost_model.profile import ProfileError, load_profile
from cost_model.nouns.user_file import MAX_NESTING, MAX_USER_FILE_BYTES, read_user_text
from tuner.cli import main

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "cost_model/catalog/models/qwen3-30b-a3b.yaml"
PROFILE = ROOT / "cost_model/data/profiles/h200.yaml"
RECIPE = ROOT / "tests/fixtures/reference_recipes/attune-tp1-pp1-ep8.yaml"
TARGET = ["--model", "qwen3-30b-a3b", "--gpu", "h200", "--gpus", "2"]   # a space scored in under a second
FIFO_TIMEOUT_S = 60   # the CLI's imports take seconds; a FIFO that blocks would wait forever


def fails_in_one_line(capsys, argv: list[str], folder: Path, *words: str) -> str:
    """Run the CLI in `folder`: exit 2, one stderr line naming `words`, no traceback, nothing written."""
    before = sorted(p.name for p in folder.iterdir())
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        code = main(argv)
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and "error:" in err[0] and "Traceback" not in err[0], err
    assert "\x1b" not in err[0]
    for word in words:
        assert word in err[0], (word, err[0])
    assert sorted(p.name for p in folder.iterdir()) == before, "a failed command wrote a file"
    return err[0]


def config(tmp_path: Path, name: str = "config.json", **changes) -> Path:
    data = yaml.safe_load(CATALOG.read_text())
    data.update(changes)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _edited(source: Path, tmp_path: Path, name: str, edit) -> Path:
    """A copy of the YAML file `source` in tmp_path/name, changed in place by `edit`."""
    data = yaml.load(source.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))   # libyaml: fast
    edit(data)
    path = tmp_path / name
    path.write_text(yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper)))
    return path


def profile(tmp_path: Path, edit) -> Path:
    return _edited(PROFILE, tmp_path, "profile.yaml", edit)


def recipe(tmp_path: Path, edit) -> Path:
    return _edited(RECIPE, tmp_path, "recipe.yaml", edit)


def inputs(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


# ---------------------------------------------------------------- not a regular file: devices, FIFOs, size
@pytest.mark.parametrize("argv", [
    ["predict", *TARGET, "--profile", "/dev/zero"],
    [*TARGET, "--profile", "/dev/zero", "--no-progress"],
    ["predict", "--recipe", "/dev/zero"],
    ["predict", "--model", "/dev/zero", "--gpu", "h200"],
    ["check-convergence", "--candidate", "/dev/zero", "--reference", "/dev/zero"],
])
def test_dev_zero_is_refused_not_read(argv, tmp_path, capsys):
    fails_in_one_line(capsys, argv, tmp_path, "/dev/zero", "not a regular file")


@pytest.mark.parametrize("flags", [
    ["predict", *TARGET, "--profile", "{fifo}"],
    ["predict", "--recipe", "{fifo}"],
    ["predict", "--model", "{fifo}", "--gpu", "h200"],
    ["check-convergence", "--candidate", "{fifo}", "--reference", "{fifo}"],
])
def test_a_fifo_is_refused_without_waiting_for_a_writer(flags, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    argv = [a.replace("{fifo}", str(fifo)) for a in flags]
    done = subprocess.run([sys.executable, "-m", "tuner", *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=FIFO_TIMEOUT_S, env={**os.environ, "PYTHONPATH": str(ROOT)})
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stderr
    assert "not a regular file" in err[0] and str(fifo) in err[0]


def test_a_file_over_the_size_limit_is_refused(tmp_path, capsys):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:
        fh.write(b"schema_version: 1\n# ")
        fh.truncate(MAX_USER_FILE_BYTES + 1)   # sparse: nothing is held in memory to write it
    line = fails_in_one_line(capsys, ["predict", *TARGET, "--profile", str(big)], inputs(tmp_path), "big.yaml")
    assert "too large" in line and "16 MiB" in line
    assert read_user_text(tmp_path / "big.yaml", ProfileError, limit=MAX_USER_FILE_BYTES + 1)  # the limit is it


def test_an_unreadable_path_is_one_line():
    with pytest.raises(ModelError, match="NUL byte"):
        load_model("qwen\x00.json")
    with pytest.raises(ProfileError, match="NUL byte"):
        load_profile("a\x00b.yaml")
    with pytest.raises(ModelError, match="cannot read"):
        load_model("m" * 5000 + ".json")   # longer than any file name may be


# ---------------------------------------------------------------- nesting, huge integers, YAML bombs
def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("what", ["model", "recipe", "profile", "curve"])
def test_nesting_3000_deep_is_one_line(what, tmp_path, capsys):
    path = tmp_path / {"model": "c.json", "recipe": "r.yaml", "profile": "p.yaml", "curve": "l.json"}[what]
    path.write_text(deep(3000))
    argv = {"model": ["predict", "--model", str(path), "--gpu", "h200"],
            "recipe": ["predict", "--recipe", str(path)],
            "profile": ["predict", *TARGET, "--profile", str(path)],
            "curve": ["check-convergence", "--candidate", str(path), "--reference", str(path)]}[what]
    fails_in_one_line(capsys, argv, inputs(tmp_path), path.name, f"nested deeper than {MAX_NESTING} levels")


@pytest.mark.parametrize("what", ["model", "recipe"])
def test_nesting_past_the_limit_the_parser_reads_names_the_file_once(what, tmp_path, capsys):
    # 80 levels: under the text check's bounds (block indentation, few brackets), so the parsed data's depth
    # is what refuses it; that refusal once went through the parsers' ValueError handler and named the path twice
    if what == "model":
        path = tmp_path / "c.json"
        path.write_text('{"model_type": ' + deep(80) + "}")
        argv = ["predict", "--model", str(path), "--gpu", "h200"]
    else:
        path = tmp_path / "r.yaml"
        path.write_text("a:\n" + "".join("  " * i + "b:\n" for i in range(1, 80)))
        argv = ["predict", "--recipe", str(path)]
    err = fails_in_one_line(capsys, argv, inputs(tmp_path), path.name, f"nested deeper than {MAX_NESTING} levels")
    assert err.count(path.name) == 1, err


def test_nesting_within_the_limit_still_reads(tmp_path, capsys):
    # 60 levels inside a field the loader ignores: the bound refuses depth, not unusual fields
    path = config(tmp_path, notes=json.loads(deep(60)))
    assert main(["predict", "--model", str(path), "--gpu", "h200", "--layout", "ep=8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("what", ["model", "recipe", "profile", "curve"])
def test_an_integer_of_5000_digits_is_one_line(what, tmp_path, capsys):
    digits = "9" * 5000
    path = tmp_path / {"model": "c.json", "recipe": "r.yaml", "profile": "p.yaml", "curve": "l.json"}[what]
    path.write_text({"model": f'{{"hidden_size": {digits}}}', "recipe": f"model: {digits}\n",
                     "profile": f"schema_version: {digits}\n", "curve": f'[{{"step": {digits}, "loss": 1}}]'}[what])
    argv = {"model": ["predict", "--model", str(path), "--gpu", "h200"],
            "recipe": ["predict", "--recipe", str(path)],
            "profile": ["predict", *TARGET, "--profile", str(path)],
            "curve": ["check-convergence", "--candidate", str(path), "--reference", str(path)]}[what]
    fails_in_one_line(capsys, argv, inputs(tmp_path), path.name, "integer longer than")


def billion_laughs(levels: int = 10) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("flag", ["--profile", "--recipe"])
def test_a_yaml_bomb_is_harmless(flag, tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("schema_version: 1\n" + billion_laughs())
    argv = ["predict", *TARGET, "--profile", str(bomb)] if flag == "--profile" else ["predict", "--recipe", str(bomb)]
    done = subprocess.run([sys.executable, "-m", "tuner", *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=FIFO_TIMEOUT_S, env={**os.environ, "PYTHONPATH": str(ROOT)})
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1 and "bomb.yaml" in err[0], done.stderr


# ---------------------------------------------------------------- numbers in config.json
@pytest.mark.parametrize("changes, words", [
    ({"num_hidden_layers": 10 ** 7}, ["num_hidden_layers", "<= 1,024"]),
    ({"num_hidden_layers": 1e30}, ["num_hidden_layers", "<= 1,024"]),
    ({"num_hidden_layers": 1e400}, ["num_hidden_layers", "integer"]),        # JSON's 1e400 is inf
    ({"num_hidden_layers": "48"}, ["num_hidden_layers", "integer", "'48'"]),
    ({"num_hidden_layers": True}, ["num_hidden_layers", "integer"]),
    ({"hidden_size": 1 << 40}, ["hidden_size", "<="]),
    ({"vocab_size": [151936] * 10_000}, ["vocab_size", "integer", "a list of 10,000 items"]),   # short: its kind, not its text
    ({"partial_rotary_factor": float("nan")}, ["partial_rotary_factor", "finite"]),
    ({"partial_rotary_factor": 2}, ["partial_rotary_factor", "(0, 1]"]),
    ({"rope_parameters": {"partial_rotary_factor": -1}}, ["rope_parameters.partial_rotary_factor"]),
    ({"_attune": {"sources": ["x"]}}, ["_attune.sources", "mapping"]),
])
def test_config_numbers_are_checked_where_read(changes, words, tmp_path, capsys):
    path = config(tmp_path, **changes)
    line = fails_in_one_line(capsys, ["predict", "--model", str(path), "--gpu", "h200"], inputs(tmp_path),
                             "config.json", *words)
    assert len(line) < 400


# ---------------------------------------------------------------- numbers in profiles
def _set_memory(key, value):
    return lambda d: d["memory"].update({key: value})


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.update(gemm_bf16=[]), ["gemm_bf16 has no measured points"]),
    (lambda d: [p.update(tflops=0) for p in d["gemm_bf16"]], ["tflops must be positive"]),
    (_set_memory("hbm_copy_tb_s", float("nan")), ["memory.hbm_copy_tb_s", "not a finite number"]),
    (_set_memory("h2d_gb_s", -5.0), ["memory.h2d_gb_s must be positive"]),
    (_set_memory("h2d_gb_s", "50"), ["memory.h2d_gb_s must be a number", "'50'"]),
    (_set_memory("d2h_gb_s", True), ["memory.d2h_gb_s must be a number"]),
    (_set_memory("d2h_gb_s", 10 ** 300), ["memory.d2h_gb_s", "larger than"]),
    (lambda d: d.update(grouped_gemm_bf16=[]), ["grouped_gemm_bf16 has no point"]),
    (lambda d: d.update(attention_bf16=[]), ["attention_bf16 has no point"]),
    (lambda d: d.update(collectives=[]), ["collectives has no curve"]),
    (lambda d: d["linear_attention"].update(efficiency=3), ["efficiency", "at most 1"]),
])
def test_broken_profiles_are_refused_in_one_line(edit, words, tmp_path, capsys):
    path = profile(tmp_path, edit)
    fails_in_one_line(capsys, ["predict", *TARGET, "--profile", str(path)], inputs(tmp_path), "profile.yaml", *words)
    fails_in_one_line(capsys, [*TARGET, "--profile", str(path), "--no-progress"], inputs(tmp_path / "work"),
                      "profile.yaml", *words)


def test_the_shipped_profiles_pass_the_checks():
    assert load_profile(PROFILE).hbm_copy_tb_s > 0


# ---------------------------------------------------------------- recipes and curves
@pytest.mark.parametrize("edit, words", [
    (lambda d: d["gpu"].update(count=10 ** 30), ["gpu.count", "between 1 and 4,096"]),
    (lambda d: d["workload"].update(global_batch=1e30), ["workload.global_batch", "integer"]),
    (lambda d: d["workload"].update(row_tokens="8192"), ["workload.row_tokens", "integer"]),
    (lambda d: d.update(correctness=[1, 2]), ["correctness", "mapping"]),
    (lambda d: d["correctness"].update(component_tests="pass"), ["component_tests", "list"]),
    (lambda d: d.update(model="x\n\x1b[31mevil"), ["unknown model", "\\x1b"]),
])
def test_broken_recipes_are_refused_in_one_line(edit, words, tmp_path, capsys):
    path = recipe(tmp_path, edit)
    fails_in_one_line(capsys, ["predict", "--recipe", str(path)], inputs(tmp_path), "recipe.yaml", *words)


def test_curve_with_an_oversized_csv_field_is_one_line(tmp_path, capsys):
    path = tmp_path / "c.csv"
    path.write_text("step,loss\n1," + "9" * 200_000 + "\n")
    fails_in_one_line(capsys, ["check-convergence", "--candidate", str(path), "--reference", str(path)],
                      inputs(tmp_path), "c.csv", "malformed CSV")


def test_curve_integer_past_float_range_is_data_not_a_traceback(tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"steps": [1, 2, 3, 4, 5, 6], "losses": [3.0, 2.8, 2.6, 2.4, 2.2, 2.0]}))
    huge = tmp_path / "huge.json"
    huge.write_text('{"steps": [1, 2, 3, 4, 5, 6], "losses": [3.0, 2.8, 2.6, 2.4, 2.2, ' + "9" * 400 + "]}")
    assert main(["check-convergence", "--candidate", str(huge), "--reference", str(good)]) == 1
    assert "inf" in capsys.readouterr().out.lower()


# ---------------------------------------------------------------- names: commands, comments, files, terminal
EVIL = "Evil\nrm -rf ~\n\x1b[31mRED\x1b[0m\x07"


def test_a_display_name_with_a_newline_adds_no_shell_line(tmp_path, capsys):
    # another RoPE base than the catalog's: not the model slime's script defines, so the comment names the config's
    model = config(tmp_path, _attune={"display_name": EVIL}, rope_theta=2000000.0)
    out = tmp_path / "out" / "r.yaml"
    assert main(["predict", "--model", str(model), "--gpu", "h200", "--layout", "ep=8", "--recipe-out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "\x1b" not in printed.out + printed.err and "\x07" not in printed.out + printed.err
    data = yaml.safe_load(out.read_text())
    run = data["run"]
    assert not any(line.strip().startswith("rm ") for line in run.splitlines()), run
    comment = run.splitlines()[0]
    assert comment.startswith("# MODEL_ARGS:") and "Evil rm -rf ~ RED" in comment
    assert all(line == "" or line.startswith(("#", "export ", "python3 ", "  --", "  ${MODEL_ARGS"))
               for line in run.splitlines()), run
    assert subprocess.run(["bash", "-n"], input=run, text=True).returncode == 0
    assert "\n" not in data["model"] and "\x1b" not in data["model"]


def test_slime_command_refuses_any_field_that_would_add_a_line():
    from cost_model.nouns.hardware import load_gpu
    from cost_model.nouns.layout import Layout
    from cost_model.nouns.workload import Workload
    from recipes.slime_command import CommandError, slime_flag_lines, slime_run

    model, gpu = load_model("qwen3-30b-a3b"), load_gpu("h200")
    layout = Layout(world_size=8, ep=8)
    renamed = dataclasses.replace(model, name="custom", display_name=EVIL)
    run = slime_run(renamed, gpu, Workload(), layout)
    assert "\x1b" not in run and len(run.splitlines()) == len(slime_run(model, gpu, Workload(), layout).splitlines())
    with pytest.raises(CommandError, match="control character"):
        slime_run(model, gpu, Workload(), layout, entry_module="train\nrm -rf ~")
    with pytest.raises(CommandError, match="control character"):
        slime_run(model, gpu, Workload(), layout, entry_module="<x\ny>")
    lines = slime_flag_lines(model, gpu, Workload(), layout, num_rollout=20)
    assert all("\n" not in str(word) for line in lines for word in line)


def test_names_are_cleaned_for_the_terminal_and_file_names():
    assert clean_name(EVIL) == "Evil rm -rf ~ RED"
    assert clean_name("x" * 1000) == "x" * 120
    assert file_name("../../etc/passwd") == "etc-passwd"
    assert file_name("..") == "unnamed" and file_name(EVIL) == "Evil-rm--rf-RED"
    assert file_name("qwen3.6-35b-a3b") == "qwen3.6-35b-a3b"


def test_a_model_folder_name_cannot_leave_the_export_folder(tmp_path):
    from cost_model.nouns.hardware import load_gpu
    from recipes.recipe import recipe_path

    model = dataclasses.replace(load_model("qwen3-30b-a3b"), name="..")
    path = recipe_path(tmp_path, model, load_gpu("h200"), "../../x")
    assert path.resolve().is_relative_to(tmp_path.resolve()) and path.name == "x.yaml"


def test_ansi_escapes_in_an_error_are_shown_escaped(tmp_path, capsys):
    line = fails_in_one_line(capsys, ["predict", "--model", "\x1b[2J\x1b[31mgone.json", "--gpu", "h200"],
                             inputs(tmp_path), "no such file")
    assert "\\x1b[2J" in line


# ---------------------------------------------------------------- recipes are written readable
def test_exported_recipes_are_written_0644_under_umask_022(tmp_path, capsys):
    out = tmp_path / "r.yaml"
    old = os.umask(0o022)
    try:
        assert main(["predict", *TARGET, "--layout", "ep=2", "--recipe-out", str(out)]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


def test_recipe_mode_respects_a_strict_umask(tmp_path):
    from recipes.recipe import write_recipe

    old = os.umask(0o077)
    try:
        path = write_recipe({"schema_version": 1}, tmp_path / "r.yaml")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_user_yaml_is_read_by_a_safe_loader_that_builds_no_python_object(tmp_path):
    """Every YAML tune reads goes through cost_model.nouns.user_file.parse_yaml, whose loader is a SafeLoader: a
    python/object tag is refused, not constructed."""
    from cost_model.nouns.user_file import _unique_keys_loader, parse_yaml

    assert issubclass(_unique_keys_loader(), yaml.SafeLoader)
    with pytest.raises(ValueError, match="malformed YAML"):
        parse_yaml("a: !!python/object/apply:os.system ['true']\n", "f.yaml", ValueError)


def test_the_packages_own_yaml_is_read_with_the_same_checks(monkeypatch):
    """constants.yaml, hypotheses.yaml and the GPU catalog go through the one checking reader: a key written twice in
    them (an edit that would silently keep the second) is refused in one line naming the file and the key."""
    import cost_model.constants as constants
    from cost_model.nouns.user_file import parse_yaml

    text = constants.constants_text()
    twice = text.replace("constants:\n", "constants:\n  memory_error_sd: {value: 0.5}\n", 1)
    monkeypatch.setattr(constants, "constants_text", lambda: twice)
    constants._shipped_data.cache_clear()
    with pytest.raises(ValueError, match=r"^cost_model/data/constants.yaml: .*duplicate key 'memory_error_sd'"):
        constants._shipped_data()
    monkeypatch.undo()
    constants._shipped_data.cache_clear()
    assert parse_yaml(text, "constants.yaml", ValueError, shipped=True)["constants"]["memory_error_sd"]["value"] > 0
