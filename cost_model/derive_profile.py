"""A profile for a GPU nobody measured here, scaled from a measured one by datasheet ratios.

Compute rates scale by dense peak, HBM by memory bandwidth, NVLink collectives by NVLink bandwidth,
host transfers by the host link; the shape of every curve (how efficiency grows with size) is the
measured GPU's. Every section says so, so no derived figure passes for a measurement.
"""
from __future__ import annotations

import copy

from cost_model.nouns.hardware import GpuSpec
from cost_model.profile import ProfileError


def derive_profile(measured: dict, source: GpuSpec, target: GpuSpec, calibrated: dict | None = None) -> dict:
    """A profile of `target` from the `measured` one of `source`, by datasheet ratios. `calibrated`: the runner
    builds' derivation the target's shipped profile carries, fitted to builds measured on the target (the H100's:
    benchmarks/derivation_check.py); where it has a calibration it prices the builds instead of the datasheet ratios
    (which that check judged and failed), so a derived profile prices the runner as the shipped one does."""
    if measured.get("provenance") != "measured":   # a user error (--from names a derived profile): one line
        raise ProfileError(f"the {source.name} profile is {measured.get('provenance')!r}, not measured: derive a "
                           f"profile from a measured one (--from a GPU whose shipped profile was measured)")
    bf16 = target.bf16_tflops / source.bf16_tflops
    fp8 = target.fp8_tflops / source.fp8_tflops
    hbm = target.hbm_tb_s / source.hbm_tb_s
    nvlink = target.nvlink_gb_s / source.nvlink_gb_s
    host = target.pcie_gb_s / source.pcie_gb_s
    basis = (f"derived from the measured {source.display_name} profile ({measured.get('date')}, "
             f"{measured.get('device')}) by datasheet ratios of {target.display_name} to {source.display_name}")
    out = copy.deepcopy(measured)
    out.update(gpu_type=target.name, provenance="derived", device=f"{target.display_name} (derived)",
               source=basis, driver=None, wall_time_s=None)
    for p in out["gemm_bf16"]:
        p["tflops"] = round(p["tflops"] * bf16, 1)
    for p in out.get("gemm_fp8") or []:
        p["tflops"] = round(p["tflops"] * fp8, 1)
    for p in out["grouped_gemm_bf16"]:
        p["fwd_tflops"] = round(p["fwd_tflops"] * bf16, 1)
        p["fwd_bwd_tflops"] = round(p["fwd_bwd_tflops"] * bf16, 1)
    for p in out["attention_bf16"]:
        p["fwd_tflops"] = round(p["fwd_tflops"] * bf16, 1)
        p["fwd_bwd_tflops"] = round(p["fwd_bwd_tflops"] * bf16, 1)
    mem = out["memory"]
    mem["hbm_copy_tb_s"] = round(mem["hbm_copy_tb_s"] * hbm, 3)
    for key in ("h2d_gb_s", "d2h_gb_s", "h2d_256mib_gb_s", "d2h_256mib_gb_s"):
        if mem.get(key) is not None:
            mem[key] = round(mem[key] * host, 2)
    _derive_linear_and_device(out, bf16, target)
    if out.get("runner_components"):
        # the builds stay as measured on the source; the parser prices them here (runner_components.Derivation)
        out["runner_components"]["derived"] = (dict(calibrated) if calibrated and calibrated.get("calibration") else
                                               {"compute": round(bf16, 4), "hbm": round(hbm, 4), "basis": basis})
    for c in out.get("collectives") or []:
        c["busbw_gb_s"] = round(c["busbw_gb_s"] * nvlink, 2)
        c["algbw_gb_s"] = round(c.get("algbw_gb_s", 0) * nvlink, 2)
        c["time_us"] = round(c["time_us"] / nvlink, 2)
    out["derivation"] = {
        "compute": f"x {bf16:.3f} (dense bf16 {target.bf16_tflops:g} / {source.bf16_tflops:g} TFLOP/s); fp8 x {fp8:.3f}",
        "hbm": f"x {hbm:.3f} ({target.hbm_tb_s:g} / {source.hbm_tb_s:g} TB/s)",
        "collectives": f"x {nvlink:.3f} (NVLink {target.nvlink_gb_s:g} / {source.nvlink_gb_s:g} GB/s per direction)",
        "host_transfers": f"x {host:.3f} (host link {target.pcie_gb_s:g} / {source.pcie_gb_s:g} GB/s)",
        "cpu_adam": "unchanged (the host CPU is not modelled per GPU type)",
        "runner_components": "the source's measured builds, priced at the compute ratio for their modelled GEMM, "
                             "attention and delta-rule work and at the HBM ratio for the rest of their GPU time; "
                             "the host's launch time and the CPU optimizer unchanged",
        "linear_attention": f"measured kernel times / {bf16:.3f} (the dense bf16 ratio)",
        "device_memory": "the visible capacity dropped (the catalog's memory_gib stands in); the memory outside "
                         "the model's tensors (context, NCCL, allocator reserve) kept: it follows the software stack",
        "sources": "GPU catalog (cost_model/catalog/gpus.yaml), each figure with its datasheet source",
    }
    notes = list(out.get("notes") or [])
    notes.append(basis + "; not measured")
    out["notes"] = notes
    return out


def _derive_linear_and_device(out: dict, bf16: float, target: GpuSpec) -> None:
    """Measured Gated DeltaNet times scaled by the compute ratio; the device capacity is the target's."""
    linear = out.get("linear_attention") or {}
    for p in linear.get("points") or []:
        for key in ("fwd_ms", "fwd_bwd_ms"):
            if p.get(key) is not None:
                p[key] = round(p[key] / bf16, 4)
    if linear.get("points"):
        linear["source"] = f"derived for {target.display_name} from: {linear.get('source', 'a measured profile')}"
    device = out.get("device_memory")
    if isinstance(device, dict):
        device.pop("visible_gib", None)
        device["provenance"] = f"derived for {target.display_name} (capacity from the catalog): {device.get('provenance')}"
