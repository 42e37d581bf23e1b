"""What is trained: row length, global batch, precision and routing."""
from __future__ import annotations

from dataclasses import dataclass
from cost_model.errors import AttuneError

PRECISIONS = ("bf16", "fp8")
ROUTINGS = ("natural", "balanced")
# Which training loop runs the layout. slime: slime's eager Megatron step (the leaderboard's stack).
# megatron: Megatron-LM / Megatron-Bridge tuned pretraining (CUDA graphs, fused kernels, no slime step).
FRAMEWORKS = ("slime", "megatron")


class WorkloadError(AttuneError, ValueError):
    pass


@dataclass(frozen=True)
class Workload:
    seq_len: int = 8192        # tokens per row (the recipes' row_tokens)
    global_batch: int = 128    # rows per optimizer step
    precision: str = "bf16"
    routing: str = "natural"   # natural: real data, unbalanced experts; balanced: forced router balance
    framework: str = "slime"

    def __post_init__(self):
        if self.seq_len <= 0 or self.global_batch <= 0:
            raise WorkloadError(f"seq_len and global_batch must be positive, got {self.seq_len} and {self.global_batch}")
        if self.precision not in PRECISIONS:
            raise WorkloadError(f"precision must be one of {', '.join(PRECISIONS)}, got '{self.precision}'")
        if self.framework not in FRAMEWORKS:
            raise WorkloadError(f"framework must be one of {', '.join(FRAMEWORKS)}, got '{self.framework}'")
        if self.routing not in ROUTINGS:
            raise WorkloadError(f"routing must be one of {', '.join(ROUTINGS)}, got '{self.routing}'")

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch
