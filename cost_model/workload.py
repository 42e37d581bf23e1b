"""What is trained: row length, global batch, precision and routing; and by which training loop."""
from __future__ import annotations

from dataclasses import dataclass
from cost_model.errors import AttuneError

PRECISIONS = ("bf16", "fp8")
ROUTINGS = ("natural", "balanced")
# Which training loop runs the layout. slime: slime's eager Megatron step (the leaderboard's stack).
# megatron: Megatron-LM / Megatron-Bridge tuned pretraining (CUDA graphs, fused kernels, no slime step).
FRAMEWORKS = ("slime", "megatron")
# CUDA graphs of a Megatron step (--cuda-graph-impl / --cuda-graph-modules): none; partial (TE graphs of some
# modules: attention, router, MoE preprocess); full (the whole iteration replayed as one graph, so the host
# launches no kernel per layer). slime's training step runs eagerly: none. The cost model removes the per-layer
# launch time under full graphs; none and partial share the fitted Megatron launch constant (the public runs it
# is fitted on mostly graph some modules, and too few say which to tell the two apart).
CUDA_GRAPHS = ("none", "partial", "full")
# Far above any job trained today; bounds keep every derived size (tokens per step) small.
MAX_SEQ_LEN = 1 << 20
MAX_GLOBAL_BATCH = 1 << 20


class WorkloadError(AttuneError, ValueError):
    pass


@dataclass(frozen=True)
class Workload:
    seq_len: int = 8192        # tokens per row (the recipes' row_tokens)
    global_batch: int = 128    # rows per optimizer step
    precision: str = "bf16"
    routing: str = "natural"   # natural: real data, unbalanced experts; balanced: forced router balance
    framework: str = "slime"
    cuda_graphs: str = "none"

    def __post_init__(self):
        for name, high in (("seq_len", MAX_SEQ_LEN), ("global_batch", MAX_GLOBAL_BATCH)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise WorkloadError(f"{name} must be an integer, got {str(value)[:40]!r}")
            if not 1 <= value <= high:
                raise WorkloadError(f"{name} must be between 1 and {high:,}, got {str(value)[:40]}")
        if self.precision not in PRECISIONS:
            raise WorkloadError(f"precision must be one of {', '.join(PRECISIONS)}, got '{self.precision}'")
        if self.framework not in FRAMEWORKS:
            raise WorkloadError(f"framework must be one of {', '.join(FRAMEWORKS)}, got '{self.framework}'")
        if self.cuda_graphs not in CUDA_GRAPHS:
            raise WorkloadError(f"cuda_graphs must be one of {', '.join(CUDA_GRAPHS)}, got '{str(self.cuda_graphs)[:40]}'")
        if self.cuda_graphs != "none" and self.framework != "megatron":
            raise WorkloadError(f"CUDA graphs ({self.cuda_graphs}) need --framework megatron: slime's training step "
                                f"runs eagerly")
        if self.routing not in ROUTINGS:
            raise WorkloadError(f"routing must be one of {', '.join(ROUTINGS)}, got '{self.routing}'")

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch
