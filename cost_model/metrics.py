"""The leaderboard's derived figures, each defined once (shared/reference/recipe-format.md)."""
from __future__ import annotations


def mfu(active_params: int, tokens_per_s_per_gpu: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: 6 x active parameters x tokens/s per GPU over the GPU's dense peak."""
    return 6 * active_params * tokens_per_s_per_gpu / (peak_tflops * 1e12)


def usd_per_million_tokens(usd_per_gpu_hour: float, tokens_per_s_per_gpu: float) -> float | None:
    """Dollars per million trained tokens at the GPU's hourly price (None when nothing was trained)."""
    if not tokens_per_s_per_gpu or tokens_per_s_per_gpu <= 0:
        return None
    return usd_per_gpu_hour / (tokens_per_s_per_gpu * 3600) * 1e6


def gpu_hours(world_size: int, seconds: float) -> float:
    return world_size * seconds / 3600
