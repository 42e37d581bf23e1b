"""slime rollout function for pre-tokenized fixed-length SFT rows (`--rollout-function-path
pretokenized_sft_rollout.generate_rollout`, as the reference recipes' command names it).

slime's rollout manager loads the function with `load_function` and calls it as
`generate_rollout(args, rollout_id, data_source, evaluation=False)` (`slime/ray/rollout.py:386,592`,
`slime/rollout/base_types.py:call_rollout_fn`, THUDM/slime @624b824). A plain return value is wrapped as
`RolloutFnTrainOutput(samples=...)`: a list of groups, each a list of `slime.utils.types.Sample`, which the
manager flattens and turns into training data from each sample's `tokens`, `response_length`, `loss_mask`
(length = response_length), `reward`, `status`, `index` and `rollout_id` (`_convert_samples_to_train_data`).
slime's own SFT example (`slime/rollout/sft_rollout.py`) tokenizes `messages` on the fly; this one reads rows
that `experiments.slime.sft_rows` already built.

Rows: the JSONL file at `args.prompt_data`, one row a line, `{"tokens": [...], "loss_mask": [...]}` of equal
length. Rollout r takes rows (r x B + i) mod N for i in 0..B-1, B = `args.rollout_batch_size`, N = rows in
the file: the rows in file order, cycling, the same rows for the same rollout id on every run and restart.
With `--n-samples-per-prompt` k > 1 each row is repeated k times in its group.

A row is the whole training sequence. slime trains on the `response_length` last tokens, and the logits that
predict them start one position earlier (`backends/megatron_utils/loss.py:get_responses`), so the first
token of a row cannot be a target: the sample's response is tokens[1:], `response_length` = len(row) - 1
and `loss_mask` = the row's mask[1:]. `experiments.slime.sft_rows` counts targets the same way.

slime is imported only inside `generate_rollout` (for `Sample`), so this module imports without slime;
pass `sample_cls` to use another Sample class (tests do). The module uses the standard library only.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

__all__ = ["generate_rollout", "RowFile"]


@dataclass
class RowFile:
    """Random access to the rows of a JSONL file through an index of line offsets (rows are read on
    demand, so a 6,400 x 8,192-token file is not held in memory)."""

    path: str
    offsets: list[int]
    mtime_ns: int
    size: int

    @classmethod
    def open(cls, path: str) -> "RowFile":
        if not os.path.exists(path):
            raise FileNotFoundError(f"pre-tokenized rows file {path!r} does not exist")
        st = os.stat(path)
        offsets = []
        with open(path, "rb") as f:
            pos = 0
            for line in f:
                if line.strip():
                    offsets.append(pos)
                pos += len(line)
        if not offsets:
            raise ValueError(f"pre-tokenized rows file {path!r} has no rows")
        return cls(path=path, offsets=offsets, mtime_ns=st.st_mtime_ns, size=st.st_size)

    def __len__(self) -> int:
        return len(self.offsets)

    def read(self, indices: list[int]) -> list[tuple[list[int], list[int]]]:
        rows = []
        with open(self.path, "rb") as f:
            for i in indices:
                f.seek(self.offsets[i])
                record = json.loads(f.readline())
                tokens, mask = record["tokens"], record["loss_mask"]
                if len(tokens) != len(mask) or len(tokens) < 2:
                    raise ValueError(f"{self.path} row {i}: tokens ({len(tokens)}) and loss_mask ({len(mask)}) "
                                     f"must have the same length, at least 2")
                rows.append(([int(t) for t in tokens], [int(m) for m in mask]))
        return rows


_ROW_FILES: dict[str, RowFile] = {}


def _row_file(path: str) -> RowFile:
    cached = _ROW_FILES.get(path)
    if cached is not None:
        st = os.stat(path)
        if (st.st_mtime_ns, st.st_size) == (cached.mtime_ns, cached.size):
            return cached
    _ROW_FILES[path] = row_file = RowFile.open(path)
    return row_file


def row_indices(rollout_id: int, batch: int, num_rows: int) -> list[int]:
    """The rows of a rollout: (rollout_id x batch + i) mod num_rows, i = 0..batch-1."""
    return [(rollout_id * batch + i) % num_rows for i in range(batch)]


def generate_rollout(args, rollout_id, data_source=None, evaluation=False, *, sample_cls=None):
    """slime's rollout function: `args.rollout_batch_size` rows as a list of groups of Samples."""
    if evaluation:
        raise ValueError("pretokenized_sft_rollout has no evaluation rollouts (run without --eval-interval)")
    if sample_cls is None:
        from slime.utils.types import Sample as sample_cls  # noqa: N813 (slime's class)
    path = str(args.prompt_data)
    rows = _row_file(path)
    batch = int(args.rollout_batch_size)
    per_group = int(getattr(args, "n_samples_per_prompt", 1) or 1)
    indices = row_indices(int(rollout_id), batch, len(rows))
    status = sample_cls.Status.COMPLETED
    groups = []
    for i, (row, (tokens, mask)) in enumerate(zip(indices, rows.read(indices))):
        group = []
        for k in range(per_group):
            sample = sample_cls()
            sample.group_index = int(rollout_id) * batch + i
            sample.index = (int(rollout_id) * batch + i) * per_group + k
            sample.tokens = list(tokens)
            sample.response_length = len(tokens) - 1
            sample.loss_mask = list(mask[1:])
            sample.reward = 0
            sample.status = status
            metadata = getattr(sample, "metadata", None)
            if isinstance(metadata, dict):
                metadata["row"] = row
            group.append(sample)
        groups.append(group)
    return groups
