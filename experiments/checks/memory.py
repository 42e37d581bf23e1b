"""The profile's memory section: pinned host <-> device copies (GB/s = 1e9 B/s) and the device-to-device (HBM)
copy rate, counting read + write (TB/s = 1e12 B/s)."""
from __future__ import annotations

from experiments.checks.measure import load_torch, median_time, sig

MEMORY_BYTES = (2 * 2 ** 30, 256 * 2 ** 20)


def measure_memory(device, repeats: int, sizes: tuple[int, int] = MEMORY_BYTES) -> dict:
    """Pinned H2D / D2H GB/s at sizes[0] and sizes[1] bytes; device copy TB/s (read + write) at sizes[0]."""
    torch = load_torch()
    big, small = sizes
    pin = device.type == "cuda"
    host = torch.empty(big, dtype=torch.uint8, pin_memory=pin)
    dev = torch.randint(0, 256, (big,), dtype=torch.uint8, device=device)
    dev2 = torch.empty_like(dev)
    host.copy_(dev)

    def gb_s(dst, src, nbytes):
        t = median_time(lambda: dst[:nbytes].copy_(src[:nbytes], non_blocking=True), device, repeats, warmup=2)
        return sig(nbytes / t / 1e9)

    out = dict(hbm_copy_tb_s=sig(gb_s(dev2, dev, big) * 2 / 1e3),
               h2d_gb_s=gb_s(dev, host, big), d2h_gb_s=gb_s(host, dev, big),
               h2d_256mib_gb_s=gb_s(dev, host, small), d2h_256mib_gb_s=gb_s(host, dev, small))
    del host, dev, dev2
    return out
