"""Megatron's --pipeline-model-parallel-layout (issue 16): DeepSeek-V3's 61 layers over PP 8 x VPP 4 divide no
other way. The string is parsed and checked as megatron-core does, megatron-core accepts the ones we build and
puts the same layers on each stage, the search space proposes one where nothing else splits the layers, and the
layout travels through the recipe, the Optuna parameters and the command line."""
from __future__ import annotations

import time
import tracemalloc

import pytest
import yaml

import megatron_validate
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout import InvalidLayout, Layout
from cost_model.nouns.layout_codec import (from_optuna_params, layout_from_recipe_block, layout_from_values,
                                           recipe_block, to_optuna_params)
from cost_model.nouns.model_spec import ModelError, load_model
from cost_model.nouns.pipeline_layout import InvalidPipelineLayout, balanced_layout, parse_stages, stage_grid
from cost_model.predict import predict
from cost_model.nouns.stack import Stack
from cost_model.stages import rank_layers
from cost_model.nouns.workload import Workload
from search_space.enumerate import SpaceOptions, parallel_shapes, pipeline_splits
from search_space.megatron_args import model_args, parallel_args
from search_space.rules import violations
from tuner.space_params import distributions

SEQ = 4096
DSV3 = "Et|(tt|)*30L"                 # Megatron-LM's DeepSeek-V3 recipe, PP 8 x VPP 4
DSV3_MTP = "Et*3|(tttt|)*14ttmL"       # PP 16, the MTP layer beside the loss


def test_the_string_unrolls_as_megatron_reads_it():
    stages = parse_stages(DSV3)
    assert len(stages) == 32 and stages[0] == "Et" and stages[-1] == "L" and set(stages[1:-1]) == {"tt"}
    assert parse_stages("Ettt|(tt|)*29,m|L") == ("Ettt",) + ("tt",) * 29 + ("m", "L")   # commas are cosmetic
    assert parse_stages("Et*4|(t*4|)*2tL") == ("Etttt", "tttt", "tttt", "tL")
    grid = stage_grid(DSV3, 8, 61)
    assert len(grid) == 4 and grid[0][0] == "Et" and grid[-1][-1] == "L"   # stage k: virtual stage k // PP


@pytest.mark.parametrize("text, pp, layers, mtp, why", [
    ("tE|(tt|)*30L", 8, 61, 0, "embedding"),
    ("Et|(tt|)*30", 8, 61, 0, "loss"),
    ("Et|(tt|)*29|tL", 8, 61, 0, "places 60 decoder layers"),
    ("Et|(tt|)*30xL", 8, 61, 0, "'x'"),
    ("Et|(tt|)*30L", 5, 61, 0, "not a multiple of PP 5"),
    ("Et|(tt|)*30mL", 8, 61, 0, "places 1 MTP"),
    ("Et|m(tt|)*30L", 8, 61, 1, "decoder layers must come before"),
    ("(t|)*999999999L", 8, 61, 0, "more than"),
    ("", 8, 61, 0, "non-empty"),
])
def test_a_layout_megatron_refuses_is_refused_with_the_reason(text, pp, layers, mtp, why):
    tracemalloc.start()
    try:
        with pytest.raises(InvalidPipelineLayout, match=why):
            stage_grid(text, pp, layers, mtp)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20   # a huge repeat is refused before it is unrolled (a billion stages would take GBs)


def test_the_layout_field_sets_vpp_and_travels():
    layout = Layout(256, pp=8, vpp=4, ep=32, pipeline_model_parallel_layout=DSV3, max_tokens_per_gpu=SEQ)
    assert layout.label == f"TP1 PP8[{DSV3}] VPP4 EP32 DP32" and "pipeline_model_parallel_layout" in layout.key()
    assert "pipeline_model_parallel_layout" not in Layout(8).key()   # keys of older studies unchanged
    args = parallel_args(layout)
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == DSV3
    assert "--num-virtual-stages-per-pipeline-rank" not in args   # Megatron refuses both together
    assert from_optuna_params(to_optuna_params(layout), 256, SEQ) == layout
    assert layout_from_recipe_block(yaml.safe_load(yaml.safe_dump(recipe_block(layout))), 256) == layout
    # given on the command line without VPP, the string's stages set it, as in Megatron
    assert layout_from_values(dict(pp=8, ep=32, pipeline_model_parallel_layout=DSV3), 256, SEQ).vpp == 4
    with pytest.raises(InvalidLayout, match="32 stages; PP 8 x VPP 2 needs 16"):
        Layout(256, pp=8, vpp=2, ep=32, pipeline_model_parallel_layout=DSV3)
    with pytest.raises(InvalidLayout, match="31 stages, not a multiple of PP 8"):
        layout_from_values(dict(pp=8, pipeline_model_parallel_layout="Et|(tt|)*29L"), 256, SEQ)
    with pytest.raises(InvalidLayout, match="cannot be set together"):
        Layout(256, pp=8, vpp=4, decoder_first_pipeline_num_layers=4, pipeline_model_parallel_layout=DSV3)
    with pytest.raises(InvalidLayout, match="must be a string"):
        Layout(256, pp=8, vpp=4, pipeline_model_parallel_layout=["E", "L"])
    mtp = Layout(256, pp=16, ep=16, pipeline_model_parallel_layout=DSV3_MTP)
    args = parallel_args(mtp)
    assert args[args.index("--mtp-num-layers") + 1] == "1"


def test_the_rules_check_the_string_against_the_model():
    model, workload = load_model("deepseek-v3"), Workload(seq_len=SEQ, global_batch=1024)
    good = Layout(256, pp=8, vpp=4, ep=32, pipeline_model_parallel_layout=DSV3, max_tokens_per_gpu=SEQ)
    assert not [v for v in violations(good, model, workload, Stack()) if v.rule == "uneven_pipeline_split"]
    short = good.replace(pipeline_model_parallel_layout="Et|(tt|)*29|tL")
    assert [v for v in violations(short, model, workload, Stack()) if v.rule == "uneven_pipeline_split"]
    with pytest.raises(ModelError, match="places 60 decoder layers"):
        model.layout_stage_layers(short.replace(pipeline_model_parallel_layout="Et|(tt|)*29|tL"))


def test_the_search_space_proposes_a_string_only_where_nothing_else_divides():
    model = load_model("deepseek-v3")
    assert pipeline_splits(model, 8, 4) == [dict(pipeline_model_parallel_layout=DSV3)]   # Megatron's own recipe
    assert balanced_layout(61, 8, 1) is not None and all("pipeline_model_parallel_layout" not in s
                                                          for s in pipeline_splits(model, 8, 1))
    assert balanced_layout(64, 8, 4) is None and pipeline_splits(load_model("qwen3-30b-a3b"), 8, 2) == [{}]
    shapes = parallel_shapes(model, 256, Workload(seq_len=SEQ, global_batch=1024), Stack(),
                             SpaceOptions(max_vpp=4))
    assert any(s.get("pipeline_model_parallel_layout") == DSV3 and s["pp"] == 8 and s["vpp"] == 4 for s in shapes)


@pytest.mark.parametrize("name, world", [("deepseek-v3", 256), ("qwen3.6-35b-a3b", 8)])
def test_every_layout_of_the_space_is_a_point_of_the_study_distributions(name, world):
    """A layout string is its own Optuna parameter (pipeline_layout): pipeline_split keeps the choices it had
    before strings existed, so a study made then still resumes, and every layout of the space can be recorded."""
    model = load_model(name)
    # slime's Gated DeltaNet spec takes no layout string (search_space.rules): Qwen3.6's strings are Megatron-LM's
    workload = Workload(seq_len=SEQ, global_batch=1024, framework="megatron" if model.has_linear_attention else "slime")
    dists = distributions(model, world, SpaceOptions(), workload)
    assert not any(str(c).startswith("layout") or "|" in str(c) for c in dists["pipeline_split"].choices)
    assert dists["pipeline_layout"].choices[0] == "none" and len(dists["pipeline_layout"].choices) > 1
    shapes = parallel_shapes(model, world, workload, Stack(), SpaceOptions())
    strings = [s for s in shapes if "pipeline_model_parallel_layout" in s]
    assert strings
    for shape in shapes:
        layout = Layout(world, **shape, max_tokens_per_gpu=SEQ)
        params = to_optuna_params(layout)
        for key, value in params.items():
            assert value in dists[key].choices, (layout.label, key, value)
        assert from_optuna_params(params, world, SEQ) == layout
    assert "pipeline_split" not in to_optuna_params(Layout(world, **strings[0], max_tokens_per_gpu=SEQ))


def test_the_cost_model_runs_the_mtp_layer_where_the_string_puts_it():
    model, gpu = load_model("deepseek-v3"), load_gpu("h100")
    workload = Workload(seq_len=SEQ, global_batch=1024, framework="megatron")
    with_mtp = Layout(256, pp=16, ep=16, pipeline_model_parallel_layout=DSV3_MTP, max_tokens_per_gpu=SEQ)
    without = with_mtp.replace(pipeline_model_parallel_layout=DSV3_MTP.replace("m", ""))
    ranks = rank_layers(model, 16, 1, pipeline_layout=DSV3_MTP)
    assert [r.mtp_layers for r in ranks] == [0] * 15 + [1] and ranks[-1].num_layers == 2
    assert ranks[0].num_layers == 3 and ranks[0].has_embedding and ranks[-1].has_head
    a, b = predict(model, gpu, workload, with_mtp), predict(model, gpu, workload, without)
    assert a.step_time_s > b.step_time_s and a.breakdown["compute_logits"] > b.breakdown["compute_logits"]


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")
@pytest.mark.parametrize("text, pp, world", [(DSV3, 8, 256), ("Et*3|(t*4|)*14ttL", 4, 256), (DSV3_MTP, 16, 256)])
def test_megatron_accepts_the_string_and_builds_our_stages(text, pp, world):
    model = load_model("deepseek-v3")
    layout = layout_from_values(dict(pp=pp, ep=16, pipeline_model_parallel_layout=text), world, SEQ)
    argv = model_args(model) + parallel_args(layout) + [
        "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ), "--micro-batch-size", "1",
        "--global-batch-size", str(layout.dp * 8), "--bf16", "--use-distributed-optimizer"]
    ok, message = megatron_validate.validate(argv, world)
    assert ok, message
    assert megatron_validate.stage_layers(argv, world) == [list(r) for r in model.layout_stage_layers(layout)]
