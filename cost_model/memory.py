"""Per-GPU and per-node host memory of a layout, in Megatron's conventions.

Static memory follows Megatron's distributed, precision-aware optimizer as the reference recipes
run it: bf16 parameters, fp32 main gradients (--accumulate-allreduce-grads-in-fp32), and a
DP-sharded optimizer holding a 16-bit master remainder plus fp32 moments (10 B per sharded
parameter). CPU offload moves the offloaded share of the optimizer to host memory (16 B per
sharded parameter: fp32 copies of parameter and gradient, and both moments).
Activations are counted per layer kind in `cost_model.activations`.
"""
from __future__ import annotations

from dataclasses import dataclass

from cost_model.activations import in_flight_microbatches, rank_activation_bytes
from cost_model.constants import Constants
from cost_model.hardware import GpuSpec
from cost_model.layout import Layout
from cost_model.model_spec import ModelSpec
from cost_model.stages import RankLayers
from cost_model.units import BF16, FP32, GIB

MOMENT_BYTES = {"fp32": 4, "bf16": 2}
HOST_BYTES_PER_OFFLOADED_PARAM = 16             # fp32 param + fp32 grad + two fp32 moments
BACKUP_BYTES_PER_PARAM = 2                      # slime's bf16 weight backup in pinned host memory


@dataclass(frozen=True)
class MemoryBreakdown:
    """GiB on the most-loaded GPU."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    buffers: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.buffers

    def as_dict(self) -> dict:
        return {"weights": self.weights, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "buffers": self.buffers, "total": self.total}


def local_params(rank: RankLayers, layout: Layout) -> tuple[float, float]:
    """(non-expert, expert) parameters held by one GPU of this pipeline rank."""
    tp = layout.tp
    # slime's Gated DeltaNet (HF module) and norms/routers are replicated on every TP rank.
    dense = ((rank.attention + rank.dense_mlp + rank.shared_expert + rank.embedding + rank.lm_head) / tp
             + rank.linear_attention + rank.replicated)
    expert = rank.routed_experts / (layout.ep * layout.etp)
    return dense, expert


def most_loaded_params(ranks: tuple[RankLayers, ...], layout: Layout) -> tuple[float, float]:
    """(non-expert, expert) parameters of one GPU of the rank holding the most."""
    dense_max = expert_max = 0.0
    for r in ranks:
        d, e = local_params(r, layout)
        if d + e > dense_max + expert_max:
            dense_max, expert_max = d, e
    return dense_max, expert_max


def sharded_params(dense: float, expert: float, layout: Layout) -> float:
    """Parameters of the distributed optimizer's shard: dense over DP x CP, experts over expert-DP."""
    return dense / (layout.dp * layout.cp) + expert / layout.edp


def backup_bytes(dense: float, expert: float) -> float:
    """slime's bf16 copy of one GPU's weights in host memory."""
    return (dense + expert) * BACKUP_BYTES_PER_PARAM


def static_memory(rank: RankLayers, layout: Layout, precision_aware: bool = True) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes on one GPU of this rank. Without the precision-aware optimizer
    (it needs Transformer Engine's FusedAdam) the shard holds an fp32 master and two fp32 moments."""
    dense, expert = local_params(rank, layout)
    params = dense + expert
    sharded = sharded_params(dense, expert, layout)
    # Precision-aware optimizer: a 16-bit master remainder beside the bf16 parameter, plus two moments.
    per_param = 2 + 2 * MOMENT_BYTES[layout.exp_avg_dtype] if precision_aware else 4 + 4 + 4
    optimizer = sharded * per_param * (1.0 - layout.optimizer_offload_fraction)
    return params * BF16, params * FP32, optimizer


def buffer_bytes(layout: Layout, c: Constants) -> float:
    groups = sum(1 for size in (layout.tp, layout.cp, layout.ep, layout.etp, layout.dp, layout.edp, layout.pp)
                 if size > 1)
    gib = c.cuda_context_gib + c.nccl_buffers_gib_per_group * groups
    if layout.dispatcher == "flex":
        gib += c.deepep_buffers_gib
    return gib * GIB


def peak_memory(ranks: tuple[RankLayers, ...], model: ModelSpec, layout: Layout, precision: str, tokens: float,
                routed_rows_per_token: float, num_microbatches: int, c: Constants,
                precision_aware: bool = True) -> MemoryBreakdown:
    """The memory of the most-loaded GPU over the pipeline ranks."""
    in_flight = in_flight_microbatches(layout, num_microbatches)
    buffers = buffer_bytes(layout, c)
    best = None
    for i, r in enumerate(ranks):
        weights, grads, optimizer = static_memory(r, layout, precision_aware)
        acts = rank_activation_bytes(i, r, model, layout, precision, tokens, routed_rows_per_token, in_flight, c)
        mem = MemoryBreakdown(weights / GIB, grads / GIB, optimizer / GIB, acts / GIB, buffers / GIB)
        if best is None or mem.total > best.total:
            best = mem
    return best


def host_memory_gib_per_node(gpu: GpuSpec, layout: Layout, framework: str, dense: float, expert: float,
                             c: Constants) -> float:
    """Host memory of one node: a base per GPU, slime's weight backup and the offloaded optimizer share.
    `dense` and `expert` are the parameters of one GPU of the rank holding the most."""
    gpus_on_node = min(layout.world_size, gpu.gpus_per_node)
    backup = backup_bytes(dense, expert) if framework == "slime" else 0.0
    offloaded = layout.optimizer_offload_fraction * sharded_params(dense, expert, layout)
    host_per_gpu = c.host_base_gib_per_gpu * GIB + backup + offloaded * HOST_BYTES_PER_OFFLOADED_PARAM
    return gpus_on_node * host_per_gpu / GIB
