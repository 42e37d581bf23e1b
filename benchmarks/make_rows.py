"""Deterministic token rows (JSONL {"tokens": [...]}) for measured trials and convergence arms.

kind=learnable: each next token follows a fixed random bigram map over 512 token ids 90% of the time
(else a random id of the 512), so a model's loss falls quickly and the curve says something.
kind=uniform: uniform random ids over the whole vocabulary (nothing to learn): "different data".
Usage: python benchmarks/make_rows.py --out rows.jsonl --rows 400 --tokens 8193 [--kind learnable|uniform] [--seed 1]
"""
from __future__ import annotations

import argparse
import json
import random


def rows(n: int, tokens: int, kind: str, seed: int, vocab: int = 248320, ids: int = 512):
    rng = random.Random(seed)
    table = [rng.randrange(ids) for _ in range(ids)]   # the bigram map
    offset = 1000                                      # keep clear of special ids
    for _ in range(n):
        if kind == "uniform":
            yield [rng.randrange(vocab) for _ in range(tokens)]
            continue
        t = rng.randrange(ids)
        row = []
        for _ in range(tokens):
            row.append(offset + t)
            t = table[t] if rng.random() < 0.9 else rng.randrange(ids)
        yield row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rows", type=int, default=400)
    p.add_argument("--tokens", type=int, default=8193)
    p.add_argument("--kind", choices=("learnable", "uniform"), default="learnable")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    with open(a.out, "w") as f:
        for row in rows(a.rows, a.tokens, a.kind, a.seed):
            f.write(json.dumps({"tokens": row}) + "\n")


if __name__ == "__main__":
    main()
