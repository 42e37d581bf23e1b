"""The search space reaches what the stack allows (issue 25): rows per micro-batch up to the rows a data-parallel
rank holds in a step, and selective-recompute modules only of the layer kinds the run has."""
from __future__ import annotations

from dataclasses import replace

import pytest

from cost_model.nouns.batching import max_tokens_per_gpu
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import DENSE, LINEAR_ATTENTION, load_model
from cost_model.nouns.stack import Stack
from cost_model.nouns.workload import Workload
from experiments.megatron.model_run import trial_model
from search_space.enumerate import (BASE_ROWS, MAX_GPUS, MAX_MICROBATCH_TOKENS, SpaceOptions, bounded_options,
                                    enumerate_layouts, parallel_shapes, recompute_choices, rows_choices,
                                    selective_module_sets, study_rows_choices)
from search_space.runner_space import narrow
from tuner.space_params import distributions

# Only the rows and recompute dimensions vary: the rest of the space held small so each test is quick.
SMALL = SpaceOptions(full_recompute_layers=(1,), offload_fractions=(0.0,), exp_avg_dtypes=("fp32",),
                     dispatchers=("alltoall",), max_vpp=1)
MOE_MODULES = {"moe_act", "moe", "shared_experts"}


def modules(sets) -> set[str]:
    return {m for s in sets for m in s}


def test_qwen3_next_on_one_gpu_reaches_eight_rows_of_4096_tokens():
    """The layout the issue found best by hand: 8 rows x 4,096 = 32k tokens per micro-batch, global batch 8."""
    model, workload = load_model("qwen3-next-80b-a3b"), Workload(seq_len=4096, global_batch=8)
    layouts = list(enumerate_layouts(model, 1, workload, Stack()))
    assert {l.rows_per_microbatch for l in layouts} == {1, 2, 4, 8}
    assert any(l.rows_per_microbatch == 8 and l.max_tokens_per_gpu == 32768 for l in layouts)
    assert 8 in distributions(model, 1, SpaceOptions(), workload)["rows_per_microbatch"].choices


@pytest.mark.parametrize("world, global_batch", [(4, 8), (4, 12), (8, 24), (2, 3)])
def test_rows_never_exceed_what_a_data_parallel_rank_holds(qwen36, world, global_batch):
    workload = Workload(seq_len=4096, global_batch=global_batch)
    layouts = list(enumerate_layouts(qwen36, world, workload, Stack(), SMALL))
    assert layouts
    by_dp = {}
    for l in layouts:
        per_rank = -(-global_batch // l.dp)
        assert l.rows_per_microbatch <= per_rank, l.long_label
        assert l.max_tokens_per_gpu == max_tokens_per_gpu(l.rows_per_microbatch, l.cp, workload.seq_len)
        by_dp.setdefault(l.dp, set()).add(l.rows_per_microbatch)
    for dp, rows in by_dp.items():   # every power of two up to the rank's rows, and those rows
        per_rank = -(-global_batch // dp)
        assert rows == {r for r in (1, 2, 4, 8, 16, 32) if r <= per_rank} | {per_rank}, dp
    # the study's Optuna choices hold every value a layout of the space takes
    assert {l.rows_per_microbatch for l in layouts} <= set(study_rows_choices(SMALL, workload, world))


def test_rows_above_the_base_ones_stop_at_the_token_cap():
    seq = 8192
    workload = Workload(seq_len=seq, global_batch=1024)
    assert rows_choices(SpaceOptions(), workload, dp=1, cp=1) == (1, 2, 4, 8)             # 64k tokens per GPU
    assert rows_choices(SpaceOptions(), workload, dp=1, cp=4) == (1, 2, 4, 8, 16, 32)     # CP 4 holds 1/4 of a row
    assert rows_choices(SpaceOptions(), Workload(seq_len=65536, global_batch=64), dp=1) == BASE_ROWS   # long rows
    assert rows_choices(SpaceOptions(), Workload(seq_len=seq, global_batch=6), dp=1, cp=2) == (1, 2, 4, 6)
    for cp in (1, 2, 4, 8):
        for rows in rows_choices(SpaceOptions(), workload, dp=1, cp=cp):
            assert rows in BASE_ROWS or rows * seq // cp <= MAX_MICROBATCH_TOKENS


def test_explicit_rows_are_kept(qwen36):
    options = replace(SMALL, rows_per_microbatch=(1, 2))
    workload = Workload(seq_len=4096, global_batch=64)
    assert {l.rows_per_microbatch for l in enumerate_layouts(qwen36, 4, workload, Stack(), options)} == {1, 2}
    assert distributions(qwen36, 4, options, workload)["rows_per_microbatch"].choices == (1, 2)


def test_the_sweep_falls_back_to_the_base_rows_where_the_space_would_pass_its_bound(qwen36, stack):
    big, small = Workload(global_batch=4096), Workload()
    shapes = list(parallel_shapes(qwen36, MAX_GPUS, big, stack, SpaceOptions()))
    assert bounded_options(shapes, qwen36, MAX_GPUS, big, stack, SpaceOptions())[0].rows_per_microbatch == BASE_ROWS
    shapes = list(parallel_shapes(qwen36, 8, small, stack, SpaceOptions()))
    assert bounded_options(shapes, qwen36, 8, small, stack, SpaceOptions())[0].rows_per_microbatch is None


def test_a_gated_deltanet_only_run_gets_no_core_attn(qwen36):
    run = trial_model(qwen36, 2)
    assert set(run.layer_types) == {LINEAR_ATTENTION}
    full = selective_module_sets(qwen36)
    sets = selective_module_sets(qwen36, run)
    assert "core_attn" in modules(full) and "core_attn" not in modules(sets)
    assert len(set(map(frozenset, sets))) == len(sets)            # no two sets cover the same modules
    assert set(sets) <= set(full)                                 # the study's Optuna choices hold them
    space = narrow(SpaceOptions(), qwen36, 1, Stack(), "megatron", run)
    assert space.options.selective_module_sets == tuple(sets)
    assert any("core_attn" in r for r in space.reasons)
    core_attn = Layout(1, max_tokens_per_gpu=4096, recompute_granularity="selective", recompute_modules=("core_attn",))
    assert space.refusal(core_attn) is None          # a no-op there, not a layout the runner cannot run
    workload = Workload(seq_len=4096, global_batch=8)
    options = replace(space.options, full_recompute_layers=(1,), offload_fractions=(0.0,), max_vpp=1)
    layouts = list(enumerate_layouts(qwen36, 1, workload, Stack(), options))
    assert layouts and not any("core_attn" in l.selective_modules for l in layouts)
    # a run with the full-attention layer keeps every set
    assert narrow(SpaceOptions(), qwen36, 1, Stack(), "megatron", trial_model(qwen36, 4)).reasons == ()


def test_a_model_without_softmax_attention_gets_no_core_attn(qwen36):
    gdn = replace(qwen36, name="gdn-only", layer_types=(LINEAR_ATTENTION,) * qwen36.num_hidden_layers,
                  num_nextn_predict_layers=0)
    assert "core_attn" not in modules(selective_module_sets(gdn))
    with_mtp = replace(gdn, num_nextn_predict_layers=1)            # the MTP layer is softmax attention
    assert "core_attn" in modules(selective_module_sets(with_mtp))


def test_a_dense_model_gets_no_moe_sets_and_a_moe_model_no_mlp(qwen36):
    dense = selective_module_sets(load_model("llama3-8b"))
    assert not modules(dense) & MOE_MODULES and "mlp" in modules(dense)
    moe = selective_module_sets(qwen36)
    assert "mlp" not in modules(moe) and MOE_MODULES <= modules(moe)
    ds = load_model("deepseek-v3")
    assert "mla_up_proj" not in modules(dense) | modules(moe) and "mla_up_proj" in modules(selective_module_sets(ds))
    # a MoE model's run of dense layers only (DeepSeek-V3's first three) drops the sets only MoE layers cover
    run = trial_model(ds, 3)
    assert set(run.mlp_types) == {DENSE}
    sets = selective_module_sets(ds, run)
    assert ("moe",) not in sets and ("moe_act",) not in sets and set(sets) <= set(selective_module_sets(ds))


def test_recompute_choices_follow_the_options_sets(qwen36):
    options = replace(SMALL, selective_module_sets=(("layernorm",),))
    selective = [rc for rc in recompute_choices(qwen36, options) if rc["recompute_granularity"] == "selective"]
    assert selective == [dict(recompute_granularity="selective", recompute_modules=("layernorm",))]
