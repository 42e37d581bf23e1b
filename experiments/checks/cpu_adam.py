"""The profile's CPU Adam section: the optimizer step rate on the host (what CPU offload runs at)."""
from __future__ import annotations

import statistics
import time

from experiments.checks.measure import load_torch, sig

ADAM_NUMEL = 64 * 2 ** 20
ADAM_TENSORS = 16


def measure_cpu_adam(repeats: int, numel: int = ADAM_NUMEL, tensors: int = ADAM_TENSORS) -> dict:
    """torch.optim.Adam(foreach=True) steps on `numel` fp32 CPU parameters: params/s."""
    torch = load_torch()
    params = [torch.nn.Parameter(torch.randn(numel // tensors)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(params, lr=1e-4, foreach=True)
    opt.step()  # allocates the moments
    times = []
    for _ in range(max(3, min(repeats, 5))):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    total = tensors * (numel // tensors)
    return dict(params_per_s=sig(total / statistics.median(times)), threads=torch.get_num_threads())
