"""The GPU memory beyond the allocator's peak, and the capacity everything shares.

A layout fits when the allocator's peak (cost_model.memory) plus the allocator's reserve plus what the
process holds outside PyTorch's allocator is at most the device's visible capacity:

- usable: the capacity torch.cuda.mem_get_info reports at start (the profile's `device_memory.visible_gib`;
  without it the catalog's memory_gib, which is what torch reports on the catalog's machine);
- allocator reserve: with expandable segments the caching allocator needs little beyond its allocated
  peak when memory is short (at the limit it gives back its cache and retries): the fraction `tune
  profile` finds by capping the allocator under a training-like pattern. This decides the fit;
- allocator cache: with room to spare the allocator keeps more (the gap between its reserved and allocated
  peaks, cost_model.memory.allocator_gap_gib, measured on real runs: `tune profile`'s synthetic pattern
  leaves 7.4% of the allocated peak reserved, the runner's dense runs 0.3 GiB), up to what the card has
  left: part of the device-level peak a run shows, never of what it needs;
- outside PyTorch: the CUDA context with cuBLAS/cuDNN workspaces and loaded kernels; the NCCL
  communicators (one per process group megatron builds when they are created eagerly, each with base
  memory at creation and channel/peer buffers on its first collectives; a single-rank communicator
  allocates a 512 MiB shared buffer then, NCCL issue #2363); DeepEP's buffers for the flex dispatcher.

Each figure comes from the hardware profile where `tune profile` measured it (with how and when), else
from the documented fallback in constants.yaml; `Overheads.sources` says which. Pure: no I/O.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from operator import attrgetter

from cost_model.memo import IdentityMemo
from cost_model.constants import Constants
from cost_model.nouns.errors import AttuneError
from cost_model.nouns.names import shown
from cost_model.nouns.hardware import GpuSpec
from cost_model.nouns.layout import Layout
from cost_model.nouns.runtime import Runtime, communicators


class DeviceMemoryError(AttuneError, ValueError):
    """A profile's device_memory section that is malformed."""


@dataclass(frozen=True)
class NcclMemory:
    """One measured communicator size: GiB per communicator at creation and added by its first collectives."""

    ranks: int
    init_gib: float
    buffers_gib: float


@dataclass(frozen=True)
class DeviceMemory:
    """The profile's device_memory section (None: not measured there)."""

    visible_gib: float | None = None
    context_gib: float | None = None            # CUDA context + cuBLAS/cuDNN workspaces + loaded kernels
    nccl: tuple[NcclMemory, ...] = ()
    reserve_fraction: float | None = None       # slack over the allocated peak the allocator needs when capped
    cache_fraction: float | None = None         # free-running reserved peak / allocated peak - 1, under tune profile's
                                                # synthetic pattern: recorded and checked, not priced (the expected
                                                # device peak takes the gap of real runs, memory.allocator_gap_gib)
    deepep_gib: float | None = None
    runner_outside: tuple[tuple[int, float], ...] = ()   # (GPUs, GiB) the megatron runner held outside PyTorch
    runner_without_gdn: bool = False            # the probe ran with its Gated DeltaNet layers replaced (no fla kernels)
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def runner_outside_at(self, gpus: int) -> float | None:
        """The runner probe's figure for `gpus` GPUs (the nearest measured GPU count), or None."""
        if not self.runner_outside:
            return None
        return min(self.runner_outside, key=lambda r: (abs(math.log2(r[0]) - math.log2(gpus)), -r[0]))[1]

    def nccl_at(self, ranks: int) -> NcclMemory | None:
        """The measured entry for a communicator of `ranks` ranks: single-rank ones apart (they allocate
        differently), otherwise the multi-rank entry nearest in log2 size."""
        pool = [n for n in self.nccl if (n.ranks == 1) == (ranks == 1)]
        if not pool:
            return None
        return min(pool, key=lambda n: (abs(math.log2(n.ranks) - math.log2(ranks)), -n.ranks))


def _count(value, what: str, origin: str) -> int:
    """A positive whole number of ranks or GPUs (sizes are compared in log2)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DeviceMemoryError(f"{origin}: device_memory.{what} must be a positive whole number, got a "
                                f"{type(value).__name__}")
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise DeviceMemoryError(f"{origin}: device_memory.{what} must be a positive whole number, got {shown(value)}")
    return int(value)


def _gib(value, what: str, origin: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise DeviceMemoryError(f"{origin}: device_memory.{what} must be a number, got {shown(value)}") from None
    if not math.isfinite(x) or x < 0:
        raise DeviceMemoryError(f"{origin}: device_memory.{what} must be a non-negative number, got {shown(value)}")
    return x


def parse_device_memory(data: dict | None, origin: str = "profile") -> DeviceMemory | None:
    """The profile's `device_memory` mapping (as `tune profile` writes it) as a DeviceMemory."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise DeviceMemoryError(f"{origin}: device_memory must be a mapping")
    how = str(data.get("provenance") or data.get("how") or "measured")
    when = str(data.get("date") or "")
    basis = f"{how}{' (' + when + ')' if when else ''}"
    sources, kw = {}, {}
    for key, part in (("visible_gib", "usable"), ("context_gib", "cuda_context"), ("deepep_gib", "deepep")):
        if data.get(key) is not None:
            kw[key] = _gib(data[key], key, origin)
            sources[part] = f"profile device_memory.{key}: {basis}"
    reserve = data.get("allocator_reserve") or {}
    if reserve.get("fraction") is not None:
        kw["reserve_fraction"] = _gib(reserve["fraction"], "allocator_reserve.fraction", origin)
        sources["allocator_reserve"] = f"profile device_memory.allocator_reserve.fraction: {basis}"
    if reserve.get("unconstrained_fraction") is not None:
        kw["cache_fraction"] = _gib(reserve["unconstrained_fraction"], "allocator_reserve.unconstrained_fraction",
                                    origin)
    nccl = []
    for row in data.get("nccl") or []:
        if not isinstance(row, dict) or "ranks" not in row:
            raise DeviceMemoryError(f"{origin}: device_memory.nccl rows need ranks, init_gib, buffers_gib")
        nccl.append(NcclMemory(_count(row["ranks"], "nccl.ranks", origin),
                               _gib(row.get("init_gib", 0), "nccl.init_gib", origin),
                               _gib(row.get("buffers_gib", 0), "nccl.buffers_gib", origin)))
    if nccl:
        sources["nccl"] = f"profile device_memory.nccl: {basis}"
    rows = [r for r in data.get("runner_outside") or [] if isinstance(r, dict) and r.get("outside_gib") is not None]
    runner = tuple((_count(r.get("gpus"), "runner_outside.gpus", origin),
                    _gib(r["outside_gib"], "runner_outside.outside_gib", origin)) for r in rows)
    without_gdn = bool(rows) and all(r.get("without_gdn") is True for r in rows)
    if runner:
        sources["runner_outside"] = (f"profile device_memory.runner_outside ({', '.join(f'{g} GPU(s): {x:g} GiB' for g, x in runner)}"
                                     f"{', its Gated DeltaNet layers replaced' if without_gdn else ''}): {basis}")
    return DeviceMemory(nccl=tuple(nccl), runner_outside=runner, runner_without_gdn=without_gdn, sources=sources,
                        **kw)


@dataclass(frozen=True)
class Overheads:
    """GiB one GPU holds beyond the allocator's peak, and the capacity; `sources` names each figure's origin."""

    allocator_reserve: float
    cuda_context: float
    nccl: float
    deepep: float
    usable: float
    communicators: int
    sources: dict = field(default_factory=dict, compare=False, hash=False)
    reserve_fraction: float = 0.0  # allocator_reserve over the allocated peak

    def at(self, allocated_gib: float) -> "Overheads":
        """The same overheads for another allocated peak (only the allocator's reserve follows it)."""
        return replace(self, allocator_reserve=allocated_gib * self.reserve_fraction)

    def reserve_and_cache(self, allocated_gib: float, gap_gib: float) -> tuple[float, float]:
        """(allocator_reserve, allocator_cache) at another allocated peak, where the allocator would hold
        `gap_gib` beyond its allocated peak with room to spare."""
        reserve = allocated_gib * self.reserve_fraction
        return reserve, self._cache(allocated_gib, reserve, gap_gib)

    @property
    def outside_pytorch(self) -> float:
        return self.cuda_context + self.nccl + self.deepep

    def allocator_cache(self, allocated_gib: float, gap_gib: float) -> float:
        """GiB the allocator keeps beyond its reserve when the card has room: `gap_gib` over the allocated
        peak in all, but never past the usable capacity (then it gives the cache back)."""
        return self._cache(allocated_gib, self.allocator_reserve, gap_gib)

    def _cache(self, allocated_gib: float, reserve: float, gap_gib: float) -> float:
        room = self.usable - (allocated_gib + reserve + self.outside_pytorch)
        return max(0.0, min(gap_gib - reserve, room))


def nccl_gib(created: tuple, used: tuple, dev: DeviceMemory | None, c: Constants) -> float:
    """GiB of NCCL communicators: base memory for every one created, buffers for every one used."""
    def per(ranks: int) -> NcclMemory:
        measured = dev.nccl_at(ranks) if dev is not None else None
        return measured or NcclMemory(ranks, c.nccl_init_gib_per_communicator, c.nccl_buffers_gib_per_communicator)
    return sum(per(size).init_gib for _, size in created) + sum(per(size).buffers_gib for _, size in used)


# Scoring a space asks for the same communicators thousands of times: the overheads depend on the layout only
# through its process groups and dispatcher (the allocator's reserve follows the allocated peak: `Overheads.at`).
_GROUP_FIELDS = ("tp", "pp", "cp", "ep", "etp", "dp", "edp", "world_size", "dispatcher")
_group_fields = attrgetter(*_GROUP_FIELDS)   # a tuple of them, read in C (a memo key per call)
_MEMO = IdentityMemo(50_000)


def overheads(layout: Layout, runtime: Runtime, is_moe: bool, allocated_gib: float, gpu: GpuSpec,
              dev: DeviceMemory | None, c: Constants, has_gdn: bool = False) -> Overheads:
    """What one GPU of `layout` holds beyond `allocated_gib` (the allocator's peak), under `runtime`; `has_gdn`:
    the model has Gated DeltaNet layers (their kernels' modules, where the runner probe ran without them).
    Memoized on its inputs (the objects by identity, held by the memo so their identity stays theirs)."""
    key = (_group_fields(layout), id(runtime), is_moe, has_gdn, id(gpu), id(dev), id(c))
    hit = _MEMO.get(key) or _MEMO.put(key, (runtime, gpu, dev, c),
                                      _overheads(layout, runtime, is_moe, gpu, dev, c, has_gdn))
    # at no allocated peak the memo's own object (built at 0) is the answer: no copy
    return hit[1] if allocated_gib == 0.0 else hit[1].at(allocated_gib)


def _overheads(layout: Layout, runtime: Runtime, is_moe: bool, gpu: GpuSpec, dev: DeviceMemory | None,
               c: Constants, has_gdn: bool = False) -> Overheads:
    allocated_gib = 0.0   # the reserve is set by `Overheads.at`
    dev = dev or DeviceMemory()
    src = dict(dev.sources)
    fallback = "constants.yaml (no measured figure in the profile)"
    created, used = communicators(layout, runtime, is_moe)
    reserve = dev.reserve_fraction if dev.reserve_fraction is not None else c.allocator_reserve_fraction
    deepep = 0.0
    if layout.dispatcher == "flex":
        deepep = dev.deepep_gib if dev.deepep_gib is not None else c.deepep_buffers_gib
    else:
        src.pop("deepep", None)
    context = dev.context_gib if dev.context_gib is not None else c.cuda_context_gib
    usable = dev.visible_gib if dev.visible_gib is not None else gpu.memory_gib
    src["allocator_cache"] = ("constants.yaml allocator_gap_*: the reserved - allocated gap of the megatron runner's "
                              "in-sample H200 grids (benchmarks/allocator_gap_fit.py)")
    for part in ("allocator_reserve", "cuda_context", "nccl") + (("deepep",) if deepep else ()):
        src.setdefault(part, fallback)
    src.setdefault("usable", f"GPU catalog memory_gib ({gpu.sources.get('memory_gib', 'catalog')})")
    unmeasured = sorted({size for _, size in created if dev.nccl_at(size) is None})
    if unmeasured and "profile" in src["nccl"]:
        src["nccl"] += f"; communicators of {', '.join(map(str, unmeasured))} ranks not measured there: {fallback}"
    src["nccl"] = (f"{src['nccl']}; {len(created)} communicators ({runtime.nccl_init} init), "
                   f"{len(used)} with buffers ({runtime.name})")
    nccl = nccl_gib(created, used, dev, c)
    runner = dev.runner_outside_at(layout.world_size) if runtime.profiled else None
    runner_src = src.pop("runner_outside", None)
    if runner is not None and has_gdn and dev.runner_without_gdn:
        runner += c.runner_gdn_kernels_gib
        runner_src += (f"; + {c.runner_gdn_kernels_gib:g} GiB for the Gated DeltaNet kernels it did not load "
                       "(constants.yaml runner_gdn_kernels_gib, measured on the runner grids)")
    exact = any(g == layout.world_size for g, _ in dev.runner_outside)
    if runner is not None and (exact or runner > context + nccl):
        # Measured on the runner itself at this GPU count, the whole is better than the sum of its parts
        # (which count every communicator megatron creates at its multi-rank fallback size); at another
        # count it is a floor: the parts miss what a real step holds (kernels it loads, buffers it uses).
        how = "measured at this GPU count" if exact else "floor from the nearest measured GPU count"
        src["cuda_context"] += (f"; CUDA context with NCCL set to {runner:.2f} GiB, what the megatron runner held "
                                f"outside PyTorch ({how}), {runner_src}")
        if runner >= nccl:
            context = runner - nccl
        else:
            # the modelled communicators alone exceed the measured whole: split the whole in the modelled proportion
            share = runner / (context + nccl)
            context, nccl = context * share, nccl * share
            src["nccl"] += f"; scaled by {share:.2f} to fit the measured whole outside PyTorch"
    return Overheads(allocator_reserve=allocated_gib * reserve, cuda_context=context, nccl=nccl, deepep=deepep,
                     usable=usable, communicators=len(created), sources=src,
                     reserve_fraction=reserve)
