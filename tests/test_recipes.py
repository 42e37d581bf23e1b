"""Recipe export and loading, checked against the two reference recipes of the leaderboard."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from cost_model.nouns.case import Case
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.model_spec import load_model
from cost_model.predict import predict
from cost_model.nouns.workload import Workload
from recipes.recipe import (
    LoadedRecipe,
    RecipeError,
    build_recipe,
    dump_recipe,
    load_recipe,
    recipe_name,
    recipe_path,
    write_recipe,
)
from recipes.slime_command import slime_env, slime_model_script, slime_run
from cost_model.nouns.layout import Layout
from cost_model.nouns.stack import Stack

# Copies of ../shared/reference/recipes/qwen3.6-35b-a3b/h200 (the leaderboard's recipes), so the tests never
# depend on the workplace's shared folder being beside the checkout.
REFERENCE_DIR = Path(__file__).resolve().parent / "fixtures" / "reference_recipes"
REFERENCE_FILES = ("attune-tp1-pp1-ep8.yaml", "attune-tp1-ep8-mt16k.yaml")
LAYOUT_FIELDS = ("label", "tp", "pp", "vpp", "cp", "ep", "etp", "dp", "sequence_parallel", "layer_split",
                 "max_tokens_per_gpu", "rows_per_microbatch", "recompute", "offload", "dispatcher")


def reference(name: str) -> Path:
    return REFERENCE_DIR / name


def export(loaded: LoadedRecipe, out_dir: Path) -> tuple[Path, dict]:
    """load -> predict -> build -> write -> yaml.safe_load."""
    case = loaded.case
    prediction = predict(case.model, case.gpu, case.workload, case.layout)
    recipe = build_recipe(case.model, case.gpu, case.workload, case.layout, prediction)
    path = write_recipe(recipe, recipe_path(out_dir, case.model, case.gpu, recipe_name(case.layout)))
    return path, yaml.safe_load(path.read_text())


def slime_flags(run: str) -> dict[str, list[tuple[str, ...]]]:
    """The python command's flags as {flag: [values of each occurrence]}, ignoring comments, the export lines
    and the entry module; placeholder values ("$HF_CKPT") become '<placeholder>'; `${MODEL_ARGS[@]}` is a key."""
    text = "\n".join(line for line in run.splitlines() if not line.lstrip().startswith("#"))
    text = text.replace("\\\n", " ")
    commands = [line for line in text.splitlines() if line.strip().startswith("python3 ")]
    assert len(commands) == 1, run
    words = shlex.split(commands[0], posix=False)
    first = next(i for i, w in enumerate(words) if w.startswith("--"))
    flags: dict[str, list[tuple[str, ...]]] = {}
    current: list[str] | None = None
    for word in words[first:]:
        if word.startswith("${"):  # an array expansion (MODEL_ARGS) stands alone, as a flag of its own
            current = []
            flags.setdefault(word, []).append(current)
        elif word.startswith("--"):
            current = []
            flags.setdefault(word, []).append(current)
        elif word.startswith(("$", '"$')):
            current.append("<placeholder>")
        else:
            current.append(word)
    return {flag: [tuple(v) for v in values] for flag, values in flags.items()}


def model_args_positions(run: str) -> int:
    return sum("${MODEL_ARGS[@]}" in line for line in run.splitlines() if not line.lstrip().startswith("#"))


# ------------------------------------------------------------------ (1) the two reference recipes
@pytest.mark.parametrize("name", REFERENCE_FILES)
def test_reference_round_trip(name, tmp_path):
    ref_path = reference(name)
    ref = yaml.safe_load(ref_path.read_text())
    loaded = load_recipe(ref_path)
    path, out = export(loaded, tmp_path)

    assert slime_flags(out["run"]) == slime_flags(ref["run"])
    assert model_args_positions(out["run"]) == model_args_positions(ref["run"]) == 1
    for field in LAYOUT_FIELDS:
        assert out["layout"][field] == ref["layout"][field], field
    # Generated to the reference's wording, and the command text is the reference's apart from the comment line.
    assert out["layout"]["summary"] == ref["layout"]["summary"]
    assert out["layout"]["highlights"] == ref["layout"]["highlights"]
    without_comments = "\n".join(line for line in out["run"].splitlines() if not line.startswith("#")) + "\n"
    assert without_comments == ref["run"]
    assert out["run"].splitlines()[0] == "# MODEL_ARGS: source <slime>/scripts/models/qwen3.5-35B-A3B.sh"
    assert out["env"] == ref["env"]
    for group in ("schema_version", "model", "patches"):
        assert out[group] == ref[group]
    assert {k: out["gpu"][k] for k in ("type", "memory_gb", "count", "per_node", "instance")} == ref["gpu"]
    assert {k: out["workload"][k] for k in ("row_tokens", "global_batch", "precision")} == \
        {k: ref["workload"][k] for k in ("row_tokens", "global_batch", "precision")}
    assert out["result"]["window"] == ref["result"]["window"]
    assert out["result"]["window_tokens"] == ref["result"]["window_tokens"] == 15_728_640
    assert out["result"]["steps_per_run"] == ref["result"]["steps_per_run"]
    assert path.parts[-3:] == ("qwen3.6-35b-a3b", "h200", f"{recipe_name(loaded.case.layout)}.yaml")
    # The export loads back to the same run description.
    assert load_recipe(path).case == loaded.case


def test_reference_loads_to_expected_layouts():
    a = load_recipe(reference("attune-tp1-pp1-ep8.yaml")).case
    assert a.model.name == "qwen3.6-35b-a3b" and a.gpu.name == "h200"
    assert a.workload == Workload(seq_len=8192, global_batch=128, precision="bf16")
    assert a.layout == Layout(world_size=8, ep=8, recompute_granularity="full", recompute_method="uniform",
                              recompute_num_layers=1)
    b = load_recipe(reference("attune-tp1-ep8-mt16k.yaml")).case
    assert b.layout == a.layout.replace(max_tokens_per_gpu=16384, rows_per_microbatch=2,
                                        optimizer_offload_fraction=1.0, overlap_d2h_h2d=True)
    assert recipe_name(a.layout) == "tp1-pp1-ep8-dp8-mt8192-full1"
    assert recipe_name(a.layout) != recipe_name(b.layout)


@pytest.mark.parametrize("name", REFERENCE_FILES)
def test_writer_reproduces_reference_text(name):
    """The YAML writer's style (block style, key order, `|` run block, line width) is the reference's."""
    text = reference(name).read_text()
    assert dump_recipe(yaml.safe_load(text)) == text


# ------------------------------------------------------------------ (2) every field group and sub-key
def missing_keys(ref, out, prefix=""):
    missing = []
    for key, value in ref.items():
        where = f"{prefix}{key}"
        if key not in out:
            missing.append(where)
        elif isinstance(value, dict) and value:
            if isinstance(out[key], dict):
                missing += missing_keys(value, out[key], where + ".")
            elif out[key] is not None or key not in ("recompute", "offload"):
                missing.append(where + " (not a mapping)")
    return missing


@pytest.mark.parametrize("name", REFERENCE_FILES)
def test_export_has_every_reference_field(name, tmp_path):
    ref = yaml.safe_load(reference(name).read_text())
    _, out = export(load_recipe(reference(name)), tmp_path)
    assert list(out)[:len(ref)] == list(ref), "top-level field groups in the reference's order"
    assert missing_keys(ref, out) == []
    for group, value in ref.items():
        if isinstance(value, dict):
            assert [k for k in out[group] if k in value] == list(value), f"{group}: keys in the reference's order"
    assert out["status"] == "predicted"
    assert out["correctness"]["result"] == "not run"
    assert out["correctness"]["convergence"]["correlation"] is None
    result = out["result"]
    assert result["measured"] is None and result["gpu_hours"] is None and result["step_time_cv_percent"] is None
    assert result["predicted"]["kind"] == "predicted"
    assert result["predicted"]["source"].startswith("attune cost model")
    assert result["active_params"]["count"] == load_model("qwen3.6-35b-a3b").params.active_non_embedding
    assert result["active_params"]["source"] == "https://huggingface.co/Qwen/Qwen3.6-35B-A3B"
    assert isinstance(result["tokens_per_s_per_gpu"], float) and result["tokens_per_s_per_gpu"] > 0
    assert result["tokens_per_s_per_gpu"] == round(result["tokens_per_s_per_gpu"], 2)
    raw = Path(write_recipe(out, tmp_path / "again.yaml")).read_text()
    assert "run: |\n" in raw


# ------------------------------------------------------------------ (3) other layouts
MODEL = "qwen3.6-35b-a3b"
FULL = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)

LAYOUTS = {
    "flex": Layout(world_size=8, ep=8, dispatcher="flex", **FULL),
    "tp2": Layout(world_size=8, tp=2, etp=1, ep=8, **FULL),
    "vpp": Layout(world_size=8, pp=2, vpp=2, ep=4, **FULL),
    "cp": Layout(world_size=8, cp=2, ep=8, max_tokens_per_gpu=8192, rows_per_microbatch=2, **FULL),
    "selective": Layout(world_size=8, ep=8, recompute_granularity="selective",
                        recompute_modules=("core_attn", "moe_act")),
    "selective-default": Layout(world_size=8, ep=8, recompute_granularity="selective"),
    "no-recompute-partial-offload": Layout(world_size=8, ep=8, optimizer_offload_fraction=0.5),
    "two-nodes": Layout(world_size=16, tp=2, etp=1, pp=2, ep=8, **FULL),
}
EXPECTED = {
    "flex": {"--moe-token-dispatcher-type": [("flex",)], "--moe-flex-dispatcher-backend": [("deepep",)]},
    "tp2": {"--tensor-model-parallel-size": [("2",)], "--sequence-parallel": [()]},
    "vpp": {"--pipeline-model-parallel-size": [("2",)], "--num-virtual-stages-per-pipeline-rank": [("2",)],
            "--expert-model-parallel-size": [("4",)]},
    "cp": {"--context-parallel-size": [("2",)], "--max-tokens-per-gpu": [("8192",)]},
    "selective": {"--recompute-granularity": [("selective",)], "--recompute-modules": [("core_attn", "moe_act")]},
    "selective-default": {"--recompute-granularity": [("selective",)]},
    "no-recompute-partial-offload": {"--optimizer-cpu-offload": [()], "--optimizer-offload-fraction": [("0.5",)]},
    "two-nodes": {"--actor-num-nodes": [("2",)], "--actor-num-gpus-per-node": [("8",)],
                  "--sequence-parallel": [()], "--pipeline-model-parallel-size": [("2",)]},
}
ABSENT = {
    "flex": ("--sequence-parallel",),
    "tp2": ("--moe-token-dispatcher-type", "--num-virtual-stages-per-pipeline-rank"),
    "vpp": ("--sequence-parallel",),
    "cp": ("--sequence-parallel",),
    "selective": ("--recompute-method", "--recompute-num-layers"),
    "selective-default": ("--recompute-modules", "--recompute-method"),
    "no-recompute-partial-offload": ("--recompute-granularity", "--overlap-cpu-optimizer-d2h-h2d"),
    "two-nodes": (),
}


@pytest.mark.parametrize("case", sorted(LAYOUTS))
def test_layout_flags_and_round_trip(case, tmp_path):
    model, gpu, workload, layout = load_model(MODEL), load_gpu("h200"), Workload(), LAYOUTS[case]
    prediction = predict(model, gpu, workload, layout)
    recipe = build_recipe(model, gpu, workload, layout, prediction)
    path = write_recipe(recipe, recipe_path(tmp_path, model, gpu, recipe_name(layout)))
    out = yaml.safe_load(path.read_text())
    flags = slime_flags(out["run"])
    for flag, values in EXPECTED[case].items():
        assert flags.get(flag) == values, (flag, flags.get(flag))
    for flag in ABSENT[case]:
        assert flag not in flags, flag
    assert all(len(v) == 1 for f, v in flags.items()), "no flag repeated"
    assert flags["--global-batch-size"] == [("128",)] and flags["--rollout-batch-size"] == [("128",)]
    assert flags["--loss-mask-type"] == [("qwen3_5",)]
    assert out["layout"]["sequence_parallel"] is (layout.tp > 1)
    assert out["layout"]["label"] == layout.label
    assert out["gpu"]["count"] == layout.world_size
    assert ("NVSHMEM_DISABLE_NCCL" in out["env"]) is (layout.dispatcher == "flex")
    assert out["run"] == slime_run(model, gpu, workload, layout)
    assert load_recipe(path).case == Case(model, gpu, workload, layout)


def test_flag_positions_follow_reference():
    layout = Layout(world_size=8, tp=2, etp=1, pp=2, vpp=2, ep=4, optimizer_offload_fraction=1.0, overlap_d2h_h2d=True,
                    dispatcher="flex", **FULL)
    run = slime_run(load_model(MODEL), load_gpu("h200"), Workload(), layout)
    lines = [line.strip().rstrip(" \\") for line in run.splitlines()]
    order = [lines.index(x) for x in (
        "--debug-train-only", "--tensor-model-parallel-size 2", "--sequence-parallel",
        "--pipeline-model-parallel-size 2", "--num-virtual-stages-per-pipeline-rank 2",
        "--expert-tensor-parallel-size 1", "--recompute-granularity full", "--use-dynamic-batch-size",
        "--use-distributed-optimizer", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
        "--use-precision-aware-optimizer", "--attention-backend flash", "--moe-token-dispatcher-type flex",
        "--moe-flex-dispatcher-backend deepep", "--distributed-timeout-minutes 30")]
    assert order == sorted(order)
    assert run.endswith('--tensorboard-dir "$PROFILE_DIR"\n')


def test_recipe_names_are_unique():
    layouts = list(LAYOUTS.values()) + [
        LAYOUTS["flex"].replace(recompute_method="block"),
        LAYOUTS["selective"].replace(recompute_modules=("moe_act", "core_attn")),
        LAYOUTS["no-recompute-partial-offload"].replace(overlap_d2h_h2d=True),
        LAYOUTS["no-recompute-partial-offload"].replace(optimizer_offload_fraction=1.0),
    ]
    names = [recipe_name(layout) for layout in layouts]
    assert len(set(names)) == len(names)
    assert all(n == n.strip() and "/" not in n and " " not in n for n in names)
    # ETP is named only where it is not TP (Megatron's default): a dense TP2 layout has none, TP2 with ETP1 says so
    assert "etp" not in recipe_name(Layout(8, tp=2))
    assert "-etp1-" in recipe_name(Layout(8, tp=2, ep=4, etp=1)) and "etp" not in recipe_name(Layout(8, tp=2, ep=2))


def test_model_scripts_and_env():
    assert slime_model_script(load_model("qwen3.6-35b-a3b")) == "scripts/models/qwen3.5-35B-A3B.sh"
    assert slime_model_script(load_model("qwen3.5-35b-a3b")) == "scripts/models/qwen3.5-35B-A3B.sh"
    assert slime_model_script(load_model("qwen3-30b-a3b")) == "scripts/models/qwen3-30B-A3B.sh"
    assert slime_model_script(load_model("deepseek-v3")) == "scripts/models/deepseek-v3.sh"
    assert slime_model_script(load_model("moonlight-16b-a3b")) == "scripts/models/moonlight.sh"
    assert slime_model_script(load_model("llama3-70b")) is None
    llama = slime_run(load_model("llama3-70b"), load_gpu("h200"), Workload(),
                      Layout(world_size=8, tp=8, etp=8, **FULL))
    assert llama.startswith("# MODEL_ARGS: slime has no scripts/models script for Llama3-70B; built from its config:")
    assert "--rotary-base 500000 " in llama.splitlines()[0] and "--norm-epsilon 1e-05 " in llama.splitlines()[0]
    env = slime_env(LAYOUTS["tp2"], load_gpu("h200"))
    assert list(env) == ["CUDA_DEVICE_MAX_CONNECTIONS", "PYTORCH_CUDA_ALLOC_CONF", "TORCHINDUCTOR_COMPILE_THREADS",
                         "NCCL_NVLS_ENABLE"]
    run = slime_run(load_model(MODEL), load_gpu("h200"), Workload(), LAYOUTS["flex"], entry_module="train_async")
    assert "python3 -m train_async --async \\\n" in run
    assert "export NVSHMEM_DISABLE_NCCL=1\n" in run


def test_a_dense_models_summary_names_no_dispatcher():
    """A dense model routes nothing: its recipe's summary says nothing of a token dispatcher; a MoE model's does."""
    gpu, workload = load_gpu("h200"), Workload()
    for name, has_dispatcher in (("llama3-70b", False), (MODEL, True)):
        model = load_model(name)
        layout = LAYOUTS["tp2"] if model.is_moe else Layout(world_size=8, tp=8, etp=8, **FULL)
        summary = build_recipe(model, gpu, workload, layout, predict(model, gpu, workload, layout))["layout"]["summary"]
        assert ("dispatcher" in summary) == has_dispatcher, summary


def test_uneven_nodes_rejected():
    layout = Layout(world_size=9, tp=1, ep=1, **FULL)
    with pytest.raises(ValueError, match="do not split evenly over 2 nodes.*6, 7, 8, 10 GPUs do"):
        slime_run(load_model("llama3-8b"), load_gpu("h200"), Workload(), layout)


def test_a_gpu_count_slime_cannot_place_is_refused_before_scoring(tmp_path):
    """13 x H200 is 2 nodes that cannot hold the same number each: one line, exit 2, no study (it had scored the
    space, run its trials and died in a traceback at export)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "tuner", "--model", "qwen3-30b-a3b", "--gpu", "h200", "--gpus", "13"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "10, 12, 14, 16 GPUs do" in out.stderr
    assert not (tmp_path / "studies").exists()


def test_a_node_holding_fewer_gpus_than_it_can_narrows_the_nvlink_domain():
    """12 x H200 places as 2 nodes of 6: a group of 8 consecutive ranks crosses nodes, and the recipe says so."""
    from cost_model.nouns.hardware import placed

    gpu = load_gpu("h200")
    assert (placed(gpu, 12).gpus_per_node, placed(gpu, 12).nvlink_domain) == (6, 6)
    assert placed(gpu, 16) is gpu and placed(gpu, 8) is gpu and placed(gpu, 6) is gpu
    gb200 = load_gpu("gb200")   # NVLink spans the rack: its domain stays
    assert placed(gb200, 6).nvlink_domain == gb200.nvlink_domain
    model = load_model("llama3-8b")
    tp8 = Layout(world_size=12, tp=4, pp=3, **FULL)
    recipe_run = slime_run(model, gpu, Workload(), tp8)
    assert "--actor-num-gpus-per-node 6" in recipe_run


# ------------------------------------------------------------------ (4) errors
def assert_one_line_error(path: Path, match: str):
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    assert match in message, message


@pytest.fixture
def good_recipe(tmp_path) -> dict:
    model, gpu, workload = load_model(MODEL), load_gpu("h200"), Workload()
    layout = Layout(world_size=8, ep=8, **FULL)
    return build_recipe(model, gpu, workload, layout, predict(model, gpu, workload, layout))


def test_error_malformed_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: Qwen3.6-35B-A3B\nlayout: [1, 2\n")
    assert_one_line_error(path, "malformed YAML")


def test_error_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    assert_one_line_error(path, "mapping")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert_one_line_error(empty, "got null")


def test_error_missing_file(tmp_path):
    assert_one_line_error(tmp_path / "nope.yaml", "no such file")


def test_error_missing_layout(tmp_path, good_recipe):
    del good_recipe["layout"]
    path = write_recipe(good_recipe, tmp_path / "nolayout.yaml")
    assert_one_line_error(path, "field 'layout' is missing")


def test_error_missing_and_wrong_type_sub_field(tmp_path, good_recipe):
    recipe = dict(good_recipe, layout=dict(good_recipe["layout"]))
    del recipe["layout"]["ep"]
    assert_one_line_error(write_recipe(recipe, tmp_path / "noep.yaml"),
                          "field 'layout': invalid layout: missing field 'ep'")
    recipe["layout"]["ep"] = "eight"
    assert_one_line_error(write_recipe(recipe, tmp_path / "strep.yaml"), "layout value ep='eight' has the wrong type")
    recipe = dict(good_recipe, gpu=dict(good_recipe["gpu"], count=True))
    assert_one_line_error(write_recipe(recipe, tmp_path / "boolcount.yaml"), "field 'gpu.count'")


def test_error_unknown_model(tmp_path, good_recipe):
    path = write_recipe(dict(good_recipe, model="Foo-1B-A1B"), tmp_path / "unknown.yaml")
    assert_one_line_error(path, "unknown model 'Foo-1B-A1B'")


def test_error_unknown_gpu(tmp_path, good_recipe):
    path = write_recipe(dict(good_recipe, gpu=dict(good_recipe["gpu"], type="A100")), tmp_path / "gpu.yaml")
    assert_one_line_error(path, "unknown GPU")


def test_error_invalid_layout(tmp_path, good_recipe):
    # EP 7 does not divide 8 GPUs (the Layout's own rule).
    recipe = dict(good_recipe, layout=dict(good_recipe["layout"], ep=7))
    assert_one_line_error(write_recipe(recipe, tmp_path / "ep7.yaml"), "invalid layout")
    # More recomputed layers than the model has: a Megatron rule of rules.check.
    recipe = dict(good_recipe, layout=dict(good_recipe["layout"],
                                           recompute=dict(good_recipe["layout"]["recompute"], num_layers=41)))
    assert_one_line_error(write_recipe(recipe, tmp_path / "rc41.yaml"), "recompute_num_layers 41")
    # TP 4 with 2 query groups and the output gate: a stack rule, checked only when a stack is given.
    recipe = dict(good_recipe, layout=dict(good_recipe["layout"], tp=4, dp=2, sequence_parallel=True,
                                           label="TP4 PP1 EP8 DP2"),
                  run=good_recipe["run"].replace("--tensor-model-parallel-size 1",
                                                 "--tensor-model-parallel-size 4 --sequence-parallel"))
    path = write_recipe(recipe, tmp_path / "tp4.yaml")
    assert load_recipe(path).case.layout.tp == 4
    with pytest.raises(RecipeError, match="output gate"):
        load_recipe(path, stack=Stack())
    fixed = Stack.with_fixes(["output-gate-tp"])
    assert load_recipe(path, stack=fixed).case == Case(load_model(MODEL), load_gpu("h200"), Workload(),
                                                       Layout(world_size=8, tp=4, etp=1, ep=8, **FULL), fixed)
    # rows_per_microbatch that slime's batching would not produce (a slime rule).
    recipe = dict(good_recipe, layout=dict(good_recipe["layout"], rows_per_microbatch=2))
    assert_one_line_error(write_recipe(recipe, tmp_path / "rows.yaml"), "rows_per_microbatch")
    # A dp that disagrees with the grid.
    recipe = dict(good_recipe, layout=dict(good_recipe["layout"], dp=4))
    assert_one_line_error(write_recipe(recipe, tmp_path / "dp.yaml"), "field 'layout': invalid layout: field 'dp' is 4")


def test_a_recipe_with_evidence_or_of_another_run_is_never_replaced(tmp_path):
    """A verified recipe is not overwritten by a prediction of its own layout; a recipe of another run (another
    global batch, same layout name) is not overwritten either: export writes beside it; component tests
    recorded in a recipe survive its re-export."""
    import shutil

    from recipes.correctness import record_component_test
    from recipes.recipe import free_path

    verified = tmp_path / "r.yaml"
    shutil.copy(reference("attune-tp1-pp1-ep8.yaml"), verified)
    before = verified.read_bytes()
    case = load_recipe(verified).case
    prediction = predict(case.model, case.gpu, case.workload, case.layout)
    predicted = build_recipe(case.model, case.gpu, case.workload, case.layout, prediction)
    with pytest.raises(RecipeError, match="not replaced: it is a verified recipe and this one is predicted"):
        write_recipe(predicted, verified)
    assert verified.read_bytes() == before
    assert free_path(predicted, verified) == tmp_path / "r-2.yaml"

    mine = write_recipe(predicted, tmp_path / "p.yaml")
    other = dict(predicted, workload=dict(predicted["workload"], global_batch=256))
    with pytest.raises(RecipeError, match="a recipe of another run"):
        write_recipe(other, mine)
    assert free_path(other, mine) == tmp_path / "p-2.yaml"

    tested = yaml.safe_load(mine.read_text())
    record_component_test(tested, {"test": "adam", "shape": "s", "gpu": "H200", "date": "2026-12-01",
                                   "result": "pass", "detail": "d", "note": None})
    write_recipe(tested, mine, guard=False)
    again = build_recipe(case.model, case.gpu, case.workload, case.layout, prediction)
    write_recipe(again, free_path(again, mine))   # the same run, predicted again: replaces, keeps the test
    assert [t["test"] for t in yaml.safe_load(mine.read_text())["correctness"]["component_tests"]] == ["adam"]


@pytest.mark.parametrize("edit, needle", [
    (("  tp: 1\n", "  tp: 1\n  tp: 2\n"), "duplicate key 'tp'"),
    (("schema_version: 1\n", "schema_version: 2\n"), "field 'schema_version' must be 1"),
    (("schema_version: 1\n", ""), "field 'schema_version' must be 1"),
    (("  per_node: 8\n", "  per_node: 3\n"), "field 'gpu.per_node' 3 does not fit gpu.count 8"),
])
def test_recipes_that_do_not_say_one_thing_are_refused(tmp_path, edit, needle):
    text = reference("attune-tp1-pp1-ep8.yaml").read_text()
    assert edit[0] in text
    broken = tmp_path / "broken.yaml"
    broken.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(RecipeError, match=needle):
        load_recipe(broken)


@pytest.mark.parametrize("edit, needle", [
    (("  label: TP1 PP1 EP8 DP8\n", "  label: TP8 PP8 EP1 DP1\n"), "says 'TP8 PP8 EP1 DP1' but the layout's fields"),
    (("--tensor-model-parallel-size 1", "--tensor-model-parallel-size 8"),
     "sets --tensor-model-parallel-size 8 but the layout has TP 1"),
    (("--tensor-model-parallel-size 1", "--tensor-model-parallel-size '4'"),
     "sets --tensor-model-parallel-size 4 but the layout has TP 1"),
    (("--tensor-model-parallel-size 1", "--tensor-model-parallel-size=\"2\""),
     "sets --tensor-model-parallel-size 2 but the layout has TP 1"),
])
def test_a_recipe_whose_label_or_command_contradicts_its_layout_is_refused(tmp_path, edit, needle):
    text = reference("attune-tp1-pp1-ep8.yaml").read_text()
    assert edit[0] in text
    broken = tmp_path / "broken.yaml"
    broken.write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(RecipeError, match=needle):
        load_recipe(broken)


def test_yaml_merge_keys_are_refused_and_a_key_twice_still_named():
    from cost_model.nouns.user_file import parse_yaml

    # YAML 1.1 only: a YAML 1.2 reader would read a key named `<<` (issue 29, point 6; tests/test_hostile_identity.py)
    text = "base: &b\n  tp: 1\n  ep: 8\nlayout:\n  <<: *b\n  tp: 2\n"
    with pytest.raises(ValueError, match="r.yaml: line 5 column 3: YAML merge keys"):
        parse_yaml(text, "r.yaml", ValueError)
    with pytest.raises(ValueError, match="duplicate key 'tp'"):
        parse_yaml("layout:\n  <<: {ep: 8}\n  tp: 1\n  tp: 2\n", "r.yaml", ValueError)


def test_a_predicted_recipe_says_which_of_its_two_tokens_per_s_is_its_headline(tmp_path):
    """`tune predict --recipe-out` leads with the hypotheses' median, as export does: its result.predicted (the shipped
    model's own figure) says it is not the headline, and the interval the headline is the median of is written."""
    from tuner.cli import main

    out = tmp_path / "r.yaml"
    assert main(["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--layout", "ep=8",
                 "max_tokens_per_gpu=32768", "recompute_granularity=full", "recompute_method=uniform",
                 "recompute_num_layers=4", "--recipe-out", str(out)]) == 0
    result = yaml.safe_load(out.read_text())["result"]
    own, head = result["predicted"]["tokens_per_s_per_gpu"], result["tokens_per_s_per_gpu"]
    assert abs(own - head) > 1   # two figures: one must say which it is
    assert f"{own:,.0f} tokens/s/GPU" in result["predicted"]["note"] and f"({head:,.0f} tokens/s/GPU)" in \
        result["predicted"]["note"]
    assert result["predicted_interval"]["tokens_per_s_per_gpu_median"] == round(head)
    model, gpu, workload = load_model("llama3-8b"), load_gpu("h100"), Workload()
    plain = build_recipe(model, gpu, workload, Layout(8), predict(model, gpu, workload, Layout(8)))
    assert "note" not in plain["result"]["predicted"]   # no headline given: one figure, nothing to tell apart


def test_a_config_models_launch_builds_its_model_args(tmp_path):
    """A model slime has no script for: the launch defines MODEL_ARGS from its config (RoPE base, norm epsilon,
    Qwen2-MoE's pre-softmax routing) where every flag is known, and stops naming what is missing where not."""
    from recipes.slime_command import slime_launch
    from search_space.megatron_args import launch_model_args

    gpu, workload = load_gpu("h200"), Workload()
    qwen2_moe = load_model("benchmarks/models/qwen2-57b-a14b/config.json")
    launch = slime_launch(qwen2_moe, gpu, workload, Layout(world_size=8, ep=8))
    line = next(l for l in launch.splitlines() if l.startswith("MODEL_ARGS=("))
    for flag in ("--rotary-base 1000000", "--norm-epsilon 1e-06", "--moe-router-pre-softmax",
                 "--moe-shared-expert-gate", "--add-qkv-bias"):
        assert flag in line, (flag, line)
    assert "define MODEL_ARGS" not in launch
    cfg = json.loads(Path("benchmarks/models/qwen2-57b-a14b/config.json").read_text())
    del cfg["rope_theta"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    no_base = load_model(str(tmp_path / "config.json"))
    assert launch_model_args(no_base)[0] is None and "rope_theta" in launch_model_args(no_base)[1]
    stops = slime_launch(no_base, gpu, workload, Layout(world_size=8, ep=8))
    assert "rope_theta" in stops and "define MODEL_ARGS here' >&2; exit 2" in stops and "MODEL_ARGS=(" not in stops


@pytest.mark.parametrize("edit, words", [
    (("--max-tokens-per-gpu 8192", "--max-tokens-per-gpu 32768"), "sets --max-tokens-per-gpu 32768 but its layout"),
    (("--use-distributed-optimizer \\", "--use-distributed-optimizer --optimizer-cpu-offload \\"),
     "sets --optimizer-cpu-offload but its layout"),
    (("--recompute-num-layers 1", "--recompute-num-layers 2"), "sets --recompute-num-layers 2 but its layout"),
])
def test_a_run_whose_layout_flags_disagree_with_its_layout_is_refused(tmp_path, edit, words):
    """Only the parallel sizes of `run` were compared with the layout: a hand-edited max-tokens-per-gpu, offload or
    recompute flag was priced as the layout block said while the command would run another job."""
    reference = Path(__file__).resolve().parent / "fixtures" / "reference_recipes" / "attune-tp1-pp1-ep8.yaml"
    text = reference.read_text()
    assert edit[0] in text
    path = tmp_path / "edited.yaml"
    path.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(RecipeError, match=words):
        load_recipe(path)
    assert load_recipe(reference).case.layout.max_tokens_per_gpu == 8192   # the reference's own run agrees
