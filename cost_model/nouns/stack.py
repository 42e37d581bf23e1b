"""What the user's training image provides: features that change which layouts are valid."""
from __future__ import annotations

from dataclasses import dataclass

STACK_FIXES = ("output-gate-tp",)
# What `tune predict --stack` prices: the training image (slime's or Megatron's, with Transformer Engine and
# DeepEP), or attune's megatron runner (megatron-core with torch-native kernels, no TE, no DeepEP).
STACK_NAMES = ("image", "megatron-runner")


@dataclass(frozen=True)
class Stack:
    # Upstream fix for the Qwen3.5 attention output gate at TP above the query-group count
    # (the leaderboard's image backports it; an unpatched Megatron pin does not have it).
    output_gate_tp_fix: bool = False
    deepep: bool = True                       # flex dispatcher available (slime's image ships DeepEP)
    transformer_engine: bool = True           # TE grouped GEMM, fused attention, permute fusion
    precision_aware_optimizer: bool = True    # we always pass --use-precision-aware-optimizer

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
        stack = cls.with_fixes(fixes)
        if name == "megatron-runner":
            return cls(output_gate_tp_fix=stack.output_gate_tp_fix, deepep=False, transformer_engine=False,
                       precision_aware_optimizer=False)
        return stack
