"""What the user's training image provides: features that change which layouts are valid."""
from __future__ import annotations

from dataclasses import dataclass

STACK_FIXES = ("output-gate-tp",)


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
