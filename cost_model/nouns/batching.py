"""Rows per micro-batch <-> max tokens per GPU: the one place the two are converted.

slime packs whole rows of `seq_len` tokens up to --max-tokens-per-gpu per GPU; with context
parallelism each GPU holds 1/CP of every row, so a micro-batch of `rows` rows needs
rows x seq_len / CP tokens on each GPU.
"""
from __future__ import annotations

from functools import lru_cache
from itertools import accumulate
from heapq import heapify, heappop, heappush


def max_tokens_per_gpu(rows_per_microbatch: int, cp: int, seq_len: int) -> int:
    """The --max-tokens-per-gpu that packs `rows_per_microbatch` whole rows on each GPU."""
    return max(1, rows_per_microbatch * seq_len // cp)


def rows_per_microbatch(max_tokens_per_gpu: int, cp: int, seq_len: int) -> int:
    """The whole rows that fit --max-tokens-per-gpu tokens on each GPU (at least one)."""
    return max(1, max_tokens_per_gpu * cp // seq_len)


def tokens_per_microbatch(rows_per_microbatch: int, cp: int, seq_len: int) -> float:
    """The tokens each GPU holds in one micro-batch: its 1/CP share of the micro-batch's rows (a fraction
    where CP does not divide the row)."""
    return rows_per_microbatch * seq_len / cp


@lru_cache(maxsize=4096)
def slime_schedule(rows: int, dp: int, rows_per_bin: int, align: int, coupled: bool) -> tuple[float, int, int]:
    """slime's dynamic batching of one step's `rows` equal rows (slime/utils/dp_schedule.py): first-fit bins of
    `rows_per_bin` rows; their count raised to a multiple of `align` (DP, x PP under VPP) by halving the largest
    bin (the last of equal ones; its larger half stays, the smaller is appended); bins dealt round-robin, bin k
    to DP rank k mod DP. Returns (rows the step waits for per DP rank, micro-batches per rank, rows of the largest
    micro-batch). The step waits for its busiest rank; `coupled` (an all-to-all every layer, EP > 1): each
    micro-batch waits for its largest bin across the ranks."""
    bins = _slime_bins(rows, rows_per_bin, align)
    per_rank = -(-len(bins) // dp)   # short of `target` only where slime refuses the step (too few rows)
    if coupled:
        work = sum(max(bins[k * dp:(k + 1) * dp]) for k in range(per_rank))
    else:
        work = max(sum(bins[r::dp]) for r in range(dp))
    return float(work), per_rank, max(bins)


@lru_cache(maxsize=4096)
def slime_rows_held(rows: int, dp: int, rows_per_bin: int, align: int) -> tuple[int, ...]:
    """Per count k of a rank's micro-batches, the most rows any DP rank's k largest hold (`slime_schedule`'s bins): what
    a pipeline's first stage holds with k micro-batches in flight, at worst."""
    bins = _slime_bins(rows, rows_per_bin, align)
    # each rank's running totals of its bins, largest first (a step of 65,536 rows deals thousands to a rank)
    held = [list(accumulate(sorted(bins[r::dp], reverse=True))) for r in range(dp)]
    longest = max(len(h) for h in held)
    return tuple(max(h[min(k, len(h)) - 1] if h else 0 for h in held) for k in range(1, longest + 1))


def slime_bin_count(rows: int, rows_per_bin: int, align: int) -> int:
    """The micro-batches slime's schedule makes of a step's `rows` rows: first-fit bins of `rows_per_bin` rows, their
    count raised to a multiple of `align`. More than `rows`: slime refuses the step (a row never splits)."""
    return max(-(-(-(-rows // rows_per_bin)) // align) * align, align)


@lru_cache(maxsize=4096)
def _slime_bins(rows: int, rows_per_bin: int, align: int) -> tuple[int, ...]:
    """The bins slime's schedule makes of a step's `rows` rows, in the order it deals them (`slime_schedule`)."""
    full, rem = divmod(rows, rows_per_bin)
    bins = [rows_per_bin] * full + ([rem] if rem else [])
    target = slime_bin_count(rows, rows_per_bin, align)
    heap = [(-size, -index) for index, size in enumerate(bins) if size > 1]
    heapify(heap)
    while len(bins) < target and heap:
        size, index = heappop(heap)
        big, small = (1 - size) // 2, -size // 2
        bins[-index] = big
        bins.append(small)
        for part, at in ((big, -index), (small, len(bins) - 1)):
            if part > 1:
                heappush(heap, (-part, -at))
    return tuple(bins)
