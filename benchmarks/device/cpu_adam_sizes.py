"""CPU Adam rate by tensor size on this host: torch.optim.AdamW(fused=True), what megatron's HybridDeviceOptimizer
steps its CPU share with, over the same parameter count split into many small tensors or a few large ones (a dense
model's offloaded share is tensors of ~10^7-10^8 elements, a MoE model's the experts' stacked ~10^9).

    python benchmarks/device/cpu_adam_sizes.py [--threads 4] [--total 268435456]

Prints one JSON line per split: tensors, elements each, parameters per second; and the host's CPU count.
"""
from __future__ import annotations

import argparse
import json
import os
import time


def rate(total: int, tensors: int, threads: int, steps: int = 3) -> float:
    import torch
    torch.set_num_threads(threads)
    params = [torch.zeros(total // tensors, requires_grad=True) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
    for _ in range(2):   # first touch of the moments' pages before timing
        opt.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return total * steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--total", type=int, default=1 << 28)
    ap.add_argument("--splits", default="64,8,1")
    args = ap.parse_args()
    print(json.dumps({"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "threads": args.threads}))
    for n in (int(s) for s in args.splits.split(",")):
        r = rate(args.total, n, args.threads)
        print(json.dumps({"tensors": n, "elements_each": args.total // n, "params_per_s": round(r),
                          "ns_per_param": round(1e9 / r, 3)}), flush=True)


if __name__ == "__main__":
    main()
