"""The leaderboard's derived figures, each defined once (shared/reference/recipe-format.md)."""
from __future__ import annotations

from fractions import Fraction


def mfu(active_params: int, tokens_per_s_per_gpu: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: 6 x active parameters x tokens/s per GPU over the GPU's dense peak."""
    return 6 * active_params * tokens_per_s_per_gpu / (peak_tflops * 1e12)


# The format's MFU divides by the dense bf16 peak whatever the run's precision (recipe-format.md: "/ 989 TFLOP/s
# (dense bf16 peak of H100/H200)"), so that an fp8 recipe's MFU is comparable with a bf16 one's.
MFU_PEAK_PRECISION = "bf16"

# A frozen base (LoRA) runs its GEMMs forward and for the input gradient only, no weight-gradient GEMMs: about
# 4 x N FLOPs a token of the 6 x N the format counts.
FROZEN_BASE_FLOPS_PER_PARAM = 4
PEFT_NAMES = {"lora": "LoRA"}


def format_peak_tflops(gpu) -> float:
    """The denominator of the format's MFU: the GPU's dense bf16 peak (a GpuSpec's), for any precision."""
    return gpu.peak_tflops(MFU_PEAK_PRECISION)


def format_mfu(active_params: int, tokens_per_s_per_gpu: float, gpu) -> float:
    """The format's MFU: 6 x active parameters x tokens/s per GPU over the GPU's dense bf16 peak."""
    return mfu(active_params, tokens_per_s_per_gpu, format_peak_tflops(gpu))


def mfu_counting(gpu, workload, value: float | None) -> str:
    """What an MFU of `value` (the format's: 6N over the dense bf16 peak) counts, for a run of `workload` on `gpu`:
    the peak it divides by, and for fp8 or a frozen base (LoRA) what the same work is against the fp8 peak, or
    what the model itself computes. No figure but `value` itself and ratios of the catalog's peaks."""
    bf16 = format_peak_tflops(gpu)
    text = f"{bf16:g} TFLOP/s ({gpu.display_name} dense bf16 peak, the format's MFU for any precision)"
    if workload.precision != MFU_PEAK_PRECISION:
        peak = gpu.peak_tflops(workload.precision)
        share = f" ({value * bf16 / peak:.1%})" if value is not None else ""
        text += (f"; the run's GEMMs are {workload.precision}: against the dense {workload.precision} peak "
                 f"({peak:g} TFLOP/s) the same work is {bf16 / peak:.2g} of this figure{share}")
    if workload.frozen_weights:
        ratio = Fraction(FROZEN_BASE_FLOPS_PER_PARAM, 6)
        share = f" ({value * float(ratio):.1%})" if value is not None else ""
        text += (f"; {PEFT_NAMES.get(workload.peft, workload.peft)} freezes the base: it computes about "
                 f"{FROZEN_BASE_FLOPS_PER_PARAM} x N FLOPs a token (forward and input gradient, no weight "
                 f"gradients), so the model's own utilisation is about {ratio} of this figure{share}")
    return text


def usd_per_million_tokens(usd_per_gpu_hour: float, tokens_per_s_per_gpu: float) -> float | None:
    """Dollars per million trained tokens at the GPU's hourly price (None when nothing was trained)."""
    if not tokens_per_s_per_gpu or tokens_per_s_per_gpu <= 0:
        return None
    return usd_per_gpu_hour / (tokens_per_s_per_gpu * 3600) * 1e6


def gpu_hours(world_size: int, seconds: float) -> float:
    return world_size * seconds / 3600
