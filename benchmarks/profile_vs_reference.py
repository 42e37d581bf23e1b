"""Compare the shipped H200 profile with the figures in ../shared/reference/h200-measured.md.

The reference figures are single probe runs (its own words: "treat as leads"); this prints each
beside the profile's interpolated value and the relative difference.
"""
from __future__ import annotations

from cost_model.profile import shipped_profile

MIB = 2 ** 20
# (label, reference value, function of the profile)
POINTS = [
    ("bf16 GEMM 8192x8192x8192 TFLOP/s", 757, lambda p: p.gemm_tflops(8192, 8192, 8192)),
    ("bf16 GEMM 8192x2048x4096 TFLOP/s", 553, lambda p: p.gemm_tflops(8192, 4096, 2048)),
    ("bf16 GEMM 8192x2048x512 TFLOP/s", 315, lambda p: p.gemm_tflops(8192, 512, 2048)),
    ("bf16 GEMM 2048x2048x1024 TFLOP/s", 221, lambda p: p.gemm_tflops(2048, 1024, 2048)),
    ("HBM device copy TB/s", 4.19, lambda p: p.hbm_copy_tb_s),
    ("H2D pinned GB/s", 54.6, lambda p: p.h2d_gb_s),
    ("all-reduce busbw 16 MB GB/s", 128, lambda p: p.busbw_gb_s("all_reduce", 16 * MIB)),
    ("all-reduce busbw 256 MB GB/s", 271, lambda p: p.busbw_gb_s("all_reduce", 256 * MIB)),
    ("all-reduce busbw 1 GB GB/s", 321, lambda p: p.busbw_gb_s("all_reduce", 1024 * MIB)),
    ("all-to-all busbw 16 MB GB/s", 91, lambda p: p.busbw_gb_s("all_to_all", 16 * MIB)),
    ("all-to-all busbw 256 MB GB/s", 243, lambda p: p.busbw_gb_s("all_to_all", 256 * MIB)),
    ("all-to-all busbw 1 GB GB/s", 311, lambda p: p.busbw_gb_s("all_to_all", 1024 * MIB)),
    ("all-gather busbw 256 MB GB/s", 235, lambda p: p.busbw_gb_s("all_gather", 256 * MIB)),
]


def main() -> None:
    p = shipped_profile("h200")
    print(f"shipped h200 profile: {p.provenance}, {p.device} x{p.count}, {p.date} ({p.source})")
    print(f"{'figure':<36}{'reference':>10}{'profile':>10}{'diff':>9}")
    for label, ref, fn in POINTS:
        got = fn(p)
        print(f"{label:<36}{ref:>10.4g}{got:>10.4g}{got / ref - 1:>+9.1%}")
    print("single synchronised calls (wall clock between device syncs), at 256 MiB:")
    for row in p.raw["collectives"]:
        if row["bytes"] == 256 * MIB and row.get("synced_busbw_gb_s"):
            print(f"  {row['op']:<16} busbw {row['synced_busbw_gb_s']:>7.4g} GB/s (batched {row['busbw_gb_s']:.4g})")
    print("message sizes: MB = MiB (2^20 bytes); the profile's collectives are timed in batches of back-to-back calls")


if __name__ == "__main__":
    main()
