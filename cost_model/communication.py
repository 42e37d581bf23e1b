"""Collectives of a training step: expert dispatch, pipeline sends, data-parallel gradient sync.

Each is latency plus bytes over the bus bandwidth of the link its group spans (`Rates.collective`);
the collectives inside one layer (TP all-gathers, the CP ring) are counted with the layer kind that
issues them (`cost_model.layer_time`).
"""
from __future__ import annotations

from cost_model.constants import Constants
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import ModelSpec
from cost_model.rates import Rates
from cost_model.nouns.units import BF16, FP32


def hidden_state_bytes(model: ModelSpec, tokens: float) -> float:
    """One bf16 hidden state of the local micro-batch, before sequence-parallel sharding."""
    return tokens * model.hidden_size * BF16


def expert_dispatch_time(token_bytes: float, k: int, ep: int, span: int, dispatcher: str, r: Rates,
                         c: Constants) -> float:
    """Seconds of one token dispatch (or combine) over the EP group; token_bytes = local tokens x hidden bytes.

    alltoall sends one copy per (token, expert); flex (DeepEP) one per destination rank inside a node
    and one per destination node across nodes. Across nodes, the NVLink and network parts run
    concurrently and the slower one sets the time.
    """
    domain = r.gpu.nvlink_domain
    if span <= domain:
        copies = k if dispatcher == "alltoall" else ep * (1 - (1 - 1 / ep) ** k) * c.deepep_traffic_dedup
        return r.collective("all_to_all", token_bytes * copies, ep, span)
    nodes = span // domain
    local = max(1, ep // nodes)
    if dispatcher == "alltoall":
        remote_copies = k * (ep - local) / ep
        local_copies = k * local / ep
    else:
        remote_copies = (nodes - 1) * (1 - (1 - 1 / nodes) ** k) * c.deepep_traffic_dedup
        local_copies = local * (1 - (1 - 1 / ep) ** k) * c.deepep_traffic_dedup
    # The local part is an all-to-all among the node's ranks of the group; the remote part goes out
    # over the node's network links.
    t_local = r.collective("all_to_all", token_bytes * local_copies, local, min(span, domain)) if local > 1 else 0.0
    t_remote = c.collective_latency_s + token_bytes * remote_copies / r.internode
    return max(t_local, t_remote)


def pipeline_p2p_time(model: ModelSpec, layout: Layout, r: Rates, tokens: float, num_microbatches: int) -> float:
    """Seconds of the step's activation and gradient sends between pipeline stages (one each way per
    micro-batch and virtual stage)."""
    if layout.pp == 1:
        return 0.0
    p2p_bytes = hidden_state_bytes(model, tokens) / layout.tp
    return num_microbatches * 2 * layout.vpp * r.collective("p2p", p2p_bytes, 2, layout.world_size)


def data_parallel_time(layout: Layout, r: Rates, c: Constants, framework: str, dense: float,
                       expert: float) -> float:
    """Exposed seconds of the distributed optimizer's gradient reduce-scatter and parameter all-gather,
    for `dense` parameters over DP x CP and `expert` parameters over expert-DP."""
    span = layout.world_size // layout.pp
    exposed = c.dp_exposed_fraction if framework == "slime" else c.megatron_dp_exposed_fraction
    dense_group = layout.dp * layout.cp
    return exposed * (
        r.collective("reduce_scatter", dense * FP32, dense_group, span)      # fp32 grads
        + r.collective("all_gather", dense * BF16, dense_group, span)        # bf16 params
        + r.collective("reduce_scatter", expert * FP32, layout.edp, span)
        + r.collective("all_gather", expert * BF16, layout.edp, span))
