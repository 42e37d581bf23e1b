"""Bytes per element of the dtypes the cost model counts, and the GiB its memory figures are in."""
from __future__ import annotations

GIB = 1024 ** 3
BF16, FP32 = 2, 4
