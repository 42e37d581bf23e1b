"""Device check: what the caching allocator pays to give back its cache and map it again (expandable segments).

A layout at the memory limit can run with the allocator retrying every micro-batch (benchmarks/runner_accuracy.py
names such runs): each retry releases the cache's pages and the next allocations map them again. This times
`torch.cuda.empty_cache()` over mapped-but-free memory and the allocations that map it back, per GiB.
Run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (benchmarks/device/session_env.sh sets it).
"""
import time

import torch

GIB = 2 ** 30


def main() -> None:
    for n, size in ((1, 40), (20, 2)):
        blocks = [torch.empty(size * GIB, dtype=torch.uint8, device="cuda") for _ in range(n)]
        del blocks
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            blocks = [torch.empty(size * GIB, dtype=torch.uint8, device="cuda") for _ in range(n)]
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            del blocks
            print(f"{n} x {size} GiB: release {1e3 * (t1 - t0) / (n * size):.2f} ms/GiB, "
                  f"map {1e3 * (t2 - t1) / (n * size):.2f} ms/GiB")


if __name__ == "__main__":
    main()
