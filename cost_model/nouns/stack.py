"""What a training stack can run: the features that change which layouts are valid, and which step it runs.

One type for the image a user trains on (`Stack.named`, `Stack.with_fixes`) and for what a trial runner's
software provides (experiments.runner.TrialRunner.stack; search_space.runner_space narrows the space to it).
Every field at its default is slime's image.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from cost_model.nouns.workload import FRAMEWORKS

STACK_FIXES = ("output-gate-tp",)
# What `tune predict --stack` prices: the training image (slime's or Megatron's, with Transformer Engine and
# DeepEP), or attune's megatron runner (megatron-core with torch-native kernels, no TE, no DeepEP); _NAMED below.
STACK_NAMES = ("image", "megatron-runner")


@dataclass(frozen=True)
class Stack:
    # Upstream fix for the Qwen3.5 attention output gate at TP above the query-group count
    # (the leaderboard's image backports it; an unpatched Megatron pin does not have it).
    output_gate_tp_fix: bool = False
    deepep: bool = True                      # the flex token dispatcher (DeepEP)
    transformer_engine: bool = True          # TE kernels (grouped GEMM, fused attention, permute fusion)
    precision_aware_optimizer: bool = True   # bf16 Adam moments on the GPU (TE's FusedAdam)
    context_parallel: bool = True            # CP > 1 (TE's ring attention)
    mla: bool = True                         # multi-latent attention models (DeepSeek-V3, Moonlight)
    gdn_kernels: bool = True                 # fla's Gated DeltaNet kernels (else a slow torch rule)
    optimizer_offload: bool = True           # optimizer CPU offload (HybridDeviceOptimizer)
    # An offloaded optimizer runs precision-aware without TE's FusedAdam: megatron's HybridDeviceOptimizer steps torch
    # Adam, so --use-precision-aware-optimizer goes with --optimizer-cpu-offload whatever the GPU-resident Adam
    # (experiments.megatron.train_loop.build_optimizer; measured on the runner without TE, v11-v31)
    offload_precision_aware: bool = True
    frameworks: tuple[str, ...] = FRAMEWORKS  # the training steps it runs (Workload.framework)
    # slime's dynamic batching packs any global batch; False: the global batch must split into whole
    # micro-batches (experiments.megatron.backend_support.microbatch_refusal)
    dynamic_batching: bool = True
    source: str = "slime's training image"   # where these facts come from

    @classmethod
    def with_fixes(cls, fixes: list[str] | tuple[str, ...] = ()) -> "Stack":
        unknown = [f for f in fixes if f not in STACK_FIXES]
        if unknown:
            raise ValueError(f"unknown stack fix {unknown}; known: {', '.join(STACK_FIXES)}")
        return cls(output_gate_tp_fix="output-gate-tp" in fixes)

    @classmethod
    def named(cls, name: str, fixes: list[str] | tuple[str, ...] = ()) -> "Stack":
        """One of STACK_NAMES: the image's stack, or the megatron runner's (priced from its measured components,
        cost_model.runner_components)."""
        if name not in STACK_NAMES:
            raise ValueError(f"unknown stack {name!r}; known: {', '.join(STACK_NAMES)}")
        return replace(cls.with_fixes(fixes), **_NAMED[name])


# What each of STACK_NAMES differs in from the default (the image)
_NAMED = {"image": {},
          "megatron-runner": dict(deepep=False, transformer_engine=False, precision_aware_optimizer=False,
                                  context_parallel=False,
                                  frameworks=("megatron",), dynamic_batching=False, source="the megatron runner")}
