"""One rank's GPU memory: the allocator's peaks, the device-level peak, and an OOM message's figures.

The allocator's peak (torch.cuda.max_memory_allocated) is not what fills the card: the caching
allocator holds reserved segments beyond it (fragmentation), and the CUDA context, NCCL and cuBLAS
workspaces live outside it (8.8-9.4 GiB per H200 rank in OOMs on H200). The device-level peak is
the largest `total - free` (torch.cuda.mem_get_info) sampled after each training step: the reserved
segments the allocator keeps plus everything outside it.
"""
from __future__ import annotations

import re

GIB = 2**30
_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = r"([\d.]+)\s*(bytes|B|KiB|MiB|GiB|TiB)"
# PyTorch's CUDA OOM message (c10/cuda/CUDACachingAllocator.cpp), figure by figure.
OOM_FIGURES = {
    "tried_to_allocate_gib": r"Tried to allocate " + _SIZE,
    "total_capacity_gib": r"total capac\w* of " + _SIZE,
    "free_gib": r"of which " + _SIZE + r" is free",
    "process_in_use_gib": r"this process has " + _SIZE + r" memory in use",
    "allocated_by_pytorch_gib": _SIZE + r" is allocated by PyTorch",
    "reserved_unallocated_gib": _SIZE + r" is reserved by PyTorch but unallocated",
}


# The caching allocator's own counters (torch.cuda.memory_stats), read after each step: a layout near the
# limit can run with the allocator freeing its cache and retrying, or mapping and unmapping segments, every
# micro-batch; those counters say whether it did, where the step time alone cannot.
CHURN_COUNTERS = {"alloc_retries": "num_alloc_retries", "device_allocs": "num_device_alloc",
                  "device_frees": "num_device_free"}
CHURN_BYTES = {"reserved_gib_mapped": "reserved_bytes.all.allocated", "reserved_gib_released": "reserved_bytes.all.freed"}


class MemoryTracker:
    """The device-level peak of one rank: the largest `total - free` over its samples (GiB), and the
    largest part of it outside PyTorch's allocator (`total - free - memory_reserved`); and, step by step,
    how much the caching allocator retried, allocated, mapped and released (`churn`).

    `mem_get_info`, `memory_reserved` and `memory_stats` are torch.cuda's unless given (the CPU tests pass
    stand-ins; without a `memory_stats` stand-in no churn is kept)."""

    def __init__(self, mem_get_info=None, memory_reserved=None, memory_stats=None):
        self._mem_get_info, self._memory_reserved = mem_get_info, memory_reserved
        self._memory_stats = memory_stats if memory_stats is not None or mem_get_info is None else dict
        self.peak: float | None = None
        self.total: float | None = None
        self.outside: float | None = None
        self.samples: dict[str, float] = {}
        self._counters: list[dict[str, float]] = []

    def _read_counters(self) -> None:
        stats = self._memory_stats() or {}
        if not stats:
            return
        row = {k: float(stats.get(key, 0)) for k, key in CHURN_COUNTERS.items()}
        row.update({k: float(stats.get(key, 0)) / GIB for k, key in CHURN_BYTES.items()})
        self._counters.append(row)

    @property
    def churn(self) -> dict[str, list[float]]:
        """Per step after the first sample: each counter's increase (GiB for the mapped/released bytes)."""
        rows = self._counters
        return {k: [round(b[k] - a[k], 3) for a, b in zip(rows, rows[1:])] for k in (rows[0] if rows else {})}

    def sample(self, label: str | None = None) -> float:
        if self._mem_get_info is None or self._memory_reserved is None:
            import torch
            self._mem_get_info = self._mem_get_info or torch.cuda.mem_get_info
            self._memory_reserved = self._memory_reserved or torch.cuda.memory_reserved
            self._memory_stats = self._memory_stats or torch.cuda.memory_stats
        self._read_counters()
        free, total = self._mem_get_info()
        used = (total - free) / GIB
        outside = used - self._memory_reserved() / GIB
        self.total = total / GIB
        self.peak = used if self.peak is None else max(self.peak, used)
        self.outside = outside if self.outside is None else max(self.outside, outside)
        if label:
            self.samples[label] = used
        return used


def memory_report(after_build: float, after_optimizer: float, tracker: MemoryTracker | None,
                  max_allocated=None, max_reserved=None) -> dict:
    """One rank's memory figures in GiB (`max_allocated`/`max_reserved`: callables, torch.cuda's by default)."""
    if max_allocated is None or max_reserved is None:
        import torch
        max_allocated, max_reserved = torch.cuda.max_memory_allocated, torch.cuda.max_memory_reserved
    out = {"after_build": after_build, "after_optimizer": after_optimizer,
           "peak_allocated": max_allocated() / GIB, "peak_reserved": max_reserved() / GIB}
    if tracker is not None and tracker.peak is not None:
        out.update(device_peak=tracker.peak, device_total=tracker.total, outside_pytorch=tracker.outside)
        if "after_optimizer_first_step" in tracker.samples:
            out["device_after_optimizer_first_step"] = tracker.samples["after_optimizer_first_step"]
    return out


def churn_report(tracker: MemoryTracker | None) -> dict:
    """The allocator's work in each step from the second on (see CHURN_COUNTERS; the samples are after the build,
    after the optimizer, then after each step, and the first step maps the cache). Empty where the tracker kept no
    counters."""
    if tracker is None:
        return {}
    churn = tracker.churn
    return {k: v[2:] for k, v in churn.items() if len(v) > 2}


def failure_snapshot(tracker: MemoryTracker | None) -> dict:
    """What a rank can still say about its memory when a step failed (best effort: never raises)."""
    out = {}
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA")
        out.update(peak_allocated=torch.cuda.max_memory_allocated() / GIB,
                   peak_reserved=torch.cuda.max_memory_reserved() / GIB)
        free, total = torch.cuda.mem_get_info()
        out.update(device_used_at_failure=(total - free) / GIB, device_total=total / GIB)
    except Exception:  # noqa: BLE001 - no CUDA, or a broken context
        pass
    if tracker is not None and tracker.peak is not None:
        out["device_peak_before_failure"] = tracker.peak
    return {k: round(v, 3) for k, v in out.items()}


def parse_oom(message: str) -> dict:
    """The figures of PyTorch's CUDA out-of-memory message, in GiB, plus what follows from them:
    reserved by PyTorch (allocated + reserved but unallocated) and held outside PyTorch's allocator
    (this process's use minus PyTorch's reserved memory). Empty when the message has none."""
    out = {}
    for key, pattern in OOM_FIGURES.items():
        m = re.search(pattern, message)
        if m:
            out[key] = round(float(m.group(1)) * _UNITS[m.group(2)] / GIB, 3)
    if "allocated_by_pytorch_gib" in out and "reserved_unallocated_gib" in out:
        out["reserved_by_pytorch_gib"] = round(out["allocated_by_pytorch_gib"] + out["reserved_unallocated_gib"], 3)
        if "process_in_use_gib" in out:
            out["outside_pytorch_gib"] = round(out["process_in_use_gib"] - out["reserved_by_pytorch_gib"], 3)
    if "total_capacity_gib" in out and "free_gib" in out:
        out["device_used_gib"] = round(out["total_capacity_gib"] - out["free_gib"], 3)
    return out
