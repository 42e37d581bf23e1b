"""Uneven pipeline splits (issue 16): the layouts DeepSeek-V3 (61 layers), Qwen3-235B-A22B (94) and
Llama3.1-405B (126) train with. The search space proposes them where the layers do not divide; megatron-core
accepts every one and builds exactly the layers our cost model puts on each stage; the recipe and the slime
command carry them; and ETP left unset is TP, as Megatron's default."""
from __future__ import annotations

import pytest
import yaml

import megatron_validate
from cost_model.nouns.layout import SPLIT_FIELDS, InvalidLayout, Layout
from cost_model.nouns.layout_codec import (from_optuna_params, layout_from_recipe_block, layout_from_values,
                                           recipe_block, to_optuna_params)
from cost_model.nouns.model_spec import ModelError, load_model, stage_layers
from cost_model.predict import predict
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.stack import Stack
from cost_model.stages import rank_layers
from cost_model.nouns.workload import Workload
from search_space.enumerate import SpaceOptions, parallel_shapes
from search_space.megatron_args import model_args, parallel_args
from search_space.pipeline_splits import accounting_splits, uneven_splits
from search_space.rules import violations
from tuner.space_params import distributions

SEQ = 4096
BIG = {"deepseek-v3": 128, "qwen3-235b-a22b": 64, "llama3.1-405b": 64}


def argv(model, layout: Layout) -> list[str]:
    return model_args(model) + parallel_args(layout) + [
        "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ), "--micro-batch-size", "1",
        "--global-batch-size", str(layout.dp * 8), "--bf16", "--use-distributed-optimizer"]


def uneven_shapes(name: str) -> list[dict]:
    model = load_model(name)
    return [s for s in parallel_shapes(model, BIG[name], Workload(seq_len=SEQ, global_batch=1024), Stack(),
                                       SpaceOptions()) if set(s) & set(SPLIT_FIELDS)]


def test_the_splits_are_balanced_and_megatron_shaped():
    assert uneven_splits(61, 4) == ((13, None), (14, 15), (15, 14), (None, 13))
    assert uneven_splits(94, 8) == ((10, None), (11, 11), (None, 10))
    assert uneven_splits(64, 1) == ()
    # Megatron's interleaving: virtual stage v runs chunk v of every rank, in rank order
    assert stage_layers(10, 2, 1, 4, None) == ((0, 1, 2, 3), (4, 5, 6, 7, 8, 9))
    assert stage_layers(12, 2, 2, 4, None) == ((0, 1, 6, 7), (2, 3, 4, 5, 8, 9, 10, 11))
    for first, last, why in ((3, None, "not divisible by VPP"), (5, 5, "not divisible by 2 middle")):
        with pytest.raises(ModelError, match=why):
            stage_layers(61, 4, 2 if first == 3 else 1, first, last)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")
@pytest.mark.parametrize("name", sorted(BIG))
def test_megatron_accepts_every_proposed_split_and_builds_our_stages(name):
    model = load_model(name)
    shapes = uneven_shapes(name)
    assert shapes, f"{name}: no uneven split proposed"
    seen = set()
    for shape in shapes:
        key = (shape["pp"], shape["vpp"], *(shape.get(f) for f in SPLIT_FIELDS))
        if key in seen:   # the split is what Megatron checks; TP/CP/EP do not change it
            continue
        seen.add(key)
        layout = Layout(BIG[name], **shape)
        ok, message = megatron_validate.validate(argv(model, layout), layout.world_size)
        assert ok, f"{name} {layout.label}: {message}"
        ours = [list(r) for r in model.layout_stage_layers(layout)]
        assert megatron_validate.stage_layers(argv(model, layout), layout.world_size) == ours, layout.label
    assert len(seen) >= 3
    if name != "deepseek-v3":   # 94 + 2 and 126 + 2 divide over PP 8: the embedding/loss accounting is proposed
        assert any(k[4] for k in seen), sorted(seen)


def test_the_embedding_and_loss_take_a_layers_place():
    assert accounting_splits(94, 8, 4) == ((True, True),) and accounting_splits(61, 4, 4) == ()
    assert [len(r) for r in stage_layers(94, 8, 4, embedding=True, loss=True)] == [11] + [12] * 6 + [11]
    assert stage_layers(10, 2, 1, embedding=True, loss=True) == ((0, 1, 2, 3, 4), (5, 6, 7, 8, 9))
    layout = Layout(64, pp=8, vpp=4, ep=8, account_for_embedding_in_pipeline_split=True,
                    account_for_loss_in_pipeline_split=True, max_tokens_per_gpu=SEQ)
    assert to_optuna_params(layout)["pipeline_split"] == "E+L"
    assert from_optuna_params(to_optuna_params(layout), 64, SEQ) == layout
    assert layout_from_recipe_block(yaml.safe_load(yaml.safe_dump(recipe_block(layout))), 64) == layout
    assert "--account-for-loss-in-pipeline-split" in parallel_args(layout) and "PP8[E+L]" in layout.label
    with pytest.raises(InvalidLayout, match="cannot be set together"):
        Layout(64, pp=8, decoder_first_pipeline_num_layers=10, account_for_loss_in_pipeline_split=True)


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")
@pytest.mark.parametrize("first, last, vpp", [(3, None, 2), (None, 8, 1), (16, 16, 1), (4, 4, 2)])
def test_a_split_megatron_refuses_is_refused(first, last, vpp):
    """61 layers over PP 4: each split breaks one of Megatron's uneven-PP checks; ours names it too."""
    model = load_model("deepseek-v3")
    try:
        layout = Layout(128, pp=4, vpp=vpp, ep=32, decoder_first_pipeline_num_layers=first,
                        decoder_last_pipeline_num_layers=last, max_tokens_per_gpu=SEQ)
        ours = [v.rule for v in violations(layout, model, Workload(seq_len=SEQ, global_batch=1024), Stack())]
    except InvalidLayout as e:
        ours = [str(e)]
        layout = None
    assert ours, (first, last, vpp)
    if layout is not None:
        assert "uneven_pipeline_split" in ours
        ok, message = megatron_validate.validate(argv(model, layout), layout.world_size)
        assert not ok, message


@pytest.mark.parametrize("name", sorted(BIG))
def test_the_cost_model_puts_the_split_on_its_stages(name):
    model = load_model(name)
    pp = 8
    first, last = uneven_splits(model.num_hidden_layers, pp)[0]
    ranks = rank_layers(model, pp, 1, first, last)
    assert sum(r.num_layers for r in ranks) == model.num_hidden_layers
    assert [r.num_layers for r in ranks] == [len(s) for s in stage_layers(model.num_hidden_layers, pp, 1, first,
                                                                          last)]
    assert ranks[0].has_embedding and ranks[-1].has_head and ranks[-1].lm_head > 0
    layout = Layout(BIG[name], pp=pp, ep=8 if model.is_moe else 1, decoder_first_pipeline_num_layers=first,
                    decoder_last_pipeline_num_layers=last, recompute_granularity="full", recompute_method="uniform",
                    recompute_num_layers=1)
    p = predict(model, load_gpu("h200"), Workload(seq_len=SEQ, global_batch=1024), layout)
    assert p.tokens_per_s_per_gpu > 0 and p.peak_memory_gib > 0


def test_recipe_flags_and_optuna_params_carry_the_split():
    model = load_model("deepseek-v3")
    layout = Layout(128, pp=8, ep=16, decoder_first_pipeline_num_layers=5, max_tokens_per_gpu=SEQ)
    flags = parallel_args(layout)
    assert flags[flags.index("--decoder-first-pipeline-num-layers") + 1] == "5"
    assert "--decoder-last-pipeline-num-layers" not in flags
    block = recipe_block(layout)
    assert block["layer_split"] == {"decoder_first_pipeline_num_layers": 5, "decoder_last_pipeline_num_layers": None}
    assert layout_from_recipe_block(yaml.safe_load(yaml.safe_dump(block)), 128) == layout
    params = to_optuna_params(layout)
    assert params["pipeline_split"] == "5:" and from_optuna_params(params, 128, SEQ) == layout
    assert params["pipeline_split"] in distributions(model, 128, SpaceOptions(), Workload())["pipeline_split"].choices
    assert "PP8[5:]" in layout.label
    even = Layout(128, pp=2, ep=16, max_tokens_per_gpu=SEQ)
    assert recipe_block(even)["layer_split"] is None and "decoder" not in even.key()
    # a stored trial of a study made before the split existed has no pipeline_split parameter
    old = {k: v for k, v in to_optuna_params(even).items() if k != "pipeline_split"}
    assert from_optuna_params(old, 128, SEQ) == even


def test_the_slime_command_of_an_uneven_recipe_carries_the_flags():
    from recipes.slime_command import slime_run

    layout = Layout(128, pp=8, ep=16, decoder_first_pipeline_num_layers=5, recompute_granularity="full",
                    recompute_method="uniform", recompute_num_layers=1)
    command = slime_run(load_model("deepseek-v3"), load_gpu("h200"), Workload(seq_len=SEQ, global_batch=1024),
                            layout)
    assert "--decoder-first-pipeline-num-layers 5" in command


def test_etp_unset_is_tp_as_in_megatron():
    assert Layout(8, tp=2).etp == 2 and Layout(8, tp=2, etp=1).etp == 1
    assert layout_from_values({"tp": 4}, 8, SEQ).etp == 4
    llama = load_model("llama3-8b")
    # a dense model at TP 2, given without ETP, is valid (it was refused when ETP defaulted to 1)
    assert not violations(Layout(8, tp=2, max_tokens_per_gpu=SEQ), llama, Workload(seq_len=SEQ, global_batch=64), Stack())
    with pytest.raises(InvalidLayout, match=r"expert grid\); ETP was not given and defaults to TP \(2\).*etp=1"):
        Layout(8, tp=2, ep=8)   # Megatron: ETP 2 x EP 8 does not divide 8 GPUs; the message says where ETP 2 came from
    with pytest.raises(InvalidLayout, match=r"\(expert grid\)$"):
        Layout(8, tp=2, ep=8, etp=2)   # given: no hint
