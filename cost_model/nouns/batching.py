"""Rows per micro-batch <-> max tokens per GPU: the one place the two are converted.

slime packs whole rows of `seq_len` tokens up to --max-tokens-per-gpu per GPU; with context
parallelism each GPU holds 1/CP of every row, so a micro-batch of `rows` rows needs
rows x seq_len / CP tokens on each GPU.
"""
from __future__ import annotations


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
