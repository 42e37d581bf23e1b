"""Megatron's EP all-to-all overlap (--overlap-moe-expert-parallel-comm) as a layout field (issue 16): the rules
TransformerConfig enforces, the flag, the recipe and Optuna forms, and what the cost model does with it (the
expert all-to-alls of the steady-state chunks run under another micro-batch's compute)."""
from __future__ import annotations

import pytest

from benchmarks.public_data import load_cases
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout import InvalidLayout, Layout
from cost_model.nouns.layout_codec import (from_optuna_params, layout_from_recipe_block, parse_pairs, recipe_block,
                                           to_optuna_params)
from cost_model.nouns.model_spec import load_model
from cost_model.predict import predict
from cost_model.step_time import ep_overlap_share
from cost_model.nouns.workload import Workload
from search_space.megatron_args import dispatcher_args

QWEN, H100 = load_model("qwen3-30b-a3b"), load_gpu("h100")
ON = dict(overlap_moe_expert_parallel_comm=True)


@pytest.mark.parametrize("kw, why", [
    (dict(ep=1), "needs expert parallelism"),
    (dict(ep=8, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1), "full recompute"),
    (dict(ep=8, recompute_granularity="selective", recompute_modules=("moe",)), "'moe' recompute module"),
    (dict(ep=4, pp=2), "needs an interleaved pipeline"),
])
def test_megatrons_rules(kw, why):
    with pytest.raises(InvalidLayout, match=why):
        Layout(8, **kw, **ON)
    Layout(8, ep=8, recompute_granularity="selective", recompute_modules=("moe_act",), **ON)   # allowed
    Layout(16, pp=2, vpp=2, ep=8, **ON)


def test_the_flag_the_recipe_and_optuna_carry_it():
    layout = Layout(16, pp=2, vpp=2, ep=8, dispatcher="flex", **ON)
    assert "--overlap-moe-expert-parallel-comm" in dispatcher_args(layout)
    off_flags = dispatcher_args(layout.replace(overlap_moe_expert_parallel_comm=False))
    assert "--overlap-moe-expert-parallel-comm" not in off_flags
    assert layout_from_recipe_block(recipe_block(layout), 16) == layout
    assert from_optuna_params(to_optuna_params(layout), 16, 8192) == layout
    assert parse_pairs(["overlap-moe-expert-parallel-comm=true"]) == ON
    # off, it is in none of them: keys, recipes and trials made before the field stay as they were
    off = Layout(16, pp=2, vpp=2, ep=8)
    assert "overlap_moe" not in off.key() and "overlap_moe" in layout.key()
    assert "overlap_moe_expert_parallel_comm" not in recipe_block(off) and \
        "overlap_moe_expert_parallel_comm" not in to_optuna_params(off)
    with pytest.raises(InvalidLayout, match="wrong type"):
        parse_pairs(["overlap_moe_expert_parallel_comm=maybe"])


def test_the_steady_state_share():
    assert ep_overlap_share(Layout(8, ep=8), 4) == 0
    assert ep_overlap_share(Layout(8, ep=8, **ON), 4) == pytest.approx(3 / 4)   # F0 alone, then pairs
    # PP 4 x VPP 2, 8 micro-batches: 16 chunks, warmup (4 - 1) x 2 + (2 - 1) x 4 + 1 = 11
    assert ep_overlap_share(Layout(32, pp=4, vpp=2, ep=8, **ON), 8) == pytest.approx(5 / 16)
    assert ep_overlap_share(Layout(32, pp=4, vpp=2, ep=8, **ON), 2) == 0


def test_overlap_hides_expert_all_to_alls_and_nothing_else():
    w = Workload(seq_len=4096, global_batch=256, framework="megatron")
    plain = Layout(32, ep=32, dispatcher="flex", max_tokens_per_gpu=4096)   # across 4 nodes: the all-to-all shows
    a, b = predict(QWEN, H100, w, plain), predict(QWEN, H100, w, plain.replace(**ON))
    assert 0 < b.breakdown["ep_comm"] < a.breakdown["ep_comm"]
    for term in ("compute_experts", "compute_attention", "tp_comm", "launch_overhead"):
        assert b.breakdown[term] == pytest.approx(a.breakdown[term])
    assert b.breakdown["expert_calls"] <= a.breakdown["expert_calls"]   # hidden behind more work, if at all
    assert b.step_time_s < a.step_time_s
    assert b.memory == a.memory   # without a pipeline: one micro-batch's forward as the other's backward frees


def test_the_interleaved_warmup_holds_one_more_chunk():
    w = Workload(seq_len=4096, global_batch=256, framework="megatron")
    plain = Layout(32, pp=2, vpp=4, ep=16, max_tokens_per_gpu=4096)
    a, b = predict(QWEN, H100, w, plain), predict(QWEN, H100, w, plain.replace(**ON))
    assert b.memory.activations > a.memory.activations


def test_the_public_rows_that_ran_it():
    cases = {m.index: m for m in load_cases()[0]}
    assert cases[73].case.layout.overlap_moe_expert_parallel_comm        # "cross-node EP + 1F1B A2A overlap"
    assert not cases[72].case.layout.overlap_moe_expert_parallel_comm    # the same run without it
    assert cases[0].case.layout.overlap_moe_expert_parallel_comm         # "EP comm overlap on"
