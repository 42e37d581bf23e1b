"""Per-GPU and per-node host memory of a layout, in Megatron's conventions.

Static memory follows Megatron's distributed, precision-aware optimizer as the reference recipes
run it: bf16 parameters, fp32 main gradients (--accumulate-allreduce-grads-in-fp32), and a
DP-sharded optimizer holding a 16-bit master remainder plus fp32 moments (10 B per sharded
parameter). CPU offload moves the offloaded share of the optimizer to host memory (16 B per
sharded parameter: fp32 copies of parameter and gradient, and both moments).

The GPU's peak is the device-level one, what `total - free` reaches: the allocator's peak (static
memory plus the larger of the forward/backward peak and the optimizer step's), the allocator's reserve
beyond it, and what the process holds outside PyTorch (cost_model.device_memory). Activations are
counted per layer kind in `cost_model.activations`, the output layer and loss in `cost_model.loss_path`.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field, fields
from operator import attrgetter

from cost_model.memo import IdentityMemo
from cost_model.activations import activation_fields, activation_source, in_flight_microbatches, rank_activation_bytes
from cost_model.constants import Constants
from cost_model.device_memory import DeviceMemory, overheads
from cost_model.nouns.hardware import GpuSpec
from cost_model.nouns.layout import Layout
from cost_model.loss_path import loss_path_bytes, loss_path_source
from cost_model.nouns.model_spec import LINEAR_ATTENTION, MLA, MOE, ModelSpec
from cost_model.nouns.quick_init import quick_init
from cost_model.nouns.runtime import Runtime
from cost_model.stages import RankLayers
from cost_model.nouns.units import BF16, FP32, GIB
from cost_model.vision import VisionWork, vision_activation_bytes

MOMENT_BYTES = {"fp32": 4, "bf16": 2}
HOST_BYTES_PER_OFFLOADED_PARAM = 16             # fp32 param + fp32 grad + two fp32 moments
BACKUP_BYTES_PER_PARAM = 2                      # slime's bf16 weight backup in pinned host memory
# The parts of a GPU's peak, in the order tables print them (MemoryBreakdown.as_dict adds the sums).
ALLOCATED_PARTS = ("weights", "grads", "optimizer", "activations", "loss_path", "optimizer_step")
OUTSIDE_PARTS = ("cuda_context", "nccl", "deepep")
# the parts as tuples, in that order, read in C (the sums below add them in the same order)
_allocated_parts, _outside_parts = attrgetter(*ALLOCATED_PARTS), attrgetter(*OUTSIDE_PARTS)


@quick_init
@dataclass(frozen=True)
class MemoryBreakdown:
    """GiB on the most-loaded GPU: the allocator's peak by part, then what the device holds beyond it.

    optimizer_step is what the optimizer step needs beyond the forward/backward peak (torch AdamW's
    foreach temporary without a fused Adam; 0 when the forward/backward peak is the larger).
    allocator_reserve is what the allocator needs beyond its allocated peak when memory is short;
    allocator_cache what it keeps beyond that when the card has room (never past the usable capacity):
    `total` (what the GPU must hold) decides the fit, `device_peak` is the device-level peak a run is
    expected to show."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    loss_path: float = 0.0
    optimizer_step: float = 0.0
    allocator_reserve: float = 0.0
    allocator_cache: float = 0.0
    cuda_context: float = 0.0
    nccl: float = 0.0
    deepep: float = 0.0
    usable: float = 0.0
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def allocated(self) -> float:
        """The allocator's peak (torch.cuda.max_memory_allocated)."""
        return sum(_allocated_parts(self))

    @property
    def outside_pytorch(self) -> float:
        return sum(_outside_parts(self))

    @property
    def buffers(self) -> float:
        """The memory outside PyTorch's allocator (this breakdown's former name for it)."""
        return self.outside_pytorch

    @property
    def total(self) -> float:
        """What the GPU must hold at its peak: allocated + allocator reserve + outside PyTorch."""
        return self.allocated + self.allocator_reserve + self.outside_pytorch

    @property
    def device_peak(self) -> float:
        """The device-level peak a run shows (total - free): the total plus the allocator's cache where
        the card has room for it."""
        return self.total + self.allocator_cache

    def as_dict(self) -> dict:
        """Every part and sum, GiB (numbers only)."""
        out = {k: getattr(self, k) for k in ALLOCATED_PARTS}
        out["allocated"] = self.allocated
        out["allocator_reserve"] = self.allocator_reserve
        out.update({k: getattr(self, k) for k in OUTSIDE_PARTS})
        out.update(outside_pytorch=self.outside_pytorch, total=self.total, allocator_cache=self.allocator_cache,
                   device_peak=self.device_peak, usable=self.usable)
        return out


def local_params(rank: RankLayers, layout: Layout, gdn_sharded: bool = False) -> tuple[float, float]:
    """(non-expert, expert) parameters held by one GPU of this pipeline rank. Norms and routers are
    replicated on every TP rank, and so is slime's Gated DeltaNet (HF module); megatron-core's
    GatedDeltaNet (`gdn_sharded`) splits its projections, conv and gates over TP."""
    tp = layout.tp
    gdn = rank.linear_attention / tp if gdn_sharded else rank.linear_attention
    dense = ((rank.attention + rank.dense_mlp + rank.shared_expert + rank.embedding + rank.lm_head + rank.vision) / tp
             + gdn + rank.replicated)
    expert = rank.routed_experts / (layout.ep * layout.etp)
    return dense, expert


def most_loaded_params(ranks: tuple[RankLayers, ...], layout: Layout,
                       gdn_sharded: bool = False) -> tuple[float, float]:
    """(non-expert, expert) parameters of one GPU of the rank holding the most."""
    dense_max = expert_max = 0.0
    for r in ranks:
        d, e = local_params(r, layout, gdn_sharded)
        if d + e > dense_max + expert_max:
            dense_max, expert_max = d, e
    return dense_max, expert_max


def sharded_params(dense: float, expert: float, layout: Layout) -> float:
    """Parameters of the distributed optimizer's shard: dense over DP x CP, experts over expert-DP."""
    return dense / (layout.dp * layout.cp) + expert / layout.edp


def backup_bytes(dense: float, expert: float) -> float:
    """slime's bf16 copy of one GPU's weights in host memory."""
    return (dense + expert) * BACKUP_BYTES_PER_PARAM


STATIC_SOURCE = ("counted from the parameters the GPU holds (cost_model.memory.static_memory): bf16 weights, fp32 "
                 "gradient buffers, the optimizer's master weights and moments at the layout's dtypes sharded by the "
                 "distributed optimizer, less an offloaded share; nothing fitted")


def static_memory(rank: RankLayers, layout: Layout, precision_aware: bool = True,
                  gdn_sharded: bool = False, frozen_weights: bool = False,
                  split: "OffloadSplit | None" = None) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes on one GPU of this rank. Without the precision-aware optimizer
    (it needs Transformer Engine's FusedAdam) the shard holds an fp32 master and two fp32 moments.
    A frozen base (LoRA) holds its bf16 weights only: no gradients, no optimizer state (the adapters'
    are under a percent of the base and not counted). With optimizer offload, `split` (offload_split) says which
    parameters megatron's HybridDeviceOptimizer keeps on the GPU (whole tensors; without it, the offload fraction
    of them)."""
    dense, expert = local_params(rank, layout, gdn_sharded)
    params = dense + expert
    if frozen_weights:
        return params * BF16, 0.0, 0.0
    sharded = sharded_params(dense, expert, layout)
    # Precision-aware optimizer: a 16-bit master remainder beside the bf16 parameter, plus two moments.
    per_param = 2 + 2 * MOMENT_BYTES[layout.exp_avg_dtype] if precision_aware else 4 + 4 + 4
    on_gpu = sharded * (1.0 - layout.optimizer_offload_fraction)
    if layout.offloaded and split is not None:
        on_gpu = split.stepped_on_gpu
    optimizer = on_gpu * per_param
    return params * BF16, params * FP32, optimizer


def optimizer_step_bytes(rank: RankLayers, layout: Layout, runtime: Runtime, frozen_weights: bool = False,
                         split: "OffloadSplit | None" = None) -> float:
    """Bytes the optimizer step allocates beyond static memory: torch AdamW's foreach step (megatron's
    Adam without TE or Apex) holds one fp32 temporary (the second moment's square root) the size of the
    parameter group it is stepping; a fused Adam none. Megatron steps the experts with an optimizer of
    their own when they have their own process groups (EP > 1 or ETP != TP: their `allreduce` is False),
    one after the other, so the temporary is the larger shard; otherwise one optimizer holds both. The
    offloaded share steps on the CPU. A frozen base (LoRA) is not stepped."""
    if frozen_weights:
        return 0.0
    if layout.offloaded and split is not None:
        # HybridDeviceOptimizer steps its GPU share with a fused Adam (no foreach temporary); what the first
        # step's moments meet is the first HybridDeviceOptimizer's fp32 copies (offload_split), unless the stack
        # collected them once the optimizer was built.
        return 0.0 if runtime.offload_first_build_collected else FP32 * split.first_copy_on_gpu
    if runtime.fused_adam:
        return 0.0
    dense, expert = local_params(rank, layout, runtime.gdn_sharded)
    dense_shard, expert_shard = dense / (layout.dp * layout.cp), expert / layout.edp
    own_expert_groups = layout.ep > 1 or layout.etp != layout.tp
    shard = max(dense_shard, expert_shard) if own_expert_groups else dense_shard + expert_shard
    return FP32 * shard * (1.0 - layout.optimizer_offload_fraction)


@dataclass(frozen=True)
class OffloadSplit:
    """Parameters (counts, this GPU) of megatron's HybridDeviceOptimizer on the GPU under optimizer offload.

    megatron-core 0.19's get_megatron_optimizer builds a HybridDeviceOptimizer on the model's parameter groups,
    then DistributedOptimizer replaces it with one on its shard's parameters. Each walks its groups in order
    (the weight-decayed group first, the norms and biases after it) and moves whole tensors to the CPU while
    fewer than `offload_fraction` of its elements have moved; it keeps an fp32 copy of each tensor left on the
    GPU (param_update_in_fp32), and its GPU Adam adds two fp32 moments at the first step. The first optimizer
    walks the parameters in the model's order (embedding, layers, output layer), the second in the gradient
    buffer's (the reverse). The first is only reachable through reference cycles (its sub-optimizers' step
    hooks), so its fp32 copies stay until Python's cyclic collector runs: the runs show them held when the
    first step allocates the moments."""

    stepped_on_gpu: float       # the shard's parameters the second (stepping) optimizer keeps on the GPU
    first_copy_on_gpu: float    # the local parameters whose fp32 copy the first optimizer made on the GPU
    stepped_on_cpu: float       # the most parameters a DP rank's stepping optimizer moves to the CPU (its step's
    #                             CPU Adam and copies: whole tensors, so up to a tensor more than the fraction)


# A rank's layers are a few kinds repeated: each kind's tensors are listed once per model, kinds and shards.
_TENSORS_MEMO = IdentityMemo(10_000)


def _layer_tensors(model: ModelSpec, attn_kind: str, mlp_kind: str, layout: Layout,
                   gdn_sharded: bool) -> tuple[tuple[float, bool], ...]:
    """`_kind_tensors`, memoized (it reads the layout's TP, EP and ETP only)."""
    key = (id(model), attn_kind, mlp_kind, layout.tp, layout.ep, layout.etp, gdn_sharded)
    hit = _TENSORS_MEMO.get(key) or _TENSORS_MEMO.put(key, model, tuple(
        _kind_tensors(model, attn_kind, mlp_kind, layout, gdn_sharded)))
    return hit[1]


def _kind_tensors(model: ModelSpec, attn_kind: str, mlp_kind: str, layout: Layout,
                  gdn_sharded: bool) -> list[tuple[float, bool]]:
    """The 2-D tensors of one layer on one GPU as (elements, is_expert), in megatron's parameter order (attention's
    linear_proj before linear_qkv; the MoE router, the experts' stacked fc1 and fc2, then the shared expert); 1-D
    tensors (norms, biases, gates) are left to the norm group."""
    h, tp = model.hidden_size, layout.tp
    lp = model.layer_params(attn_kind, mlp_kind)
    if attn_kind == LINEAR_ATTENTION:
        kd = model.linear_num_key_heads * model.linear_key_head_dim
        vd = model.linear_num_value_heads * model.linear_value_head_dim
        div = tp if gdn_sharded else 1
        mixer = [h * (2 * kd + 2 * vd + 2 * model.linear_num_value_heads) / div,
                 (2 * kd + vd) * model.linear_conv_kernel_dim / div, vd * h / div]
    elif attn_kind == MLA:
        mixer = [lp.attention / tp]
    else:
        q = model.num_attention_heads * model.head_dim
        o_proj = q * h
        mixer = [o_proj / tp, max(lp.attention - o_proj, 0) / tp]
    tensors = [(n, False) for n in mixer]
    if mlp_kind == MOE:
        e, local = model.moe_intermediate_size, layout.ep * layout.etp
        tensors += [(model.num_experts * h, False),
                    (model.num_experts * 2 * e * h / local, True), (model.num_experts * e * h / local, True)]
        if model.shared_expert_intermediate_size:
            sh = model.shared_expert_intermediate_size
            tensors += [(2 * sh * h / tp, False), (sh * h / tp, False)]
        return tensors
    i = model.intermediate_size
    return tensors + [(2 * i * h / tp, False), (i * h / tp, False)]


def _kept_on_gpu(tensors: list, rest: float, fraction: float) -> float:
    """Elements HybridDeviceOptimizer keeps on the GPU: it walks `tensors` (then the norm group, `rest`, whose
    tensors are small) moving whole tensors while fewer than `fraction` of all elements have moved."""
    total = sum(tensors) + rest
    threshold, moved = fraction * total, 0.0
    for n in tensors:
        if moved >= threshold:
            break
        moved += n
    if moved < threshold:
        moved = threshold  # the norm group's small tensors take it to the threshold
    return max(0.0, total - moved)


def _rank_layer_indices(model: ModelSpec, layout: Layout, ranks: int) -> tuple:
    try:
        stages = model.layout_stage_layers(layout)
    except Exception:  # noqa: BLE001 - a layout string this helper cannot place: the ranks' kinds in order
        return (None,) * ranks
    return tuple(stages) if len(stages) == ranks else (None,) * ranks


def offload_split(model: ModelSpec, indices, rank: RankLayers, layout: Layout, gdn_sharded: bool) -> OffloadSplit:
    """Where HybridDeviceOptimizer leaves this GPU's parameters (OffloadSplit). Megatron steps the experts with an
    optimizer of their own (its own pair of HybridDeviceOptimizers) when they have their own process groups.
    The shard of a DP rank is a contiguous range of the gradient buffer; the largest share over the DP ranks is
    taken. `indices`: the rank's layers in order (None: its layer kinds in the order RankLayers keeps them)."""
    if indices is None:
        kinds = [(a, m) for a, m, n in rank.kinds for _ in range(n)]
    else:
        kinds = [(model.layer_types[i], model.mlp_types[i]) for i in indices]
    ordered = [(rank.embedding / layout.tp, False)] if rank.embedding else []
    for a, m in kinds:
        ordered += _layer_tensors(model, a, m, layout, gdn_sharded)
    if rank.lm_head:
        ordered.append((rank.lm_head / layout.tp, False))
    dense, expert = local_params(rank, layout, gdn_sharded)
    own_expert_groups = layout.ep > 1 or layout.etp != layout.tp
    f = layout.optimizer_offload_fraction
    # Experts with their own process groups are a buffer and an optimizer of their own; otherwise they sit among
    # the layer's other tensors, in the model's order (the runs' optimizer builds, benchmarks/offload_split_check.py)
    if own_expert_groups:
        groups = [([n for n, x in ordered if not x], dense, layout.dp * layout.cp),
                  ([n for n, x in ordered if x], expert, layout.edp)]
    else:
        groups = [([n for n, _ in ordered], dense + expert, layout.dp * layout.cp)]
    stepped = first = moved = 0.0
    for tensors, total, shards in groups:
        rest = max(0.0, total - sum(tensors))
        first += _kept_on_gpu(tensors, rest, f)
        kept, most_moved = _shard_split(tuple(reversed(tensors)), rest, f, shards)
        stepped += kept
        moved += most_moved
    return OffloadSplit(stepped_on_gpu=stepped, first_copy_on_gpu=first, stepped_on_cpu=moved)


# Scoring a space asks for the same rank's split under the many layouts that differ elsewhere (recompute, tokens,
# dispatcher): it depends on the layout only through these fields (the ranks' layers and the shards), memoized with
# the model held by the memo.
_SPLIT_FIELDS = ("pp", "vpp", "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                 "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                 "pipeline_model_parallel_layout", "tp", "ep", "etp", "dp", "cp", "edp", "optimizer_offload_fraction")
_split_fields = attrgetter(*_SPLIT_FIELDS)   # a tuple of them, read in C (a memo key per call)
_SPLIT_MEMO = IdentityMemo(50_000)


def offloaded_params(model: ModelSpec, layout: Layout, ranks: tuple[RankLayers, ...], gdn_sharded: bool) -> float:
    """The most parameters one GPU's optimizer steps on the CPU under offload (OffloadSplit.stepped_on_cpu)."""
    if not layout.offloaded:
        return 0.0
    return max(_rank_offload_split(model, layout, ranks, i, gdn_sharded).stepped_on_cpu for i in range(len(ranks)))


def _rank_offload_split(model: ModelSpec, layout: Layout, ranks: tuple[RankLayers, ...], i: int,
                        gdn_sharded: bool) -> OffloadSplit:
    """`offload_split` of pipeline rank `i`, memoized."""
    key = (id(model), _split_fields(layout), len(ranks), i, ranks[i], gdn_sharded)
    hit = _SPLIT_MEMO.get(key)
    if hit is None:
        indices = _rank_layer_indices(model, layout, len(ranks))[i]
        hit = _SPLIT_MEMO.put(key, model, offload_split(model, indices, ranks[i], layout, gdn_sharded))
    return hit[1]


# A space's thousands of shapes split a few hundred distinct buffers, each walked over up to 4,096 shards at each
# call: memoized by value (a tuple of floats and three numbers; no object held).
_SHARD_MEMO = IdentityMemo(20_000)


def _shard_split(buffer_order: tuple, rest: float, fraction: float, shards: int) -> tuple[float, float]:
    """(the most any DP rank's shard keeps on the GPU, the most any moves to the CPU): each rank holds 1/shards of
    the buffer (the tensors in buffer order, then the norm group), as pieces of the tensors it cuts."""
    key = (buffer_order, rest, fraction, shards)
    hit = _SHARD_MEMO.get(key) or _SHARD_MEMO.put(key, None, _walk_shards(buffer_order, rest, fraction, shards))
    return hit[1]


def _walk_shards(buffer_order: tuple, rest: float, fraction: float, shards: int) -> tuple[float, float]:
    """`_shard_split`, worked out."""
    total = sum(buffer_order) + rest
    if shards <= 1:
        kept = _kept_on_gpu(list(buffer_order), rest, fraction)
        return kept, total - kept
    size = total / shards
    items = list(buffer_order) + ([rest] if rest else [])
    most_kept = most_moved = 0.0
    bounds, acc = [], 0.0
    for n in items:
        bounds.append((acc, acc + n))
        acc += n
    # the tensors a shard cuts are a contiguous run of them (starts and ends both ascend): found by bisection
    starts, ends = [a for a, _ in bounds], [b for _, b in bounds]
    for r in range(min(shards, 4096)):
        lo, hi = r * size, (r + 1) * size
        pieces = [min(b, hi) - max(a, lo) for a, b in bounds[bisect_right(ends, lo):bisect_left(starts, hi)]]
        kept = _kept_on_gpu(pieces, 0.0, fraction)
        most_kept, most_moved = max(most_kept, kept), max(most_moved, sum(pieces) - kept)
    return most_kept, most_moved


@quick_init
@dataclass(frozen=True)
class MemoryInputs:
    """What the GPU memory of a layout depends on beyond the model and the layout."""

    precision: str
    tokens: float                   # the micro-batch's tokens on one GPU (its CP shard)
    routed_rows_per_token: float
    num_microbatches: int
    runtime: Runtime
    gpu: GpuSpec
    device: DeviceMemory | None
    precision_aware: bool = True
    frozen_weights: bool = False    # LoRA's frozen base: weights only, no gradients or optimizer state
    vision: VisionWork | None = None  # a VLM's encoder work per micro-batch (first rank)
    # the first stage's micro-batches in flight, in units of `tokens` (predict.in_flight_share); None: the layout's count
    in_flight: float | None = None


# The static memory of a rank (weights, gradients, optimizer state, the optimizer step's temporary) is the same for
# the layouts of a parallel shape that differ in their micro-batch or recompute: it reads the layout only through
# these fields (the offload split's and the Adam moments' dtype). Memoized with the model, runtime and ranks held by
# the memo.
_STATIC_FIELDS = _SPLIT_FIELDS + ("exp_avg_dtype",)
_static_fields = attrgetter(*_STATIC_FIELDS)
_STATIC_MEMO = IdentityMemo(50_000)


def _rank_static(model: ModelSpec, layout: Layout, ranks: tuple[RankLayers, ...], i: int,
                 inputs: MemoryInputs) -> tuple[float, float, float, float]:
    """(weights, grads, optimizer, optimizer step) bytes on one GPU of pipeline rank `i`, memoized."""
    rt = inputs.runtime
    key = (id(model), id(rt), id(ranks), _static_fields(layout), i, inputs.precision_aware, inputs.frozen_weights)
    hit = _STATIC_MEMO.get(key)
    if hit is None:
        r = ranks[i]
        split = (_rank_offload_split(model, layout, ranks, i, rt.gdn_sharded)
                 if layout.offloaded and not inputs.frozen_weights else None)
        weights, grads, optimizer = static_memory(r, layout, inputs.precision_aware, rt.gdn_sharded,
                                                  inputs.frozen_weights, split)
        step = optimizer_step_bytes(r, layout, rt, inputs.frozen_weights, split)
        hit = _STATIC_MEMO.put(key, (model, rt, ranks), (weights, grads, optimizer, step))
    return hit[1]


# The layouts of a parallel shape share their ranks' static memory per optimizer choice, and their activations per
# micro-batch and recompute: each is one table over the pipeline ranks (one memo lookup per layout, not one per rank),
# keyed as its per-rank terms are (_rank_static, activations.rank_activation_bytes).
_STATIC_TABLE_MEMO = IdentityMemo(50_000)
_ACTIVATION_TABLE_MEMO = IdentityMemo(100_000)


def _static_table(model: ModelSpec, layout: Layout, ranks: tuple[RankLayers, ...], inputs: MemoryInputs) -> tuple:
    """Per pipeline rank, `_rank_static`."""
    rt = inputs.runtime
    key = (id(model), id(rt), id(ranks), _static_fields(layout), inputs.precision_aware, inputs.frozen_weights)
    hit = _STATIC_TABLE_MEMO.get(key) or _STATIC_TABLE_MEMO.put(key, (model, rt, ranks), tuple(
        _rank_static(model, layout, ranks, i, inputs) for i in range(len(ranks))))
    return hit[1]


def _activation_table(model: ModelSpec, layout: Layout, ranks: tuple[RankLayers, ...], inputs: MemoryInputs,
                      in_flight: float, c: Constants) -> tuple:
    """Per pipeline rank, (saved, working) activation bytes (activations.rank_activation_bytes)."""
    rt = inputs.runtime
    key = (id(model), id(ranks), id(c), activation_fields(layout), inputs.tokens, inputs.routed_rows_per_token,
           rt.gdn_sharded, rt.fused_kernels, inputs.precision, in_flight)
    hit = _ACTIVATION_TABLE_MEMO.get(key) or _ACTIVATION_TABLE_MEMO.put(key, (model, ranks, c), tuple(
        rank_activation_bytes(i, r, model, layout, inputs, in_flight, c) for i, r in enumerate(ranks)))
    return hit[1]


# Layouts that differ only in whether the offloaded optimizer's copies overlap its step (overlap_d2h_h2d: time, not
# memory) hold the same memory: the peak reads every other field of the layout, and the inputs in the key (objects
# by identity, held by the memo). A vision workload's inputs are built per layout: not memoized.
MEMORY_BLIND_FIELDS = ("overlap_d2h_h2d",)   # the layout's fields no part of its memory reads
_MEMORY_FIELDS = tuple(f.name for f in fields(Layout) if f.name not in MEMORY_BLIND_FIELDS)
_memory_fields = attrgetter(*_MEMORY_FIELDS)
_PEAK_MEMO = IdentityMemo(50_000)


def lighter_optimizer(choice: dict) -> dict | None:
    """An optimizer choice (the offload and moments' fields of a layout) whose layouts hold no more GPU memory than
    this one's, all else alike, to the bit: bf16 Adam moments for fp32 ones on the GPU. Only the optimizer state
    reads the moments' dtype (static_memory), every sum after it is monotonic, and the host memory does not read it:
    a layout that does not fit with bf16 moments does not fit with fp32 ones. None: no such choice."""
    if choice.get("exp_avg_dtype") != "fp32" or choice.get("optimizer_offload_fraction", 0.0) > 0:
        return None
    return {**choice, "exp_avg_dtype": "bf16"}


def peak_memory(ranks: tuple[RankLayers, ...], model: ModelSpec, layout: Layout, inputs: MemoryInputs,
                c: Constants) -> MemoryBreakdown:
    """The device-level peak of the most-loaded GPU over the pipeline ranks."""
    if inputs.vision is not None:
        return _peak_memory(ranks, model, layout, inputs, c)
    held = (ranks, model, c, inputs.runtime, inputs.gpu, inputs.device)
    key = (tuple(map(id, held)), _memory_fields(layout), inputs.precision, inputs.tokens, inputs.routed_rows_per_token,
           inputs.num_microbatches, inputs.precision_aware, inputs.frozen_weights, inputs.in_flight)
    hit = _PEAK_MEMO.get(key) or _PEAK_MEMO.put(key, held, _peak_memory(ranks, model, layout, inputs, c))
    return hit[1]


def _peak_memory(ranks: tuple[RankLayers, ...], model: ModelSpec, layout: Layout, inputs: MemoryInputs,
                 c: Constants) -> MemoryBreakdown:
    rt = inputs.runtime
    in_flight = in_flight_microbatches(layout, inputs.num_microbatches) if inputs.in_flight is None else inputs.in_flight
    # The same for every rank but the allocator's reserve: worked out once (its sources are long strings).
    fixed = overheads(layout, rt, model.is_moe, 0.0, inputs.gpu, inputs.device, c, model.has_linear_attention)
    outside = fixed.outside_pytorch
    head_loss = loss_path_bytes(model, layout, inputs.tokens, rt)   # the same on every rank that holds a head
    best, best_total = None, None
    statics, activations = _static_table(model, layout, ranks, inputs), _activation_table(model, layout, ranks,
                                                                                          inputs, in_flight, c)
    for i, r in enumerate(ranks):
        weights, grads, optimizer, step_bytes = statics[i]
        saved, working = activations[i]
        # MTP layers (placed by a layout string) each hold one more LM head's logits until their backward.
        loss = head_loss * (int(r.has_head) + r.mtp_layers)
        # The loss path's tensors are gone before the last layer runs its backward: the two peaks do not add.
        acts = saved + max(0.0, working - loss)
        if inputs.vision is not None and r.vision:
            acts += vision_activation_bytes(inputs.vision.spec, inputs.vision.patches, layout.tp, in_flight)
        step = max(0.0, step_bytes - acts - loss)
        parts = (weights / GIB, grads / GIB, optimizer / GIB, acts / GIB, loss / GIB, step / GIB)   # ALLOCATED_PARTS
        allocated = sum(parts)
        # MemoryBreakdown.total, summed as it sums: only the peak rank's breakdown is built
        total = allocated + allocated * fixed.reserve_fraction + outside
        if best_total is None or total > best_total:
            best, best_total = (parts, allocated), total
    parts, allocated = best
    gap = allocator_gap_gib(model, layout, inputs.tokens, inputs.routed_rows_per_token, c)
    reserve, cache = fixed.reserve_and_cache(allocated, gap)
    return MemoryBreakdown(*parts, allocator_reserve=reserve, allocator_cache=cache, cuda_context=fixed.cuda_context,
                           nccl=fixed.nccl, deepep=fixed.deepep, usable=fixed.usable,
                           sources=_memory_sources(fixed.sources, model, rt, c))


# Every layout of a space shares its model, runtime and constants, and its overheads' sources with the layouts of
# its process groups: the merged sources are built once per such set, not once per layout scored.
_SOURCES_MEMO = IdentityMemo(10_000)


def _memory_sources(overhead_sources: dict, model: ModelSpec, rt: Runtime, c: Constants) -> dict:
    """Where each memory part's figure comes from: the overheads' sources and the counted parts'."""
    held = (overhead_sources, model, rt, c)
    key = tuple(map(id, held))
    hit = _SOURCES_MEMO.get(key) or _SOURCES_MEMO.put(key, held, {
        **overhead_sources, "activations": activation_source(model, rt.fused_kernels, c),
        "loss_path": loss_path_source(rt), "weights, grads, optimizer": STATIC_SOURCE})
    return hit[1]


def dispatched_gib(model: ModelSpec, layout: Layout, tokens: float, routed_rows_per_token: float) -> float:
    """GiB of one micro-batch's routed rows on one GPU (bf16 hidden states after the dispatch); 0 without MoE layers."""
    if not model.has_moe_layers:
        return 0.0
    return BF16 * model.hidden_size * routed_rows_per_token * tokens / layout.tp / GIB


def allocator_gap_gib(model: ModelSpec, layout: Layout, tokens: float, routed_rows_per_token: float,
                      c: Constants) -> float:
    """GiB the caching allocator holds reserved beyond its allocated peak when the card has room. MoE layers
    allocate routing-dependent sizes every micro-batch, so the gap grows with the routed rows; dense layers
    reuse the same sizes (constants.yaml allocator_gap_*: fitted on the runner's in-sample grids,
    benchmarks/allocator_gap_fit.py). A MoE model built without its MoE layers has a dense model's gap."""
    if not model.has_moe_layers:
        return c.allocator_gap_dense_gib
    return c.allocator_gap_moe_gib + c.allocator_gap_per_dispatched_gib * dispatched_gib(
        model, layout, tokens, routed_rows_per_token)


def host_memory_gib_per_node(gpu: GpuSpec, layout: Layout, framework: str, dense: float, expert: float,
                             c: Constants, frozen_weights: bool = False) -> float:
    """Host memory of one node: a base per GPU, slime's weight backup and the offloaded optimizer share.
    `dense` and `expert` are the parameters of one GPU of the rank holding the most; a frozen base has
    no optimizer state to offload."""
    gpus_on_node = min(layout.world_size, gpu.gpus_per_node)
    backup = backup_bytes(dense, expert) if framework == "slime" else 0.0
    trained = 0.0 if frozen_weights else sharded_params(dense, expert, layout)
    offloaded = layout.optimizer_offload_fraction * trained
    host_per_gpu = c.host_base_gib_per_gpu * GIB + backup + offloaded * HOST_BYTES_PER_OFFLOADED_PARAM
    return gpus_on_node * host_per_gpu / GIB
