"""Gated DeltaNet layers (Qwen3.5/3.6, Qwen3-Next) built with megatron-core's own GatedDeltaNet.

The layer: megatron-core 0.19.2 builds GDN with `get_gated_delta_net_module_spec(config, backend)`
(models/gpt/experimental_attention_variant_module_specs.py) from a backend's
column_parallel_layer_norm_linear (TE's fused input norm + linear), layer_norm (the gated output
norm) and row_parallel_linear. The torch-native and local backends have no fused norm + linear, so
`gdn_attention_spec` hands that function the backend's ColumnParallelLinear in its place and marks
the spec `fuse_input_layernorm: False`: the layer keeps its own input norm, as megatron's hybrid
layer builder does for an unfused attention spec. Everything else (the in_proj sections q, k, v, z,
beta, alpha sharded per section over TP, conv1d, A_log, dt_bias, the gated RMSNorm, out_proj, the
CP all-to-alls) is megatron's GatedDeltaNet, through `AttuneGatedDeltaNet`, a subclass that changes
two things only:

- the kernel: megatron calls fla's chunk_gated_delta_rule (and fla's causal_conv1d and l2norm) when
  fla is importable. Without fla its module refuses to build (HAVE_FLA); then the kernel is
  megatron's own torch_chunk_gated_delta_rule (what its deterministic mode runs) and torch
  equivalents stand in for fla's causal_conv1d and l2norm (`torch_causal_conv1d`, `torch_l2norm`).
  Which one ran is recorded (`linear_attention_kernel`, the kernel report);
- the initial weights under CPU initialisation (same_weights.init_gdn_cpu): every parameter drawn
  whole, as the TP 1 model holds it, from a seed drawn once from the layer's generator, and sliced
  as megatron shards it (in_proj and conv1d per section, A_log/dt_bias by value head, out_proj by
  input column), so a TP-sharded layer is the TP 1 layer. megatron's own CPU initialisation would
  slice in_proj contiguously (a different model at TP 2) and draws conv1d and A_log per rank.

fla 0.6.0 on Hopper (`configure_fla`): fla's Triton `chunk_bwd_dqkwg` is wrong on Hopper with Triton
3.4 to 3.7.0 (fla issue #640) and raises there; its TileLang backend (fla.ops.common.backends.tilelang,
needs the tilelang package and nvcc) replaces that kernel. fla enables it by default on Hopper with
Triton >= 3.4 (env FLA_TILELANG, "0" disables); the runner sets FLA_TILELANG=1 on Hopper unless the
user set it, and refuses to train (before the first step) when neither TileLang nor FlashQLA would run.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os

import torch
import torch.nn.functional as F

from experiments.megatron import same_weights
from experiments.megatron import torch_native as tnb

FLA_KERNEL = "fla.ops.gated_delta_rule.chunk_gated_delta_rule"
TORCH_KERNEL = "megatron.core torch_chunk_gated_delta_rule (fla not importable)"
BAD_TRITON = ((3, 4, 0), (3, 7, 1))   # [from, to): fla's Triton chunk_bwd_dqkwg is wrong on Hopper (fla #640)


# ------------------------------------------------------------------------------ torch stand-ins for fla
def torch_l2norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-6, **unused) -> torch.Tensor:
    """fla.modules.l2norm: x / sqrt(sum(x^2) + eps) over `dim`, computed in fp32."""
    xf = x.float()
    return (xf * torch.rsqrt((xf * xf).sum(dim, keepdim=True) + eps)).to(x.dtype)


def torch_causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                        activation: str | None = None, initial_state=None, output_final_state: bool = False,
                        cu_seqlens=None, **unused):
    """fla.modules.convolution.causal_conv1d as megatron calls it: depthwise causal convolution of
    x [b, s, d] with weight [d, w] (what megatron's deterministic mode computes with F.conv1d)."""
    if cu_seqlens is not None or initial_state is not None or output_final_state:
        raise NotImplementedError("the torch causal_conv1d stand-in has no packed sequences or carried state")
    seq, (d, w) = x.shape[1], weight.shape
    y = F.conv1d(x.transpose(1, 2), weight.unsqueeze(1), bias, padding=w - 1, groups=d)[..., :seq]
    if activation in ("silu", "swish"):
        y = F.silu(y)
    elif activation is not None:
        raise NotImplementedError(f"activation {activation!r}")
    return y.transpose(1, 2), None


def _megatron_gdn():
    from megatron.core.ssm.gated_delta_net import common, gdn
    return common, gdn


def fla_importable() -> bool:
    return _megatron_gdn()[0].chunk_gated_delta_rule is not None


def linear_attention_kernel() -> tuple:
    """(the gated delta rule GatedDeltaNet calls, its name): fla's when importable, else megatron's torch one."""
    common, _ = _megatron_gdn()
    if common.chunk_gated_delta_rule is not None:
        return common.chunk_gated_delta_rule, FLA_KERNEL
    return common.torch_chunk_gated_delta_rule, TORCH_KERNEL


def kernel_description() -> str:
    """The linear-attention kernel as the trial's notes and details["kernels"] say it."""
    _, name = linear_attention_kernel()
    if name != FLA_KERNEL:
        return f"{name}, torch conv1d and l2norm, in megatron-core GatedDeltaNet"
    import fla

    backends = "; ".join(f"{op} backends: {', '.join(b)}" for op, b in fla_backends().items())
    return f"fla {getattr(fla, '__version__', '?')} chunk_gated_delta_rule in megatron-core GatedDeltaNet ({backends})"


@contextlib.contextmanager
def _buildable():
    """Without fla: torch stand-ins where megatron's GDN module keeps fla's functions (None there),
    and its HAVE_FLA check passed for the construction only. With fla: nothing changes."""
    common, gdn = _megatron_gdn()
    if common.chunk_gated_delta_rule is not None:
        yield
        return
    common.l2norm = common.l2norm or torch_l2norm
    gdn.causal_conv1d = gdn.causal_conv1d or torch_causal_conv1d
    saved = common.HAVE_FLA
    common.HAVE_FLA = True
    try:
        yield
    finally:
        common.HAVE_FLA = saved


def _counted(fn, name: str):
    def gated_delta_rule(*args, **kwargs):
        tnb._count(name)
        return fn(*args, **kwargs)
    return gated_delta_rule


# ------------------------------------------------------------------------------ the module
_CLASS: dict = {}


def gdn_class():
    """AttuneGatedDeltaNet: megatron's GatedDeltaNet with the kernel chosen here and, under CPU
    initialisation, layout-independent initial weights (see the module docstring)."""
    if "cls" in _CLASS:
        return _CLASS["cls"]
    from megatron.core.ssm.gated_delta_net import GatedDeltaNet

    class AttuneGatedDeltaNet(GatedDeltaNet):
        def __init__(self, config, submodules, layer_number=None, *args, **kwargs):
            same = bool(config.use_cpu_initialization and config.perform_initialization)
            # One draw from the layer's generator (the same in every layout); megatron's own draws
            # (per-rank sizes) then come from a forked generator and are replaced.
            base = int(torch.randint(0, 2**62, (1,)).item()) if same else None
            with _buildable(), (_forked_rng() if same else contextlib.nullcontext()):
                super().__init__(config, submodules, layer_number, *args, **kwargs)
            if same:
                same_weights.init_gdn_cpu(self, base)

        def _setup_variant_attrs(self):
            super()._setup_variant_attrs()
            if not self.config.deterministic_mode:
                fn, name = linear_attention_kernel()
                self.gated_delta_rule = _counted(fn, name)

    _CLASS["cls"] = AttuneGatedDeltaNet
    return AttuneGatedDeltaNet


def _forked_rng():
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    return torch.random.fork_rng(devices=devices)


# ------------------------------------------------------------------------------ specs
class _UnfusedNorm:
    """A backend provider whose column_parallel_layer_norm_linear is its plain ColumnParallelLinear
    (torch-native and local have no fused norm + linear; the layer keeps its input norm)."""

    def __init__(self, provider):
        self._provider = provider

    def column_parallel_layer_norm_linear(self):
        return self._provider.column_parallel_linear()

    def __getattr__(self, name):
        return getattr(self._provider, name)


def gdn_attention_spec(config, provider):
    """The GDN attention ModuleSpec megatron's get_gated_delta_net_module_spec builds for `provider`,
    with AttuneGatedDeltaNet and, unless the provider fuses norm and linear, an unfused in_proj."""
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import get_gated_delta_net_module_spec
    from megatron.core.transformer.spec_utils import ModuleSpec

    fused = provider.column_parallel_layer_norm_linear() is not None
    spec = get_gated_delta_net_module_spec(config, backend=provider if fused else _UnfusedNorm(provider))
    return ModuleSpec(module=gdn_class(), params=dict(spec.params), submodules=spec.submodules,
                      metainfo={**spec.metainfo, "fuse_input_layernorm": fused})


def te_block_layers(config, vp_stage=None, pp_rank=None):
    """Transformer Engine: megatron's hybrid GDN block spec, GatedDeltaNet swapped for AttuneGatedDeltaNet."""
    import dataclasses

    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        get_transformer_block_with_experimental_attention_variant_spec)
    from megatron.core.ssm.gated_delta_net import GatedDeltaNet

    spec = get_transformer_block_with_experimental_attention_variant_spec(config, vp_stage=vp_stage, pp_rank=pp_rank)
    for ls in spec.layer_specs:
        attn = ls.submodules.self_attention
        if attn.module is GatedDeltaNet:
            ls.submodules.self_attention = dataclasses.replace(attn, module=gdn_class())
    return spec


# ------------------------------------------------------------------------------ fla on the GPU
def _version(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out + [0] * (3 - len(out)))


def fla_backends() -> dict:
    """The fla backends usable and enabled here for each GDN operation family, in fla's order of
    preference ('gated_delta_rule': the whole call, e.g. flash_qla; 'common': the chunk kernels, e.g.
    tilelang's chunk_bwd_dqkwg); fla runs its default Triton kernels where none takes a call."""
    out = {}
    try:
        from fla import backends as fb
        for op in ("gated_delta_rule", "common"):
            importlib.import_module(f"fla.ops.{op}.backends")
            registry = getattr(fb, "_operation_registries", {}).get(op)
            ordered = registry._get_sorted_backends() if registry is not None else []
            out[op] = [b.backend_type for b in ordered if b.is_available() and b.is_enabled()] or ["none (triton)"]
    except Exception as e:  # noqa: BLE001 - a report, not a requirement
        out["error"] = [f"{type(e).__name__}: {e}"]
    return out


def fla_dispatches() -> list[str]:
    """What fla's dispatcher logged it ran ("operation:function:backend", ":fail" for a rejection)."""
    try:
        from fla import backends as fb
    except ImportError:
        return []
    seen = set()
    for registry in list(getattr(fb, "_operation_registries", {}).values()) + list(
            getattr(fb, "_function_registries", {}).values()):
        seen |= set(getattr(registry, "_logged", ()))
    return sorted(seen)


def configure_fla(device_index: int) -> dict:
    """Before GDN runs on a GPU: FLA_TILELANG=1 on Hopper unless the user set it; then the backends fla
    will use. Raises ImportError when fla's kernels would be wrong here (Hopper, Triton in [3.4, 3.7.1),
    neither TileLang nor FlashQLA usable), so the trial fails before its first step, with the fix."""
    if importlib.util.find_spec("fla") is None:
        return {"fla": "not importable: megatron's torch gated delta rule runs"}
    hopper = torch.cuda.get_device_capability(device_index)[0] == 9
    status = {}
    if hopper:
        if "FLA_TILELANG" in os.environ:
            status["FLA_TILELANG"] = f"{os.environ['FLA_TILELANG']} (set by the user)"
        else:
            os.environ["FLA_TILELANG"] = "1"
            status["FLA_TILELANG"] = "1 (set by the runner: fla's TileLang backend on Hopper)"
    import fla
    import triton

    from experiments.megatron import fla_tuning
    status.update(fla=getattr(fla, "__version__", "?"), triton=triton.__version__, hopper=hopper,
                  backends=fla_backends())
    bad = BAD_TRITON[0] <= _version(triton.__version__) < BAD_TRITON[1]
    b = status["backends"]
    if hopper and bad and "flash_qla" not in b.get("gated_delta_rule", []) and "tilelang" not in b.get("common", []):
        raise ImportError(
            f"fla {status['fla']} on Hopper with Triton {triton.__version__}: its Triton chunk_bwd_dqkwg is wrong "
            f"there (fla #640) and needs the TileLang backend, which is not usable (backends {b}; "
            f"FLA_TILELANG={os.environ.get('FLA_TILELANG')}): install tilelang and make nvcc findable "
            f"(CUDA_HOME, PATH or the nvidia-cuda-nvcc wheel), or use Triton >= 3.7.1")
    status["tuning"] = fla_tuning.seed_for_megatron(torch.cuda.get_device_name(device_index))
    return status
