"""predict(model, gpu, workload, layout): memory, step time, throughput and cost of one layout.

A pure function of its arguments (the constants come from a cached data file): no other I/O, no
global state, fast enough to score every layout of a search space.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cost_model.constants import Constants, default_constants
from cost_model.hardware import GpuSpec
from cost_model.memory import (BACKUP_BYTES_PER_PARAM, GIB, HOST_BYTES_PER_OFFLOADED_PARAM, MemoryBreakdown,
                               activation_bytes_per_microbatch, buffer_bytes, in_flight_microbatches,
                               local_params, logits_bytes, static_memory)
from cost_model.metrics import mfu as model_flops_utilisation
from cost_model.metrics import usd_per_million_tokens
from cost_model.model_spec import ModelSpec
from cost_model.profile import HardwareProfile, shipped_profile
from cost_model.rates import rates_for
from cost_model.stages import rank_layers
from cost_model.step_time import TERMS, rank_microbatch_terms
from cost_model.workload import Workload
from cost_model.layout import Layout
from cost_model.batching import rows_per_microbatch

# Adam's GPU step streams param, remainder, grad and both moments in and writes four of them back.
ADAM_BYTES_PER_PARAM = 2 + 2 + 4 + 4 + 4 + 2 + 2 + 4 + 4


@dataclass(frozen=True)
class Prediction:
    fits: bool
    reasons: tuple[str, ...]            # why it does not fit; empty when it fits
    memory: MemoryBreakdown             # GiB on the most-loaded GPU
    gpu_memory_gib: float               # usable HBM of one GPU
    host_memory_gib_per_node: float
    host_memory_capacity_gib: float
    step_time_s: float
    breakdown: dict = field(default_factory=dict)  # seconds per term; sums to step_time_s
    tokens_per_s_per_gpu: float = 0.0
    mfu: float = 0.0
    usd_per_million_tokens: float = 0.0
    num_microbatches: int = 0
    tokens_per_microbatch: float = 0.0
    source: str = ""

    @property
    def peak_memory_gib(self) -> float:
        return self.memory.total

    def to_dict(self) -> dict:
        return {
            "kind": "predicted",
            "source": self.source,
            "fits": self.fits,
            "reasons": list(self.reasons),
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "step_time_s": self.step_time_s,
            "peak_memory_gib": self.peak_memory_gib,
            "gpu_memory_gib": self.gpu_memory_gib,
            "memory_gib": self.memory.as_dict(),
            "host_memory_gib_per_node": self.host_memory_gib_per_node,
            "host_memory_capacity_gib": self.host_memory_capacity_gib,
            "mfu": self.mfu,
            "usd_per_million_tokens": self.usd_per_million_tokens,
            "num_microbatches": self.num_microbatches,
            "tokens_per_microbatch": self.tokens_per_microbatch,
            "breakdown": dict(self.breakdown),
        }


def predict(model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout,
            constants: Constants | None = None, profile: HardwareProfile | None = None,
            precision_aware_optimizer: bool = True) -> Prediction:
    """`profile` defaults to the profile shipped for the GPU type; without one, datasheet rates apply.
    `precision_aware_optimizer`: False for a stack without Transformer Engine (standard fp32 optimizer)."""
    c = constants or default_constants()
    rates = rates_for(gpu, c, workload.precision, profile or shipped_profile(gpu.name))
    tp, pp, vpp, cp, dp = layout.tp, layout.pp, layout.vpp, layout.cp, layout.dp

    rows = rows_per_microbatch(layout.max_tokens_per_gpu, layout.cp, workload.seq_len)
    tokens = rows * workload.seq_len / cp                    # per GPU per micro-batch (its CP shard)
    rows_per_dp = -(-workload.global_batch // dp)
    n_mb = -(-rows_per_dp // rows)
    if vpp > 1:  # slime raises the bin count to a multiple of DP x PP for interleaving
        n_mb = -(-n_mb // pp) * pp

    imbalance = 1.0
    if model.is_moe and workload.routing == "natural":
        imbalance = 1.0 + (c.routing_imbalance_natural - 1.0) * (1.0 - 1.0 / layout.ep)
    routed_rows_per_token = model.num_experts_per_tok * imbalance * layout.etp

    ranks = rank_layers(model, pp, vpp)
    per_rank_terms = [rank_microbatch_terms(r, model, rates, layout, tokens, workload.seq_len, imbalance, c,
                                            workload.framework) for r in ranks]
    per_rank_mb = [sum(t.values()) for t in per_rank_terms]
    slowest = max(range(pp), key=per_rank_mb.__getitem__)

    breakdown = {k: v * n_mb for k, v in per_rank_terms[slowest].items()}
    breakdown["pp_bubble"] = (pp - 1) / vpp * per_rank_mb[slowest]
    breakdown["pp_p2p"] = 0.0
    if pp > 1:
        p2p_bytes = tokens * model.hidden_size * 2 / tp
        breakdown["pp_p2p"] = n_mb * 2 * vpp * rates.collective("p2p", p2p_bytes, 2, layout.world_size)

    # Static memory and the optimizer step, on the rank holding the most parameters.
    dense_max = expert_max = 0.0
    for r in ranks:
        d, e = local_params(r, layout)
        if d + e > dense_max + expert_max:
            dense_max, expert_max = d, e
    dp_span = layout.world_size // pp
    dp_exposed = c.dp_exposed_fraction if workload.framework == "slime" else c.megatron_dp_exposed_fraction
    breakdown["dp_comm"] = dp_exposed * (
        rates.collective("reduce_scatter", dense_max * 4, dp * cp, dp_span)      # fp32 grads
        + rates.collective("all_gather", dense_max * 2, dp * cp, dp_span)        # bf16 params
        + rates.collective("reduce_scatter", expert_max * 4, layout.edp, dp_span)
        + rates.collective("all_gather", expert_max * 2, layout.edp, dp_span))
    sharded = dense_max / (dp * cp) + expert_max / layout.edp
    hbm = rates.hbm
    f = layout.optimizer_offload_fraction
    breakdown["optimizer"] = (sharded * (1 - f) * ADAM_BYTES_PER_PARAM + (dense_max + expert_max) * 4) / hbm
    offload = 0.0
    pcie = rates.pcie
    if f > 0:
        cpu = f * sharded / rates.cpu_adam
        transfer = f * sharded * 8 / pcie  # fp32 grads down, fp32 params up
        offload = max(cpu, transfer) if layout.overlap_d2h_h2d else cpu + transfer
    breakdown["offload"] = offload
    if workload.framework == "slime":
        # slime backs up the bf16 weights to host memory after every train call.
        backup = (dense_max + expert_max) * BACKUP_BYTES_PER_PARAM / pcie
        breakdown["step_overhead"] = c.step_overhead_s + backup
    else:
        breakdown["step_overhead"] = c.megatron_step_overhead_s
    breakdown = {k: breakdown.get(k, 0.0) for k in TERMS}
    step_time = sum(breakdown.values())

    # Memory per rank; the peak is the most-loaded rank.
    in_flight = in_flight_microbatches(layout, n_mb)
    buffers = buffer_bytes(layout, c)
    best = None
    for i, r in enumerate(ranks):
        weights, grads, optimizer = static_memory(r, layout, precision_aware_optimizer)
        saved, working = activation_bytes_per_microbatch(r, model, layout, tokens, routed_rows_per_token)
        in_flight_rank = in_flight if i == 0 else max(1.0, in_flight * (pp - i) / pp)
        acts = saved * in_flight_rank + working
        if r.has_head:
            acts += logits_bytes(model, layout, tokens)
        if workload.precision == "fp8":
            acts *= c.fp8_activation_factor
        acts *= c.fragmentation
        mem = MemoryBreakdown(weights / GIB, grads / GIB, optimizer / GIB, acts / GIB, buffers / GIB)
        if best is None or mem.total > best.total:
            best = mem

    gpus_on_node = min(layout.world_size, gpu.gpus_per_node)
    backup_bytes = (dense_max + expert_max) * BACKUP_BYTES_PER_PARAM if workload.framework == "slime" else 0.0
    host_per_gpu = c.host_base_gib_per_gpu * GIB + backup_bytes + f * sharded * HOST_BYTES_PER_OFFLOADED_PARAM
    host = gpus_on_node * host_per_gpu / GIB

    capacity = gpu.memory_gib * c.usable_memory_fraction
    reasons = []
    if best.total > capacity:
        reasons.append(f"GPU memory {best.total:.1f} GiB exceeds {capacity:.1f} GiB usable of {gpu.display_name} "
                       f"(weights {best.weights:.1f}, grads {best.grads:.1f}, optimizer {best.optimizer:.1f}, "
                       f"activations {best.activations:.1f}, buffers {best.buffers:.1f})")
    if host > gpu.host_memory_gib_per_node:
        reasons.append(f"host memory {host:.0f} GiB per node exceeds the node's {gpu.host_memory_gib_per_node:.0f} GiB")

    tokens_per_s_per_gpu = workload.tokens_per_step / step_time / layout.world_size
    mfu = model_flops_utilisation(model.params.active_non_embedding, tokens_per_s_per_gpu,
                                  gpu.peak_tflops(workload.precision))
    usd = usd_per_million_tokens(gpu.usd_per_gpu_hour, tokens_per_s_per_gpu)
    return Prediction(
        fits=not reasons, reasons=tuple(reasons), memory=best, gpu_memory_gib=capacity,
        host_memory_gib_per_node=host, host_memory_capacity_gib=gpu.host_memory_gib_per_node,
        step_time_s=step_time, breakdown=breakdown, tokens_per_s_per_gpu=tokens_per_s_per_gpu, mfu=mfu,
        usd_per_million_tokens=usd, num_microbatches=n_mb, tokens_per_microbatch=tokens,
        source=f"attune cost model {c.version}, {gpu.display_name} {rates.source}",
    )
