"""The cost model's free constants, read from data/constants.yaml with their provenance."""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources

from cost_model.nouns.user_file import parse_yaml


@dataclass(frozen=True)
class Constants:
    version: str
    gemm_max_efficiency: float
    gemm_half_m: float
    gemm_half_nk: float
    grouped_gemm_max_efficiency: float
    grouped_gemm_half_rows: float
    attention_efficiency: float
    linear_attention_efficiency: float
    hbm_efficiency: float
    elementwise_bytes_per_token_per_layer_h: float
    permute_passes: float
    collective_latency_s: float
    nvlink_bus_efficiency: float
    internode_bus_efficiency: float
    deepep_traffic_dedup: float
    routing_imbalance_natural: float
    cp_exposed_fraction: float
    dp_exposed_fraction: float
    megatron_dp_exposed_fraction: float
    pcie_efficiency: float
    cpu_adam_params_per_s_per_gpu: float
    cpu_adam_share_of_profile: float
    layer_launch_overhead_s: float
    expert_gemm_call_s: float
    flex_overhead_factor: float
    step_overhead_s: float
    megatron_layer_launch_overhead_s: float
    megatron_step_overhead_s: float
    pipeline_chunk_overhead_s: float
    cuda_context_gib: float
    nccl_init_gib_per_communicator: float
    nccl_buffers_gib_per_communicator: float
    deepep_buffers_gib: float
    allocator_reserve_fraction: float
    allocator_gap_dense_gib: float
    allocator_gap_moe_gib: float
    allocator_gap_per_dispatched_gib: float
    allocator_remap_s_per_gib: float
    fp8_activation_factor: float
    unfused_activation_factor: float
    unfused_moe_activation_factor: float
    unfused_glu_backward_tensors: float
    unfused_dense_glu_backward_tensors: float
    unfused_moe_act_recompute_tensors: float
    prediction_error_sd: float
    runner_prediction_error_sd: float
    runner_scaled_layer_error_sd: float
    runner_modelled_layer_error_sd: float
    runner_cross_kind_layer_error_sd: float
    runner_multi_gpu_error_sd: float
    runner_host_crossing_error_sd: float
    runner_host_cpu_error_sd: float
    runner_host_launch_error_sd: float
    runner_scaled_work_exponent: float
    runner_scaled_linear_work_exponent: float
    runner_host_overlap_exponent: float
    runner_gdn_kernels_gib: float
    prediction_error_sd_lora_vlm: float
    memory_error_sd: float
    host_base_gib_per_gpu: float

    @classmethod
    def from_mapping(cls, data: dict) -> "Constants":
        values = {k: v["value"] if isinstance(v, dict) else v for k, v in data["constants"].items()}
        names = {f.name for f in fields(cls)} - {"version"}
        missing, unknown = names - set(values), set(values) - names
        if missing or unknown:
            raise ValueError(f"constants file: missing {sorted(missing)}, unknown {sorted(unknown)}")
        return cls(version=str(data["version"]), **{k: float(v) for k, v in values.items()})


@lru_cache(maxsize=1)
def _shipped_data() -> dict:
    """constants.yaml parsed once (values and their sources)."""
    return parse_yaml(constants_text(), "cost_model/data/constants.yaml", ValueError, shipped=True)


@lru_cache(maxsize=1)
def default_constants() -> Constants:
    return Constants.from_mapping(_shipped_data())


def constants_text() -> str:
    return resources.files("cost_model").joinpath("data/constants.yaml").read_text()


def constants_sources() -> dict[str, str]:
    return {k: v.get("source", "") for k, v in _shipped_data()["constants"].items() if isinstance(v, dict)}
