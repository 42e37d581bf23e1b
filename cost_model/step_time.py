"""Step time of a layout, term by term: each pipeline rank's micro-batch, then the step around it.

A rank's micro-batch is the sum of its layers (`cost_model.layer_time`) plus recompute, host launch
overhead and the LM head; the step is the slowest rank's micro-batches, the pipeline bubble and
sends, the data-parallel gradient sync and the optimizer. All times are seconds on one GPU.
"""
from __future__ import annotations

import math
from copy import copy
from dataclasses import dataclass, replace
from operator import attrgetter

from cost_model.nouns.quick_init import quick_init
from cost_model.memo import IdentityMemo
from cost_model.communication import data_parallel_time, pipeline_p2p_time
from cost_model.constants import Constants
from cost_model.layer_time import LayerInputs, LayerTime, layer_time
from cost_model.nouns.layout import Layout
from cost_model.memory import backup_bytes, offloaded_params, sharded_params
from cost_model.micro_batch_constants import time_twin, with_launch
from cost_model.nouns.model_spec import FULL_ATTENTION, LINEAR_ATTENTION, MLA, MOE, SLIDING_ATTENTION, ModelSpec
from cost_model.rates import Rates
from cost_model.runner_components import (GRAD_ACCUMULATION_BYTES, Derivation, HostFloor, LayerCurves, RunnerComponents,
                                         signature_model)
from cost_model.stages import RankLayers
from cost_model.nouns.units import FP32
from cost_model.vision import VisionWork, vision_seconds

@quick_init
@dataclass(frozen=True)
class StepContext:
    """Everything one step's time depends on, computed once per layout by `cost_model.predict`.

    `dense`/`expert`: the parameters of one GPU of the rank holding the most; `gdn_sharded`: megatron-core's
    GatedDeltaNet (heads over TP) rather than slime's HF module; `cuda_graphs`: Workload.cuda_graphs ('full'
    removes the host's per-layer launch time; 'partial' is what the Megatron launch constant was fitted on);
    `frozen_weights`: LoRA's frozen base (no weight gradients, no gradient sync or optimizer step over it);
    `vision`: a VLM's encoder work per micro-batch; `expert_calls`: the stack issues a GEMM call per local
    expert (TE's GroupedLinear), not one grouped GEMM."""

    ranks: tuple[RankLayers, ...]
    model: ModelSpec
    rates: Rates
    layout: Layout
    tokens: float
    num_microbatches: int
    seq_len: int
    imbalance: float
    c: Constants
    framework: str
    dense: float
    expert: float
    gdn_sharded: bool = False
    cuda_graphs: str = "none"
    frozen_weights: bool = False
    vision: VisionWork | None = None
    expert_calls: bool = True
    # The megatron runner's components measured on this GPU (cost_model.runner_components): when set, the
    # step is composed from them (`runner_step_breakdown`), not from the constants fitted to tuned stacks.
    runner: RunnerComponents | None = None
    ranks_per_host: int = 1
    # the largest micro-batch's tokens (the memory peak's); `tokens` is the mean one the step's time sees
    largest_tokens: float = 0.0

    @property
    def trained_params(self) -> tuple[float, float]:
        """(dense, expert) parameters whose gradients are synced and stepped: none of a frozen base."""
        return (0.0, 0.0) if self.frozen_weights else (self.dense, self.expert)


# Breakdown keys, in the order tables print them: a rank's micro-batch terms, then the step's.
RANK_TERMS = (
    "compute_attention", "compute_linear_attention", "compute_mlp", "compute_experts", "compute_logits",
    "compute_vision",
    "elementwise", "launch_overhead", "expert_calls", "recompute", "tp_comm", "ep_comm", "cp_comm",
    "layers", "microbatch_ends",
)
# allocator_remap: a MoE layout on the runner's stack with no room for the allocator's cache (cost_model.allocator_strain,
# added by predict once the memory is known; 0 in step_breakdown)
TERMS = RANK_TERMS + ("pp_p2p", "pp_bubble", "dp_comm", "optimizer", "offload", "step_overhead", "allocator_remap")
# The terms a runner-priced step has only for the layer kinds its profile did not measure (the fitted terms price
# those; the measured kinds are in `layers`), the host's exposed launch time of the measured kinds aside.
RUNNER_FALLBACK_TERMS = ("compute_attention", "compute_linear_attention", "compute_mlp", "compute_experts",
                         "elementwise", "launch_overhead", "expert_calls")

# Share of a layer's kernels each selective-recompute module launches again in the backward pass.
SELECTIVE_LAUNCH_SHARE = {"core_attn": 0.1, "mla_up_proj": 0.1, "layernorm": 0.1, "moe_act": 0.05, "mlp": 0.3,
                          "moe": 0.5, "shared_experts": 0.15}

# Tokens per micro-batch at which a layer timed as another model's takes its modelled GPU work ratio: the middle,
# in log, of the 4k-64k tokens the profile's layer builds measure. Leave-one-model-out on the H200 builds
# (benchmarks/layer_transfer.py) against the ratio at each token count: median 2.4% -> 2.0%, across attention kinds
# rms log 0.184 -> 0.099, Gated DeltaNet from softmax layers 0.114 -> 0.061.
SCALED_RATIO_TOKENS = 16384.0

# Adam's GPU step streams param, remainder, grad and both moments in and writes four of them back.
ADAM_BYTES_PER_PARAM = 2 + 2 + 4 + 4 + 4 + 2 + 2 + 4 + 4


# The selective-recompute modules inside the attention (the rest rerun the norms, the MLP or the experts).
ATTENTION_MODULES = frozenset({"core_attn", "mla_up_proj"})


def selective_launch_share(mods: set, attn_kind: str, mlp_kind: str) -> float:
    applies = {"core_attn": attn_kind in (FULL_ATTENTION, SLIDING_ATTENTION, MLA), "mla_up_proj": attn_kind == MLA,
               "layernorm": True, "moe_act": mlp_kind == MOE and "moe" not in mods, "moe": mlp_kind == MOE,
               "shared_experts": mlp_kind == MOE and "moe" not in mods, "mlp": mlp_kind != MOE}
    return min(1.0, sum(SELECTIVE_LAUNCH_SHARE[m] for m in mods if applies.get(m)))


def full_recompute_fraction(rank: RankLayers, layout: Layout) -> float:
    """Fraction of each layer's forward that full recompute runs again in the backward pass."""
    if layout.recompute_granularity != "full":
        return 0.0
    if layout.recompute_method == "uniform":
        return 1.0
    per_chunk = rank.num_layers // layout.vpp
    return min(layout.recompute_num_layers, per_chunk) / max(per_chunk, 1)


def ep_overlap_share(layout: Layout, num_microbatches: int) -> float:
    """The share of a rank's micro-batch chunks whose expert all-to-alls run under another chunk's compute
    (Megatron's combined 1F1B with --overlap-moe-expert-parallel-comm): all but the warmup forwards and the
    cooldown backwards. Counted for the first rank (the most warmup): (PP-1) x 2 + (VPP-1) x PP + 1 chunks
    (schedules.get_pp_rank_microbatches); one without a pipeline."""
    if not layout.overlap_moe_expert_parallel_comm:
        return 0.0
    chunks = num_microbatches * layout.vpp
    warmup = 1 if layout.pp == 1 else (layout.pp - 1) * 2 + (layout.vpp - 1) * layout.pp + 1
    return max(0, chunks - warmup) / chunks


def exposed_ep_comm(lt: LayerTime, share: float) -> float:
    """A layer's expert all-to-all time left exposed when `share` of its chunks overlap: in a combined step one
    micro-batch's forward dispatch and combine run under the other's backward compute, its backward ones under
    the other's forward compute. The SMs the communication kernels take from the compute are not counted."""
    if share <= 0:
        return lt.ep_comm
    forward = lt.gpu_pass
    backward = lt.gpu_work - forward
    half = lt.ep_comm / 2
    overlapped = max(0.0, half - backward) + max(0.0, half - forward)
    return share * overlapped + (1 - share) * lt.ep_comm


def _add_layer(t: dict[str, float], lt: LayerTime, count: int, full_fraction: float) -> None:
    """Add `count` layers of one kind to the rank's terms, with their recompute (the launch overhead apart:
    micro_batch_constants.with_launch)."""
    # Full recompute reruns the forward (a third of the GEMM work, half the comm: the fwd collectives).
    recompute = full_fraction * (lt.gpu_pass + lt.comm / 2) + lt.selective
    t["compute_attention"] += count * lt.attention
    t["compute_linear_attention"] += count * lt.linear_attention
    t["compute_mlp"] += count * lt.mlp
    t["compute_experts"] += count * lt.experts
    t["elementwise"] += count * lt.elementwise
    t["tp_comm"] += count * lt.tp_comm
    t["ep_comm"] += count * lt.ep_comm
    t["cp_comm"] += count * lt.cp_comm
    t["recompute"] += count * recompute


def exposed_expert_calls(lt: LayerTime, model: ModelSpec, layout: Layout, c: Constants, full_fraction: float,
                         mods: set, ep_overlap: float = 0.0) -> float:
    """Host seconds of one MoE layer's per-expert GEMM calls in a micro-batch that its expert GEMMs do not hide.

    The local experts' linears are not one kernel: Transformer Engine's GroupedLinear (--moe-grouped-gemm)
    issues one cuBLAS GEMM per expert and linear (multi-stream cuBLAS, its default unless
    NVTE_USE_CUTLASS_GROUPED_GEMM is set), each with its own host-side setup, and each expert's weights are
    parameters of their own, with their own gradient hook in the backward (attune's runner calls one
    torch._grouped_mm per linear instead: Runtime.per_expert_gemm_calls). The host issues them after the
    dispatcher's sync on the split sizes, so the GPU waits unless its expert GEMMs take longer: the host time is
    hidden behind those GEMMs only. Two linears per expert, in the forward, input-gradient and (trained)
    weight-gradient passes, and again in recomputed forwards (`expert_gemm_call_s`, fitted on the public
    Megatron rows). In the chunks that --overlap-moe-expert-parallel-comm pairs (`ep_overlap`), the GPU has the
    partner micro-batch's work queued: there the calls hide behind the whole layer's GPU work."""
    passes = lt.weight_passes + full_fraction + (1.0 if "moe" in mods else 0.0)
    host = c.expert_gemm_call_s * 2 * passes * model.num_experts / layout.ep
    alone = max(0.0, host - lt.experts * passes / lt.weight_passes)
    if ep_overlap <= 0:
        return alone
    return ep_overlap * max(0.0, host - lt.gpu_work) + (1 - ep_overlap) * alone


# Scoring a space prices the same rank at the same micro-batch for the thousands of layouts that differ only in
# what a micro-batch does not see (DP, PP splits elsewhere, offload, the optimizer...). A rank's micro-batch
# terms depend on the layout only through these fields (layer_time's, selective recompute's and the launch's) and
# the share of a layer full recompute reruns; on the rank only through its layers' kinds, its heads and vision.
# Keyed on those: the ranks of shapes that differ in PP, VPP or where the embedding sits share their terms.
_RANK_FIELDS = ("tp", "cp", "ep", "etp", "dispatcher", "selective_modules")
_rank_fields = attrgetter(*_RANK_FIELDS)   # a tuple of them, read in C (a memo key per call)
_RANK_MEMO = IdentityMemo(100_000)


def layer_launch_s(ctx: StepContext) -> float:
    """The host's launch time per layer pass that a pass's GPU work must cover (0 under a whole-step CUDA graph)."""
    return pass_launch_s(ctx.c, ctx.framework, ctx.cuda_graphs, ctx.layout.dispatcher)


def pass_launch_s(c: Constants, framework: str, cuda_graphs: str, dispatcher: str) -> float:
    """`layer_launch_s` from what it reads."""
    # A whole-iteration CUDA graph replays every kernel, the experts' GEMMs included: the host launches nothing.
    if cuda_graphs == "full":
        return 0.0
    return (c.layer_launch_overhead_s if framework == "slime" else c.megatron_layer_launch_overhead_s) * (
        c.flex_overhead_factor if dispatcher == "flex" else 1.0)


def rank_microbatch_terms(ctx: StepContext, rank: RankLayers, ep_overlap: float = 0.0) -> dict[str, float]:
    """Seconds per micro-batch on one GPU of this pipeline rank, by term (no pipeline/step terms).
    `ep_overlap`: the share of chunks whose expert all-to-alls overlap another's compute (`ep_overlap_share`).
    Memoized on its inputs (objects by identity, held by the memo): the dict is shared, not to be changed. The
    terms but the launch's are shared by the constants that differ only in what prices the launch
    (cost_model.micro_batch_constants)."""
    return _rank_pricer(ctx, ep_overlap)(rank)[0]


def _rank_pricer(ctx: StepContext, ep_overlap: float):
    """rank_microbatch_terms of `ctx` as a function of the rank, with the rank's launch passes (with_launch's): what
    its memo key reads of the context is read once for all the ranks of a pipeline."""
    c, rates = time_twin(ctx.c, ctx.rates)
    launch, layout = layer_launch_s(ctx), ctx.layout
    held = (ctx.model, rates, c, ctx.vision)
    head = (tuple(map(id, held)), _rank_fields(layout), ctx.tokens, ctx.seq_len, ctx.imbalance, ctx.framework,
            ctx.gdn_sharded, ctx.cuda_graphs, ctx.frozen_weights, ctx.expert_calls, ep_overlap)

    def price(rank: RankLayers) -> tuple[dict[str, float], tuple]:
        key = head + (full_recompute_fraction(rank, layout), rank.kinds, rank.has_head, rank.mtp_layers, rank.vision)
        hit = _RANK_MEMO.get(key + (launch,))
        if hit is None:
            base = _BASE_MEMO.get(key)
            if base is None:
                base = _BASE_MEMO.put(key, held, _rank_microbatch_terms(ctx, rank, ep_overlap, c, rates))
            hit = _RANK_MEMO.put(key + (launch,), held, (with_launch(*base[1], launch), base[1][1]))
        return hit[1]
    return price


# a rank's terms without the launch term, and what prices it (micro_batch_constants.with_launch)
_BASE_MEMO = IdentityMemo(100_000)


def _rank_microbatch_terms(ctx: StepContext, rank: RankLayers, ep_overlap: float, c: Constants,
                           rates: Rates) -> tuple[dict[str, float], tuple]:
    """The terms without the launch term, under `c` and `rates` (the context's time twin) for the rest of `ctx`."""
    model, layout, tokens = ctx.model, ctx.layout, ctx.tokens
    frozen_weights, vision = ctx.frozen_weights, ctx.vision
    h, tp = model.hidden_size, layout.tp
    mods = set(layout.selective_modules)
    t = dict.fromkeys(RANK_TERMS, 0.0)
    full_fraction = full_recompute_fraction(rank, layout)
    graphed = ctx.cuda_graphs == "full"
    expert_calls = ctx.expert_calls and not graphed
    layer = LayerInputs(model, layout, rates, c, tokens, ctx.seq_len, ctx.imbalance, mods, ctx.gdn_sharded,
                        frozen_weights)
    launches = []
    for attn_kind, mlp_kind, count in rank.kinds:
        lt = layer_time(attn_kind, mlp_kind, layer)
        ep_comm = exposed_ep_comm(lt, ep_overlap)
        if ep_comm != lt.ep_comm:   # the memo's layer is shared: change a copy
            lt = copy(lt)
            lt.ep_comm = ep_comm
        _add_layer(t, lt, count, full_fraction)
        # The host launches each layer pass eagerly; when the GPU compute of a pass is shorter than the
        # host's launch time, the difference is exposed. Communication does not hide it: the alltoall
        # dispatcher's host sync on split sizes stops the host from running ahead of the collectives.
        # Recomputed kernels are launched again: a full pass for full recompute, a share for selective
        # (only the modules this layer has, and never more than the whole layer).
        launches.append((count, 2 + max(full_fraction, selective_launch_share(mods, attn_kind, mlp_kind)),
                         lt.gpu_pass))
        if expert_calls and mlp_kind == MOE:
            t["expert_calls"] += count * exposed_expert_calls(lt, model, layout, c, full_fraction, mods, ep_overlap)
    if vision is not None and rank.vision:
        seconds, forward = vision_seconds(vision.spec, vision.patches, vision.patches_per_image, tp, rates,
                                          2 if frozen_weights else 3)
        # No launch term: a ViT layer is a dozen dense kernels with no host sync, hidden behind its GEMMs
        # (the fitted per-layer launch time is a MoE layer's, dispatcher syncs included).
        t["compute_vision"] += seconds + full_fraction * forward
    heads = int(rank.has_head) + rank.mtp_layers   # each MTP layer has its own pass through the LM head and loss
    if heads:
        v = model.vocab_size
        passes = 2 if frozen_weights else 3
        t["compute_logits"] += heads * passes * 2 * h * v * tokens / tp / rates.gemm(tokens, v / tp, h)
        t["elementwise"] += heads * 3 * 6 * tokens * v / tp / rates.hbm  # fp32 softmax / cross-entropy passes
    return t, tuple(launches)


# The layouts of a shape that differ only in what the pipeline does not see (offload, the optimizer's dtype) share
# their pipeline terms: they read the layout through the ranks' fields and these, and the context through the rest
# of the key (objects by identity, held by the memo).
_PIPELINE_FIELDS = _RANK_FIELDS + ("recompute_granularity", "recompute_method", "recompute_num_layers", "vpp", "pp",
                                   "world_size", "overlap_moe_expert_parallel_comm")
_pipeline_fields = attrgetter(*_PIPELINE_FIELDS)
_PIPELINE_MEMO = IdentityMemo(50_000)


def pipeline_terms(ctx: StepContext) -> dict[str, float]:
    """The slowest rank's micro-batches, the pipeline bubble it sets, and the sends between stages (a new dict:
    the caller adds the step's terms to it)."""
    return dict(_pipeline_entry(ctx)[0])


def slowest_launch_passes(ctx: StepContext) -> tuple:
    """The launch passes (micro_batch_constants.with_launch's) of the rank whose micro-batches `pipeline_terms`
    counts: per layer kind, (layers, passes, one pass's GPU seconds)."""
    return _pipeline_entry(ctx)[1]


def _pipeline_entry(ctx: StepContext) -> tuple[dict[str, float], tuple]:
    c, rates = time_twin(ctx.c, ctx.rates)   # what else they read of the constants and rates is the twin's
    held = (ctx.ranks, ctx.model, rates, c, ctx.vision)
    key = (tuple(map(id, held)), _pipeline_fields(ctx.layout), ctx.tokens, ctx.num_microbatches, ctx.seq_len,
           ctx.imbalance, ctx.framework, ctx.gdn_sharded, ctx.cuda_graphs, ctx.frozen_weights, ctx.expert_calls,
           layer_launch_s(ctx))
    hit = _PIPELINE_MEMO.get(key) or _PIPELINE_MEMO.put(key, held, _pipeline_terms(ctx))
    return hit[1]


def _pipeline_terms(ctx: StepContext) -> tuple[dict[str, float], tuple]:
    layout, num_microbatches = ctx.layout, ctx.num_microbatches
    price = _rank_pricer(ctx, ep_overlap_share(layout, num_microbatches))
    # the first rank of the largest micro-batch sum, each distinct rank priced and summed once (equal ranks are one
    # object: stages.rank_layers); a repeat cannot be larger than its first
    seen, slowest, slowest_mb, launches = set(), None, None, None
    for r in ctx.ranks[:layout.pp]:
        if id(r) not in seen:
            seen.add(id(r))
            t, passes = price(r)
            mb = sum(t.values())
            if slowest is None or mb > slowest_mb:
                slowest, slowest_mb, launches = t, mb, passes
    terms = {k: v * num_microbatches for k, v in slowest.items()}
    # (PP - 1) / VPP x the slowest stage: the fitted constants were fitted with it (the runner's per-stage fill and
    # drain, pipeline_bubble_s, puts the published rows' nested cold-start error at 20.0% instead of 16.5%)
    bubble = (layout.pp - 1) / layout.vpp * slowest_mb
    # Each virtual stage of each micro-batch is one more scheduled chunk (sends posted, waited on, switched to):
    # a cost per chunk, so interleaving trades a smaller bubble for more of it.
    chunks = num_microbatches * layout.vpp if layout.pp > 1 else 0
    # in TERMS order (every rank term is there: dict.fromkeys(RANK_TERMS)), so the step's terms follow as they are
    terms["pp_p2p"] = pipeline_p2p_time(ctx.model, layout, ctx.rates, ctx.tokens, num_microbatches) + \
        chunks * ctx.c.pipeline_chunk_overhead_s
    terms["pp_bubble"] = bubble
    return terms, launches


def _per_distinct_rank(ranks, price) -> list:
    """price(rank) for each rank, computed once per distinct rank object (stages.rank_layers makes equal ranks one)."""
    done: dict = {}
    out = []
    for r in ranks:
        v = done.get(id(r))
        if v is None:
            v = done[id(r)] = price(r)
        out.append(v)
    return out


def pipeline_bubble_s(per_mb: list[float], vpp: int) -> float:
    """The 1F1B schedule's fill and drain: the stages other than the slowest each run one micro-batch that nothing
    overlaps (a stage's micro-batch seconds, forward and backward), over VPP when interleaved; with equal stages
    (PP - 1) / VPP x a micro-batch. The slowest stage's own micro-batches are the step's other terms."""
    return (sum(per_mb) - max(per_mb)) / vpp


def optimizer_time(layout: Layout, rates: Rates, dense: float, expert: float) -> float:
    """The GPU Adam step over the rank's shard, plus the pass over its full fp32 gradients."""
    sharded = sharded_params(dense, expert, layout)
    f = layout.optimizer_offload_fraction
    return (sharded * (1 - f) * ADAM_BYTES_PER_PARAM + (dense + expert) * FP32) / rates.hbm


def offload_time(layout: Layout, rates: Rates, dense: float, expert: float) -> float:
    """The CPU Adam step over the offloaded share and its PCIe traffic (overlapped or not)."""
    f = layout.optimizer_offload_fraction
    if f > 0:
        sharded = sharded_params(dense, expert, layout)
        cpu = f * sharded / rates.cpu_adam
        transfer = f * sharded * 8 / rates.pcie  # fp32 grads down, fp32 params up
        return max(cpu, transfer) if layout.overlap_d2h_h2d else cpu + transfer
    return 0.0


def step_overhead(rates: Rates, c: Constants, framework: str, dense: float, expert: float) -> float:
    if framework == "slime":
        # slime backs up the bf16 weights to host memory after every train call.
        return c.step_overhead_s + backup_bytes(dense, expert) / rates.pcie
    return c.megatron_step_overhead_s


def step_breakdown(ctx: StepContext) -> dict[str, float]:
    """Seconds of one optimizer step by term, in TERMS order."""
    if ctx.runner is not None:
        return runner_step_breakdown(ctx)
    terms = pipeline_terms(ctx)   # every rank term, then the pipeline's, in TERMS order
    trained_dense, trained_expert = ctx.trained_params
    dp_comm, step_overhead = _sync_and_overhead(ctx)
    terms["dp_comm"] = dp_comm
    terms["optimizer"] = optimizer_time(ctx.layout, ctx.rates, trained_dense, trained_expert)
    terms["offload"] = offload_time(ctx.layout, ctx.rates, trained_dense, trained_expert)
    terms["step_overhead"] = step_overhead
    terms["allocator_remap"] = 0.0
    return terms


# The gradient sync and the step's fixed overhead are the same for every layout of a parallel shape: they read the
# layout through these fields and the context through the rest of the key (objects by identity, held by the memo).
_SYNC_FIELDS = ("world_size", "pp", "dp", "cp", "edp")
_sync_fields = attrgetter(*_SYNC_FIELDS)
_SYNC_MEMO = IdentityMemo(20_000)


def _sync_and_overhead(ctx: StepContext) -> tuple[float, float]:
    held = (ctx.rates, ctx.c)
    trained_dense, trained_expert = ctx.trained_params
    key = (tuple(map(id, held)), _sync_fields(ctx.layout), ctx.framework, trained_dense, trained_expert, ctx.dense,
           ctx.expert)
    hit = _SYNC_MEMO.get(key) or _SYNC_MEMO.put(key, held, (
        data_parallel_time(ctx.layout, ctx.rates, ctx.c, ctx.framework, trained_dense, trained_expert),
        step_overhead(ctx.rates, ctx.c, ctx.framework, ctx.dense, ctx.expert)))
    return hit[1]


# ------------------------------------------------------------------------- the megatron runner's own stack
SOFTMAX_KINDS = (FULL_ATTENTION, SLIDING_ATTENTION)


def shard_layer_params(model: ModelSpec, attn_kind: str, mlp_kind: str, layout: Layout) -> float:
    """Parameters of one layer of this kind held by one GPU (megatron-core shards the GDN projections too)."""
    p = model.layer_params(attn_kind, mlp_kind)
    return ((p.attention + p.linear_attention + p.dense_mlp + p.shared_expert) / layout.tp + p.replicated
            + p.routed_experts / (layout.ep * layout.etp))


def runner_layer_terms(ctx: StepContext, attn_kind: str, mlp_kind: str, full_fraction: float,
                       ep_overlap: float) -> tuple[dict[str, float], str]:
    """One layer's seconds per micro-batch on the runner's stack, by term, and where the figure comes from.

    The layer's forward-backward (gradient accumulation included) and its full-recompute cost are the profile's
    measurement of this layer kind at these tokens per micro-batch on one GPU. What differs from that
    measurement is modelled: a shard other than TP1/EP1 is timed as the measured layer at the tokens that give
    the whole layer the shard's modelled GPU work (so a shard small enough to be host-bound stays host-bound,
    as the measured layer is at few tokens); a sequence length other than the profile's adds the attention core's difference; selective
    recompute reruns the modelled share of the forward; TP/EP/CP communication comes from the collectives."""
    layout, mods = ctx.layout, set(ctx.layout.selective_modules)
    layer = LayerInputs(ctx.model, layout, ctx.rates, ctx.c, ctx.tokens, ctx.seq_len, ctx.imbalance, mods, True,
                        ctx.frozen_weights)
    lt = layer_time(attn_kind, mlp_kind, layer)
    comm = {"tp_comm": lt.tp_comm, "ep_comm": exposed_ep_comm(lt, ep_overlap), "cp_comm": lt.cp_comm}
    found = ctx.runner.layer_for(ctx.model, attn_kind, mlp_kind)
    if found is None:
        return None, "modelled"
    donor, curves = found
    measured_model, measured_attn, power, notes = ctx.model, attn_kind, 1.0, []
    if donor is not None:
        measured_model, measured_attn = signature_model(ctx.model, donor), donor.split("+")[0]
        power, power_name = scaled_work_exponent(ctx.c, measured_attn)
        notes.append(f"{curves.model}'s measured {measured_attn}+{mlp_kind} layer, its GPU work scaled to this "
                     f"layer's (modelled ratio at {SCALED_RATIO_TOKENS:,.0f} tokens to the power "
                     f"{power:g}, fitted: {power_name}), its host floor the lowest measured of the kind"
                     + (f" (no {attn_kind}+{mlp_kind} layer measured: another attention kind's, the ratio modelled "
                        f"across the kinds at the profile's seq {ctx.runner.seq_len})" if measured_attn != attn_kind
                        else ""))
    ratio = 1.0
    if measured_model is not ctx.model or any(getattr(layout, d) > 1 for d in ("tp", "ep", "etp", "cp")):
        # another attention kind's layer was measured at the profile's sequence length: both sides of the ratio there
        at = layer if measured_attn == attn_kind else replace(layer, seq_len=ctx.runner.seq_len)
        if measured_model is not ctx.model:
            # another model's layer: the measured curve keeps its own shape over tokens, the modelled ratio sets
            # its level (at every token count the GEMM table's bumps between shapes, not the GPU, would bend it)
            at = replace(at, tokens=SCALED_RATIO_TOKENS)
        whole = layer_time(measured_attn, mlp_kind, replace(at, model=measured_model, layout=Layout(1)))
        ratio = (lt if at is layer else layer_time(attn_kind, mlp_kind, at)).gpu_work / whole.gpu_work
        if measured_model is ctx.model:
            notes.append(f"shard's GPU work {ratio:.2f}x the layer's (modelled ratio), host floor as measured")
        else:
            # another model's layer: its measured time scales as the modelled work ratio to a fitted power (a
            # smaller layer's kernels run less efficiently than the GEMM table says)
            ratio **= power
    on, on_full = _on_target(ctx.runner.derivation_of(curves), lt, attn_kind == LINEAR_ATTENTION)
    base = curves.none(ctx.tokens, ratio, on)
    full_extra = (curves.full(ctx.tokens, ratio, on_full) - base) if curves.full is not None else None
    if ratio != 1.0:
        shift, note = fixed_cost_shift(ctx, curves, measured_model, attn_kind, mlp_kind)
        base = max(base + shift, 0.0)
        notes += [note] if note else []
    if attn_kind in SOFTMAX_KINDS and ctx.seq_len != ctx.runner.seq_len:
        at_profile = layer_time(attn_kind, mlp_kind, replace(layer, seq_len=ctx.runner.seq_len))
        delta = lt.attention - at_profile.attention
        base += delta
        full_extra = None if full_extra is None else full_extra + delta / 3
        notes.append(f"attention at seq {ctx.seq_len} (modelled from {ctx.runner.seq_len})")
    if full_extra is None:
        full_extra = lt.gpu_pass
        notes.append("recompute modelled")
    full_extra = max(full_extra, 0.0)
    # the measured recompute is one GPU's; a recomputed forward also runs its collectives again (TP, EP, CP)
    recompute = full_fraction * (full_extra + sum(comm.values()) / 2)
    if layout.recompute_granularity == "selective" and lt.gpu_pass > 0:
        # the modelled share of the forward that the selected modules rerun, of the measured recompute
        recompute += min(1.0, lt.selective / lt.gpu_pass) * full_extra
    terms = {"layers": max(base, 0.0), "recompute": recompute, **comm}
    return terms, "measured" + (f" ({'; '.join(notes)})" if notes else "")


def fixed_cost_shift(ctx: StepContext, curves: LayerCurves, measured_model: ModelSpec, attn_kind: str,
                     mlp_kind: str) -> tuple[float, str]:
    """Seconds per micro-batch by which this shard's fixed cost differs from the measured layer's, and a note where
    experts count in it. A measured layer's fixed cost (its line's intercept) is its gradient accumulation over every
    parameter it holds plus, for an MoE layer, a cost that grows with its experts whatever its tokens: the H200
    builds' dense layers' intercepts are their gradient accumulation alone (Llama3-8B 0.60 ms against 0.51,
    Llama3-70B 2.02 against 2.02), their MoE layers' exceed it by 5.3-5.5 ms at 128 experts (Qwen3-30B-A3B,
    Qwen3-235B-A22B), 7.0 at 256 (Qwen3.6-35B-A3B), 13.8 at 512 (Qwen3-Next-80B-A3B): not a cost per expert alone
    (27 us an expert at 256, 43 at 128). The cost of an expert is the slope of a line through the profile's
    measured layers of the kind (`expert_fixed_line`), else, with one expert count measured, the measured layer's
    own (its intercept beyond its gradient accumulation, over its experts); moved to this GPU type's rest ratio
    where the layers were measured on another."""
    layout = ctx.layout
    held = shard_layer_params(ctx.model, attn_kind, mlp_kind, layout)
    measured = shard_layer_params(measured_model, attn_kind, mlp_kind, Layout(1))
    shift = (held - measured) * GRAD_ACCUMULATION_BYTES / ctx.rates.hbm
    line = curves.none.line
    held_experts = layer_experts(ctx.model, mlp_kind)
    measured_experts = layer_experts(measured_model, mlp_kind)
    if line is None or not measured_experts or held_experts == measured_experts:
        return shift, ""
    derived = ctx.runner.derivation_of(curves)
    fixed_line = expert_fixed_line(ctx, curves, attn_kind, mlp_kind)
    if fixed_line is None:
        beyond = fixed_beyond_accumulation(curves, measured_model, attn_kind, mlp_kind,
                                           copy_rate_measured_at(ctx, derived), measured)
        per_expert = max(beyond, 0.0) / measured_experts
        whence = "the measured layer's intercept beyond its gradient accumulation, over its experts"
    else:
        per_expert = max(fixed_line[1], 0.0)
        whence = (f"the slope of the measured {attn_kind}+{mlp_kind} layers' intercepts beyond their gradient "
                  "accumulation against their experts")
    per_expert /= derived.rest_for(attn_kind == LINEAR_ATTENTION) if derived else 1.0
    note = (f"fixed cost {per_expert * 1e6:.0f} us an expert ({whence}) for {held_experts} experts, not "
            f"{measured_experts}")
    return shift + (held_experts - measured_experts) * per_expert, note


_EXPERT_LINE_MEMO = IdentityMemo(1_000)


def expert_fixed_line(ctx: StepContext, curves: LayerCurves, attn_kind: str, mlp_kind: str) -> tuple | None:
    """(seconds at no experts, seconds an expert): the least-squares line, against their experts, of the fixed costs
    per micro-batch beyond gradient accumulation of the measured layers of this kind measured as `curves` was (the
    same builds: a borrowed layer only with those borrowed with it), in that GPU type's seconds; None where fewer than
    two expert counts are measured. A layer whose intercept sits at its gradient accumulation is left out: the
    profile's parser raised it to that floor (Mixtral's two), so it bounds the cost and does not measure it."""
    derived = ctx.runner.derivation_of(curves)
    # the donor's curves are a fresh copy each call (its kind's lowest host floor): keyed by what the line reads
    key = (id(ctx.runner), curves.borrowed, id(derived), id(ctx.model), id(ctx.rates), attn_kind, mlp_kind)
    hit = _EXPERT_LINE_MEMO.get(key)
    if hit is not None:
        return hit[1]
    hbm, points = copy_rate_measured_at(ctx, derived), []
    for sig, c in ctx.runner.layers.items():
        if not sig.startswith(f"{attn_kind}+{mlp_kind}|") or c.none.line is None or c.borrowed != curves.borrowed \
                or ctx.runner.derivation_of(c) != derived:
            continue
        model = signature_model(ctx.model, sig)
        beyond = fixed_beyond_accumulation(c, model, attn_kind, mlp_kind, hbm)
        if beyond > 1e-6:    # a microsecond: the floor comes back within rounding
            points.append((layer_experts(model, mlp_kind), beyond))
    line = None
    if len({e for e, _ in points}) > 1:
        mean_e = sum(e for e, _ in points) / len(points)
        mean_s = sum(s for _, s in points) / len(points)
        slope = sum((e - mean_e) * (s - mean_s) for e, s in points) / sum((e - mean_e) ** 2 for e, _ in points)
        line = (mean_s - slope * mean_e, slope)
    return _EXPERT_LINE_MEMO.put(key, (ctx.runner, derived, ctx.model, ctx.rates), line)[1]


def copy_rate_measured_at(ctx: StepContext, derived: Derivation | None) -> float:
    """The copy rate (bytes/s) of the GPU type whose builds a layer's curves come from: this one's, or for curves
    `derived` from another type's builds, that type's."""
    return ctx.rates.hbm / derived.hbm if derived else ctx.rates.hbm


def fixed_beyond_accumulation(curves: LayerCurves, model: ModelSpec, attn_kind: str, mlp_kind: str,
                              hbm: float, params: float | None = None) -> float:
    """A measured layer's fixed cost per micro-batch (its line's intercept, which it must have) beyond its gradient
    accumulation over every parameter it holds (`model`: the layer's own, at the copy rate `hbm` it ran at;
    `params`: that layer's parameters where the caller has counted them)."""
    if params is None:
        params = shard_layer_params(model, attn_kind, mlp_kind, Layout(1))
    return curves.none.line[0] - params * GRAD_ACCUMULATION_BYTES / hbm


def layer_experts(model: ModelSpec, mlp_kind: str) -> int:
    """Routed experts of a layer of this MLP kind (0 for a dense layer), all of them whatever the expert parallelism:
    the stored two-GPU runs say an EP 2 shard keeps the whole layer's fixed cost (priced with half of it, their 37
    runs went from median 4.5%, max 27.2% to 5.1%, 30.1%, 33 of them over-predicted:
    benchmarks/runner_multi_gpu_accuracy.py), so the cost counts the layer's experts (its routing and permutation
    over all of them), not a GPU's."""
    return (model.num_experts or 0) if mlp_kind == MOE else 0


def scaled_work_exponent(c, measured_attn: str) -> tuple[float, str]:
    """The power of the modelled work ratio by which another model's measured layer of this attention kind is
    scaled, and its constant's name: a Gated DeltaNet layer's own (fla's kernels lose more than GEMMs do at a smaller
    layer's heads and widths), every other kind's the dense fit."""
    if measured_attn == LINEAR_ATTENTION:
        return c.runner_scaled_linear_work_exponent, "runner_scaled_linear_work_exponent"
    return c.runner_scaled_work_exponent, "runner_scaled_work_exponent"


def _on_target(derived: Derivation | None, lt, linear: bool = False) -> tuple:
    """For a layer measured on another GPU type (`derived`: its components' `Derivation`): the functions that take
    its measured GPU seconds, without and with full recompute, to this GPU's, its modelled GEMM, attention and
    delta-rule work (at this GPU's rates, back to the source's by the compute ratio) split from the rest (`linear`: a
    Gated DeltaNet layer's rest, at its own ratio where one was fitted); (None, None) otherwise."""
    if derived is None:
        return None, None
    compute = (lt.attention + lt.linear_attention + lt.mlp + lt.experts) * derived.compute
    again = compute * (1 + 1 / lt.weight_passes)        # full recompute runs the forward's share once more
    return (lambda s: derived.seconds(s, compute, linear)), (lambda s: derived.seconds(s, again, linear))


def lm_head_seconds(ctx: StepContext, hidden: int, vocab: int) -> float:
    """The output layer's GEMMs of one micro-batch (forward and both backward products) on one GPU at the
    profile's measured GEMM rate for that shape."""
    t = ctx.tokens
    return 3 * 2 * t * hidden * vocab / ctx.rates.gemm(t, vocab, hidden)


def nearest_ends(ends: dict, hidden: int, vocab: int) -> tuple[int, int]:
    """The measured ends nearest this model's: the same vocabulary first (its loss path carries over), then the
    nearest hidden size."""
    return min(ends, key=lambda k: (abs(math.log(k[1] / vocab)), abs(math.log(k[0] / hidden))))


def runner_ends(ctx: StepContext) -> float:
    """A micro-batch's embedding, LM head, cross-entropy and schedule time on the runner: measured for this
    hidden size and vocabulary. Otherwise the nearest measured ends: its LM head GEMMs (at the measured GEMM rate)
    replaced by this model's, the rest (cross-entropy, embedding, schedule: work per logit, not per hidden x
    logit) scaled by the vocabulary."""
    model, ends, derived = ctx.model, ctx.runner.ends, ctx.runner.derived
    key = (model.hidden_size, model.vocab_size)
    if key in ends:
        on = None if derived is None else (
            lambda s: derived.seconds(s, lm_head_seconds(ctx, *key) * derived.compute))
        return ends[key][1](ctx.tokens, 1.0, on) / ctx.layout.tp
    if not ends:
        return 0.0
    near = nearest_ends(ends, *key)
    measured = ends[near][1](ctx.tokens)
    # the measured ends less their LM head GEMMs (at the source GPU's rates where the components were derived)
    compute, other = (derived.compute, derived.rest_ratio) if derived is not None else (1.0, 1.0)
    rest = max(measured - lm_head_seconds(ctx, *near) * compute, 0.0) * key[1] / near[1] / other
    # the vocabulary tables' gradient accumulation per micro-batch is this model's (the scaling by the vocabulary
    # above leaves out the hidden size)
    tables = 1 if model.tie_word_embeddings else 2
    rest += tables * (key[0] - near[0]) * key[1] * GRAD_ACCUMULATION_BYTES / ctx.rates.hbm
    return (lm_head_seconds(ctx, *key) + max(rest, 0.0)) / ctx.layout.tp


def runner_rank_terms(ctx: StepContext, rank: RankLayers, ep_overlap: float) -> dict[str, float]:
    """Seconds per micro-batch of one pipeline rank on the runner's stack. Layer kinds the profile did not
    measure fall back to the fitted Megatron terms (`rank_microbatch_terms`), counted as they are."""
    t, host = _runner_rank_work(ctx, rank, ep_overlap)
    if host > 0:
        # The host issues a micro-batch's kernels ahead of the GPU; where issuing them takes longer than the
        # GPU's work (a small layer at few tokens), the micro-batch takes the host's time. Near that point the
        # two do not overlap fully (the dispatcher's host sync each MoE layer, uneven kernels): a smooth maximum.
        gpu = sum(t.values())
        t["launch_overhead"] += host_and_gpu_s(host, gpu, ctx.c.runner_host_overlap_exponent) - gpu
    return t


def _runner_rank_work(ctx: StepContext, rank: RankLayers, ep_overlap: float) -> tuple[dict[str, float], float]:
    """(the rank's GPU terms per micro-batch, the host's measured seconds to issue them: 0 without a host floor)."""
    t = dict.fromkeys(RANK_TERMS, 0.0)
    full_fraction = full_recompute_fraction(rank, ctx.layout)
    fallback = []
    host = ends_host = 0.0
    for attn_kind, mlp_kind, count in rank.kinds:
        terms, _ = runner_layer_terms(ctx, attn_kind, mlp_kind, full_fraction, ep_overlap)
        if terms is None:
            fallback.append((attn_kind, mlp_kind, count))
            continue
        for k, v in terms.items():
            t[k] += count * v
        floor = ctx.runner.host_floor(attn_kind, mlp_kind)
        if floor is not None:
            host += count * layer_host_s(ctx, floor, attn_kind, mlp_kind, full_fraction)
            ends_host = max(ends_host, floor.ends_s)
    if fallback:
        part = replace(rank, kinds=tuple(fallback), has_head=False, mtp_layers=0, vision=0)
        for k, v in rank_microbatch_terms(ctx, part, ep_overlap).items():
            t[k] += v
    if rank.has_head:
        t["microbatch_ends"] += runner_ends(ctx)
    if host > 0 and rank.has_head:
        host += ends_host
    return t, host


def runner_host_to_gpu(ctx: StepContext) -> float:
    """The host's time to issue the slowest rank's micro-batch over the GPU's time to run it, on the runner's
    stack (0 without a measured host floor): near 1 and above, the step is as uncertain as the host's speed."""
    overlap = ep_overlap_share(ctx.layout, ctx.num_microbatches)
    worst = (0.0, 0.0)
    for rank in ctx.ranks:
        t, host = _runner_rank_work(ctx, rank, overlap)
        gpu = sum(t.values())
        if max(gpu, host) > max(worst):
            worst = (gpu, host)
    gpu, host = worst
    return host / gpu if gpu > 0 else 0.0


def host_and_gpu_s(host: float, gpu: float, exponent: float) -> float:
    """A micro-batch's seconds when the host takes `host` to issue its kernels and the GPU `gpu` to run them:
    (host^p + gpu^p)^(1/p), the larger of the two where they differ much, up to 2^(1/p) x either where they are
    equal (p: runner_host_overlap_exponent, fitted)."""
    big, small = max(host, gpu), min(host, gpu)
    share = (small / big) ** exponent if big > 0 else 0.0
    if share < 1e-4:   # the smooth part is under 1e-5 of the larger: the larger alone (no term of noise)
        return big
    return big * (1.0 + share) ** (1.0 / exponent)


def layer_host_s(ctx: StepContext, floor: HostFloor, attn_kind: str, mlp_kind: str, full_fraction: float) -> float:
    """The host's seconds per micro-batch to issue one layer of this kind on the runner's stack, as the kind's
    host-floor builds measured it (`floor`): full recompute issues the measured recomputed forward again, selective
    recompute the modelled share of the layer's kernels its modules rerun."""
    extra = full_fraction * max(floor.layer_full_s - floor.layer_s, 0.0)
    if ctx.layout.recompute_granularity == "selective":
        mods = set(ctx.layout.selective_modules)
        attn_mods, other_mods = mods & ATTENTION_MODULES, mods - ATTENTION_MODULES
        # the shares are of a softmax-attention layer's kernels: the modules outside the attention (norms, MLP,
        # experts) rerun that share of a full-attention layer of this MLP kind, not of a Gated DeltaNet layer's
        # many more launches, which they do not rerun
        base = ctx.runner.host_floor(FULL_ATTENTION, mlp_kind) if attn_kind != FULL_ATTENTION else None
        extra += (selective_launch_share(attn_mods, attn_kind, mlp_kind) * floor.layer_s
                  + selective_launch_share(other_mods, attn_kind, mlp_kind) * (base or floor).layer_s)
    return floor.layer_s + extra


def runner_step_breakdown(ctx: StepContext) -> dict[str, float]:
    """The megatron runner's step from its measured components: the slowest rank's micro-batches, the bubble,
    the exposed data-parallel sync (the runner does not overlap it), the measured per-step work (zeroing the
    gradient buffers, grad norm, clip, Adam over the optimizer's shard) and the CPU share of an offloaded
    optimizer at the measured CPU Adam rate of a rank sharing its host."""
    layout, comps = ctx.layout, ctx.runner
    overlap = ep_overlap_share(layout, ctx.num_microbatches)
    per_rank = _per_distinct_rank(ctx.ranks, lambda r: runner_rank_terms(ctx, r, overlap))
    per_mb = [sum(t.values()) for t in per_rank]
    slowest = max(range(layout.pp), key=per_mb.__getitem__)
    terms = {k: v * ctx.num_microbatches for k, v in per_rank[slowest].items()}
    terms["pp_bubble"] = pipeline_bubble_s(per_mb, layout.vpp)
    terms["pp_p2p"] = pipeline_p2p_time(ctx.model, layout, ctx.rates, ctx.tokens, ctx.num_microbatches)
    dense, expert = ctx.trained_params
    terms["dp_comm"] = data_parallel_time(layout, ctx.rates, ctx.c, "slime", dense, expert)
    sharded = sharded_params(dense, expert, layout)
    # HybridDeviceOptimizer moves whole tensors: a model of few large tensors (the runner's stacked experts) moves
    # up to one tensor more than the fraction (Qwen3-235B-A22B at 2 layers, 0.25: 49% of the shard, measured)
    moved = min(offloaded_params(ctx.model, layout, ctx.ranks, ctx.gdn_sharded), sharded)
    terms["optimizer"] = comps.optimizer_s_per_step + comps.optimizer_s_per_param_here * (sharded - moved)
    if moved and comps.offload_s_per_param is not None:
        # measured with one rank on the host; ranks sharing it share the CPU Adam rate as measured
        share = comps.cpu_adam_rate(1) / comps.cpu_adam_rate(ctx.ranks_per_host) if comps.cpu_adam else 1.0
        terms["offload"] = moved * comps.offload_s_per_param_here * share
    elif moved:
        cpu = moved / comps.cpu_adam_rate(ctx.ranks_per_host)
        transfer = moved * 8 / ctx.rates.pcie  # fp32 grads down, fp32 params up
        terms["offload"] = max(cpu, transfer) if layout.overlap_d2h_h2d else cpu + transfer
    return {k: terms.get(k, 0.0) for k in TERMS}
