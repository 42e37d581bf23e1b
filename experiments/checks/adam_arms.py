"""The precision-aware Adam step under test, emulated in PyTorch: TE's FP32 master stored as a BF16 parameter
plus an int16 remainder, the arms compared with it, and the FP64 reference Adam.

What the recipe's optimizer does (`--use-precision-aware-optimizer`, BF16 params, FP32 masters, FP32
moments): Megatron hands the step to Transformer Engine's FusedAdam with `store_param_remainders`,
which keeps no FP32 master tensor at all. The FP32 master is the BF16 parameter's 16 bits plus an
int16 tensor of the 16 low bits. Re-derived from NVIDIA/TransformerEngine (v2.10, the recipe's TE,
and main @ d0067d0da6cb01811b8072a7d304f0e00344ce2b, identical lines):

- transformer_engine/pytorch/optimizers/fused_adam.py L98-103 (v2.10 L95-100): "store the trailing
  16 remainder bits. Whole FP32 master can be reconstructed from BF16 params plus the trailing
  remainder bits"; the state is `torch.zeros_like(param, dtype=torch.int16)` (L414-415), so a fresh
  master equals the BF16 parameter (remainder 0).
- transformer_engine/common/multi_tensor/adam.cu L178-292, `AdamFunctorMasterParamRemainder`:
  - L239-245 reconstruct: `if (p_rem < 0) p--;  // Undo rounding`, then the FP32 master's high
    int16 half = p, its low half = p_rem (a union of one float and two int16);
  - L249-268 the Adam step in FP32 (MATH_T = float); adam_w_mode: update = m_hat / (sqrt(v_hat) +
    eps) + decay * p; p -= lr * update; bias corrections 1 - beta^step;
  - L271-277 split: p = high half, p_rem = low half, `if (p_rem < 0) p++;  // Round up`.

So the BF16 parameter is NOT the truncated upper half of the FP32 master: it is the upper half
rounded to nearest (a low half >= 0x8000, i.e. a negative int16 remainder, increments the upper
half's bits, away from zero in magnitude; an exact tie rounds away rather than to even), and the
sign of the remainder tells the reconstruction to undo that. The forward pass therefore sees the
round-to-nearest BF16 of the master. Split and merge are bit-exact inverses for every 32-bit
pattern; `split_master` / `merge_master` below re-implement exactly this (in int64 arithmetic, no
TE needed), and `tests/test_adam_component.py` checks the round trip on all edge patterns.

Arms, each on the same random FP32 masters and FP32 gradients (steps 1..max(steps)), per tensor:

- main: BF16 param + int16 remainder, FP32 moments, FP32 math (TE's functor, emulated in PyTorch).
- fp32_master: explicit FP32 master, same math. The main arm's reconstructed masters must be
  bitwise identical to it at every step (the remainder loses nothing).
- bf16_moments (informational variant, not the recipe's setting): the main arm with m and v stored
  as BF16 (`--exp-avg-dtype/--exp-avg-sq-dtype bf16`).
- negative control drop_remainder: the remainder is thrown away, the master is the BF16 param only
  (FP32 math, rounded back to BF16 each step).
- negative control bf16_master: a plain BF16 master; the FP32-computed step lr * update is cast to
  BF16 and subtracted in BF16.

Reference: the same Adam (decoupled weight decay) in FP64 from the same FP32 master and gradients.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Hyper:
    """The reference recipes' optimizer flags: --lr 1e-5 --adam-beta1 0.9 --adam-beta2 0.98 --weight-decay 0.1."""

    lr: float = 1e-5
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-8
    weight_decay: float = 0.1

    def to_dict(self) -> dict:
        return {"lr": self.lr, "beta1": self.beta1, "beta2": self.beta2, "eps": self.eps,
                "weight_decay": self.weight_decay, "weight_decay_mode": "decoupled (AdamW)"}


# ---------------------------------------------------------------------- the remainder format
def split_master(master: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 master -> (BF16 parameter, int16 remainder), as TE's adam.cu L271-277.

    high = the upper 16 bits, low = the lower 16 bits read as int16; when low < 0 (bit 15 set),
    high += 1 (rounds the BF16 parameter to nearest, ties away from zero in magnitude).
    """
    if master.dtype != torch.float32:
        raise TypeError(f"master must be float32, got {master.dtype}")
    bits = master.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    high = bits >> 16                                    # 0 .. 0xFFFF
    low = bits & 0xFFFF
    low_negative = low >= 0x8000
    high = (high + low_negative.to(torch.int64)) & 0xFFFF   # int16 ++ with wrap-around
    param = _to_int16(high).view(torch.bfloat16)
    remainder = _to_int16(low)
    return param, remainder


def merge_master(param: torch.Tensor, remainder: torch.Tensor) -> torch.Tensor:
    """(BF16 parameter, int16 remainder) -> FP32 master, as TE's adam.cu L239-245 (bit-exact inverse of split)."""
    if param.dtype != torch.bfloat16 or remainder.dtype != torch.int16:
        raise TypeError(f"expected bfloat16 param and int16 remainder, got {param.dtype} and {remainder.dtype}")
    high = param.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
    low = remainder.to(torch.int64) & 0xFFFF
    high = (high - (low >= 0x8000).to(torch.int64)) & 0xFFFF   # undo the rounding, int16 -- with wrap
    bits = (high << 16) | low
    bits = torch.where(bits >= 1 << 31, bits - (1 << 32), bits)
    return bits.to(torch.int32).view(torch.float32)


def _to_int16(u16: torch.Tensor) -> torch.Tensor:
    """0..0xFFFF held in int64 -> the int16 with those bits."""
    return torch.where(u16 >= 0x8000, u16 - 0x10000, u16).to(torch.int16)


# ---------------------------------------------------------------------- Adam steps
def _f32(x: float) -> float:
    """x rounded to FP32, as a float constant in the CUDA kernel."""
    return struct.unpack("f", struct.pack("f", x))[0]


class Fp32Math:
    """TE's adam_w_mode step in FP32 (adam.cu L260-268): constants as the kernel's floats."""

    def __init__(self, hp: Hyper):
        self.lr = _f32(hp.lr)
        self.b1 = _f32(hp.beta1)
        self.b2 = _f32(hp.beta2)
        self.one_minus_b1 = _f32(1.0 - self.b1)
        self.one_minus_b2 = _f32(1.0 - self.b2)
        self.eps = _f32(hp.eps)
        self.wd = _f32(hp.weight_decay)
        self.hp = hp

    def corrections(self, step: int) -> tuple[float, float]:
        # fused_adam.py computes 1 - beta**step on the host (Python floats); the kernel gets floats.
        return _f32(1.0 - self.hp.beta1 ** step), _f32(1.0 - self.hp.beta2 ** step)

    def step(self, p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int):
        """Returns (lr * update, new m, new v), all FP32; p, g, m, v FP32."""
        bc1, bc2 = self.corrections(step)
        m = self.b1 * m + self.one_minus_b1 * g
        v = self.b2 * v + self.one_minus_b2 * g * g
        denom = torch.sqrt(v / bc2) + self.eps
        update = (m / bc1) / denom + self.wd * p
        return self.lr * update, m, v


def fp64_reference(w0: torch.Tensor, grads: list[torch.Tensor], hp: Hyper) -> list[torch.Tensor]:
    """FP64 Adam (decoupled weight decay) from the FP32 master; the master after each step."""
    p = w0.to(torch.float64)
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    out = [p.clone()]
    for k, g32 in enumerate(grads, start=1):
        g = g32.to(torch.float64)
        m = hp.beta1 * m + (1.0 - hp.beta1) * g
        v = hp.beta2 * v + (1.0 - hp.beta2) * g * g
        m_hat = m / (1.0 - hp.beta1 ** k)
        v_hat = v / (1.0 - hp.beta2 ** k)
        p = p - hp.lr * (m_hat / (torch.sqrt(v_hat) + hp.eps) + hp.weight_decay * p)
        out.append(p.clone())
    return out


def _arm_remainder(w0, grads, math32: Fp32Math, moment_dtype=torch.float32) -> list[torch.Tensor]:
    """BF16 param + int16 remainder (main arm; with moment_dtype=bfloat16 the BF16-moments variant)."""
    param, rem = split_master(w0)
    m = torch.zeros_like(w0, dtype=moment_dtype)
    v = torch.zeros_like(w0, dtype=moment_dtype)
    out = [merge_master(param, rem)]
    for k, g in enumerate(grads, start=1):
        p = merge_master(param, rem)
        delta, m32, v32 = math32.step(p, g, m.float(), v.float(), k)
        param, rem = split_master(p - delta)
        m, v = m32.to(moment_dtype), v32.to(moment_dtype)
        out.append(merge_master(param, rem))
    return out


def _arm_fp32_master(w0, grads, math32: Fp32Math) -> list[torch.Tensor]:
    p = w0.clone()
    m = torch.zeros_like(w0)
    v = torch.zeros_like(w0)
    out = [p.clone()]
    for k, g in enumerate(grads, start=1):
        delta, m, v = math32.step(p, g, m, v, k)
        p = p - delta
        out.append(p.clone())
    return out


def _arm_drop_remainder(w0, grads, math32: Fp32Math) -> list[torch.Tensor]:
    """Negative control: the remainder is dropped, the master is the BF16 parameter alone."""
    param, _ = split_master(w0)
    m = torch.zeros_like(w0)
    v = torch.zeros_like(w0)
    out = [param.float()]
    for k, g in enumerate(grads, start=1):
        p = param.float()
        delta, m, v = math32.step(p, g, m, v, k)
        param, _ = split_master(p - delta)
        out.append(param.float())
    return out


def _arm_bf16_master(w0, grads, math32: Fp32Math) -> list[torch.Tensor]:
    """Negative control: a plain BF16 master, the step applied in BF16."""
    w = w0.to(torch.bfloat16)
    m = torch.zeros_like(w0)
    v = torch.zeros_like(w0)
    out = [w.float()]
    for k, g in enumerate(grads, start=1):
        delta, m, v = math32.step(w.float(), g, m, v, k)
        w = w - delta.to(torch.bfloat16)
        out.append(w.float())
    return out


ARMS = {
    # key: (label, role)
    "main": ("BF16 param + int16 remainder, FP32 m/v", "main"),
    "fp32_master": ("explicit FP32 master, FP32 m/v", "check"),
    "bf16_moments": ("BF16 param + int16 remainder, BF16 m/v", "variant"),
    "drop_remainder": ("control: remainder dropped (master = BF16 param)", "control"),
    "bf16_master": ("control: plain BF16 master, update applied in BF16", "control"),
}


def run_arms(w0: torch.Tensor, grads: list[torch.Tensor], math32: Fp32Math) -> dict[str, list[torch.Tensor]]:
    """Every arm of ARMS from the same FP32 master and gradients: the master after each step, step 0 first."""
    return {
        "main": _arm_remainder(w0, grads, math32),
        "fp32_master": _arm_fp32_master(w0, grads, math32),
        "bf16_moments": _arm_remainder(w0, grads, math32, torch.bfloat16),
        "drop_remainder": _arm_drop_remainder(w0, grads, math32),
        "bf16_master": _arm_bf16_master(w0, grads, math32),
    }
