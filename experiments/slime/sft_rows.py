"""Fixed-length SFT rows, built as the reference recipes' `workload.dataset.build` describes: "source
conversations in a seeded global permutation, concatenated with an EOS token between them and cut into
consecutive 8,192-token rows; rows without supervised targets are skipped" (padding 0).

Exactly:
1. Order: the conversations' indices 0..n-1 shuffled by `random.Random(seed).shuffle` (Python's Mersenne
   Twister; stable across Python versions).
2. Each conversation is tokenized with its chat template by `loss_mask_fn(tokenizer, messages) ->
   (token_ids, loss_mask)`: mask 1 on the tokens of assistant turns, 0 elsewhere. Conversations that give
   no tokens are left out (counted in `empty_conversations`).
3. The token stream is conv_0, EOS, conv_1, EOS, ..., conv_last (one `tokenizer.eos_token_id` between two
   conversations, none after the last); the EOS separators have loss mask 0.
4. The stream is cut into consecutive rows of `row_tokens` tokens. A row's supervised targets are its
   positions 1..row_tokens-1 with mask 1 (position 0 has no preceding token in the row, so it is never a
   target: slime's loss starts one position in; see `experiments.slime.pretokenized_sft_rollout`). Rows without
   targets are skipped; so is the final partial row (no padding, `padding_tokens` = 0). `max_rows` stops the
   build after that many rows.

Recorded: rows, row_tokens, padding_tokens (0), seed, supervised_token_ratio (= mask-1 tokens / all tokens
of the kept rows, every position counted), and `rows_sha256`: SHA-256 over the kept rows in order, each row
as its `row_tokens` token ids in little-endian unsigned 32-bit integers followed by its `row_tokens` loss-mask
values as single bytes (0x00 / 0x01). No separators, no header.

Output (pyarrow is not assumed): JSONL, one row a line, `{"tokens": [...], "loss_mask": [...]}` (compact
JSON, the key order as written), plus a sidecar manifest `<out>.manifest.json` with the build fields and the
JSONL file's sha256 and bytes. `experiments.slime.pretokenized_sft_rollout` reads the JSONL.

Tokenizer interface (duck-typed): `eos_token_id` (int) and whatever `loss_mask_fn` needs. The default
`loss_mask_fn` is `segment_loss_mask`, for any object with `encode(text) -> list[int]` and
`chat_segments(messages) -> list[(text, supervised)]` (the rendered chat template cut into pieces, each
flagged as assistant content or not; each piece is encoded on its own). For a Hugging Face fast tokenizer
use `qwen3_5_loss_mask` (slime's `--loss-mask-type qwen3_5` rule: render the whole conversation with
`apply_chat_template`, tokenize it with offsets, mask the tokens that overlap an assistant turn's content
after `<|im_start|>assistant\\n` and an optional `<think>\\n`, through `<|im_end|>` and its newline).

CLI: `python -m experiments.slime.sft_rows --input conversations.jsonl --tokenizer HF_TOKENIZER_DIR --out rows.jsonl`
(needs `transformers`; imported only there).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from cost_model.nouns.errors import AttuneError

ROWS_BUILD_NAME = "attune-fixed-sft-v1"
PACKING = ("source conversations in a seeded global permutation, concatenated with an EOS token between them "
           "and cut into consecutive {row_tokens:,}-token rows; rows without supervised targets are skipped")
SHA256_LAYOUT = ("sha256 over the rows in order; per row: row_tokens token ids as little-endian uint32, then "
                 "row_tokens loss-mask bytes (0/1)")

LossMaskFn = Callable[[object, list], tuple[list[int], list[int]]]


class RowsError(AttuneError, ValueError):
    pass


@dataclass(frozen=True)
class Row:
    tokens: array          # array('I') of row_tokens token ids
    loss_mask: bytes       # row_tokens bytes, 0 or 1

    def to_json(self) -> str:
        return json.dumps({"tokens": self.tokens.tolist(), "loss_mask": list(self.loss_mask)}, separators=(",", ":"))


@dataclass
class RowsResult:
    rows: list[Row]
    row_tokens: int
    seed: int
    eos_token_id: int
    conversations: int                   # source conversations
    conversations_used: int              # conversations whose tokens reached a row (kept or skipped)
    empty_conversations: int
    skipped_rows: int                    # rows without supervised targets
    dropped_tail_tokens: int             # tokens of the final partial row (or past max_rows)
    supervised_tokens: int               # mask-1 tokens in the kept rows
    rows_sha256: str
    padding_tokens: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def supervised_token_ratio(self) -> float:
        total = len(self.rows) * self.row_tokens
        return self.supervised_tokens / total if total else 0.0

    def build_fields(self, name: str = ROWS_BUILD_NAME, tokenizer: str | None = None,
                     loss_mask: str | None = None) -> dict:
        """The recipe's `workload.dataset.build` fields this build determines."""
        return {
            "name": name,
            "tokenizer": tokenizer,
            "loss_mask": loss_mask,
            "rows": len(self.rows),
            "row_tokens": self.row_tokens,
            "padding_tokens": self.padding_tokens,
            "seed": self.seed,
            "packing": PACKING.format(row_tokens=self.row_tokens),
            "supervised_token_ratio": round(self.supervised_token_ratio, 6),
            "rows_sha256": self.rows_sha256,
            "rows_sha256_layout": SHA256_LAYOUT,
            "eos_token_id": self.eos_token_id,
            "conversations": self.conversations,
            "conversations_used": self.conversations_used,
            "empty_conversations": self.empty_conversations,
            "skipped_rows": self.skipped_rows,
            "dropped_tail_tokens": self.dropped_tail_tokens,
            "builder": "experiments/slime/sft_rows.py",
        }


# --- loss masks -----------------------------------------------------------------------------------------


def segment_loss_mask(tokenizer, messages: list) -> tuple[list[int], list[int]]:
    """Token ids and loss mask from `tokenizer.chat_segments(messages)`: each (text, supervised) piece
    encoded with `tokenizer.encode(text)`, mask 1 on the pieces flagged supervised."""
    ids: list[int] = []
    mask: list[int] = []
    for text, supervised in tokenizer.chat_segments(messages):
        piece = list(tokenizer.encode(text))
        ids += piece
        mask += [1 if supervised else 0] * len(piece)
    return ids, mask


def qwen3_5_loss_mask(tokenizer, messages: list, tools: list | None = None) -> tuple[list[int], list[int]]:
    """slime's qwen3_5 loss mask (`slime/utils/mask_utils.py:gen_multi_turn_loss_mask_qwen3_5`) for a Hugging
    Face fast tokenizer with a Qwen chat template. A message with `step_loss_mask` != 1 is not supervised."""
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, tools=tools)
    encoded = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
    token_ids, offsets = encoded["input_ids"], encoded.get("offset_mapping")
    if offsets is None:
        raise RowsError("the qwen3_5 loss mask needs a fast tokenizer (return_offsets_mapping)")
    header, think, end = "<|im_start|>assistant\n", "<think>\n", "<|im_end|>"
    char_mask = bytearray(len(rendered))
    cursor = 0
    for message in messages:
        if message.get("role") != "assistant":
            continue
        pos = rendered.find(header, cursor)
        if pos < 0:
            raise RowsError("cannot find an assistant turn in the rendered chat template")
        start = pos + len(header)
        stop = rendered.find(end, start)
        if stop < 0:
            raise RowsError("cannot find <|im_end|> after an assistant turn")
        span_end = stop + len(end)
        if span_end < len(rendered) and rendered[span_end] == "\n":
            span_end += 1
        cursor = span_end
        if message.get("step_loss_mask", 1) != 1:
            continue
        if rendered.startswith(think, start):
            start += len(think)
        char_mask[start:span_end] = b"\x01" * (span_end - start)
    prefix = [0]
    for v in char_mask:
        prefix.append(prefix[-1] + v)
    mask = [1 if e > s and prefix[e] - prefix[s] > 0 else 0 for s, e in offsets]
    return list(token_ids), mask


LOSS_MASKS: dict[str, LossMaskFn] = {"qwen3_5": qwen3_5_loss_mask, "segments": segment_loss_mask}


# --- build -----------------------------------------------------------------------------------------------


def permutation(n: int, seed: int) -> list[int]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def iter_rows(conversations: Sequence, tokenizer, row_tokens: int = 8192, seed: int = 42,
              loss_mask_fn: LossMaskFn | None = None, stats: dict | None = None):
    """Yield (tokens array('I'), mask bytes, has_targets) for every full row, kept or not, in order;
    `stats` (if given) receives conversations_used / empty_conversations / tail_tokens."""
    if row_tokens < 2:
        raise RowsError(f"row_tokens must be at least 2, got {row_tokens}")
    loss_mask_fn = loss_mask_fn or segment_loss_mask
    eos = getattr(tokenizer, "eos_token_id", None)
    if not isinstance(eos, int) or isinstance(eos, bool) or eos < 0:
        raise RowsError(f"the tokenizer needs an integer eos_token_id, got {eos!r}")
    stats = stats if stats is not None else {}
    stats.update(conversations_used=0, empty_conversations=0, tail_tokens=0)
    buf_tokens = array("I")
    buf_mask = bytearray()
    first = True
    for index in permutation(len(conversations), seed):
        ids, mask = loss_mask_fn(tokenizer, conversations[index])
        if len(ids) != len(mask):
            raise RowsError(f"conversation {index}: {len(ids)} token ids but {len(mask)} loss-mask values")
        if not ids:
            stats["empty_conversations"] += 1
            continue
        stats["conversations_used"] += 1
        if not first:
            buf_tokens.append(eos)
            buf_mask.append(0)
        first = False
        buf_tokens.extend(int(t) for t in ids)
        buf_mask.extend(1 if m else 0 for m in mask)
        while len(buf_tokens) >= row_tokens:
            tokens, row_mask = buf_tokens[:row_tokens], bytes(buf_mask[:row_tokens])
            del buf_tokens[:row_tokens]
            del buf_mask[:row_tokens]
            stats["tail_tokens"] = len(buf_tokens)
            yield tokens, row_mask, any(row_mask[1:])
    stats["tail_tokens"] = len(buf_tokens)


def build_rows(conversations: Iterable[list[dict]], tokenizer, row_tokens: int = 8192, seed: int = 42,
               loss_mask_fn: LossMaskFn | None = None, max_rows: int | None = None) -> RowsResult:
    """Build the rows (see the module docstring). `conversations` is a sequence of message lists (any
    iterable is read into a list first; a sequence with len() and [] is used as is, so a lazily read file
    is never held in memory)."""
    if not (hasattr(conversations, "__len__") and hasattr(conversations, "__getitem__")):
        conversations = list(conversations)
    if max_rows is not None and max_rows < 1:
        raise RowsError(f"max_rows must be positive, got {max_rows}")
    stats: dict = {}
    digest = hashlib.sha256()
    rows: list[Row] = []
    skipped = supervised = 0
    for tokens, mask, has_targets in iter_rows(conversations, tokenizer, row_tokens, seed, loss_mask_fn, stats):
        if not has_targets:
            skipped += 1
            continue
        rows.append(Row(tokens=tokens, loss_mask=mask))
        supervised += sum(mask)
        digest.update(_le_uint32(tokens))
        digest.update(mask)
        if max_rows is not None and len(rows) >= max_rows:
            break
    if not rows:
        raise RowsError(f"no {row_tokens}-token row with supervised targets could be built from "
                        f"{len(conversations)} conversations")
    return RowsResult(rows=rows, row_tokens=row_tokens, seed=seed, eos_token_id=tokenizer.eos_token_id,
                      conversations=len(conversations), conversations_used=stats["conversations_used"],
                      empty_conversations=stats["empty_conversations"], skipped_rows=skipped,
                      dropped_tail_tokens=stats["tail_tokens"], supervised_tokens=supervised,
                      rows_sha256=digest.hexdigest())


def rows_sha256(rows: Iterable[tuple[Sequence[int], Sequence[int]]]) -> str:
    """The `rows_sha256` of (tokens, loss_mask) rows, e.g. read back from a JSONL file."""
    digest = hashlib.sha256()
    for tokens, mask in rows:
        digest.update(_le_uint32(array("I", tokens)))
        digest.update(bytes(mask))
    return digest.hexdigest()


def _le_uint32(tokens: array) -> bytes:
    if sys.byteorder == "little":
        return tokens.tobytes()
    swapped = array("I", tokens)
    swapped.byteswap()
    return swapped.tobytes()


def write_rows(result: RowsResult, out_path: str, manifest_path: str | None = None, **build_fields) -> dict:
    """Write the JSONL rows and the sidecar manifest (default `<out>.manifest.json`); returns the manifest."""
    out_dir = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(out_dir, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    tmp = out_path + ".tmp"
    with open(tmp, "wb") as f:
        for row in result.rows:
            data = (row.to_json() + "\n").encode()
            f.write(data)
            digest.update(data)
            size += len(data)
    os.replace(tmp, out_path)
    manifest = dict(result.build_fields(**build_fields), jsonl=os.path.basename(out_path),
                    jsonl_sha256=digest.hexdigest(), jsonl_bytes=size)
    manifest_path = manifest_path or out_path + ".manifest.json"
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    return manifest


# --- CLI -------------------------------------------------------------------------------------------------


class JsonlConversations(Sequence):
    """The conversations of a JSONL file (one object a line with the messages under `key`, or a bare list),
    read on demand through an index of line offsets."""

    def __init__(self, path: str, key: str = "messages"):
        self.path, self.key = path, key
        self.offsets = []
        with open(path, "rb") as f:
            pos = 0
            for line in f:
                if line.strip():
                    self.offsets.append(pos)
                pos += len(line)
        self._file = open(path, "rb")

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i):
        self._file.seek(self.offsets[i])
        record = json.loads(self._file.readline())
        messages = record if isinstance(record, list) else record.get(self.key)
        if not isinstance(messages, list):
            raise RowsError(f"{self.path}: line {i + 1} has no message list under {self.key!r}")
        return messages


def _load_hf_tokenizer(path: str):
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise RowsError("--tokenizer needs the 'transformers' package for the chat template "
                        "(pip install transformers)") from None
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.eos_token_id is None:
        raise RowsError(f"the tokenizer at {path} has no eos_token_id")
    return tokenizer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.slime.sft_rows", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="conversations JSONL (one object a line with a message list)")
    p.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer directory (needs transformers)")
    p.add_argument("--out", required=True, help="rows JSONL to write; the manifest goes to OUT.manifest.json")
    p.add_argument("--messages-key", default="messages")
    p.add_argument("--row-tokens", type=int, default=8192)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--max-rows", type=int, default=None)
    p.add_argument("--loss-mask", choices=sorted(LOSS_MASKS), default="qwen3_5")
    p.add_argument("--name", default=ROWS_BUILD_NAME)
    args = p.parse_args(argv)
    try:
        tokenizer = _load_hf_tokenizer(args.tokenizer)
        conversations = JsonlConversations(args.input, args.messages_key)
        result = build_rows(conversations, tokenizer, row_tokens=args.row_tokens, seed=args.seed,
                            loss_mask_fn=LOSS_MASKS[args.loss_mask], max_rows=args.max_rows)
        manifest = write_rows(result, args.out, name=args.name, tokenizer=args.tokenizer, loss_mask=args.loss_mask)
    except (RowsError, OSError, json.JSONDecodeError) as e:
        print(f"sft_rows: {e}", file=sys.stderr)
        return 2
    print(json.dumps({k: manifest[k] for k in ("rows", "row_tokens", "supervised_token_ratio", "rows_sha256",
                                               "jsonl_sha256", "jsonl_bytes")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
