"""GPU catalog: peaks, memory, interconnect and price per GPU type, each with its source."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from cost_model.nouns.user_file import parse_yaml
from cost_model.nouns.errors import AttuneError
from cost_model.nouns.names import shown_name


class HardwareError(AttuneError, ValueError):
    """Unknown GPU type or a malformed GPU entry."""


@dataclass(frozen=True)
class GpuSpec:
    name: str                      # catalog key: h100, h200, b200, gb200
    display_name: str
    variant: str
    bf16_tflops: float             # dense peak
    fp8_tflops: float
    memory_gb: float               # marketed HBM size (recipes' gpu.memory_gb)
    memory_gib: float              # usable HBM as torch reports it
    hbm_tb_s: float
    nvlink_domain: int             # GPUs in one NVLink domain
    nvlink_gb_s: float             # per GPU, per direction
    internode_gb_s: float          # per GPU, per direction, outside the NVLink domain
    pcie_gb_s: float               # host <-> GPU, per direction
    host_memory_gib_per_node: float
    gpus_per_node: int
    usd_per_gpu_hour: float
    instance: str
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def peak_tflops(self, precision: str) -> float:
        return self.fp8_tflops if precision == "fp8" else self.bf16_tflops

    def with_price(self, usd_per_gpu_hour: float | None) -> "GpuSpec":
        if usd_per_gpu_hour is None:
            return self
        if not math.isfinite(usd_per_gpu_hour) or usd_per_gpu_hour <= 0:
            raise HardwareError(f"--usd-per-gpu-hour must be a positive finite number, got {usd_per_gpu_hour}")
        sources = dict(self.sources, usd_per_gpu_hour="given by the user")
        return dataclasses.replace(self, usd_per_gpu_hour=usd_per_gpu_hour, sources=sources)


@lru_cache(maxsize=1)
def _catalog() -> dict:
    text = resources.files("cost_model").joinpath("catalog/gpus.yaml").read_text()
    return parse_yaml(text, "cost_model/catalog/gpus.yaml", HardwareError, shipped=True)


def gpu_names() -> list[str]:
    return sorted(_catalog())


def load_gpu(name: str) -> GpuSpec:
    entries = _catalog()
    if not isinstance(name, str):   # a recipe's or a batch line's gpu field may hold anything
        raise HardwareError(f"GPU type must be a string, got {type(name).__name__}; known: {', '.join(sorted(entries))}")
    key = name.strip().lower()
    if key not in entries:
        raise HardwareError(f"unknown GPU {shown_name(name)}; known: {', '.join(sorted(entries))}")
    entry = dict(entries[key], sources=dict(entries[key].get("sources", {})))  # callers must not share the cache
    return GpuSpec(name=key, **entry)


def all_gpus() -> list[GpuSpec]:
    return [load_gpu(n) for n in gpu_names()]


def node_placement(gpu: GpuSpec, world_size: int) -> tuple[int, int]:
    """(nodes, GPUs on each) as slime places `world_size` GPUs: the fewest nodes that hold them, the same number on
    each (--actor-num-nodes x --actor-num-gpus-per-node). HardwareError where they do not split evenly."""
    nodes = -(-world_size // gpu.gpus_per_node)
    if world_size % nodes:
        near = sorted((n for n in range(max(1, world_size - 16), world_size + 17)
                       if n % -(-n // gpu.gpus_per_node) == 0), key=lambda n: (abs(n - world_size), n))[:4]
        raise HardwareError(f"{world_size} {gpu.display_name} GPUs ({gpu.gpus_per_node} a node) do not split evenly "
                            f"over {nodes} nodes: slime runs the same number of GPUs on each node; "
                            f"{', '.join(map(str, sorted(near)))} GPUs do")
    return nodes, world_size // nodes


def placed(gpu: GpuSpec, world_size: int) -> GpuSpec:
    """`gpu` as `world_size` of them are placed (node_placement): where a node holds fewer than it can (12 x H200 is
    2 nodes of 6), its GPUs a node and, where NVLink spans one node, its NVLink domain are the placement's: a group
    of 8 consecutive ranks then crosses nodes. Otherwise `gpu` itself."""
    if world_size <= gpu.gpus_per_node or world_size % gpu.gpus_per_node == 0:
        return gpu   # itself: the cost model's memos key on its identity
    return _fewer_a_node(gpu, node_placement(gpu, world_size)[1])


@lru_cache(maxsize=256)
def _fewer_a_node(gpu: GpuSpec, per_node: int) -> GpuSpec:
    """One object per (GPU, GPUs a node): the cost model's memos key on it."""
    domain = per_node if gpu.nvlink_domain == gpu.gpus_per_node else gpu.nvlink_domain
    return dataclasses.replace(gpu, gpus_per_node=per_node, nvlink_domain=domain)
