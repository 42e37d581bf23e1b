import pytest

from cost_model.nouns.model_spec import load_model
from cost_model.nouns.workload import Workload
from search_space.enumerate import enumerate_layouts
from cost_model.nouns.layout import InvalidLayout, Layout
from cost_model.nouns.layout_codec import layout_from_stored, layout_values
from search_space.rules import check, violations
from cost_model.nouns.stack import Stack

FULL1 = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)


def test_derived_sizes_follow_megatron_folding():
    layout = Layout(16, tp=2, pp=2, cp=2, ep=8, etp=1)
    assert layout.dp == 2 and layout.edp == 1
    assert layout.sequence_parallel
    assert layout.label == "TP2 PP2 CP2 EP8 DP2"
    assert not Layout(8, ep=8).sequence_parallel


@pytest.mark.parametrize("kwargs, needle", [
    (dict(world_size=8, tp=4, pp=4), "TP x PP x CP = 4 x 4 x 1 = 16"),
    (dict(world_size=8, ep=16), "ETP x EP x PP = 1 x 16 x 1 = 16"),
    (dict(world_size=8, vpp=2), "VPP 2 needs pipeline parallelism"),
    (dict(world_size=8, ep=1, dispatcher="flex"), "EP 1 x ETP 1"),
    (dict(world_size=8, recompute_granularity="full"), "recompute_method uniform or block"),
    (dict(world_size=8, recompute_granularity="selective", recompute_method="uniform"), "selective recompute takes no"),
    (dict(world_size=8, recompute_granularity="selective", recompute_modules=("bogus",)), "unknown recompute_modules"),
    (dict(world_size=8, recompute_method="block"), "need a recompute_granularity"),
    (dict(world_size=8, optimizer_offload_fraction=1.5), "[0, 1]"),
    (dict(world_size=8, overlap_d2h_h2d=True), "needs optimizer CPU offload"),
    (dict(world_size=0), "world_size must be a positive integer"),
])
def test_layout_rejects_with_the_failing_numbers(kwargs, needle):
    with pytest.raises(InvalidLayout) as e:
        Layout(**kwargs)
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_key_and_params_round_trip():
    layout = Layout(8, tp=2, ep=4, etp=1, recompute_granularity="selective", recompute_modules=("moe_act", "layernorm"),
                    optimizer_offload_fraction=0.5, overlap_d2h_h2d=True, dispatcher="flex")
    again = layout_from_stored({"world_size": layout.world_size, **layout_values(layout)})
    assert again == layout and again.key() == layout.key()
    with pytest.raises(InvalidLayout, match="unknown layout key"):
        layout_from_stored({"world_size": 8, "bogus": 1})


def test_layout_pairs_are_what_parse_pairs_reads_back(qwen36):
    """`--layout` pairs a message prints (tuner.space_scoring's partial-offload hint) give back the same layout."""
    from cost_model.nouns.layout_codec import layout_from_values, layout_pairs, parse_pairs
    workload = Workload(seq_len=4096, global_batch=64)
    layouts = list(enumerate_layouts(qwen36, 8, workload, Stack()))[::97] + [Layout(8, tp=2, ep=4, etp=1)]
    assert len(layouts) > 20
    for layout in layouts:
        assert layout_from_values(parse_pairs(layout_pairs(layout)), 8, workload.seq_len) == layout
    assert layout_pairs(Layout(8)) == ["max_tokens_per_gpu=8192", "rows_per_microbatch=1"]
    assert layout_pairs(Layout(8, ep=8, overlap_d2h_h2d=True, optimizer_offload_fraction=1.0))[:1] == ["ep=8"]
    assert "overlap_d2h_h2d=true" in layout_pairs(Layout(8, ep=8, overlap_d2h_h2d=True, optimizer_offload_fraction=1.0))


def rules_of(layout, model, workload=Workload(), stack=Stack()):
    return {v.rule for v in violations(layout, model, workload, stack)}


def test_qwen35_output_gate_limits_tp_unless_the_stack_has_the_fix(qwen36):
    assert rules_of(Layout(8, tp=4, ep=2, etp=1, max_tokens_per_gpu=8192), qwen36) == {"output_gate_tp"}
    assert not rules_of(Layout(8, tp=4, ep=2, etp=1), qwen36, stack=Stack(output_gate_tp_fix=True))
    assert not rules_of(Layout(8, tp=2, etp=1, ep=8), qwen36)


def test_model_rules_name_the_numbers(qwen36):
    found = violations(Layout(36, pp=3, ep=3, tp=1), qwen36, Workload(), Stack())
    text = " ".join(str(v) for v in found)
    assert "256 experts are not divisible by EP 3" in text
    assert "40 layers are not divisible by PP 3" in text


def test_slime_rules(qwen36):
    assert "cp_divides_2048" in rules_of(Layout(24, cp=3, ep=8, max_tokens_per_gpu=2730), qwen36,
                                         Workload(seq_len=8190))
    assert "rows_per_microbatch" in rules_of(Layout(8, ep=8, max_tokens_per_gpu=16384, rows_per_microbatch=1), qwen36)
    assert "global_batch_vs_dp" in rules_of(Layout(8, ep=8), qwen36, Workload(global_batch=4))
    assert "flex_needs_deepep" in rules_of(Layout(8, ep=8, dispatcher="flex"), qwen36,
                                           stack=Stack(deepep=False))


def test_dense_model_rules():
    llama = load_model("llama3-8b")
    assert "ep_needs_experts" in rules_of(Layout(8, ep=2), llama)
    assert "moe_recompute_needs_moe" in rules_of(Layout(8, recompute_granularity="selective",
                                                        recompute_modules=("moe_act",)), llama)


def test_check_raises_one_line_with_every_rule(qwen36):
    with pytest.raises(InvalidLayout) as e:
        check(Layout(36, pp=3, ep=3), qwen36, Workload(), Stack())
    msg = str(e.value)
    assert msg.startswith("invalid layout TP1 PP3 EP3 DP12") and "\n" not in msg


@pytest.mark.slow
def test_enumeration_yields_only_valid_layouts_and_contains_the_reference(qwen36, workload, stack):
    layouts = list(enumerate_layouts(qwen36, 8, workload, stack))
    assert len(layouts) > 1000
    assert len({l.key() for l in layouts}) == len(layouts)
    for layout in layouts[::97]:
        check(layout, qwen36, workload, stack)
    reference = Layout(8, ep=8, **FULL1)
    assert reference in layouts
    assert {l.tp for l in layouts} == {1, 2}  # the output gate: TP must divide the 2 query groups
    with_fix = {l.tp for l in enumerate_layouts(qwen36, 8, workload, Stack(output_gate_tp_fix=True))}
    assert with_fix == {1, 2, 4, 8}


def test_derived_layouts_are_what_the_constructor_builds(qwen36, workload, stack):
    """The enumeration derives a shape's layouts from its first one (Layout.with_choices, with_microbatch: only the
    checks of what changed run): each is the layout the constructor builds, its key and derived sizes too; what the
    constructor refuses, they refuse."""
    for layout in list(enumerate_layouts(qwen36, 8, workload, stack))[::7]:
        built = Layout(**layout.__getstate__())
        assert layout == built and layout.key() == built.key()
        assert (layout.dp, layout.edp, layout.selective_modules, layout.offloaded) == \
            (built.dp, built.edp, built.selective_modules, built.offloaded)
    base = Layout(8, ep=4, pp=2, max_tokens_per_gpu=4096, **FULL1)
    base.key()   # cached on the layout: a derived one has its own
    assert base.with_microbatch(8192, 2).key() == Layout(8, ep=4, pp=2, max_tokens_per_gpu=8192,
                                                         rows_per_microbatch=2, **FULL1).key()
    assert base.with_choices(4096, 1, dispatcher="flex") == Layout(8, ep=4, pp=2, max_tokens_per_gpu=4096,
                                                                   dispatcher="flex")
    with pytest.raises(InvalidLayout, match="overlap_d2h_h2d needs optimizer CPU offload"):
        base.with_choices(4096, 1, overlap_d2h_h2d=True)
    with pytest.raises(InvalidLayout, match="must be a positive integer"):
        base.with_microbatch(0, 1)


@pytest.mark.slow
def test_enumeration_across_models_and_sizes(workload, stack):
    from search_space.enumerate import SpaceOptions

    # DeepSeek-V3 on 64 GPUs: every parallel shape, with one full-recompute depth, no offload and fp32 moments (the
    # whole space is 2.3 million layouts, about 30 s to enumerate; the other two are whole)
    wide = SpaceOptions(full_recompute_layers=(1,), offload_fractions=(0.0,), exp_avg_dtypes=("fp32",))
    for name, n, options in (("qwen3-30b-a3b", 16, SpaceOptions()), ("deepseek-v3", 64, wide),
                             ("llama3-8b", 4, SpaceOptions())):
        model = load_model(name)
        layouts = list(enumerate_layouts(model, n, workload, stack, options))
        assert layouts, name
        assert all(not violations(l, model, workload, stack) for l in layouts[::211])


def test_context_parallel_rules_follow_the_framework_and_cp():
    """slime's --seq-length placeholder (2048) bounds CP for slime runs only; a Megatron run of 12,288-token rows
    takes CP 3 (12,288 % 6 == 0); rows of any length are fine at CP 1 (nothing splits them)."""
    llama = load_model("llama3-70b")
    layout = Layout(48, tp=8, cp=3, max_tokens_per_gpu=4096)
    megatron = Workload(seq_len=12288, global_batch=64, framework="megatron")
    assert not violations(layout, llama, megatron, Stack())
    slime = Workload(seq_len=12288, global_batch=64)
    assert [v.rule for v in violations(layout, llama, slime, Stack())] == ["cp_divides_2048"]
    odd = Workload(seq_len=8191, global_batch=64)
    assert not violations(Layout(8, max_tokens_per_gpu=8191), load_model("llama3-8b"), odd, Stack())
    assert "row_divisible_by_2cp" in [v.rule for v in violations(Layout(8, cp=2, max_tokens_per_gpu=4096),
                                                                 load_model("llama3-8b"), odd, Stack())]


def test_an_indivisible_pipeline_names_the_balanced_splits_and_each_runs(capsys):
    from tuner.cli import main
    args = ["predict", "--model", "deepseek-v3", "--gpu", "h200", "--gpus", "128", "--layout", "pp=16", "ep=8"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "61 layers are not divisible by PP 16" in err
    hint = err.split("the balanced splits the search space uses: ")[1].split(" [megatron")[0]
    splits = hint.split(" | ")
    assert "decoder_first_pipeline_num_layers=1" in splits and len(splits) == 4
    for split in splits:   # each named split is a layout `tune predict` takes as written
        assert main(args + split.split()) == 0, split
        capsys.readouterr()


def test_comma_joined_pairs_read_as_pairs_and_a_stray_equals_sign_is_named():
    """`--layout tp=2,ep=8` (a common way to write pairs) reads as two pairs; a module list keeps its commas; a pair
    that swallowed another (`tp=2,recompute_modules=a,b`) is refused naming what to do, not as a wrong type."""
    from cost_model.nouns.layout_codec import parse_pairs
    assert parse_pairs(["tp=2,ep=8"]) == {"tp": 2, "ep": 8}
    assert parse_pairs(["recompute_modules=core_attn,mlp"]) == {"recompute_modules": ("core_attn", "mlp")}
    with pytest.raises(InvalidLayout, match="separated by spaces"):
        parse_pairs(["tp=2,recompute_modules=mlp,layernorm"])


def test_uniform_recompute_must_divide_every_chunk_on_slimes_megatron(qwen36):
    """slime's image pins Megatron 1dcf0da, whose uniform recompute indexes layers [i, i + N) of a chunk with no
    clamp: 40 layers over PP 2 x VPP 4 are chunks of 5, which N = 4 overruns (the run fails at its first step)."""
    def rules(n, framework="slime", **pipeline):
        layout = Layout(8, ep=4, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=n,
                        **pipeline)
        return {v.rule for v in violations(layout, qwen36, Workload(framework=framework), Stack())}
    assert "uniform_recompute_divides_chunks" in rules(4, pp=2, vpp=4)
    assert "uniform_recompute_divides_chunks" not in rules(5, pp=2, vpp=4)
    assert "uniform_recompute_divides_chunks" not in rules(4, "megatron", pp=2, vpp=4)   # later Megatron clamps
    assert "uniform_recompute_divides_chunks" in rules(3)      # one chunk of 40
    # a layout string's chunks, each counted: 4, 5 and 6 layers, which neither 4 nor 5 divides all of
    text = "Et*4|(t*5|)*6t*6L"
    assert qwen36.layout_chunks(Layout(8, pp=2, vpp=4, ep=4, pipeline_model_parallel_layout=text)) == \
        ((4, 5), (5, 5), (5, 5), (5, 6))
    assert "gdn_spec_no_layout_string" in rules(1, pp=2, vpp=4, pipeline_model_parallel_layout=text)
    llama = load_model("llama3-8b")   # 32 layers: chunks 3, 4 and 5 of a layout string
    text = "Et*3|(t*4|)*6t*5L"
    layout = Layout(8, pp=2, vpp=4, recompute_granularity="full", recompute_method="uniform",
                    recompute_num_layers=4, pipeline_model_parallel_layout=text)
    assert llama.layout_chunks(layout) == ((3, 4), (4, 4), (4, 4), (4, 5))
    assert "uniform_recompute_divides_chunks" in {v.rule for v in violations(layout, llama, Workload(), Stack())}
