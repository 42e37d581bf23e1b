"""What is trained: row length, global batch, precision and routing; and by which training loop."""
from __future__ import annotations

from dataclasses import dataclass
from cost_model.nouns.errors import AttuneError
from cost_model.nouns.names import shown

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
# Parameter-efficient fine-tuning (Megatron-Bridge's `peft`): none trains every weight; lora freezes the base
# and trains low-rank adapters (no weight gradients, gradient sync or optimizer state for the base).
PEFTS = ("none", "lora")
# Images per row of a VLM workload (each a square image `image_size` pixels a side, run through the model's
# vision encoder on the first pipeline stage); 0 for text. Bounds keep the encoder's work finite.
MAX_IMAGES_PER_ROW = 1024
MAX_IMAGE_SIZE = 16384
# The step options beyond a full-training text step, at the values that leave them out (image_size goes with
# images_per_row): what study identities and recipes record only when set.
STEP_OPTION_DEFAULTS = {"cuda_graphs": "none", "peft": "none", "images_per_row": 0}
# Each step option's command-line flag: what a runner or a command that does not set one up names.
STEP_OPTION_FLAGS = {"cuda_graphs": "--cuda-graphs", "peft": "--peft", "images_per_row": "--images-per-row"}
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
    peft: str = "none"
    images_per_row: int = 0
    image_size: int = 448

    def __post_init__(self):
        for name, low, high in (("seq_len", 1, MAX_SEQ_LEN), ("global_batch", 1, MAX_GLOBAL_BATCH),
                                ("images_per_row", 0, MAX_IMAGES_PER_ROW), ("image_size", 1, MAX_IMAGE_SIZE)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise WorkloadError(f"{name} must be an integer, got {shown(value)}")
            if not low <= value <= high:
                raise WorkloadError(f"{name} must be between {low} and {high:,}, got {shown(value)}")
        if self.precision not in PRECISIONS:
            raise WorkloadError(f"precision must be one of {', '.join(PRECISIONS)}, got {shown(self.precision)}")
        if self.framework not in FRAMEWORKS:
            raise WorkloadError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {shown(self.framework)}")
        if self.cuda_graphs not in CUDA_GRAPHS:
            raise WorkloadError(f"cuda_graphs must be one of {', '.join(CUDA_GRAPHS)}, got {shown(self.cuda_graphs)}")
        if self.cuda_graphs != "none" and self.framework != "megatron":
            raise WorkloadError(f"CUDA graphs ({self.cuda_graphs}) need --framework megatron: slime's training step "
                                f"runs eagerly")
        if self.peft not in PEFTS:
            raise WorkloadError(f"peft must be one of {', '.join(PEFTS)}, got {shown(self.peft)}")
        if self.peft != "none" and self.framework != "megatron":
            raise WorkloadError(f"PEFT ({self.peft}) is modelled for --framework megatron only (Megatron-Bridge's "
                                f"LoRA); slime's step trains every weight")
        if self.routing not in ROUTINGS:
            raise WorkloadError(f"routing must be one of {', '.join(ROUTINGS)}, got {shown(self.routing)}")

    @property
    def step_options(self) -> dict:
        """The step options set away from their defaults (`STEP_OPTION_DEFAULTS`), image_size with images."""
        out = {k: getattr(self, k) for k, default in STEP_OPTION_DEFAULTS.items() if getattr(self, k) != default}
        if self.images_per_row:
            out["image_size"] = self.image_size
        return out

    @property
    def frozen_weights(self) -> bool:
        """The base weights get no gradients (LoRA)."""
        return self.peft != "none"

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch
