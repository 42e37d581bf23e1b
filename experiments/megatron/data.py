"""A trial's training data: token rows from a JSONL file, or deterministic random tokens.

torch is imported only where a rank builds its batches: the parent process reads rows files to
check them before any worker starts.
"""
from __future__ import annotations

import json
import os


def load_rows(path: str | os.PathLike) -> list[dict]:
    """Rows of a JSONL file: {"tokens": [int, ...], "loss_mask": [0/1, ...]} (loss_mask optional)."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: malformed JSON: {e.msg}") from None
            toks = obj.get("tokens") if isinstance(obj, dict) else None
            if not isinstance(toks, list) or not toks or not all(isinstance(t, int) for t in toks):
                raise ValueError(f"{path}:{i}: 'tokens' must be a non-empty list of integers")
            mask = obj.get("loss_mask", [1] * len(toks))
            if not isinstance(mask, list) or len(mask) != len(toks):
                raise ValueError(f"{path}:{i}: 'loss_mask' must be a list as long as 'tokens'")
            rows.append({"tokens": toks, "loss_mask": [1 if m else 0 for m in mask]})
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def row_arrays(row: dict, seq_len: int, vocab: int) -> tuple[list[int], list[int], list[int]]:
    """(input ids, labels, loss mask) of one row: inputs are tokens[:s], labels tokens[1:s+1];
    short rows are padded (mask 0), ids are taken modulo the vocabulary."""
    toks = [t % vocab for t in row["tokens"][:seq_len + 1]]
    mask = list(row["loss_mask"][:seq_len + 1])
    pad = seq_len + 1 - len(toks)
    toks += [0] * pad
    mask += [0] * pad
    return toks[:seq_len], toks[1:], mask[1:]


class StepBatches:
    """One rank's micro-batches of each step: its DP shard of the step's global batch, identical on
    its TP/PP/EP peers (they share the DP rank). Random tokens are drawn from the seed and the step,
    so every layout of one seed sees the same global batch."""

    def __init__(self, *, global_batch: int, dp: int, dp_rank: int, rows_per_microbatch: int, seq_len: int,
                 vocab: int, seed: int, rows: list[dict] | None = None):
        self.global_batch, self.dp_rank, self.mbs = global_batch, dp_rank, rows_per_microbatch
        self.rows_per_dp = global_batch // dp
        self.num_microbatches = self.rows_per_dp // rows_per_microbatch
        self.seq, self.vocab, self.seed, self.rows = seq_len, vocab, seed, rows

    def __call__(self, step: int) -> list[dict]:
        import torch

        ids, labels, mask = self._synthetic(step) if self.rows is None else self._given(step)
        mbs, seq = self.mbs, self.seq
        pos = torch.arange(seq).unsqueeze(0).expand(mbs, seq)
        out = []
        for i in range(self.num_microbatches):
            sl = slice(i * mbs, (i + 1) * mbs)
            out.append({"tokens": ids[sl].cuda(non_blocking=True), "labels": labels[sl].cuda(non_blocking=True),
                        "loss_mask": mask[sl].cuda(non_blocking=True), "position_ids": pos.cuda(non_blocking=True)})
        return out

    def _synthetic(self, step: int):
        import torch

        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        toks = torch.randint(0, self.vocab, (self.global_batch, self.seq + 1), generator=g)
        toks = toks[self.dp_rank * self.rows_per_dp:(self.dp_rank + 1) * self.rows_per_dp]
        return toks[:, :-1], toks[:, 1:], torch.ones(self.rows_per_dp, self.seq, dtype=torch.float32)

    def _given(self, step: int):
        import torch

        start = step * self.global_batch + self.dp_rank * self.rows_per_dp
        arr = [row_arrays(self.rows[(start + i) % len(self.rows)], self.seq, self.vocab)
               for i in range(self.rows_per_dp)]
        return (torch.tensor([a[0] for a in arr]), torch.tensor([a[1] for a in arr]),
                torch.tensor([a[2] for a in arr], dtype=torch.float32))
