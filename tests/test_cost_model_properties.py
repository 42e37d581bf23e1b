"""Property tests of the cost model: orderings and identities that must hold for every valid layout.

Layouts are drawn from the enumeration (everything Megatron and slime accept) of a few catalog
models on 8, 16 and 64 GPUs: hypothesis draws a parallel shape of the space (`space_plan`), then one of
that shape's layouts (`shape_layouts`, each shape enumerated once and cached). On 8 GPUs the space is the default one; on 16 and 64 it holds every
parallel shape with the non-parallel dimensions narrowed (one full-recompute depth, no offload, fp32
moments): the properties that vary those dimensions vary them on the drawn layout themselves, and the
whole 64-GPU spaces (8.5 million layouts, about 110 s to enumerate) made this file the suite's slowest. Variants of a drawn layout (another recompute setting, another
offload fraction, another world size) are kept only when they pass `violations` for the same
model, workload and stack, so every layout the cost model scores here is one the tuner could score.
"""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from cost_model.nouns.hardware import load_gpu
from cost_model.memory import GIB, static_memory
from cost_model.nouns.model_spec import load_model
from cost_model.predict import predict
from cost_model.stages import layout_rank_layers
from cost_model.step_time import TERMS
from cost_model.nouns.workload import FRAMEWORKS, PRECISIONS, ROUTINGS, Workload
from search_space.enumerate import SpaceOptions, recompute_choices, shape_layouts, space_plan
from cost_model.nouns.layout import RECOMPUTE_MODULES, Layout
from search_space.rules import violations
from cost_model.nouns.stack import Stack

MODELS = ("qwen3.6-35b-a3b", "qwen3-30b-a3b", "moonlight-16b-a3b", "deepseek-v3", "llama3-8b")
WORLDS = (8, 16, 64)
GPUS = ("h100", "h200", "b200", "gb200")
WORKLOAD = Workload()  # validity depends on seq_len and global_batch only; those stay at the defaults
STACK = Stack()
OPTIONS = SpaceOptions()
WIDE = SpaceOptions(full_recompute_layers=(1,), offload_fractions=(0.0,), exp_avg_dtypes=("fp32",))

# Enumerating the spaces the properties sample from takes tens of seconds, whichever test runs first.
pytestmark = pytest.mark.slow

PROPERTY = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@lru_cache(maxsize=None)
def model(name: str):
    return load_model(name)


@lru_cache(maxsize=None)
def gpu(name: str):
    return load_gpu(name)


@lru_cache(maxsize=None)
def plan(name: str, world_size: int) -> tuple[list[dict], SpaceOptions]:
    """The space's parallel shapes and the options its enumeration uses (the whole space is 3k-300k layouts a
    model and GPU count: enumerated whole, 22 s for the 15 of them; drawn shape by shape, a shape's layouts only)."""
    shapes, options, _ = space_plan(model(name), world_size, WORKLOAD, STACK, OPTIONS if world_size == 8 else WIDE)
    return shapes, options


@lru_cache(maxsize=None)
def shape_space(name: str, world_size: int, index: int) -> tuple[Layout, ...]:
    shapes, options = plan(name, world_size)
    return tuple(shape_layouts(shapes[index], model(name), world_size, WORKLOAD, STACK, options))


RECOMPUTE_MODULE_RULES = {"mla_up_proj_needs_mla", "moe_recompute_needs_moe", "moe_layer_recompute_needs_moe",
                          "shared_experts_recompute"}


@lru_cache(maxsize=None)
def valid_modules(name: str) -> tuple[str, ...]:
    """Recompute modules `violations` accepts for this model, one at a time (mlp included on an all-MoE
    model: Megatron accepts it there, as a no-op)."""
    return tuple(m for m in RECOMPUTE_MODULES if not any(
        v.rule in RECOMPUTE_MODULE_RULES for v in violations(
            Layout(8, recompute_granularity="selective", recompute_modules=(m,)), model(name), WORKLOAD, STACK)))


@st.composite
def enumerated(draw, worlds=WORLDS):
    """(model name, a valid layout of that model) drawn from the enumerated space: a parallel shape, then one of
    its layouts."""
    name = draw(st.sampled_from(MODELS))
    n = draw(st.sampled_from(worlds))
    shapes, _ = plan(name, n)
    layouts = shape_space(name, n, draw(st.integers(0, len(shapes) - 1)))
    assume(layouts)
    return name, layouts[draw(st.integers(0, len(layouts) - 1))]


def is_valid(layout: Layout, name: str, workload: Workload = WORKLOAD) -> bool:
    return not violations(layout, model(name), workload, STACK)


def with_recompute(layout: Layout, granularity=None, method=None, num_layers=None, modules=()) -> Layout:
    return replace(layout, recompute_granularity=granularity, recompute_method=method,
                   recompute_num_layers=num_layers, recompute_modules=tuple(modules))


def stage_layers(name: str, layout: Layout) -> int:
    return model(name).num_hidden_layers // layout.pp // layout.vpp


def chunk_divisors(name: str, layout: Layout) -> list[int]:
    """The layer counts that divide every (virtual) pipeline chunk of the layout."""
    sizes = {c for row in model(name).layout_chunks(layout) for c in row if c}
    return [k for k in range(1, min(sizes) + 1) if all(c % k == 0 for c in sizes)]


def run(name: str, layout: Layout, gpu_name: str = "h200", workload: Workload = WORKLOAD):
    assert is_valid(layout, name, workload), layout
    return predict(model(name), gpu(gpu_name), workload, layout)


def le(a: float, b: float, rel: float = 1e-12) -> bool:
    """a <= b up to floating-point summation noise."""
    return a <= b + rel * max(abs(a), abs(b))


def describe(name, layout, **extra):
    return f"{name} | {layout.long_label} | world {layout.world_size} " + " ".join(f"{k}={v}" for k, v in extra.items())


ORDER = {m: i for i, m in enumerate(RECOMPUTE_MODULES)}


@lru_cache(maxsize=None)
def catalog_sets(name: str) -> tuple[tuple[str, ...], ...]:
    """The selective module sets the tuner enumerates for this model (`recompute_choices`)."""
    return tuple(tuple(rc["recompute_modules"]) for rc in recompute_choices(model(name), OPTIONS)
                 if rc["recompute_granularity"] == "selective")


@st.composite
def nested_module_sets(draw, name: str, any_set: bool = True):
    """S subset of T: catalog sets, or (any_set) S a catalog set or any subset of the model's valid modules
    and T any superset of S among them."""
    if not any_set:
        s = draw(st.sampled_from(catalog_sets(name)))
        t = draw(st.sampled_from([c for c in catalog_sets(name) if set(s) <= set(c)]))
        return s, t
    mods = valid_modules(name)
    s = draw(st.one_of(st.sampled_from(catalog_sets(name)).map(set), st.sets(st.sampled_from(mods), min_size=1)))
    t = s | draw(st.sets(st.sampled_from(mods)))
    return tuple(sorted(s, key=ORDER.get)), tuple(sorted(t, key=ORDER.get))


# ---------------------------------------------------------------------------------------------------
# 1. Recompute: more recompute never lowers step time nor raises activation memory.
#
# Partial order that must hold: none <= selective(S) <= selective(S u T) <= full uniform (any k) in
# step time; none >= selective(S) >= selective(S u T) >= full uniform 1 in activations (full uniform 1
# keeps only each layer's input). Full uniform k > 1 trades a smaller saved set for a k-layer working
# set, so it is not ordered against selective in memory. Full block k recomputes only k layers per
# virtual stage: it is ordered against none and, by k, against itself and full uniform, not against
# selective. Module sets are the tuner's catalog sets (`recompute_choices`) or any set of the modules
# Megatron accepts for the model. Two orderings once failed and keep their counterexamples as
# examples: selective (any set) <= full uniform in step time, and selective >= full uniform 1 in
# activations (fixed: launch shares apply per layer kind and are capped at one pass; a selective
# layer's working set is the whole layer, as it rebuilds its modules in the backward).
# ---------------------------------------------------------------------------------------------------

@st.composite
def recompute_case(draw, any_set: bool = True):
    name, base = draw(enumerated())
    s, t = draw(nested_module_sets(name, any_set))
    # recompute_num_layers for full uniform recompute: one dividing every pipeline chunk (slime's pinned Megatron
    # indexes past a chunk it does not divide: search_space.rules._uniform_chunk_rule)
    k = draw(st.sampled_from(chunk_divisors(name, base)))
    return name, base, s, t, draw(st.sampled_from(GPUS)), k


@PROPERTY
@given(recompute_case())
def test_step_time_none_le_selective_subset_le_superset(case):
    name, base, s, t, g, k = case
    none = with_recompute(base)
    sel_s = with_recompute(base, "selective", modules=s)
    sel_t = with_recompute(base, "selective", modules=t)
    times = [run(name, x, g).step_time_s for x in (none, sel_s, sel_t)]
    assert le(times[0], times[1]) and le(times[1], times[2]), describe(name, base, S=s, T=t, times=times)


@PROPERTY
@given(recompute_case())
def test_activations_none_ge_selective_subset_ge_superset(case):
    name, base, s, t, g, k = case
    preds = [run(name, with_recompute(base, *rc), g) for rc in
             ((None,), ("selective", None, None, s), ("selective", None, None, t))]
    acts = [p.memory.activations for p in preds]
    totals = [p.memory.total for p in preds]
    assert le(totals[1], totals[0]) and le(totals[2], totals[1]), describe(name, base, S=s, T=t, totals=totals)
    assert le(acts[1], acts[0]) and le(acts[2], acts[1]), describe(name, base, S=s, T=t, acts=acts)


def check_selective_le_full_uniform(case):
    name, base, s, t, g, k = case
    sel = run(name, with_recompute(base, "selective", modules=t), g)
    full = run(name, with_recompute(base, "full", "uniform", k), g)
    assert le(sel.step_time_s, full.step_time_s), describe(
        name, base, T=t, k=k, selective=sel.step_time_s, full=full.step_time_s,
        recompute=(sel.breakdown["recompute"], full.breakdown["recompute"]),
        launch=(sel.breakdown["launch_overhead"], full.breakdown["launch_overhead"]))


@PROPERTY
@given(recompute_case(any_set=False))
def test_step_time_catalog_selective_le_full_uniform(case):
    check_selective_le_full_uniform(case)


# Any module set Megatron accepts, not only the tuner's catalog sets. step_time.SELECTIVE_LAUNCH_SHARE
# adds each module's share of a layer's kernel launches to every layer, whatever its kind (mlp, which
# Megatron applies to dense layers only, adds 0.3 on every MoE layer), and the sum is not capped at
# the one extra pass full recompute pays: core_attn + mlp + moe + shared_experts relaunch 1.05 passes.
# Where launch overhead is exposed (short micro-batches) selective then comes out slower than full
# uniform recompute. Minimal counterexample: moonlight-16b-a3b, 8 GPUs, TP1 PP1 CP4 EP2 DP2, 2048
# tokens per GPU, (core_attn, mlp, moe, shared_experts): +0.57 % on H200; with mla_up_proj added
# (1.15 passes) at CP8 EP4 DP1, 1024 tokens per GPU: +3.5 %.
MOONLIGHT_CP4 = Layout(8, cp=4, ep=2, max_tokens_per_gpu=2048)
MOONLIGHT_CP8 = Layout(8, cp=8, ep=4, max_tokens_per_gpu=1024)
CORE_MLP_MOE_SHARED = ("core_attn", "mlp", "moe", "shared_experts")
CORE_UP_MLP_MOE_SHARED = ("core_attn", "mla_up_proj", "mlp", "moe", "shared_experts")


@PROPERTY
@example(case=("moonlight-16b-a3b", MOONLIGHT_CP4, CORE_MLP_MOE_SHARED, CORE_MLP_MOE_SHARED, "h200", 1))
@example(case=("moonlight-16b-a3b", MOONLIGHT_CP8, CORE_UP_MLP_MOE_SHARED, CORE_UP_MLP_MOE_SHARED, "h200", 1))
@given(recompute_case(any_set=True))
def test_step_time_any_selective_set_le_full_uniform(case):
    check_selective_le_full_uniform(case)


# The catalog set (core_attn, layernorm, mlp) on llama3-8b, 64 GPUs, TP1 PP16 DP4, 4 rows (32768 tokens)
# per micro-batch: the last stage (2 layers, 1 micro-batch in flight, logits) is the most-loaded
# GPU and full uniform 1 predicts 1.76 GiB more activations there than selective. Cause:
# activations.activation_bytes_per_microbatch takes the working set `largest` from the per-layer
# activations *after* the selective reductions, while full recompute keeps the unreduced layer
# (largest * min(k, n)). Selective recompute rematerialises its modules in the layer's backward too,
# so its working set is the unreduced layer as well; counted that way, full uniform 1 (layer inputs
# only) can never exceed selective, whose per-layer saved bytes are always >= the layer input.
LLAMA_PP16 = Layout(64, pp=16, max_tokens_per_gpu=32768, rows_per_microbatch=4)
CORE_LN_MLP = ("core_attn", "layernorm", "mlp")


@PROPERTY
@example(case=("llama3-8b", LLAMA_PP16, CORE_LN_MLP, CORE_LN_MLP, "h200", 1))
@given(recompute_case())
def test_activations_selective_ge_full_uniform_1(case):
    name, base, s, t, g, k = case
    sel = run(name, with_recompute(base, "selective", modules=t), g)
    full = run(name, with_recompute(base, "full", "uniform", 1), g)
    assert le(full.memory.total, sel.memory.total), describe(
        name, base, T=t, selective=sel.memory.as_dict(), full=full.memory.as_dict())
    assert le(full.memory.activations, sel.memory.activations), describe(
        name, base, T=t, selective=sel.memory.as_dict(), full=full.memory.as_dict())


@PROPERTY
@given(enumerated(), st.sampled_from(GPUS), st.data())
def test_full_block_recompute_is_monotone_in_num_layers(case, g, data):
    name, base = case
    n = stage_layers(name, base)
    k1 = data.draw(st.integers(1, n), label="k1")
    k2 = data.draw(st.integers(k1, n), label="k2")
    none = run(name, with_recompute(base), g)
    b1 = run(name, with_recompute(base, "full", "block", k1), g)
    b2 = run(name, with_recompute(base, "full", "block", k2), g)
    uni = run(name, with_recompute(base, "full", "uniform", 1), g)
    label = describe(name, base, k1=k1, k2=k2)
    t = [none.step_time_s, b1.step_time_s, b2.step_time_s, uni.step_time_s]
    assert le(t[0], t[1]) and le(t[1], t[2]) and le(t[2], t[3]), (label, t)
    m = [none.memory.total, b1.memory.total, b2.memory.total]
    assert le(m[1], m[0]) and le(m[2], m[1]), (label, m)
    a = [none.memory.activations, b1.memory.activations, b2.memory.activations]
    assert le(a[1], a[0]) and le(a[2], a[1]), (label, a)


# ---------------------------------------------------------------------------------------------------
# 2. More offload never raises GPU memory (but the first step's transient when offload is turned on).
# ---------------------------------------------------------------------------------------------------

fractions = st.floats(0.0, 1.0, allow_nan=False)


@PROPERTY
@given(enumerated(), st.sampled_from(GPUS), fractions, fractions, st.booleans())
def test_more_optimizer_offload_never_raises_gpu_memory(case, g, f1, f2, overlap):
    name, base = case
    f1, f2 = sorted((f1, f2))
    assume(f1 < f2)
    # CPU offload keeps fp32 moments (Layout rejects bf16 moments with offload): compare at fp32.
    lo = replace(base, optimizer_offload_fraction=f1, overlap_d2h_h2d=overlap and f1 > 0, exp_avg_dtype="fp32")
    hi = replace(base, optimizer_offload_fraction=f2, overlap_d2h_h2d=overlap, exp_avg_dtype="fp32")
    p_lo, p_hi = run(name, lo, g), run(name, hi, g)
    label = describe(name, base, f1=f1, f2=f2)
    if f1 > 0:
        assert le(p_hi.memory.total, p_lo.memory.total), (label, p_lo.memory.as_dict(), p_hi.memory.as_dict())
    else:
        # megatron-core builds the CPU-offload optimizer twice and the first build's fp32 copies meet the first
        # step's moments (cost_model.memory.optimizer_step_bytes): turning offload on can raise that transient
        # peak; what stays resident never rises
        resident = lambda m: m.allocated - m.optimizer_step  # noqa: E731
        assert le(resident(p_hi.memory), resident(p_lo.memory)), (label, p_lo.memory.as_dict(),
                                                                   p_hi.memory.as_dict())
    # the breakdown is the most-loaded GPU's: with a pipeline, more offload can move the peak to another stage (whose
    # weights differ; offload never changes a GPU's weights), and only one GPU's optimizer compares with itself
    if p_hi.memory.weights == p_lo.memory.weights:
        assert le(p_hi.memory.optimizer, p_lo.memory.optimizer), label
    assert le(p_lo.host_memory_gib_per_node, p_hi.host_memory_gib_per_node), label


# ---------------------------------------------------------------------------------------------------
# 3. More GPUs at equal layout shape (DP grows) never raise per-GPU weights or optimizer memory.
#
# What holds is per GPU: every pipeline rank's weights are independent of the world size and its
# optimizer shard shrinks as DP x CP and expert-DP grow. Prediction.memory is the breakdown of the
# *most-loaded* rank, and which rank that is can change with the world size: with fewer micro-batches
# per DP rank the first stage holds fewer in flight, and the last stage (logits, output layer and the
# final norm) takes over. Its weights exceed the first stage's by the final norm, so memory.weights
# can rise by hidden_size x 2 bytes (qwen3-30b-a3b TP1 PP2 EP2, 4 rows per micro-batch: 8 -> 64 GPUs,
# +4 KiB). The reported components are therefore bounded by the heaviest rank at the smaller world.
# ---------------------------------------------------------------------------------------------------

@PROPERTY
@given(enumerated(worlds=(8,)), st.sampled_from(GPUS))
def test_more_data_parallel_gpus_never_raise_weight_or_optimizer_memory(case, g):
    name, base = case
    scaled = [replace(base, world_size=n) for n in WORLDS]
    assume(all(is_valid(x, name) for x in scaled))
    ranks = layout_rank_layers(model(name), base)
    static = [[static_memory(r, x) for r in ranks] for x in scaled]  # [world][rank] = (weights, grads, optimizer)
    label = describe(name, base, dp=[x.dp for x in scaled], edp=[x.edp for x in scaled])
    for i in range(len(ranks)):
        w = [s[i][0] for s in static]
        o = [s[i][2] for s in static]
        assert le(w[1], w[0]) and le(w[2], w[1]), (label, "rank", i, "weights", w)
        assert le(o[1], o[0]) and le(o[2], o[1]), (label, "rank", i, "optimizer", o)
    mems = [run(name, x, g).memory for x in scaled]
    for j in (1, 2):
        assert le(mems[j].weights, max(s[0] for s in static[j - 1]) / GIB), (label, "weights", mems)
        assert le(mems[j].optimizer, max(s[2] for s in static[j - 1]) / GIB), (label, "optimizer", mems)


# ---------------------------------------------------------------------------------------------------
# 4-5. The breakdown adds up; throughput, MFU and price follow from the step time.
# ---------------------------------------------------------------------------------------------------

@st.composite
def scored(draw):
    name, layout = draw(enumerated())
    workload = Workload(precision=draw(st.sampled_from(PRECISIONS)), routing=draw(st.sampled_from(ROUTINGS)),
                        framework=draw(st.sampled_from(FRAMEWORKS)))
    g = draw(st.sampled_from(GPUS))
    return name, layout, workload, g, run(name, layout, g, workload)


@PROPERTY
@given(scored())
def test_breakdown_sums_to_step_time_and_every_term_is_non_negative(case):
    name, layout, workload, g, p = case
    label = describe(name, layout, gpu=g, workload=workload)
    assert tuple(p.breakdown) == TERMS, label
    assert all(math.isfinite(v) and v >= 0 for v in p.breakdown.values()), (label, p.breakdown)
    assert math.isfinite(p.step_time_s) and p.step_time_s > 0, label
    assert math.isclose(sum(p.breakdown.values()), p.step_time_s, rel_tol=1e-9), (label, p.breakdown)


@PROPERTY
@given(scored())
def test_throughput_mfu_and_price_follow_from_step_time(case):
    name, layout, workload, g, p = case
    label = describe(name, layout, gpu=g, workload=workload)
    expected = workload.global_batch * workload.seq_len / p.step_time_s / layout.world_size
    assert math.isclose(p.tokens_per_s_per_gpu, expected, rel_tol=1e-12), label
    for value in (p.tokens_per_s_per_gpu, p.mfu, p.usd_per_million_tokens):
        assert math.isfinite(value) and value > 0, (label, p.tokens_per_s_per_gpu, p.mfu, p.usd_per_million_tokens)
    assert p.mfu < 1, (label, p.mfu)
